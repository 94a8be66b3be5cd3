"""Page math of the G1 resident cache (domain brief §1.3).

A page holds 256 tokens of K for every KV head, then, at the next multiple of 128 bytes, 256
tokens of V (``ggml_cuda_kv_stream_page_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.kvstream.ggml_types import ggml_type
from kvdiag.model.pages import PAGE_TOKENS, V_ALIGN, round_up

__all__ = ["MIB", "PAGE_TOKENS", "V_ALIGN", "PageGeometry", "host_kv_bytes", "pad_ctx", "round_up"]

MIB = 1 << 20


def view_n_kv(cells_used: int, kv_size: int) -> int:
    """KV cells the attention view covers when ``cells_used`` cells hold the ubatch's tokens:
    padded to whole pages (FATTN_KQ_STRIDE, brief §2.2), at least one, at most the stream."""
    return min(kv_size, max(PAGE_TOKENS, round_up(cells_used, PAGE_TOKENS)))


@dataclass(frozen=True)
class PageGeometry:
    """Byte geometry of one page for a (K type, V type, head dims, KV heads) combination."""

    type_k: str
    type_v: str
    head_dim_k: int
    head_dim_v: int
    n_head_kv: int
    page_tokens: int = PAGE_TOKENS

    def __post_init__(self) -> None:
        if self.page_tokens != PAGE_TOKENS:
            raise ValueError(f"page_tokens must be {PAGE_TOKENS} (the resident cache refuses others)")
        for t, d in ((self.type_k, self.head_dim_k), (self.type_v, self.head_dim_v)):
            gt = ggml_type(t)
            if not gt.storage:
                raise ValueError(f"type {t} cannot be stored in a kv-stream page")
            if d <= 0 or d % gt.block_elems:
                raise ValueError(f"head dim {d} is not a multiple of the {t} block ({gt.block_elems})")

    @property
    def row_k(self) -> int:
        """Bytes of one token's K for one head (``ggml_row_size(type_k, head_dim_k)``)."""
        return ggml_type(self.type_k).row_bytes(self.head_dim_k)

    @property
    def row_v(self) -> int:
        return ggml_type(self.type_v).row_bytes(self.head_dim_v)

    @property
    def k_bytes(self) -> int:
        return self.row_k * self.n_head_kv * self.page_tokens

    @property
    def v_offset(self) -> int:
        return round_up(self.k_bytes, V_ALIGN)

    @property
    def v_bytes(self) -> int:
        return self.row_v * self.n_head_kv * self.page_tokens

    @property
    def page_bytes(self) -> int:
        return self.v_offset + self.v_bytes

    @property
    def minimum_stage_bytes(self) -> int:
        """Validator minimum: 256 × (K row + V row) of the first attention layer (no pad)."""
        return self.page_tokens * (self.row_k + self.row_v) * self.n_head_kv


def pad_ctx(n_ctx: int) -> int:
    """llama_context pads n_ctx to a multiple of 256."""
    return round_up(n_ctx, PAGE_TOKENS)


def host_kv_bytes(geom: PageGeometry, kv_size: int, n_stream: int, layers: int) -> int:
    """Size of the ``CUDA_KV_Stream_Host`` buffer: cells × streams × layers × (K row + V row)
    of all KV heads."""
    return kv_size * n_stream * layers * (geom.row_k + geom.row_v) * geom.n_head_kv
