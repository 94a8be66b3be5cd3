"""Telemetry: the NVML helper's failure handling and the sampler's event fields, against a fake
pynvml module (no driver needed)."""

from __future__ import annotations

import time

import msgspec
import pytest

from kvdiag.model import events as ev
from kvdiag.telemetry import nvml as nvml_mod
from kvdiag.telemetry.devices import gpu_info, list_gpus
from kvdiag.telemetry.nvml import Nvml
from kvdiag.telemetry.sampler import TelemetrySampler, open_sampler, read_sample
from tests.fake_nvml import H200, make_fake_pynvml


def test_no_driver_means_not_available_with_the_reason_and_no_raise() -> None:
    fake = make_fake_pynvml(init_error="Driver Not Loaded")
    nvml = Nvml(fake)
    assert not nvml.available
    assert nvml.unavailable_reason == "FakeNVMLError: Driver Not Loaded"
    assert nvml.call("nvmlDeviceGetCount") is None
    # NVML is not retried on every call once it failed to start
    assert fake.calls.count("nvmlInit") == 1  # type: ignore[attr-defined]


def test_missing_pynvml_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml_mod, "_import_pynvml", boom)
    nvml = Nvml()
    assert nvml.call("nvmlDeviceGetCount") is None
    assert nvml.unavailable_reason == "pynvml (nvidia-ml-py) is not installed"


def test_one_failing_query_leaves_the_others() -> None:
    fake = make_fake_pynvml([H200], failing=("nvmlDeviceGetPowerUsage",
                                             "nvmlDeviceGetPcieThroughput"))
    nvml = Nvml(fake)
    h = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    s = read_sample(nvml, h, t_ns=5)
    assert s.power_mw is None and s.pcie_rx_kbps is None and s.pcie_tx_kbps is None
    assert s.mem_used == 4_000_000_000 and s.mem_total == 150_754_820_096
    assert (s.gpu_util, s.mem_util, s.sm_clock_mhz, s.mem_clock_mhz, s.temperature_c) == (
        37, 12, 1980, 3201, 41)
    # power is queried last: the helper remembers the most recent failure and its text
    assert nvml.last_error == "nvmlDeviceGetPowerUsage: FakeNVMLError: " \
                              "nvmlDeviceGetPowerUsage Not Supported"


def test_sample_fields_make_a_telemetry_event_that_round_trips() -> None:
    nvml = Nvml(make_fake_pynvml([H200]))
    s = read_sample(nvml, nvml.call("nvmlDeviceGetHandleByIndex", 0), t_ns=7)
    fields = s.event_fields()
    assert fields == {"mem_used": 4_000_000_000, "mem_total": 150_754_820_096, "gpu_util": 37,
                      "mem_util": 12, "pcie_rx_kbps": 51_200, "pcie_tx_kbps": 1_024,
                      "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 41,
                      "power_mw": 123_456}
    event = ev.Telemetry(seq=3, t_ns=s.t_ns, step=1, **fields)
    line = msgspec.json.encode(event)
    assert b'"kind":"telemetry"' in line
    back = msgspec.json.decode(line, type=ev.AnyEvent)
    assert back == event
    # a field NVML could not give is absent from the event, not null
    partial = read_sample(Nvml(make_fake_pynvml([H200], failing=("nvmlDeviceGetTemperature",))),
                          H200, t_ns=0)
    assert "temperature_c" not in partial.event_fields()
    assert b"temperature_c" not in msgspec.json.encode(
        ev.Telemetry(seq=1, t_ns=0, step=0, **partial.event_fields()))


def test_sampler_thread_buffers_samples_in_time_order_and_snapshots_the_latest() -> None:
    ticks = iter(range(1_000, 10**9, 1_000))
    sampler = TelemetrySampler(Nvml(make_fake_pynvml([H200])), interval_s=0.005,
                               t0_ns=0, clock=lambda: next(ticks))
    assert sampler.snapshot() is None
    with sampler:
        deadline = time.monotonic() + 5.0
        while sampler.count < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
    assert sampler.count >= 4
    got = sampler.drain()
    assert len(got) == sampler.count
    assert [s.t_ns for s in got] == sorted(s.t_ns for s in got)
    assert got[0].t_ns >= 1_000
    assert sampler.snapshot() == got[-1]
    assert sampler.drain() == []
    assert all(s.gpu_util == 37 for s in got)


def test_open_sampler_without_nvml_warns_once_and_returns_none() -> None:
    warnings: list[str] = []
    got = open_sampler(nvml=Nvml(make_fake_pynvml(init_error="NVML Shared Library Not Found")),
                       warn=warnings.append)
    assert got is None
    assert warnings == ["no GPU telemetry: NVML is not available "
                        "(FakeNVMLError: NVML Shared Library Not Found)"]
    warnings.clear()
    assert open_sampler(device=3, nvml=Nvml(make_fake_pynvml([H200])), warn=warnings.append) \
        is None
    assert len(warnings) == 1 and "no GPU 3" in warnings[0]


def test_open_sampler_with_a_gpu_samples_until_stopped() -> None:
    warnings: list[str] = []
    sampler = open_sampler(interval_s=0.01, nvml=Nvml(make_fake_pynvml([H200])),
                           warn=warnings.append)
    assert sampler is not None and warnings == []
    deadline = time.monotonic() + 5.0
    while sampler.count < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    sampler.stop()
    n = sampler.count
    time.sleep(0.03)
    assert sampler.count == n >= 2


def test_invalid_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        TelemetrySampler(Nvml(make_fake_pynvml([H200])), interval_s=0)


def test_gpu_info_reads_link_memory_driver_and_capability() -> None:
    nvml = Nvml(make_fake_pynvml([H200, {**H200, "name": "NVIDIA H100", "gen": 4,
                                         "cc": (9, 0), "uuid": "GPU-5678"}]))
    gpus = list_gpus(nvml)
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H100"]
    g = gpus[1]
    assert g.pcie == "Gen4 x16 (max Gen5 x16)"
    assert gpus[0].pcie == "Gen5 x16"
    assert (g.driver, g.cuda_driver, g.compute_capability, g.bus_id, g.uuid) == (
        "580.159.04", "13.0", "9.0", "00000000:19:00.0", "GPU-5678")
    dev = gpus[0].as_device()
    assert (dev.name, dev.memory_bytes, dev.pcie) == ("NVIDIA H200", 150_754_820_096, "Gen5 x16")
    assert gpu_info(nvml, 7) is None
