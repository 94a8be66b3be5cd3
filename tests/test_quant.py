"""kvdiag.executors.quant: bit-exact ggml row quantization.

Three independent witnesses:
* the ``gguf`` package's NumPy quantizers (bytes compared) on finite inputs where gguf follows
  ggml's reference C code;
* a literal, element-by-element transcription of ggml-quants.c ``quantize_row_*_ref`` /
  ``dequantize_row_*`` (below, ``_ref_*``), using float32 scalars and an integer-only fp16/bf16
  rounding, which also covers NaN, inf, signed zeros and tiny blocks where gguf diverges;
* blocks encoded by hand from the spec.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvdiag.errors import InputError, UsageError
from kvdiag.executors.quant import (
    SUPPORTED_TYPES,
    dequantize_rows,
    fp32_to_bf16_bits,
    fp32_to_fp16_bits,
    quantize_rows,
)
from kvdiag.kvstream.ggml_types import ggml_type

F = np.float32
QUANTS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
GGUF_TYPES = ("f32", "f16", "bf16", *QUANTS)


# --- the literal reference ----------------------------------------------------------------------


def _f16_bits(v: float) -> int:
    """fp32 -> fp16 by integer rounding (half to even), NaN -> sign | 0x7E00 as ggml does."""
    sign = 0x8000 if math.copysign(1.0, v) < 0 else 0
    if math.isnan(v):
        return sign | 0x7E00
    a = abs(v)
    if a == 0 or math.isinf(a):
        return sign | (0x7C00 if a else 0)
    quantum = max(math.frexp(a)[1] - 1, -14) - 10
    r = round(a / 2.0**quantum)  # exact quotient; round() is half-to-even
    return sign | min(((quantum + 24) << 10) + r, 0x7C00)


def _f16_value(bits: int) -> float:
    sign = -1.0 if bits & 0x8000 else 1.0
    exp, man = (bits >> 10) & 0x1F, bits & 0x3FF
    if exp == 0x1F:
        return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * man * 2.0**-24
    return sign * (1024 + man) * 2.0 ** (exp - 25)


def _bf16_bits(v: float) -> int:
    u = int(np.array(v, dtype=F).view(np.uint32))
    if math.isnan(v):
        return (u >> 16) | 0x40
    sign = 0x8000 if u >> 31 else 0
    a = abs(v)
    if a == 0 or math.isinf(a):
        return sign | (0x7F80 if a else 0)
    quantum = max(math.frexp(a)[1] - 1, -126) - 7
    r = round(a / 2.0**quantum)
    return sign | min(((quantum + 133) << 7) + r, 0x7F80)


def _c_int(v: float) -> int:
    """C (int) of a float as x86-64 does it: truncate; NaN or out of range -> INT32_MIN."""
    return int(v) if abs(v) < 2.0**31 else -(2**31)


def _int8(i: int) -> int:
    return ((i & 0xFF) ^ 0x80) - 0x80


def _roundf(v: float) -> float:
    return math.copysign(math.floor(abs(v) + 0.5), v) if math.isfinite(v) else v


def _ref_quantize_block(name: str, x: list[np.float32]) -> bytes:
    """One block, statement by statement as in ggml-quants.c."""
    with np.errstate(all="ignore"):
        if name == "q8_0":
            amax = F(0)
            for v in x:
                amax = amax if amax > abs(v) else abs(v)  # MAX(amax, fabsf(v))
            d = amax / F(127)
            ident = F(1) / d if d != 0 else F(0)
            qs = [_c_int(_roundf(float(v * ident))) & 0xFF for v in x]
            return struct.pack("<H", _f16_bits(float(d))) + bytes(qs)
        if name in ("q4_0", "q5_0"):
            amax, vmax = F(0), F(0)
            for v in x:
                if amax < abs(v):
                    amax, vmax = abs(v), v
            levels = 16 if name == "q4_0" else 32
            d = vmax / F(-(levels // 2))
            ident = F(1) / d if d != 0 else F(0)
            bias = F(levels // 2 + 0.5)
            xi = [min(levels - 1, _int8(_c_int(float(v * ident + bias)))) & 0xFF for v in x]
        else:
            vmin, vmax = F(np.finfo(F).max), F(-np.finfo(F).max)
            for v in x:
                if v < vmin:
                    vmin = v
                if v > vmax:
                    vmax = v
            levels = 16 if name == "q4_1" else 32
            d = (vmax - vmin) / F(levels - 1)
            ident = F(1) / d if d != 0 else F(0)
            conv = [_c_int(float((v - vmin) * ident + F(0.5))) for v in x]
            xi = (
                [min(15, _int8(c)) & 0xFF for c in conv]
                if name == "q4_1"
                else [c & 0xFF for c in conv]
            )
        head = struct.pack("<H", _f16_bits(float(d)))
        if name in ("q4_1", "q5_1"):
            head += struct.pack("<H", _f16_bits(float(vmin)))
        if name in ("q4_0", "q4_1"):
            return head + bytes((xi[j] | (xi[j + 16] << 4)) & 0xFF for j in range(16))
        qh = 0
        for j in range(16):
            qh |= ((xi[j] & 0x10) >> 4) << j
            qh |= ((xi[j + 16] & 0x10) >> 4) << (j + 16)
        qs = bytes((xi[j] & 0x0F) | ((xi[j + 16] & 0x0F) << 4) for j in range(16))
        return head + struct.pack("<I", qh) + qs


def _ref_dequantize_block(name: str, raw: bytes) -> list[np.float32]:
    d = F(_f16_value(struct.unpack_from("<H", raw, 0)[0]))
    with np.errstate(all="ignore"):
        if name == "q8_0":
            return [F(q) * d for q in struct.unpack_from("<32b", raw, 2)]
        m = F(_f16_value(struct.unpack_from("<H", raw, 2)[0])) if name in ("q4_1", "q5_1") else F(0)
        start = {"q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[name]
        qs = raw[start : start + 16]
        q = [b & 0x0F for b in qs] + [b >> 4 for b in qs]
        if name in ("q5_0", "q5_1"):
            (qh,) = struct.unpack_from("<I", raw, start - 4)
            q = [q[e] | (((qh >> e) & 1) << 4) for e in range(32)]
        if name == "q4_0":
            return [F(v - 8) * d for v in q]
        if name == "q5_0":
            return [F(v - 16) * d for v in q]
        return [F(v) * d + m for v in q]


def _ref_quantize(name: str, x: np.ndarray) -> np.ndarray:
    rows = []
    for row in x:
        if name == "f16":
            rows.append(b"".join(struct.pack("<H", _f16_bits(float(v))) for v in row))
        elif name == "bf16":
            rows.append(b"".join(struct.pack("<H", _bf16_bits(float(v))) for v in row))
        else:
            blocks = [list(row[i : i + 32]) for i in range(0, row.size, 32)]
            rows.append(b"".join(_ref_quantize_block(name, b) for b in blocks))
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(x.shape[0], -1)


# --- inputs -------------------------------------------------------------------------------------


def _block(*values: float, fill: float = 0.0) -> np.ndarray:
    x = np.full(32, fill, dtype=F)
    x[: len(values)] = values
    return x


def _finite_cases() -> dict[str, np.ndarray]:
    """[rows, 256] float32 inputs on which gguf follows ggml's reference exactly."""
    rng = np.random.default_rng(20240607)
    n = (4, 256)
    cases = {
        "normal": rng.standard_normal(n),
        "cauchy": rng.standard_cauchy(n),
        "small": rng.standard_normal(n) * 1e-4,  # fp16 scales are subnormal
        "tiny": rng.standard_normal(n) * 1e-30,  # fp16 scales flush to zero
        "huge": rng.standard_normal(n) * 1e30,  # fp16 scales overflow to inf
        "fp16_edge": rng.choice([65504.0, 65519.0, 65520.0, -65504.0, 6.1e-5, 5.96e-8], n),
        "zeros": np.zeros(n),
        "all_equal_pos": np.full(n, 3.25),
        "all_equal_neg": np.full(n, -3.25),
        "integers": rng.integers(-8, 8, n),
        "halves": rng.integers(-16, 16, n) + 0.5,
        "quarters": rng.integers(-64, 64, n) / 4,
        "ramp": np.tile(np.arange(-128, 128), (4, 1)),
        "mixed_magnitudes": rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n),
    }
    neg = rng.standard_normal(n)
    neg.reshape(-1, 32)[:, 7] = -10.0  # the largest magnitude is negative in every block
    cases["negative_max"] = neg
    tie = rng.uniform(-1, 1, n)
    tie.reshape(-1, 32)[:, 3], tie.reshape(-1, 32)[:, 20] = 2.0, -2.0  # |max| tie: first wins
    cases["abs_tie"] = tie
    # q8_0 with amax = 127 has d = 1 and id = 1, so x*id lands exactly on .5 points.
    q8 = np.tile(np.concatenate([[127.0], np.arange(-15, 16) + 0.5]), (4, 8))
    cases["q8_half_points"] = q8
    # q4_0 with max = -8 has d = 1 and id = 1: x + 8.5 is exact.
    q4 = np.tile(np.concatenate([[-8.0], np.arange(-15, 16) / 2]), (4, 8))
    cases["q4_half_points"] = q4
    return {k: np.asarray(v, dtype=F) for k, v in cases.items()}


