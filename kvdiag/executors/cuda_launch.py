"""Kernel launches through the CUDA driver's ``cuLaunchKernelEx``, for the one thing CuPy's
launch cannot ask for: programmatic stream serialization (programmatic dependent launch,
compute capability 9.0 and newer). The attention merge kernel is launched this way so that
its blocks start while the partial kernel ahead of it finishes; ``griddepcontrol.wait`` in
the kernel (kernels/kvdiag_platform.cuh ``kv_grid_wait``) keeps its reads after the partial
kernel's writes. Stream capture records the launch as a programmatic graph edge.

The driver library is the one CuPy already loaded; the function handle is CuPy's
(``Function.ptr``), the arguments are the kernel's parameter bytes. Nothing here runs without
a GPU, and the executor falls back to CuPy's own launch when the driver lacks the entry point.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class LaunchError(RuntimeError):
    """cuLaunchKernelEx returned an error; the message is the driver's own text."""


class _Attribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):
    # CUlaunchConfig (ctypes inserts the padding before the 8-byte-aligned stream handle)
    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint),
    ]  # fmt: skip


class DriverLauncher:
    """``launch`` = cuLaunchKernelEx with the parameter bytes of a by-value struct argument."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            self._launch = lib.cuLaunchKernelEx
            self._error_string = lib.cuGetErrorString
        except (OSError, AttributeError) as exc:
            raise LaunchError(f"the CUDA driver has no cuLaunchKernelEx: {exc}") from None
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._error_string.restype = ctypes.c_int
        self._error_string.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._attr = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value[0] = 1

    def launch(self, function: Any, grid: tuple[int, int, int], block: int, shared_mem: int,
               stream_ptr: int, params: np.ndarray, programmatic: bool) -> None:
        """Launch ``function`` (a CuPy RawKernel: its CUfunction is ``.kernel.ptr``) with one
        by-value argument whose bytes are ``params``; ``programmatic`` lets it start before the
        kernel ahead of it finishes."""
        cfg = _Config(grid[0], grid[1], grid[2], block, 1, 1, shared_mem, stream_ptr,
                      ctypes.pointer(self._attr) if programmatic else None,
                      1 if programmatic else 0)
        args = (ctypes.c_void_p * 1)(params.ctypes.data)
        rc = self._launch(ctypes.byref(cfg), function.kernel.ptr, args, None)
        if rc != 0:
            text = ctypes.c_char_p()
            self._error_string(rc, ctypes.byref(text))
            name = text.value.decode(errors="replace") if text.value else f"CUresult {rc}"
            raise LaunchError(f"cuLaunchKernelEx: {name}")
