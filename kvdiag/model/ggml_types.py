"""ggml type geometry and the kv-stream type capabilities.

Block sizes are those of ggml-common.h (``block_q8_0`` = fp16 scale + 32 int8, ...).
Capability flags are those of ``ggml_backend_cuda_kv_stream_type_capabilities`` (ggml-cuda.h
in the adaptive-kv-streaming forks); only the types kvdiag can store are listed in full.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class GgmlType:
    name: str
    block_elems: int
    block_bytes: int
    direct_attention: bool
    storage: bool = True
    online_write: bool = True
    decode_f16: bool = True

    def row_bytes(self, n: int) -> int:
        """``ggml_row_size(type, n)``: bytes of ``n`` consecutive elements (n % block == 0)."""
        if n % self.block_elems:
            raise ValueError(f"{n} elements is not a multiple of the {self.name} block size")
        return n // self.block_elems * self.block_bytes


TYPES: dict[str, GgmlType] = {
    t.name: t
    for t in (
        GgmlType("f32", 1, 4, direct_attention=False),
        GgmlType("f16", 1, 2, direct_attention=True),
        GgmlType("bf16", 1, 2, direct_attention=True),
        GgmlType("q8_0", 32, 34, direct_attention=True),
        GgmlType("q4_0", 32, 18, direct_attention=True),
        GgmlType("q4_1", 32, 20, direct_attention=True),
        GgmlType("q5_0", 32, 22, direct_attention=True),
        GgmlType("q5_1", 32, 24, direct_attention=True),
        GgmlType("iq4_nl", 32, 18, direct_attention=False),
    )
}

#: Types kvdiag can quantize, store and attend over (the issue's list; f32 only for Q).
KV_TYPES: tuple[str, ...] = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def ggml_type(name: str) -> GgmlType:
    try:
        return TYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown ggml type {name!r} (known: {', '.join(TYPES)})") from None


class AttentionMode(enum.IntEnum):
    """``ggml_cuda_kv_stream_attention_mode``: UNSUPPORTED = 0, DIRECT = 1, F16 = 2."""

    UNSUPPORTED = 0
    DIRECT = 1
    F16 = 2


def attention_mode(type_k: str, type_v: str, native_quants: bool = True) -> AttentionMode:
    """DIRECT when both types are direct_attention and a native kernel exists for the pair
    (``GGML_CUDA_FA_ALL_QUANTS``: ``native_quants``); F16 when both are storage, online_write
    and decode_f16; otherwise UNSUPPORTED.
    """
    k, v = TYPES.get(type_k), TYPES.get(type_v)
    if k is None or v is None:
        return AttentionMode.UNSUPPORTED
    if k.direct_attention and v.direct_attention and native_quants:
        return AttentionMode.DIRECT
    if all(t.storage and t.online_write and t.decode_f16 for t in (k, v)):
        return AttentionMode.F16
    return AttentionMode.UNSUPPORTED