def _special_cases() -> dict[str, np.ndarray]:
    """Inputs where the C reference's NaN, signed-zero and overflow rules decide the bytes."""
    nan, inf = float("nan"), float("inf")
    blocks = {
        "nan_mid": _block(1, 2, -3, nan, 0.5, fill=0.25),
        "nan_last": np.concatenate([np.full(31, 0.5, F), [nan]]).astype(F),
        "nan_first": _block(nan, 2, -3, fill=0.25),
        "all_nan": np.full(32, nan, F),
        "inf": _block(1, inf, -2, fill=0.5),
        "neg_inf": _block(1, -inf, -2, fill=0.5),
        "inf_and_nan": _block(nan, -inf, inf, fill=1),
        "all_inf": np.full(32, inf, F),
        "all_neg_inf": np.full(32, -inf, F),
        "neg_zeros": np.full(32, -0.0, F),
        "neg_zero_first": _block(-0.0, fill=0.0),
        "neg_zero_later": _block(0.0, 0.0, -0.0, fill=0.0),
        "tiny_recip_overflow": np.full(32, 1e-38, F),
        "subnormal": _block(1e-45, -3e-45, 7e-44, fill=0),
        "flt_max": _block(3.4e38, -3.4e38, 1, fill=0),
        "range_overflow": _block(3e38, -3e38, fill=1e38),
    }
    return {k: np.tile(v, 2).reshape(1, 64) for k, v in blocks.items()}


