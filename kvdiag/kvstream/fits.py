"""``ggml_cuda_kv_stream_fattn_fits(dst)`` and ``..._streamed_supported(dst, stage_bytes)``
(brief §2.1–§2.2, G1 form).

The runtime returns a bare bool; kvdiag evaluates every condition and names each one that
fails, in the order the runtime tests them (runtime identity first, then geometry).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.kvstream.ggml_types import AttentionMode, attention_mode, ggml_type
from kvdiag.kvstream.pages import round_up
from kvdiag.kvstream.views import AttentionNode
from kvdiag.model.geometry import Tensor
from kvdiag.model.pages import PAGE_TOKENS

KV_STREAM_HEAD_DIM = 256
FATTN_KQ_STRIDE = 256
V_ALIGN = 128



@dataclass(frozen=True)
class FitsResult:
    ok: bool
    failed: tuple[str, ...]
    membership: bool
    """runtime_from_tensor(K) or runtime_from_tensor(V) is non-null: what the upstream
    dispatcher routes on."""


def block_tokens(k: Tensor, v: Tensor, stage_bytes: int) -> int:
    """``kv_stream_block_tokens``: the largest multiple of 256 ≤ n_kv whose K bytes (all KV
    heads, padded to 128) plus V bytes fit in ``stage_bytes``; 0 if none."""
    row_k = ggml_type(k.type).row_bytes(k.ne[0]) * k.ne[2]
    row_v = ggml_type(v.type).row_bytes(v.ne[0]) * v.ne[2]
    tokens = k.ne[1] // PAGE_TOKENS * PAGE_TOKENS
    while tokens > 0:
        if round_up(row_k * tokens, V_ALIGN) + row_v * tokens <= stage_bytes:
            return tokens
        tokens -= PAGE_TOKENS
    return 0


def _layout_conditions(name: str, t: Tensor) -> list[tuple[str, bool]]:
    gt = ggml_type(t.type)
    row = gt.row_bytes(t.ne[0]) if t.ne[0] % gt.block_elems == 0 else -1
    return [
        (f"{name}.nb[0]==type_size", t.nb[0] == gt.block_bytes),
        (f"{name}.nb[1]>=row_size", t.nb[1] >= row),
        (f"{name}.nb[1]==row_size*{name}.ne[2]", t.nb[1] == row * t.ne[2]),
        (f"{name}.nb[2]==row_size", t.nb[2] == row),
    ]


def fits(
    node: AttentionNode, stage_bytes: int, native_quants: bool = True, sinks: bool = False
) -> FitsResult:
    return fits_tensors(node.q, node.k, node.v, node.mask, stage_bytes, native_quants, sinks)


def fits_tensors(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, stage_bytes: int,
    native_quants: bool = True, sinks: bool = False,
) -> FitsResult:
    """The predicate over the operands as a trace logs them (a ``fits`` event's q, k, v, mask
    and stage_bytes): what ``kvdiag check`` evaluates when the writer recorded only the bool
    (``evaluated: false``). A null mask passes ("mask absent, or f16 and contiguous",
    kv-stream-domain.md §2.2)."""
    checks: list[tuple[str, bool]] = [
        ("K.runtime!=NULL", k.runtime is not None),
        ("V.runtime!=NULL", v.runtime is not None),
    ]
    if k.runtime is not None and v.runtime is not None:
        checks.append(("K.runtime==V.runtime", k.runtime == v.runtime))
    checks += [
        ("Q.type==f32", q.type == "f32"),
        ("mode(K,V)!=UNSUPPORTED",
         attention_mode(k.type, v.type, native_quants) != AttentionMode.UNSUPPORTED),
        ("Q.ne[0]==256", q.ne[0] == KV_STREAM_HEAD_DIM),
        ("V.ne[0]==256", v.ne[0] == KV_STREAM_HEAD_DIM),
        ("Q.ne[1]>=1", q.ne[1] >= 1),
        ("Q.ne[3]==1", q.ne[3] == 1),
        ("K.ne[3]==1", k.ne[3] == 1),
        ("V.ne[3]==1", v.ne[3] == 1),
        ("K.ne[1]==V.ne[1]", k.ne[1] == v.ne[1]),
        ("K.ne[2]==V.ne[2]", k.ne[2] == v.ne[2]),
        ("K.ne[1]%256==0", k.ne[1] % FATTN_KQ_STRIDE == 0),
        *_layout_conditions("K", k),
        *_layout_conditions("V", v),
        ("mask.type==f16", mask is None or mask.type == "f16"),
        ("mask.contiguous", mask is None or mask.contiguous),
        ("sinks==NULL", not sinks),
        ("block_tokens(stage_bytes)>0", block_tokens(k, v, stage_bytes) > 0),
    ]
    failed = tuple(name for name, ok in checks if not ok)
    return FitsResult(
        ok=not failed,
        failed=failed,
        membership=k.runtime is not None or v.runtime is not None,
    )
