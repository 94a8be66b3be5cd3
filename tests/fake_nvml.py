"""A stand-in for the ``pynvml`` module: answers the NVML queries kvdiag makes from a table,
and raises NVMLError-like exceptions for the ones a test marks as failing."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


class FakeNVMLError(Exception):
    pass


def make_fake_pynvml(
    gpus: list[dict[str, Any]] | None = None,
    failing: tuple[str, ...] = (),
    init_error: str | None = None,
) -> types.ModuleType:
    """``gpus``: one dict per device (keys: name, total, used, util, mem_util, rx, tx, sm, mem,
    temp, power, gen, width, max_gen, max_width, cc, bus, uuid)."""
    gpus = gpus if gpus is not None else []
    m = types.ModuleType("pynvml")
    m.calls = []  # type: ignore[attr-defined]
    state = {"init": 0, "shutdown": 0}
    m.state = state  # type: ignore[attr-defined]
    m.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    m.NVML_PCIE_UTIL_TX_BYTES = 0  # type: ignore[attr-defined]
    m.NVML_PCIE_UTIL_RX_BYTES = 1  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.NVML_CLOCK_MEM = 2  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def fn(name: str, body: Callable[..., Any]) -> None:
        def wrapper(*args: Any) -> Any:
            m.calls.append(name)  # type: ignore[attr-defined]
            if name in failing:
                raise FakeNVMLError(f"{name} Not Supported")
            return body(*args)

        setattr(m, name, wrapper)

    def init() -> None:
        if init_error:
            raise FakeNVMLError(init_error)
        state["init"] += 1

    fn("nvmlInit", init)
    fn("nvmlShutdown", lambda: state.__setitem__("shutdown", state["shutdown"] + 1))
    fn("nvmlDeviceGetCount", lambda: len(gpus))

    def handle(i: int) -> dict[str, Any]:
        if not 0 <= i < len(gpus):
            raise FakeNVMLError("Invalid Argument")
        return gpus[i]

    fn("nvmlDeviceGetHandleByIndex", handle)
    fn("nvmlDeviceGetName", lambda h: h["name"].encode())
    fn("nvmlSystemGetDriverVersion", lambda: b"580.159.04")
    fn("nvmlSystemGetCudaDriverVersion", lambda: 13000)
    fn("nvmlDeviceGetMemoryInfo",
       lambda h: types.SimpleNamespace(total=h["total"], used=h["used"],
                                       free=h["total"] - h["used"]))
    fn("nvmlDeviceGetUtilizationRates",
       lambda h: types.SimpleNamespace(gpu=h["util"], memory=h["mem_util"]))
    fn("nvmlDeviceGetPcieThroughput", lambda h, c: h["rx"] if c == 1 else h["tx"])
    fn("nvmlDeviceGetClockInfo", lambda h, c: h["sm"] if c == 1 else h["mem"])
    fn("nvmlDeviceGetTemperature", lambda h, s: h["temp"])
    fn("nvmlDeviceGetPowerUsage", lambda h: h["power"])
    fn("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: h["gen"])
    fn("nvmlDeviceGetCurrPcieLinkWidth", lambda h: h["width"])
    fn("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: h["max_gen"])
    fn("nvmlDeviceGetMaxPcieLinkWidth", lambda h: h["max_width"])
    fn("nvmlDeviceGetCudaComputeCapability", lambda h: h["cc"])
    fn("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=h["bus"].encode()))
    fn("nvmlDeviceGetUUID", lambda h: h["uuid"])
    return m


H200 = {
    "name": "NVIDIA H200", "total": 150_754_820_096, "used": 4_000_000_000, "util": 37,
    "mem_util": 12, "rx": 51_200, "tx": 1_024, "sm": 1980, "mem": 3201, "temp": 41,
    "power": 123_456, "gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "cc": (9, 0),
    "bus": "00000000:19:00.0", "uuid": "GPU-1234",
}
