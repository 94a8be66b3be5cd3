"""The tensors a flash-attention node sees, built as llama_kv_cache and build_attn_mha build them
(brief §4.1).

Per layer K is a 3-D tensor ``[n_embd_k_gqa, kv_size, n_stream]``. ``get_k`` takes a 4-D view
``[head_dim, n_head_kv, n_kv, ns]`` at byte offset ``nb[3] × s0`` (s0..s1 = the streams of the
ubatch) and build_attn_mha permutes it (0, 2, 1, 3), so at FA ``K.ne = [D, n_kv, n_head_kv, ns]``
with ``nb = [type_size, row(n_embd_k_gqa), row(D), row(n_embd_k_gqa) × kv_size]``. Q is
``[D, tokens, n_head, ns]`` f32 and the result ``[D_v, n_head, tokens, ns]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.ggml_types import ggml_type
from kvdiag.kvstream.pages import round_up
from kvdiag.model.geometry import Tensor

KV_STREAM_BUFFER = "CUDA_KV_Stream_Host"
DEVICE_BUFFER = "CUDA0"
KQ_MASK_PAD = 64
"""GGML_KQ_MASK_PAD: the mask's row count is padded to this."""


@dataclass(frozen=True)
class AddressMap:
    """Base addresses of the per-layer K/V tensors and of the device pool.

    The CuPy executor supplies real pointers (pinned host store, cudaMalloc pool); the NumPy
    executor uses this synthetic map laid out like the runtime's single host buffer.
    """

    host_base: int = 0x7F3A_0000_0000
    device_base: int = 0x7E10_0000_0000
    pool_base: int = 0x7E00_0000_0000
    compute_base: int = 0x7F31_C400_0000
    """Where the compute buffer holds Q and the FA results (one 1 MiB region per layer)."""
    alignment: int = 256

    def tensor_bytes(self, cfg: RuntimeConfig, type_name: str) -> int:
        return ggml_type(type_name).row_bytes(cfg.head_dim * cfg.n_head_kv) * cfg.kv_size * cfg.n_stream

    def k_base(self, cfg: RuntimeConfig, layer: int) -> int:
        return self._layer_base(cfg, layer)

    def v_base(self, cfg: RuntimeConfig, layer: int) -> int:
        return self._layer_base(cfg, layer) + round_up(
            self.tensor_bytes(cfg, cfg.type_k), self.alignment
        )

    def _layer_base(self, cfg: RuntimeConfig, layer: int) -> int:
        streamed = layer < cfg.n_streamed
        base = self.host_base if streamed else self.device_base
        index = layer if streamed else layer - cfg.n_streamed
        per_layer = round_up(self.tensor_bytes(cfg, cfg.type_k), self.alignment) + round_up(
            self.tensor_bytes(cfg, cfg.type_v), self.alignment
        )
        return base + index * per_layer


@dataclass(frozen=True)
class AttentionNode:
    """The FA node of one layer for one ubatch."""

    layer: int
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor
    dst: Tensor
    s0: int
    ns: int

    @property
    def name(self) -> str:
        return f"__fattn__-{self.layer}"


def _kv_view(
    cfg: RuntimeConfig, name: str, type_name: str, base: int, streamed: bool, n_kv: int,
    s0: int, ns: int,
) -> Tensor:
    t = ggml_type(type_name)
    row_head = t.row_bytes(cfg.head_dim)
    row_all = t.row_bytes(cfg.head_dim * cfg.n_head_kv)
    stream_stride = row_all * cfg.kv_size
    return Tensor(
        name=name,
        type=type_name,
        ne=(cfg.head_dim, n_kv, cfg.n_head_kv, ns),
        nb=(t.block_bytes, row_all, row_head, stream_stride),
        data=base + s0 * stream_stride,
        buffer=KV_STREAM_BUFFER if streamed else DEVICE_BUFFER,
        runtime=1 if streamed else None,
        contiguous=False,
    )


def attention_node(
    cfg: RuntimeConfig, layer: int, streams: tuple[int, ...], tokens: int, n_kv: int,
    addresses: AddressMap,
) -> AttentionNode:
    """Views for ``tokens`` query tokens per stream over streams ``s0..s1`` of ``streams``."""
    s0, s1 = min(streams), max(streams)
    ns = s1 - s0 + 1
    streamed = layer < cfg.n_streamed
    k = _kv_view(cfg, f"cache_k_l{layer} (view) (permuted)", cfg.type_k,
                 addresses.k_base(cfg, layer), streamed, n_kv, s0, ns)
    v = _kv_view(cfg, f"cache_v_l{layer} (view) (permuted)", cfg.type_v,
                 addresses.v_base(cfg, layer), streamed, n_kv, s0, ns)
    d = cfg.head_dim
    q = Tensor(
        name=f"Qcur-{layer} (permuted)",
        type="f32",
        ne=(d, tokens, cfg.n_head, ns),
        nb=(4, 4 * d * cfg.n_head, 4 * d, 4 * d * cfg.n_head * tokens),
        contiguous=False,
        buffer=DEVICE_BUFFER,
        data=addresses.compute_base + (2 * layer) * (1 << 20),
    )
    mask_rows = round_up(tokens, KQ_MASK_PAD)
    mask = Tensor(
        name="attn_inp_kq_mask",
        type="f16",
        ne=(n_kv, mask_rows, 1, ns),
        nb=(2, 2 * n_kv, 2 * n_kv * mask_rows, 2 * n_kv * mask_rows),
        buffer=DEVICE_BUFFER,
    )
    dst = Tensor(
        name=f"__fattn__-{layer}",
        type="f32",
        ne=(d, cfg.n_head, tokens, ns),
        nb=(4, 4 * d, 4 * d * cfg.n_head, 4 * d * cfg.n_head * tokens),
        buffer=DEVICE_BUFFER,
        data=addresses.compute_base + (2 * layer + 1) * (1 << 20),
    )
    return AttentionNode(layer=layer, q=q, k=k, v=v, mask=mask, dst=dst, s0=s0, ns=ns)
