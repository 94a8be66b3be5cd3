"""A background NVML sampler: one sample every ``interval_s`` (default 100 ms) into a buffer
that the capture drains into ``telemetry`` events after each step.

A sample holds exactly the fields of :class:`kvdiag.model.events.Telemetry`; a field NVML
cannot provide stays None and is left out of the event. The thread never raises: every
query goes through :class:`~kvdiag.telemetry.nvml.Nvml`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvdiag.telemetry.nvml import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_TEMPERATURE_GPU,
    Nvml,
)

DEFAULT_INTERVAL_S = 0.1


@dataclass(frozen=True)
class TelemetrySample:
    """One NVML reading; ``t_ns`` is monotonic nanoseconds since the sampler's ``t0_ns``."""

    t_ns: int
    mem_used: int | None = None
    mem_total: int | None = None
    gpu_util: int | None = None
    mem_util: int | None = None
    pcie_rx_kbps: int | None = None
    pcie_tx_kbps: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None

    def event_fields(self) -> dict[str, int]:
        """Keyword arguments for ``Telemetry`` (without seq/t_ns/step): the known fields."""
        return {k: v for k, v in asdict(self).items() if k != "t_ns" and v is not None}

    @property
    def empty(self) -> bool:
        return not self.event_fields()


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def read_sample(nvml: Nvml, handle: Any, t_ns: int) -> TelemetrySample:
    """One reading of every field (each query may fail on its own)."""
    mem = nvml.call("nvmlDeviceGetMemoryInfo", handle)
    util = nvml.call("nvmlDeviceGetUtilizationRates", handle)
    c = nvml.const
    return TelemetrySample(
        t_ns=t_ns,
        mem_used=_int(getattr(mem, "used", None)),
        mem_total=_int(getattr(mem, "total", None)),
        gpu_util=_int(getattr(util, "gpu", None)),
        mem_util=_int(getattr(util, "memory", None)),
        pcie_rx_kbps=_int(nvml.call("nvmlDeviceGetPcieThroughput", handle,
                                    c("NVML_PCIE_UTIL_RX_BYTES", NVML_PCIE_UTIL_RX_BYTES))),
        pcie_tx_kbps=_int(nvml.call("nvmlDeviceGetPcieThroughput", handle,
                                    c("NVML_PCIE_UTIL_TX_BYTES", NVML_PCIE_UTIL_TX_BYTES))),
        sm_clock_mhz=_int(nvml.call("nvmlDeviceGetClockInfo", handle,
                                    c("NVML_CLOCK_SM", NVML_CLOCK_SM))),
        mem_clock_mhz=_int(nvml.call("nvmlDeviceGetClockInfo", handle,
                                     c("NVML_CLOCK_MEM", NVML_CLOCK_MEM))),
        temperature_c=_int(nvml.call("nvmlDeviceGetTemperature", handle,
                                     c("NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU))),
        power_mw=_int(nvml.call("nvmlDeviceGetPowerUsage", handle)),
    )


class TelemetrySampler:
    """Samples GPU ``device`` every ``interval_s`` on a daemon thread until :meth:`stop`."""

    def __init__(self, nvml: Nvml, device: int = 0, interval_s: float = DEFAULT_INTERVAL_S,
                 t0_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 max_buffered: int = 100_000) -> None:
        if interval_s <= 0:
            raise ValueError(f"telemetry interval must be positive, got {interval_s}")
        self.nvml = nvml
        self.device = device
        self.interval_s = interval_s
        self.clock = clock
        self.t0_ns = clock() if t0_ns is None else t0_ns
        self._handle = nvml.call("nvmlDeviceGetHandleByIndex", device)
        self._buffer: deque[TelemetrySample] = deque(maxlen=max_buffered)
        self._latest: TelemetrySample | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.count = 0

    @property
    def usable(self) -> bool:
        """NVML answered and has a handle for the device."""
        return self._handle is not None

    def sample(self) -> TelemetrySample:
        """Take one sample now (also what the thread does each interval)."""
        s = read_sample(self.nvml, self._handle, self.clock() - self.t0_ns)
        with self._lock:
            self._buffer.append(s)
            self._latest = s
            self.count += 1
        return s

    def snapshot(self) -> TelemetrySample | None:
        """The latest sample, without consuming the buffer."""
        with self._lock:
            return self._latest

    def drain(self) -> list[TelemetrySample]:
        """Samples taken since the last drain, oldest first."""
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def start(self) -> TelemetrySampler:
        if self._thread is None and self.usable:
            self._thread = threading.Thread(target=self._run, name="kvdiag-telemetry",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1.0)
            self._thread = None

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stderr(message: str) -> None:
    print(f"kvdiag: warning: {message}", file=sys.stderr)


def open_sampler(device: int = 0, interval_s: float = DEFAULT_INTERVAL_S,
                 nvml: Nvml | None = None, t0_ns: int | None = None,
                 warn: Callable[[str], None] = _stderr) -> TelemetrySampler | None:
    """A started sampler, or None after exactly one warning when NVML (no driver, no GPU,
    no pynvml) or the device is not available: capture goes on without telemetry."""
    nvml = nvml or Nvml()
    if not nvml.available:
        warn(f"no GPU telemetry: NVML is not available ({nvml.unavailable_reason})")
        return None
    sampler = TelemetrySampler(nvml, device, interval_s, t0_ns)
    if not sampler.usable:
        warn(f"no GPU telemetry: NVML has no GPU {device} ({nvml.last_error})")
        return None
    return sampler.start()