# --- gguf agreement -----------------------------------------------------------------------------


def _gguf_bytes(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # gguf's own casts warn on fp16 overflow
        out = gguf_quantize(x, GGMLQuantizationType[name.upper()])
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


@pytest.mark.parametrize("case", sorted(_finite_cases()))
@pytest.mark.parametrize("name", GGUF_TYPES)
def test_quantize_bytes_equal_gguf(name: str, case: str) -> None:
    x = _finite_cases()[case]
    ours = quantize_rows(name, x)
    assert ours.shape == (4, ggml_type(name).row_bytes(256))
    np.testing.assert_array_equal(ours, _gguf_bytes(name, x))


@pytest.mark.parametrize("case", sorted(_finite_cases()))
@pytest.mark.parametrize("name", GGUF_TYPES)
def test_dequantize_equals_gguf(name: str, case: str) -> None:
    raw = quantize_rows(name, _finite_cases()[case])
    gtype = GGMLQuantizationType[name.upper()]
    theirs_in = (
        raw.view(np.float16) if name == "f16" else raw.view(np.float32) if name == "f32" else raw
    )
    with np.errstate(all="ignore"):
        theirs = gguf_dequantize(theirs_in, gtype).reshape(4, 256)
    np.testing.assert_array_equal(dequantize_rows(name, raw, 256), theirs)


@pytest.mark.parametrize("name", QUANTS)
def test_random_bytes_dequantize_like_gguf(name: str) -> None:
    """Any byte pattern (NaN/inf scales included) dequantizes as gguf's NumPy code does."""
    raw = np.random.default_rng(7).integers(0, 256, (16, ggml_type(name).row_bytes(128)), np.uint8)
    with np.errstate(all="ignore"):
        theirs = gguf_dequantize(raw, GGMLQuantizationType[name.upper()])
    np.testing.assert_array_equal(dequantize_rows(name, raw, 128), theirs)


# --- the literal reference, including what gguf gets wrong --------------------------------------


@pytest.mark.parametrize("case", sorted(_finite_cases()))
@pytest.mark.parametrize("name", ("f16", "bf16", *QUANTS))
def test_quantize_equals_literal_reference_finite(name: str, case: str) -> None:
    x = _finite_cases()[case][:1]
    np.testing.assert_array_equal(quantize_rows(name, x), _ref_quantize(name, x))


@pytest.mark.parametrize("case", sorted(_special_cases()))
@pytest.mark.parametrize("name", ("f16", "bf16", *QUANTS))
def test_quantize_equals_literal_reference_special(name: str, case: str) -> None:
    x = _special_cases()[case]
    np.testing.assert_array_equal(quantize_rows(name, x), _ref_quantize(name, x))


@pytest.mark.parametrize("name", QUANTS)
def test_dequantize_equals_literal_reference(name: str) -> None:
    raw = np.random.default_rng(11).integers(0, 256, (3, ggml_type(name).row_bytes(64)), np.uint8)
    bb = ggml_type(name).block_bytes
    expected = np.array(
        [
            [
                v
                for k in range(0, raw.shape[1], bb)
                for v in _ref_dequantize_block(name, bytes(r[k : k + bb]))
            ]
            for r in raw
        ],
        dtype=F,
    )
    np.testing.assert_array_equal(dequantize_rows(name, raw, 64), expected)


def test_gguf_divergences_follow_c() -> None:
    """Where gguf's NumPy code and ggml's C disagree, the C semantics win."""
    # q4_0 of an all-zero block: C keeps max = +0.0, so d = +0.0/-8 = -0.0 (bytes 00 80) even
    # when the first element is -0.0; gguf takes the first element and stores +0.0.
    negz = np.full((1, 32), -0.0, F)
    assert quantize_rows("q4_0", negz)[0, :2].tobytes() == b"\x00\x80"
    assert _gguf_bytes("q4_0", negz)[0, :2].tobytes() == b"\x00\x00"
    # q4_1 keeps the first of equal minima: -0.0 first gives m = -0.0 (bytes 00 80).
    first_neg = _block(-0.0, fill=0.0).reshape(1, 32)
    assert quantize_rows("q4_1", first_neg)[0, 2:4].tobytes() == b"\x00\x80"
    assert quantize_rows("q4_1", _block(0.0, -0.0).reshape(1, 32))[0, 2:4].tobytes() == b"\x00\x00"
    # q8_0's MAX macro lets a NaN reset the running maximum: the scale comes from the elements
    # after the last NaN (here 0.5 -> d = 0.5/127), and the NaN element itself stores 0.
    x = _block(4.0, float("nan"), fill=0.5).reshape(1, 32)
    raw = quantize_rows("q8_0", x)
    assert raw[0, :2].tobytes() == struct.pack("<H", _f16_bits(float(F(0.5) / F(127))))
    # 4.0*id = 1016 does not fit int8_t (undefined in C); x86-64 keeps the low byte, 0xF8.
    assert raw[0, 2:5].tolist() == [0xF8, 0, 127]


# --- blocks encoded by hand ---------------------------------------------------------------------


def _one_block(name: str, x: np.ndarray) -> bytes:
    return quantize_rows(name, x.reshape(1, 32)).tobytes()


def test_q8_0_by_hand_unit_scale() -> None:
    # amax = 127 -> d = 1.0 (fp16 0x3C00), id = 1; roundf rounds halves away from zero.
    x = _block(127, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 4.5, -126.5, 0.49999997)
    expected = bytes([0x00, 0x3C, 0x7F, 3, 0xFD, 1, 0xFF, 2, 0xFE, 5, 0x81, 0]) + bytes(22)
    assert _one_block("q8_0", x) == expected
    assert dequantize_rows("q8_0", np.frombuffer(expected, np.uint8).reshape(1, 34), 32)[
        0, :9
    ].tolist() == [127, 3, -3, 1, -1, 2, -2, 5, -127]


def test_q8_0_by_hand_half_scale() -> None:
    # amax = 63.5 -> d = 0.5 (fp16 0x3800), id = 2.
    x = _block(-63.5, -1.25, 0.75, 0.25, -0.25, 1.75, 0.2)
    expected = bytes([0x00, 0x38, 0x81, 0xFD, 2, 1, 0xFF, 4, 0]) + bytes(25)
    assert _one_block("q8_0", x) == expected


def test_q4_0_by_hand_negative_max() -> None:
    # max by magnitude is -8 -> d = -8/-8 = 1.0, id = 1; q = MIN(15, (int8_t)(x + 8.5)).
    x = _block(-8, 7, 7.4, -0.5, 0.5, 0, -7.9, -7.5, 3.2)
    x[16], x[17] = 6.6, -3.0
    qs = [0xF0, 0x5F, 0x8F, 0x88, 0x89, 0x88, 0x80, 0x81, 0x8B] + [0x88] * 7
    assert _one_block("q4_0", x) == bytes([0x00, 0x3C, *qs])
    back = dequantize_rows("q4_0", quantize_rows("q4_0", x.reshape(1, 32)), 32)[0]
    # Halves round up (toward +inf): -0.5 -> 0 and 0.5 -> 1.
    assert back[:9].tolist() == [-8, 7, 7, 0, 1, 0, -8, -7, 3]
    assert back[16:18].tolist() == [7, -3]


def test_q4_0_by_hand_positive_max_clips_the_far_end() -> None:
    # max = +8 -> d = -1.0 (0xBC00), id = -1: -8 maps to 16.5 -> 16 -> clipped to 15 -> -7.
    x = _block(8, -8, 1)
    assert _one_block("q4_0", x) == bytes([0x00, 0xBC, 0x80, 0x8F, 0x87] + [0x88] * 13)
    back = dequantize_rows("q4_0", quantize_rows("q4_0", x.reshape(1, 32)), 32)[0]
    assert back[:3].tolist() == [8, -7, 1]


def test_q4_0_zero_block_has_negative_zero_scale() -> None:
    raw = quantize_rows("q4_0", np.zeros((1, 32), F))
    assert raw.tobytes() == bytes([0x00, 0x80] + [0x88] * 16)
    back = dequantize_rows("q4_0", raw, 32)
    assert np.all(back == 0) and np.all(np.signbit(back))  # (8 - 8) * -0.0


def test_q4_1_by_hand() -> None:
    # min -1, max 14 -> d = 1.0, m = -1.0 (0xBC00); q = MIN(15, (int8_t)(x - min + 0.5)).
    x = _block(-1, 14, 2.5, 2.49)
    assert _one_block("q4_1", x) == bytes(
        [0x00, 0x3C, 0x00, 0xBC, 0x10, 0x1F, 0x14, 0x13] + [0x11] * 12
    )


def test_q5_0_by_hand() -> None:
    # max by magnitude -16 -> d = 1.0; q = MIN(31, (int8_t)(x + 16.5)); bit 4 of element e in qh.
    x = _block(-16, 15)
    x[16], x[17] = -1, 3
    expected = bytes([0x00, 0x3C, 0xFE, 0xFF, 0xFE, 0xFF, 0xF0, 0x3F] + [0x00] * 14)
    assert _one_block("q5_0", x) == expected
    back = dequantize_rows("q5_0", np.frombuffer(expected, np.uint8).reshape(1, 22), 32)[0]
    assert back[[0, 1, 2, 16, 17]].tolist() == [-16, 15, 0, -1, 3]


def test_q5_1_by_hand() -> None:
    # min 0, max 31 -> d = 1.0, m = 0; q = (uint8_t)(x - min + 0.5).
    x = _block(0, 31, 17.5)
    x[16] = 16.49
    expected = bytes(
        [0x00, 0x3C, 0x00, 0x00, 0x06, 0x00, 0x01, 0x00, 0x00, 0x0F, 0x02] + [0x00] * 13
    )
    assert _one_block("q5_1", x) == expected


@pytest.mark.parametrize(
    ("bits_in", "bf16"),
    [
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F808000, 0x3F80),  # 1 + 2^-8: tie, even mantissa stays
        (0x3F818000, 0x3F82),  # 1 + 3*2^-8: tie, rounds up to even
        (0x3F808001, 0x3F81),  # just above the tie
        (0x7F7FFFFF, 0x7F80),  # FLT_MAX rounds to inf
        (0x00000001, 0x0000),  # smallest subnormal rounds to zero
        (0x00018000, 0x0002),  # subnormals are kept, not flushed
        (0x7FC00000, 0x7FC0),  # quiet NaN
        (0x7F800001, 0x7FC0),  # signalling NaN: top bits kept, quiet bit forced
        (0xFFA12345, 0xFFE1),  # negative NaN with payload
    ],
)
def test_bf16_bits_by_hand(bits_in: int, bf16: int) -> None:
    v = np.array([bits_in], np.uint32).view(F)
    assert int(fp32_to_bf16_bits(v)[0]) == bf16


