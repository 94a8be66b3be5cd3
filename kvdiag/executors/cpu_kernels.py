"""The NumPy executor's compiled decode products (kernels/cpu_attend.c), built on first use.

The two einsum products of decode attention (scores = Q.K^T, output = P.V) dominate a long
capture. ``kernels/cpu_attend.c`` computes them with the rounding of NumPy's einsum loops (see
its header) but with the K and V rows reused across a KV head's query rows, and without
holding the GIL, so that heads run on several cores. It is compiled with the system C compiler
the first time it is needed (:func:`kvdiag.compiled.build`: cached, atomic, only this user's
own build is loaded), then loaded with ctypes.

Before use, each function is checked against ``np.einsum`` on probe arrays of the shapes and
strides the executor passes (tails included); any difference, a missing compiler or a failed
build leaves ``load()`` returning None, and the executor keeps einsum. ``KVDIAG_NUMPY_NATIVE=0``
turns the kernels off.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from functools import cache

import numpy as np

from kvdiag.compiled import build
from kvdiag.errors import DeviceUnavailable
from kvdiag.kvstream.backend import F32Array

NATIVE_ENV = "KVDIAG_NUMPY_NATIVE"
SOURCE = "cpu_attend.c"
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math")
"""No -march: the SSE2 baseline, plus the AVX functions the source selects at run time.
No contraction into fused multiply-add: einsum's loops round the product, then the sum."""

_L = ctypes.c_long
_P = ctypes.c_void_p

unavailable_reason = ""
"""Why ``load()`` returned None (empty when it did not, or before it ran)."""


def _strides(a: np.ndarray) -> tuple[int, int]:
    if a.dtype != np.float32 or a.ndim != 3 or a.strides[2] != 4:
        raise ValueError(f"need float32 [h, rows, cols] with contiguous rows, got {a.dtype} "
                         f"{a.shape} strides {a.strides}")
    return a.strides[0] // 4, a.strides[1] // 4


class CpuKernels:
    """ctypes bindings of kv_scores and kv_pv; each call releases the GIL."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        for fn in (lib.kv_scores, lib.kv_pv):
            # (heads, rows, cols, inner, a, a head stride, a row stride, b, ..., out, ...)
            fn.argtypes = [_L, _L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _L]
            fn.restype = None

    def scores(self, q: F32Array, k: F32Array) -> F32Array:
        """``np.einsum("hqd,hdk->hqk", q, k.transpose(0, 2, 1))`` for q ``[h, rows, d]`` and
        k ``[h, n, d]``."""
        h, rows, d = q.shape
        n = k.shape[1]
        out = np.empty((h, rows, n), np.float32)
        self._lib.kv_scores(h, rows, n, d, q.ctypes.data, *_strides(q), k.ctypes.data,
                            *_strides(k), out.ctypes.data, *_strides(out))
        return out

    def pv(self, p: F32Array, v: F32Array, out: F32Array) -> None:
        """``out[...] = np.einsum("hqd,hdk->hqk", p, v)`` for p ``[h, rows, n]`` and v
        ``[h, n, dv]``."""
        h, rows, n = p.shape
        dv = v.shape[2]
        if out.shape != (h, rows, dv):
            raise ValueError(f"out is {out.shape}, need {(h, rows, dv)}")
        self._lib.kv_pv(h, rows, n, dv, p.ctypes.data, *_strides(p), v.ctypes.data,
                        *_strides(v), out.ctypes.data, *_strides(out))


def _agrees(kernels: CpuKernels) -> bool:
    """Both functions equal np.einsum bit for bit on probes shaped like the executor's calls:
    4-lane and 16-element tails of the head dimension, row counts around the 6-row blocks,
    and views into larger arrays (the executor's K/V views have spare capacity)."""
    rng = np.random.default_rng(2026)
    for heads, rows, n, d in ((2, 6, 300, 256), (3, 13, 257, 72), (1, 1, 33, 40), (2, 30, 64, 128)):
        q = rng.standard_normal((heads, rows, d), dtype=np.float32)
        k = rng.standard_normal((heads + 1, n + 50, d), dtype=np.float32)[1:, :n]
        v = rng.standard_normal((heads, n + 9, d), dtype=np.float32)[:, :n]
        s = np.einsum("hqd,hdk->hqk", q, k.transpose(0, 2, 1))
        if not np.array_equal(kernels.scores(q, k), s):
            return False
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out = np.empty((heads, rows, d), np.float32)
        kernels.pv(p, v, out)
        if not np.array_equal(out, np.einsum("hqd,hdk->hqk", p, v)):
            return False
    return True


@cache
def load() -> CpuKernels | None:
    """The checked kernels, or None (reason in ``unavailable_reason``); built once per source."""
    global unavailable_reason
    if os.environ.get(NATIVE_ENV, "1") == "0":
        unavailable_reason = f"{NATIVE_ENV}=0"
        return None
    try:
        from kvdiag.executors.cuda_kernels import kernel_dir

        kernels = CpuKernels(ctypes.CDLL(str(build(kernel_dir() / SOURCE, "cpu_attend",
                                                   CFLAGS))))
    except (DeviceUnavailable, OSError, subprocess.SubprocessError) as exc:
        unavailable_reason = f"could not build {SOURCE}: {exc}"
        return None
    if not _agrees(kernels):
        unavailable_reason = f"{SOURCE} does not round as this NumPy's einsum does"
        return None
    unavailable_reason = ""
    return kernels
