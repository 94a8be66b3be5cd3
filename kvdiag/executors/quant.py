"""Bit-exact NumPy row quantization and dequantization for the K/V cache types.

Semantics are those of ggml's reference C code, vectorised over every row and block at once:

* ``quantize_row_{q8_0,q4_0,q4_1,q5_0,q5_1}_ref`` and ``dequantize_row_*`` (ggml/src/ggml-quants.c),
  block layouts from ggml-common.h (little endian, packed): ``block_q8_0`` = fp16 d + 32 int8;
  ``block_q4_0`` = fp16 d + 16 nibble bytes; ``block_q4_1`` = fp16 d, fp16 m + 16 bytes;
  ``block_q5_0`` = fp16 d + uint32 qh + 16 bytes; ``block_q5_1`` = fp16 d, fp16 m, qh, 16 bytes.
  Nibble byte ``j`` holds element ``j`` (low) and element ``j + 16`` (high); bit ``e`` of ``qh``
  is the fifth bit of element ``e``.
* ``GGML_FP32_TO_FP16`` (ggml-impl.h ``ggml_compute_fp32_to_fp16``): IEEE round to nearest even,
  overflow to infinity, subnormals kept, every NaN becomes ``sign | 0x7E00``.
* ``GGML_FP32_TO_BF16`` (ggml-impl.h ``ggml_compute_fp32_to_bf16``): round to nearest even on the
  bit pattern, NaN becomes ``(bits >> 16) | 0x40`` (quietened, payload truncated).

All arithmetic is float32, as C ``float`` arithmetic is on x86-64 (SSE, no contraction into FMA
in the baseline build of ggml-base). Where the C code converts a non-finite or out-of-range float
to an integer (undefined in C; reached only by inf/NaN inputs or by blocks so tiny that ``1/d``
overflows), this module does what gcc and clang emit on x86-64: ``cvttss2si`` yields INT32_MIN,
whose low byte is kept. Dequantization is exact in float32 (``q*d`` needs at most 19 significant
bits), so it agrees with every ggml backend, fused multiply-add or not.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from kvdiag.errors import InputError, UsageError
from kvdiag.kvstream.ggml_types import ggml_type

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]
_Bool = NDArray[np.bool_]

_QK = 32
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_INT32_MIN = np.int32(np.iinfo(np.int32).min)
_TWO_31 = np.float32(2.0**31)


# --- scalar conversions -------------------------------------------------------------------------


def fp32_to_fp16_bits(v: F32) -> NDArray[np.uint16]:
    """``GGML_FP32_TO_FP16`` as raw bits: NumPy's cast is IEEE round-to-nearest-even (as ggml's
    bit-trick conversion is); only NaN differs, which ggml canonicalises to ``sign | 0x7E00``."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = v.astype("<f2").view("<u2")
    nan = np.isnan(v)
    if nan.any():
        sign = (v.view(np.uint32)[nan] >> np.uint32(16)) & np.uint32(0x8000)
        bits[nan] = (sign | np.uint32(0x7E00)).astype(np.uint16)
    return bits


def fp32_to_bf16_bits(v: F32) -> NDArray[np.uint16]:
    """``ggml_compute_fp32_to_bf16``: add ``0x7FFF`` plus the kept LSB, shift; NaN keeps its top
    bits with the quiet bit forced. Subnormals are not flushed (older ggml flushed them)."""
    u = v.view(np.uint32)
    # The largest non-NaN pattern (0xFF800000) plus 0x8000 cannot wrap a uint32.
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded[nan] = (u[nan] >> np.uint32(16)) | np.uint32(64)
    return rounded.astype("<u2")


def _c_float_to_int32(v: F32, suspect: _Bool) -> NDArray[np.int32]:
    """C ``(int)v`` per element of ``v`` ``[nb, 32]``, truncating toward zero. Out-of-range and
    NaN values give INT32_MIN (x86-64 ``cvttss2si``); only rows flagged ``suspect`` can hold
    them, so the fix-up pass runs on those rows alone."""
    with np.errstate(invalid="ignore"):
        out = v.astype(np.int32)
    rows = np.flatnonzero(suspect)
    if rows.size:
        sub = out[rows]
        sub[~(np.abs(v[rows]) < _TWO_31)] = _INT32_MIN
        out[rows] = sub
    return out