@pytest.mark.parametrize(
    ("bits_in", "f16"),
    [
        (0x477FE000, 0x7BFF),  # 65504, the largest half
        (0x477FEFFF, 0x7BFF),  # 65519.996: below the rounding boundary
        (0x477FF000, 0x7C00),  # 65520: rounds to inf
        (0x33800000, 0x0001),  # 2^-24, the smallest subnormal half
        (0x33000000, 0x0000),  # 2^-25: tie between 0 and 2^-24, even is 0
        (0x33400000, 0x0001),  # 1.5 * 2^-25
        (0xFFC00000, 0xFE00),  # negative quiet NaN
        (0x7F800001, 0x7E00),  # signalling NaN: ggml returns the canonical quiet NaN
        (0x7FFFFFFF, 0x7E00),
    ],
)
def test_fp16_bits_by_hand(bits_in: int, f16: int) -> None:
    v = np.array([bits_in], np.uint32).view(F)
    assert int(fp32_to_fp16_bits(v)[0]) == f16
    assert _f16_bits(float(v[0])) == f16


def test_fp16_matches_integer_rounding_on_random_patterns() -> None:
    bits = np.random.default_rng(3).integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(F)
    expected = [_f16_bits(float(f)) for f in v]
    assert fp32_to_fp16_bits(v).tolist() == expected


