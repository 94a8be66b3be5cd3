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

#: Plain-words explanations of each condition, for reports and the TUI detail pane.
EXPLAIN: dict[str, str] = {
    "K.runtime!=NULL": "K is not in a CUDA_KV_Stream_Host buffer (runtime_from_tensor is null)",
    "V.runtime!=NULL": "V is not in a CUDA_KV_Stream_Host buffer (runtime_from_tensor is null)",
    "K.runtime==V.runtime": "K and V belong to different kv-stream runtimes",
    "Q.type==f32": "the streamed kernel takes an f32 query",
    "mode(K,V)!=UNSUPPORTED": "no streamed attention mode for this K/V type pair",
    "Q.ne[0]==256": "query head dim must be 256 (KV_STREAM_HEAD_DIM)",
    "V.ne[0]==256": "value head dim must be 256 (KV_STREAM_HEAD_DIM)",
    "Q.ne[1]>=1": "no query tokens",
    "Q.ne[3]==1": "the query spans several KV streams (slots); the streamed kernel handles one",
    "K.ne[3]==1": "the K view spans several KV streams (slots); the streamed kernel handles one",
    "V.ne[3]==1": "the V view spans several KV streams (slots); the streamed kernel handles one",
    "K.ne[1]==V.ne[1]": "K and V views have different n_kv",
    "K.ne[2]==V.ne[2]": "K and V views have different KV head counts",
    "K.ne[1]%256==0": "n_kv is not a multiple of FATTN_KQ_STRIDE (256)",
    "K.nb[0]==type_size": "K has gaps inside a block row",
    "V.nb[0]==type_size": "V has gaps inside a block row",
    "K.nb[1]>=row_size": "K token stride is shorter than one row",
    "V.nb[1]>=row_size": "V token stride is shorter than one row",
    "K.nb[1]==row_size*K.ne[2]": "K token stride is not all KV heads of one token",
    "V.nb[1]==row_size*V.ne[2]": "V token stride is not all KV heads of one token",
    "K.nb[2]==row_size": "K head stride is not one row",
    "V.nb[2]==row_size": "V head stride is not one row",
    "mask.type==f16": "the KQ mask must be f16",
    "mask.contiguous": "the KQ mask must be contiguous",
    "sinks==NULL": "attention sinks are not supported on the streamed path",
    "block_tokens(stage_bytes)>0": "not even one 256-token page of K and V fits in stage_bytes",
}


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
    q, k, v, mask = node.q, node.k, node.v, node.mask
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
        ("mask.type==f16", mask.type == "f16"),
        ("mask.contiguous", mask.contiguous),
        ("sinks==NULL", not sinks),
        ("block_tokens(stage_bytes)>0", block_tokens(k, v, stage_bytes) > 0),
    ]
    failed = tuple(name for name, ok in checks if not ok)
    return FitsResult(
        ok=not failed,
        failed=failed,
        membership=k.runtime is not None or v.runtime is not None,
    )
