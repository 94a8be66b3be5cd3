"""The runtime configuration a capture models: model shape, server flags, streaming knobs.

Validation mirrors the boot-time gates of the G1 validator (brief §1.1) where they are
configuration facts; nonsense values (negative sizes, unknown types) and sizes past what the
real runtime can hold (:mod:`kvdiag.kvstream.limits`) raise ValueError, which the CLI turns
into a one-line usage error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kvdiag.kvstream.ggml_types import KV_TYPES, ggml_type
from kvdiag.kvstream.limits import MAX_BUFFER_BYTES, UINT32_MAX, over_limit
from kvdiag.kvstream.pages import pad_ctx
from kvdiag.model.pages import PAGE_TOKENS

Layout = Literal["shared", "per-stream"]
Dispatch = Literal["membership", "fits"]
LAYOUTS: tuple[str, ...] = ("shared", "per-stream")
DISPATCHES: tuple[str, ...] = ("membership", "fits")


@dataclass(frozen=True)
class RuntimeConfig:
    layers: int = 4
    """Attention layers of the model."""
    streamed_layers: int | None = None
    """How many of them keep K/V in ``CUDA_KV_Stream_Host`` (the first N; None = all)."""
    ctx: int = 4096
    np: int = 1
    kv_unified: bool = False
    type_k: str = "q8_0"
    type_v: str = "q5_1"
    head_dim: int = 256
    n_head: int = 24
    n_head_kv: int = 4
    stage_mib: int = 4
    n_ubatch: int = 512
    ring_slots: int | None = None
    """Models ``GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS``."""
    native_quants: bool = True
    """Built with ``GGML_CUDA_FA_ALL_QUANTS`` (native quantized vec kernels: DIRECT mode)."""
    layout: Layout = "shared"
    dispatch: Dispatch = "membership"
    adaptive: bool = False
    """Model the adaptive partition controller (``kv_stream_adapt``, brief §1.10): after each
    evaluation it may move the resident/ring boundary and switch to the decode layout. Off,
    the uniform boot partition stays fixed (as with GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS)."""
    assert_file: str = "/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"
    assert_line: int = 1898
    """Where the modelled build's ``GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst))`` sits
    (1898 in the arm117 port; other trees differ)."""

    def __post_init__(self) -> None:
        positive = {
            "layers": self.layers,
            "ctx": self.ctx,
            "np": self.np,
            "head-dim": self.head_dim,
            "n-head": self.n_head,
            "n-head-kv": self.n_head_kv,
            "stage-mib": self.stage_mib,
            "ubatch": self.n_ubatch,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"--{name} must be positive, got {value}")
        optional = {"streamed-layers": self.streamed_layers, "ring-slots": self.ring_slots}
        for name, limited in (*positive.items(), *optional.items()):
            refusal = over_limit(name, limited) if limited is not None else None
            if refusal is not None:
                raise ValueError(refusal)
        if self.head_dim * self.n_head_kv > UINT32_MAX:
            raise ValueError(f"--head-dim {self.head_dim} × --n-head-kv {self.n_head_kv} is "
                             f"more than the runtime can hold: n_embd_k_gqa is a uint32_t in "
                             f"llama_hparams (at most {UINT32_MAX:,})")
        if self.streamed_layers is not None and not 0 < self.streamed_layers <= self.layers:
            raise ValueError(
                f"--streamed-layers must be between 1 and --layers ({self.layers}), "
                f"got {self.streamed_layers}"
            )
        for flag, t in (("type-k", self.type_k), ("type-v", self.type_v)):
            if t not in KV_TYPES:
                raise ValueError(f"--{flag} {t!r} is not a supported KV type ({', '.join(KV_TYPES)})")
            block = ggml_type(t).block_elems
            if self.head_dim % block:
                raise ValueError(f"--head-dim {self.head_dim} is not a multiple of the {t} block ({block})")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"--n-head {self.n_head} is not a multiple of --n-head-kv {self.n_head_kv}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}")
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"--dispatch must be one of {', '.join(DISPATCHES)}")
        if self.ring_slots is not None and self.ring_slots <= 0:
            raise ValueError(f"--ring-slots must be positive, got {self.ring_slots}")
        width = self.head_dim * self.n_head_kv
        host = (self.kv_size * self.n_stream * self.n_streamed
                * (ggml_type(self.type_k).row_bytes(width) + ggml_type(self.type_v).row_bytes(width)))
        if host > MAX_BUFFER_BYTES:
            raise ValueError(f"the CUDA_KV_Stream_Host buffer would be {host:,} bytes, more than "
                             f"ggml can address (sizes are size_t, element counts int64_t: at "
                             f"most {MAX_BUFFER_BYTES:,}); lower --ctx, --layers or the head "
                             f"geometry")

    # -- derived, as llama_context / llama_kv_cache compute them ---------------------------

    @property
    def n_streamed(self) -> int:
        return self.layers if self.streamed_layers is None else self.streamed_layers

    @property
    def n_ctx(self) -> int:
        return pad_ctx(self.ctx)

    @property
    def n_stream(self) -> int:
        """One stream when the cache is unified, else one per sequence (slot)."""
        return 1 if self.kv_unified else self.np

    @property
    def kv_size(self) -> int:
        """Cells per stream (``n_ctx_seq``): n_ctx / n_seq_max padded to 256 when not unified."""
        if self.kv_unified:
            return self.n_ctx
        return pad_ctx(self.n_ctx // self.np)

    @property
    def pages_per_stream(self) -> int:
        return self.kv_size // PAGE_TOKENS

    @property
    def gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def replace(self, **changes: Any) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict[str, Any]] = {
    # The production shape of the arm117 port (PR description, domain brief §1.3, §8):
    # head dim 256, 24 query / 4 KV heads, 16 attention layers of which 9 stream on CUDA0,
    # ctx 65536, K q8_0 / V q5_1, 2048 MiB stage.
    "arm117": dict(
        layers=16, streamed_layers=9, ctx=65536, np=1, type_k="q8_0", type_v="q5_1",
        head_dim=256, n_head=24, n_head_kv=4, stage_mib=2048,
    ),
    # Same head geometry, small enough for the NumPy executor in seconds.
    "small": dict(
        layers=4, ctx=4096, np=1, type_k="q8_0", type_v="q5_1",
        head_dim=256, n_head=24, n_head_kv=4, stage_mib=4,
    ),
}