def test_bf16_matches_integer_rounding_on_random_patterns() -> None:
    bits = np.random.default_rng(4).integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(F)
    assert fp32_to_bf16_bits(v).tolist() == [_bf16_bits(float(f)) for f in v]


# --- round-trip error bounds --------------------------------------------------------------------


def _scales(raw: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Stored fp16 d and m per block (m = 0 for the symmetric types)."""
    blocks = raw.reshape(-1, ggml_type(name).block_bytes)
    d16 = blocks[:, :2].copy().view("<f2").astype(np.float64)[:, 0]
    m16 = (
        blocks[:, 2:4].copy().view("<f2").astype(np.float64)[:, 0]
        if name in ("q4_1", "q5_1")
        else 0 * d16
    )
    return d16, m16


@pytest.mark.parametrize("name", QUANTS)
def test_round_trip_error_is_half_a_step(name: str) -> None:
    x = np.random.default_rng(5).standard_normal((64, 512)).astype(F)
    raw = quantize_rows(name, x)
    err = np.abs(dequantize_rows(name, raw, 512).astype(np.float64) - x).reshape(-1, 32)
    xb = x.reshape(-1, 32).astype(np.float64)
    d16, m16 = _scales(raw, name)
    slack = 1 + 1e-5
    if name in ("q4_1", "q5_1"):
        levels = 15 if name == "q4_1" else 31
        lo, hi = xb.min(axis=1), xb.max(axis=1)
        d = (hi - lo) / levels
        bound = 0.5 * d + levels * np.abs(d - d16) + np.abs(lo - m16)
        assert np.all(err <= bound[:, None] * slack)
    else:
        half = {"q8_0": 127, "q4_0": 8, "q5_0": 16}[name]
        vmax = xb[np.arange(xb.shape[0]), np.abs(xb).argmax(axis=1)]
        d = np.abs(vmax) / half
        fp16_part = half * np.abs(d - np.abs(d16))
        within = err <= (0.5 * d + fp16_part)[:, None] * slack
        if name == "q8_0":
            assert within.all()
        else:
            # Only values beyond (half - 0.5) steps on the side opposite to vmax may be clipped,
            # and then by less than one step.
            clipped = ~within
            opposite = np.sign(xb) == -np.sign(vmax)[:, None]
            far = np.abs(xb) > ((half - 0.5) * d)[:, None] * (1 - 1e-6)
            assert np.all(~clipped | (opposite & far))
            assert np.all(err <= (d + fp16_part)[:, None] * slack)
    # The bound is tight: some element is off by more than 40% of its block's step.
    assert (err / d[:, None]).max() > 0.4


@pytest.mark.parametrize(("name", "rel"), [("f16", 2.0**-11), ("bf16", 2.0**-8), ("f32", 0.0)])
def test_float_types_round_trip(name: str, rel: float) -> None:
    x = (np.random.default_rng(6).standard_normal((8, 64)) * 100).astype(F)
    back = dequantize_rows(name, quantize_rows(name, x), 64)
    assert np.all(np.abs(back.astype(np.float64) - x) <= rel * np.abs(x.astype(np.float64)))
    if name == "f32":
        assert back.tobytes() == x.tobytes()


# --- properties ---------------------------------------------------------------------------------


def _float_rows(max_abs: float | None) -> st.SearchStrategy[np.ndarray]:
    bounded = max_abs is not None
    elements = st.floats(-max_abs, max_abs, width=32) if bounded else st.floats(width=32)
    shapes = st.tuples(st.integers(1, 3), st.integers(1, 3).map(lambda b: 32 * b))
    return shapes.flatmap(lambda s: hnp.arrays(F, s, elements=elements))


@pytest.mark.parametrize("name", SUPPORTED_TYPES)
@settings(max_examples=60, deadline=None)
@given(x=_float_rows(1e4))
def test_round_trip_of_finite_rows_is_finite_and_deterministic(name: str, x: np.ndarray) -> None:
    raw = quantize_rows(name, x)
    assert raw.dtype == np.uint8 and raw.shape == (
        x.shape[0],
        ggml_type(name).row_bytes(x.shape[1]),
    )
    assert np.array_equal(raw, quantize_rows(name, x.copy()))
    # Batching must not matter: each row quantized alone gives the same bytes.
    assert np.array_equal(raw, np.concatenate([quantize_rows(name, r[None]) for r in x]))
    back = dequantize_rows(name, raw, x.shape[1])
    assert back.dtype == np.float32 and back.shape == x.shape
    assert np.all(np.isfinite(back))


@pytest.mark.parametrize("name", ("f16", "bf16", *QUANTS))
@settings(max_examples=60, deadline=None)
@given(x=_float_rows(None))
def test_any_float32_matches_literal_reference(name: str, x: np.ndarray) -> None:
    np.testing.assert_array_equal(quantize_rows(name, x), _ref_quantize(name, x))


# --- API ----------------------------------------------------------------------------------------


def test_leading_dimensions_and_layout() -> None:
    x = np.random.default_rng(8).standard_normal((2, 3, 128)).astype(F)
    raw = quantize_rows("Q5_1", x)
    assert raw.shape == (2, 3, 96)
    assert np.array_equal(raw.reshape(6, 96), quantize_rows("q5_1", x.reshape(6, 128)))
    assert dequantize_rows("q5_1", raw, 128).shape == (2, 3, 128)
    strided = np.random.default_rng(9).standard_normal((4, 256)).astype(F)[:, :64]
    assert np.array_equal(quantize_rows("q8_0", strided), quantize_rows("q8_0", strided.copy()))
    assert np.array_equal(
        quantize_rows("q8_0", strided.astype(np.float64)), quantize_rows("q8_0", strided)
    )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: quantize_rows("q4_0", np.zeros((2, 48), F)), UsageError, "block size 32"),
        (lambda: quantize_rows("q7_0", np.zeros((2, 32), F)), UsageError, "q7_0"),
        (lambda: quantize_rows("iq4_nl", np.zeros((2, 32), F)), UsageError, "supported"),
        (lambda: quantize_rows("q8_0", np.zeros((2, 32), np.int32)), UsageError, "float"),
        (lambda: dequantize_rows("q8_0", np.zeros((2, 33), np.uint8), 32), InputError, "[..., 34]"),
        (lambda: dequantize_rows("q8_0", np.zeros((2, 34), np.int8), 32), InputError, "int8"),
        (
            lambda: dequantize_rows("f16", np.zeros((2, 64), np.uint8), 0),
            UsageError,
            "row length 0",
        ),
    ],
)
def test_bad_arguments_are_reported(
    call: Callable[[], object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