def _low_byte_int8(i: NDArray[np.int32]) -> NDArray[np.int8]:
    """C ``(int8_t)`` of an int: modulo 2**8 (implementation-defined in C; gcc/clang wrap)."""
    return i.astype(np.int8)


def _c_recip(d: F32) -> F32:
    """``d ? 1.0f/d : 0.0f`` (NaN is truthy in C; a subnormal ``d`` overflows to inf)."""
    ident = np.zeros_like(d)
    nz = d != 0
    with np.errstate(over="ignore", invalid="ignore"):
        np.divide(np.float32(1.0), d, out=ident, where=nz)
    return ident


# --- per-block statistics with the C loops' NaN and signed-zero behaviour ------------------------


def _signed_absmax(blocks: F32) -> tuple[F32, _Bool]:
    """The q4_0/q5_0 scan ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` from
    ``amax = max = 0``: the first element of largest magnitude, sign kept; NaN never wins; a
    block without a non-zero magnitude keeps ``max = +0.0``. Also returns "block not finite"."""
    nb = blocks.shape[0]
    ax = np.abs(blocks)
    idx = ax.argmax(axis=1)
    rows = np.arange(nb)
    amax = ax[rows, idx]
    nonfinite = ~np.isfinite(amax)
    nan_rows = np.flatnonzero(np.isnan(amax))
    if nan_rows.size:
        sub = ax[nan_rows]
        sub[np.isnan(sub)] = 0
        idx[nan_rows] = sub.argmax(axis=1)
        amax[nan_rows] = sub[np.arange(nan_rows.size), idx[nan_rows]]
    vmax = np.where(amax > 0, blocks[rows, idx], np.float32(0.0))
    return vmax, nonfinite


def _c_max_abs(blocks: F32) -> tuple[F32, _Bool]:
    """The q8_0 scan ``amax = MAX(amax, fabsf(v))`` with ``MAX(a, b) = a > b ? a : b``: a NaN
    resets the running value, so the result is the largest magnitude after the last NaN, or NaN
    when the last element is NaN. Also returns "block not finite"."""
    ax = np.abs(blocks)
    amax = ax.max(axis=1)
    nonfinite = ~np.isfinite(amax)
    nan_rows = np.flatnonzero(np.isnan(amax))
    if nan_rows.size:
        sub = ax[nan_rows]
        isn = np.isnan(sub)
        last = _QK - 1 - isn[:, ::-1].argmax(axis=1)
        after = np.arange(_QK)[None, :] > last[:, None]
        tail = np.where(after, sub, np.float32(0.0)).max(axis=1)
        tail[last == _QK - 1] = np.nan
        amax[nan_rows] = tail
    return amax, nonfinite


def _c_min_max(blocks: F32) -> tuple[F32, F32, _Bool]:
    """The q4_1/q5_1 scan ``if (v < min) min = v; if (v > max) max = v;`` from ``FLT_MAX`` and
    ``-FLT_MAX``: NaN is skipped; among equal values (``-0.0 == +0.0``) the first is kept, and
    ``argmin``/``argmax`` return first occurrences, which gives the same signed zero; ``+inf`` is
    never a minimum (nor ``-inf`` a maximum) since it does not compare below ``FLT_MAX``."""
    nb = blocks.shape[0]
    rows = np.arange(nb)
    vmin = blocks[rows, blocks.argmin(axis=1)]
    vmax = blocks[rows, blocks.argmax(axis=1)]
    nonfinite = ~(np.isfinite(vmin) & np.isfinite(vmax))
    nan_rows = np.flatnonzero(np.isnan(vmin))  # argmin lands on a NaN whenever the block has one
    if nan_rows.size:
        sub = blocks[nan_rows]
        isn = np.isnan(sub)
        r = np.arange(nan_rows.size)
        lo = np.where(isn, _FLT_MAX, sub)
        hi = np.where(isn, -_FLT_MAX, sub)
        vmin[nan_rows] = lo[r, lo.argmin(axis=1)]
        vmax[nan_rows] = hi[r, hi.argmax(axis=1)]
    # The scan starts from FLT_MAX and -FLT_MAX, which an all +inf (all -inf) block never beats.
    np.minimum(vmin, _FLT_MAX, out=vmin)
    np.maximum(vmax, -_FLT_MAX, out=vmax)
    return vmin, vmax, nonfinite


