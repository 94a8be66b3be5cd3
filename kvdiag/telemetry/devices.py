"""GPUs as NVML reports them: name, memory, driver, PCIe link, compute capability.

Each field comes from one NVML query (nvml.h): ``nvmlDeviceGetName``, ``nvmlDeviceGetMemoryInfo``
(``.total``), ``nvmlSystemGetDriverVersion``, ``nvmlSystemGetCudaDriverVersion`` (e.g. 13000 →
13.0), ``nvmlDeviceGetCurrPcieLinkGeneration``/``Width`` and their ``Max`` forms,
``nvmlDeviceGetCudaComputeCapability``, ``nvmlDeviceGetPciInfo`` (``.busId``) and
``nvmlDeviceGetUUID``. A field NVML cannot provide is None.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.model.events import Device
from kvdiag.telemetry.nvml import Nvml


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int | None
    driver: str | None
    cuda_driver: str | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_max_gen: int | None
    pcie_max_width: int | None
    compute_capability: str | None
    bus_id: str | None
    uuid: str | None

    @property
    def pcie(self) -> str | None:
        """``Gen5 x16`` (current link), with the maximum when it differs."""
        if self.pcie_gen is None or self.pcie_width is None:
            return None
        text = f"Gen{self.pcie_gen} x{self.pcie_width}"
        if (self.pcie_max_gen, self.pcie_max_width) not in (
            (None, None), (self.pcie_gen, self.pcie_width)
        ):
            text += f" (max Gen{self.pcie_max_gen} x{self.pcie_max_width})"
        return text

    def as_device(self) -> Device:
        """The trace header's ``device``."""
        return Device(name=self.name, memory_bytes=self.memory_bytes, driver=self.driver,
                      pcie=self.pcie, compute_capability=self.compute_capability)


def _as_int(v: object) -> int | None:
    return int(v) if isinstance(v, int) else None


def gpu_count(nvml: Nvml) -> int:
    n = nvml.call("nvmlDeviceGetCount")
    return int(n) if isinstance(n, int) else 0


def gpu_info(nvml: Nvml, index: int) -> GpuInfo | None:
    """NVML's view of GPU ``index``, or None when NVML has no handle for it."""
    h = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if h is None:
        return None
    mem = nvml.call("nvmlDeviceGetMemoryInfo", h)
    cc = nvml.call("nvmlDeviceGetCudaComputeCapability", h)
    pci = nvml.call("nvmlDeviceGetPciInfo", h)
    cuda = _as_int(nvml.call("nvmlSystemGetCudaDriverVersion"))
    bus = getattr(pci, "busId", None) if pci is not None else None
    name = nvml.call("nvmlDeviceGetName", h)
    return GpuInfo(
        index=index,
        name=str(name) if name is not None else f"GPU {index}",
        memory_bytes=_as_int(getattr(mem, "total", None)),
        driver=_opt_str(nvml.call("nvmlSystemGetDriverVersion")),
        cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        pcie_gen=_as_int(nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", h)),
        pcie_width=_as_int(nvml.call("nvmlDeviceGetCurrPcieLinkWidth", h)),
        pcie_max_gen=_as_int(nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", h)),
        pcie_max_width=_as_int(nvml.call("nvmlDeviceGetMaxPcieLinkWidth", h)),
        compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) and len(cc) == 2 else None,
        bus_id=bus.decode() if isinstance(bus, bytes) else _opt_str(bus),
        uuid=_opt_str(nvml.call("nvmlDeviceGetUUID", h)),
    )


def list_gpus(nvml: Nvml) -> list[GpuInfo]:
    return [g for i in range(gpu_count(nvml)) if (g := gpu_info(nvml, i)) is not None]


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)
