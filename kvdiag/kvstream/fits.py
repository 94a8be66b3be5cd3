"""``ggml_cuda_kv_stream_fattn_fits(dst)`` and ``..._streamed_supported(dst, stage_bytes)``
(brief §2.1–§2.2, G1 form), as the runtime model routes on it.

The predicate itself, condition by condition, is :func:`kvdiag.model.fits.conditions` (the
judgement evaluates logged decisions with the same code); the runtime returns a bare bool,
kvdiag names each condition that fails, in the order the runtime tests them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.kvstream.views import AttentionNode
from kvdiag.model.fits import FATTN_KQ_STRIDE, KV_STREAM_HEAD_DIM, block_tokens, conditions
from kvdiag.model.geometry import Tensor
from kvdiag.model.pages import V_ALIGN

__all__ = ["FATTN_KQ_STRIDE", "KV_STREAM_HEAD_DIM", "V_ALIGN", "FitsResult", "block_tokens",
           "fits", "fits_tensors"]


@dataclass(frozen=True)
class FitsResult:
    ok: bool
    failed: tuple[str, ...]
    membership: bool
    """runtime_from_tensor(K) or runtime_from_tensor(V) is non-null: what the upstream
    dispatcher routes on."""


def fits(
    node: AttentionNode, stage_bytes: int, native_quants: bool = True, sinks: bool = False
) -> FitsResult:
    return fits_tensors(node.q, node.k, node.v, node.mask, stage_bytes, native_quants, sinks)


def fits_tensors(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, stage_bytes: int,
    native_quants: bool = True, sinks: bool = False,
) -> FitsResult:
    """The predicate over the model's own operands (every field known). A condition the
    model cannot evaluate (a type it does not know) counts as failed: the runtime's
    capability tables do not list it either."""
    conds = conditions(q, k, v, mask, stage_bytes, native_quants, sinks)
    bad = tuple(c.name for c in conds if c.state != "held")
    return FitsResult(
        ok=not bad,
        failed=bad,
        membership=k.runtime is not None or v.runtime is not None,
    )
