"""The one door to NVML: every call goes through :meth:`Nvml.call`, which starts NVML on first
use and turns any failure into ``None`` ("not available") plus a remembered reason.

Only this package imports ``pynvml`` (the ``nvidia-ml-py`` distribution). Function and
constant names are NVML's (nvml.h): ``nvmlDeviceGetMemoryInfo`` → ``.used``/``.total`` bytes,
``nvmlDeviceGetUtilizationRates`` → ``.gpu``/``.memory`` percent, ``nvmlDeviceGetPcieThroughput``
KB/s over a 20 ms window, ``nvmlDeviceGetClockInfo`` MHz, ``nvmlDeviceGetTemperature`` °C,
``nvmlDeviceGetPowerUsage`` milliwatts.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

# nvml.h enum values, fixed since NVML 2.x (used when a fake module lacks the constants).
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


def _import_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


class Nvml:
    """A lazily started NVML session. ``module`` replaces ``pynvml`` (tests pass a fake)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module
        self._started = False
        self._failed: str | None = None
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def _start(self) -> ModuleType | None:
        with self._lock:
            if self._started:
                return self._module
            if self._failed is not None:
                return None
            try:
                if self._module is None:
                    self._module = _import_pynvml()
                self._module.nvmlInit()
            except Exception as exc:
                self._failed = _reason(exc)
                self.last_error = self._failed
                return None
            self._started = True
            return self._module

    @property
    def available(self) -> bool:
        """NVML started (a driver answered)."""
        return self._start() is not None

    @property
    def unavailable_reason(self) -> str | None:
        """Why NVML could not start, once a call has tried."""
        self._start()
        return self._failed

    def call(self, name: str, *args: Any) -> Any | None:
        """``pynvml.<name>(*args)``, or None when NVML is absent or the call fails."""
        module = self._start()
        if module is None:
            return None
        try:
            result = getattr(module, name)(*args)
        except Exception as exc:
            self.last_error = f"{name}: {_reason(exc)}"
            return None
        return result.decode() if isinstance(result, bytes) else result

    def const(self, name: str, default: int) -> int:
        module = self._start()
        value = getattr(module, name, default) if module is not None else default
        return int(value)

    def shutdown(self) -> None:
        with self._lock:
            if self._started and self._module is not None:
                try:
                    self._module.nvmlShutdown()
                except Exception as exc:
                    self.last_error = f"nvmlShutdown: {_reason(exc)}"
            self._started = False


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, ImportError):
        return "pynvml (nvidia-ml-py) is not installed"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