# --- block quantizers: [nb, 32] float32 -> [nb, block_bytes] uint8 -------------------------------


def _suspect(nonfinite: _Bool, d: F32, ident: F32) -> _Bool:
    """Blocks whose scaled values may be non-finite or out of int range (see module docstring)."""
    return nonfinite | ~np.isfinite(d) | ~np.isfinite(ident)


def _put_fp16(out: U8, col: int, v: F32) -> None:
    out[:, col : col + 2] = fp32_to_fp16_bits(v).view(np.uint8).reshape(-1, 2)


def _pack_nibbles(q: U8) -> U8:
    """Byte ``j`` = element ``j`` in the low nibble, element ``j + 16`` in the high nibble."""
    lo, hi = q[:, : _QK // 2], q[:, _QK // 2 :]
    return (lo & np.uint8(0x0F)) | (hi << np.uint8(4))


def _quantize_q8_0(blocks: F32) -> U8:
    amax, nonfinite = _c_max_abs(blocks)
    with np.errstate(all="ignore"):
        d = amax / np.float32(127)
        ident = _c_recip(d)
        v = blocks * ident[:, None]
    suspect = _suspect(nonfinite, d, ident)
    # roundf: half away from zero. The fraction v - trunc(v) is exact in float32.
    i = _c_float_to_int32(v, suspect)
    with np.errstate(invalid="ignore"):
        frac = v - i.astype(np.float32)
    i += (frac >= np.float32(0.5)).astype(np.int32)
    i -= (frac <= np.float32(-0.5)).astype(np.int32)
    rows = np.flatnonzero(suspect)
    if rows.size:
        vs = v[rows]
        with np.errstate(invalid="ignore"):
            t = np.trunc(vs)
            r = np.where(np.abs(vs - t) >= np.float32(0.5), t + np.sign(vs), t)
        i[rows] = _c_float_to_int32(r, np.ones(rows.size, dtype=np.bool_))
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    _put_fp16(out, 0, d)
    out[:, 2:] = _low_byte_int8(i).view(np.uint8)
    return out


def _quantize_q4_0(blocks: F32) -> U8:
    vmax, nonfinite = _signed_absmax(blocks)
    with np.errstate(all="ignore"):
        d = vmax / np.float32(-8)
        ident = _c_recip(d)
        v = blocks * ident[:, None] + np.float32(8.5)
    i = _c_float_to_int32(v, _suspect(nonfinite, d, ident))
    q = np.minimum(_low_byte_int8(i), np.int8(15)).view(np.uint8)
    out = np.empty((blocks.shape[0], 18), dtype=np.uint8)
    _put_fp16(out, 0, d)
    # C stores xi0 whole, then ORs in xi1 << 4: a stray high nibble of xi0 would survive.
    out[:, 2:] = q[:, : _QK // 2] | (q[:, _QK // 2 :] << np.uint8(4))
    return out


def _quantize_q4_1(blocks: F32) -> U8:
    vmin, vmax, nonfinite = _c_min_max(blocks)
    with np.errstate(all="ignore"):
        d = (vmax - vmin) / np.float32(15)
        ident = _c_recip(d)
        v = (blocks - vmin[:, None]) * ident[:, None] + np.float32(0.5)
    i = _c_float_to_int32(v, _suspect(nonfinite, d, ident))
    q = np.minimum(_low_byte_int8(i), np.int8(15)).view(np.uint8)
    out = np.empty((blocks.shape[0], 20), dtype=np.uint8)
    _put_fp16(out, 0, d)
    _put_fp16(out, 2, vmin)
    out[:, 4:] = q[:, : _QK // 2] | (q[:, _QK // 2 :] << np.uint8(4))
    return out


def _put_q5(out: U8, col: int, q: U8) -> None:
    """``qh`` (4 bytes, little-endian uint32, bit e = bit 4 of element e) then 16 nibble bytes."""
    out[:, col : col + 4] = np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")
    out[:, col + 4 :] = _pack_nibbles(q)


def _quantize_q5_0(blocks: F32) -> U8:
    vmax, nonfinite = _signed_absmax(blocks)
    with np.errstate(all="ignore"):
        d = vmax / np.float32(-16)
        ident = _c_recip(d)
        v = blocks * ident[:, None] + np.float32(16.5)
    i = _c_float_to_int32(v, _suspect(nonfinite, d, ident))
    q = np.minimum(_low_byte_int8(i), np.int8(31)).view(np.uint8)
    out = np.empty((blocks.shape[0], 22), dtype=np.uint8)
    _put_fp16(out, 0, d)
    _put_q5(out, 2, q)
    return out


def _quantize_q5_1(blocks: F32) -> U8:
    vmin, vmax, nonfinite = _c_min_max(blocks)
    with np.errstate(all="ignore"):
        d = (vmax - vmin) / np.float32(31)
        ident = _c_recip(d)
        v = (blocks - vmin[:, None]) * ident[:, None] + np.float32(0.5)
    i = _c_float_to_int32(v, _suspect(nonfinite, d, ident))
    # The C code has no MIN(31, .) here: (uint8_t) keeps the low byte, then bits 0-4 are stored.
    q = i.astype(np.uint8)
    out = np.empty((blocks.shape[0], 24), dtype=np.uint8)
    _put_fp16(out, 0, d)
    _put_fp16(out, 2, vmin)
    _put_q5(out, 4, q)
    return out


# --- block dequantizers: [nb, block_bytes] uint8 -> [nb, 32] float32 -----------------------------


def _fp16_at(raw: U8, col: int) -> F32:
    """The fp16 field at byte ``col`` of each block, widened exactly, as a ``[nb, 1]`` column."""
    return np.ascontiguousarray(raw[:, col : col + 2]).view("<f2").astype(np.float32)


def _unpack_nibbles(qs: U8) -> NDArray[np.uint8]:
    out = np.empty((qs.shape[0], _QK), dtype=np.uint8)
    out[:, : _QK // 2] = qs & np.uint8(0x0F)
    out[:, _QK // 2 :] = qs >> np.uint8(4)
    return out


def _unpack_q5(raw: U8, col: int) -> NDArray[np.uint8]:
    high = np.unpackbits(raw[:, col : col + 4], axis=1, bitorder="little")
    q = _unpack_nibbles(raw[:, col + 4 :])
    q |= high << np.uint8(4)
    return q


def _dequantize_q8_0(raw: U8) -> F32:
    return raw[:, 2:].view(np.int8).astype(np.float32) * _fp16_at(raw, 0)


def _dequantize_q4_0(raw: U8) -> F32:
    q = _unpack_nibbles(raw[:, 2:]).astype(np.float32)
    q -= np.float32(8)
    q *= _fp16_at(raw, 0)
    return q


def _dequantize_q4_1(raw: U8) -> F32:
    # x*d + m as two float32 operations; x*d is exact, so an FMA would round identically.
    q = _unpack_nibbles(raw[:, 4:]).astype(np.float32)
    q *= _fp16_at(raw, 0)
    q += _fp16_at(raw, 2)
    return q


def _dequantize_q5_0(raw: U8) -> F32:
    q = _unpack_q5(raw, 2).astype(np.float32)
    q -= np.float32(16)
    q *= _fp16_at(raw, 0)
    return q


def _dequantize_q5_1(raw: U8) -> F32:
    q = _unpack_q5(raw, 4).astype(np.float32)
    q *= _fp16_at(raw, 0)
    q += _fp16_at(raw, 2)
    return q


_BLOCK_QUANTIZERS: dict[str, Callable[[F32], U8]] = {
    "q8_0": _quantize_q8_0,
    "q4_0": _quantize_q4_0,
    "q4_1": _quantize_q4_1,
    "q5_0": _quantize_q5_0,
    "q5_1": _quantize_q5_1,
}

_BLOCK_DEQUANTIZERS: dict[str, Callable[[U8], F32]] = {
    "q8_0": _dequantize_q8_0,
    "q4_0": _dequantize_q4_0,
    "q4_1": _dequantize_q4_1,
    "q5_0": _dequantize_q5_0,
    "q5_1": _dequantize_q5_1,
}

#: Types this module converts (``f32`` is the identity, for Q and for completeness).
SUPPORTED_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", *_BLOCK_QUANTIZERS)


# --- public API ---------------------------------------------------------------------------------


def _checked_type(type_name: str, d: int) -> int:
    """Validate the type and row length; return the bytes per row."""
    name = type_name.lower()
    if name not in SUPPORTED_TYPES:
        raise UsageError(
            f"cannot quantize to {type_name!r} (supported: {', '.join(SUPPORTED_TYPES)})"
        )
    t = ggml_type(name)
    if d <= 0 or d % t.block_elems:
        raise UsageError(
            f"row length {d} is not a positive multiple of the {name} block size {t.block_elems}"
        )
    return t.row_bytes(d)


def quantize_rows(type_name: str, x: NDArray[np.floating]) -> U8:
    """Quantize float rows ``[..., d]`` to ggml's byte layout ``[..., row_bytes(d)]``.

    ``x`` should be float32 (the type ggml quantizes from); other float dtypes are first cast
    to float32 with NumPy's round-to-nearest. ``d`` must be a multiple of the block size.
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating) or arr.ndim < 1:
        raise UsageError(f"quantize_rows needs a float array [..., d], got {arr.dtype} {arr.shape}")
    d = int(arr.shape[-1])
    row_bytes = _checked_type(type_name, d)
    name = type_name.lower()
    lead = arr.shape[:-1]
    src = np.ascontiguousarray(arr, dtype=np.float32)
    if name == "f32":
        raw = src.astype("<f4").view(np.uint8)
    elif name == "f16":
        raw = fp32_to_fp16_bits(src).view(np.uint8)
    elif name == "bf16":
        raw = fp32_to_bf16_bits(src).view(np.uint8)
    else:
        raw = _BLOCK_QUANTIZERS[name](src.reshape(-1, _QK))
    return raw.reshape(*lead, row_bytes)


def dequantize_rows(type_name: str, raw: NDArray[np.uint8], d: int) -> F32:
    """Dequantize ggml rows ``[..., row_bytes(d)]`` (uint8) to float32 ``[..., d]``."""
    row_bytes = _checked_type(type_name, d)
    arr = np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim < 1 or arr.shape[-1] != row_bytes:
        raise InputError(
            f"{type_name} rows of {d} elements are uint8 [..., {row_bytes}], "
            f"got {arr.dtype} {arr.shape}"
        )
    name = type_name.lower()
    lead = arr.shape[:-1]
    src = np.ascontiguousarray(arr)
    out: F32
    if name == "f32":
        out = src.view("<f4").astype(np.float32)
    elif name == "f16":
        out = src.view("<f2").astype(np.float32)
    elif name == "bf16":
        out = (src.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        t = ggml_type(name)
        # An inf or NaN fp16 scale yields inf/NaN values (0 * inf = NaN), as in C: no warning.
        with np.errstate(invalid="ignore", over="ignore"):
            out = _BLOCK_DEQUANTIZERS[name](src.reshape(-1, t.block_bytes))
    return out.reshape(*lead, d)
