"""GPU telemetry through NVML: the one NVML door (:mod:`.nvml`), device facts (:mod:`.devices`)
and the background sampler (:mod:`.sampler`). Only this package imports pynvml."""

from __future__ import annotations

from kvdiag.telemetry.devices import GpuInfo, gpu_info, list_gpus
from kvdiag.telemetry.nvml import Nvml
from kvdiag.telemetry.sampler import TelemetrySample, TelemetrySampler, open_sampler

__all__ = [
    "GpuInfo",
    "Nvml",
    "TelemetrySample",
    "TelemetrySampler",
    "gpu_info",
    "list_gpus",
    "open_sampler",
]
