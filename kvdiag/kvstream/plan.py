"""Boot-time sizing and gates: what the runtime computes and logs before the first token.

Combines the page geometry (§1.3), the pool constructor (§1.4), the attention mode (§1.7) and
the validator gates (§1.1) into one record for ``kvdiag plan`` and for trace headers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.ggml_types import AttentionMode, attention_mode
from kvdiag.kvstream.pages import MIB, PageGeometry, host_kv_bytes
from kvdiag.kvstream.pool import PoolError, PoolPlan, plan_pool


@dataclass(frozen=True)
class Plan:
    page_bytes: int
    v_offset: int
    minimum_stage_bytes: int
    host_kv_bytes: int
    host_k_bytes: int
    """The K part of the host buffer (the size line's ``K (<type>): <MiB> MiB``)."""
    n_ctx: int
    kv_size: int
    n_stream: int
    pages_per_stream: int
    streamed_layers: int
    attention_mode: str
    conversion_bytes: int
    pool: PoolPlan | None
    pool_error: str | None
    gates: tuple[str, ...]
    """Validator messages this configuration would be rejected with (empty = accepted)."""
    fits_outlook: str
    fits_notes: tuple[str, ...]

    @property
    def ctx_pages_per_layer(self) -> int:
        """Pages one layer of this context occupies (all streams): what the resident window
        could use, however large the pool's capacity."""
        return self.pages_per_stream * self.n_stream

    @property
    def refusal(self) -> str | None:
        """Why the runtime would not boot with this plan (pool constructor, then validator);
        None when it would."""
        if self.pool_error is not None:
            return f"pool refused: {self.pool_error}"
        if self.gates:
            return f"the validator refuses: {'; '.join(self.gates)}"
        return None

    @property
    def host_kv_buffer_mib(self) -> float:
        return self.host_kv_bytes / MIB

    def as_json(self) -> dict[str, Any]:
        pool = self.pool
        return {
            "host_kv_buffer_mib": round(self.host_kv_buffer_mib, 2),
            "host_kv_bytes": self.host_kv_bytes,
            "host_k_bytes": self.host_k_bytes,
            "page_bytes": self.page_bytes,
            "v_offset": self.v_offset,
            "minimum_stage_bytes": self.minimum_stage_bytes,
            "n_ctx": self.n_ctx,
            "kv_size": self.kv_size,
            "n_stream": self.n_stream,
            "pages_per_layer": self.pages_per_stream * self.n_stream,
            "pages_per_stream": self.pages_per_stream,
            "streamed_layers": self.streamed_layers,
            "pool_pages": pool.pool_pages if pool else None,
            "resident_pages_per_layer": pool.resident_pages_per_layer if pool else None,
            "ring_slots": pool.ring_slots if pool else None,
            "min_ring_slots": pool.min_ring_slots if pool else None,
            "conversion_bytes": self.conversion_bytes,
            "pool": asdict(pool) if pool else None,
            "pool_error": self.pool_error,
            "attention_mode": self.attention_mode,
            "gates": list(self.gates),
            "fits_outlook": self.fits_outlook,
            "fits_notes": list(self.fits_notes),
        }


MULTISEQ_GATE = "block KV streaming requires exactly one sequence (-np 1)"


def multiseq_warning(cfg: RuntimeConfig) -> str | None:
    """The warning ``plan`` and ``capture`` both print for several sequences in separate
    streams: the upstream validator refuses that boot (brief §1.1) unless the arm117 port's
    opt-in is set, and capture always models the port with it set."""
    if cfg.np <= 1 or cfg.kv_unified:
        return None
    return (f"-np {cfg.np} without --kv-unified: the validator refuses to boot "
            f"('{MULTISEQ_GATE}') unless LLAMA_KV_STREAM_ALLOW_MULTISEQ=1; capture models the "
            "port with that opt-in set (plan --allow-multiseq)")


def make_plan(cfg: RuntimeConfig, allow_multiseq: bool = False) -> Plan:
    geom = PageGeometry(cfg.type_k, cfg.type_v, cfg.head_dim, cfg.head_dim, cfg.n_head_kv)
    mode = attention_mode(cfg.type_k, cfg.type_v, cfg.native_quants)
    conversion = 0
    if mode == AttentionMode.F16:
        conversion = PageGeometry("f16", "f16", cfg.head_dim, cfg.head_dim, cfg.n_head_kv).page_bytes
    stage_bytes = cfg.stage_mib * MIB
    pool: PoolPlan | None = None
    pool_error: str | None = None
    try:
        pool = plan_pool(stage_bytes, geom.page_bytes, cfg.n_streamed, conversion, cfg.ring_slots)
    except PoolError as exc:
        pool_error = str(exc)

    gates: list[str] = []
    if cfg.np > 1 and not cfg.kv_unified and not allow_multiseq:
        gates.append(MULTISEQ_GATE)
    if mode == AttentionMode.UNSUPPORTED:
        gates.append(f"block KV streaming does not support K {cfg.type_k} and V {cfg.type_v}")
    if stage_bytes < geom.minimum_stage_bytes:
        gates.append("block KV streaming stage is too small for one 256-token cache page")

    notes: list[str] = []
    if cfg.head_dim != 256:
        notes.append("head dim is not 256: every FA node fails Q.ne[0]==256 and V.ne[0]==256")
    if mode == AttentionMode.UNSUPPORTED:
        notes.append("type pair has no streamed mode")
    if notes:
        outlook = "never"
    elif cfg.n_stream > 1:
        outlook = "single-stream ubatches only"
        notes.append(
            f"{cfg.n_stream} KV streams (-np {cfg.np} without --kv-unified): a ubatch holding "
            "more than one slot gives K/V views with ne[3] > 1 and fails Q/K/V.ne[3]==1"
        )
    else:
        outlook = "always"
    return Plan(
        page_bytes=geom.page_bytes,
        v_offset=geom.v_offset,
        minimum_stage_bytes=geom.minimum_stage_bytes,
        host_kv_bytes=host_kv_bytes(geom, cfg.kv_size, cfg.n_stream, cfg.n_streamed),
        host_k_bytes=cfg.kv_size * cfg.n_stream * cfg.n_streamed * geom.row_k * cfg.n_head_kv,
        n_ctx=cfg.n_ctx,
        kv_size=cfg.kv_size,
        n_stream=cfg.n_stream,
        pages_per_stream=cfg.pages_per_stream,
        streamed_layers=cfg.n_streamed,
        attention_mode=mode.name,
        conversion_bytes=conversion,
        pool=pool,
        pool_error=pool_error,
        gates=tuple(gates),
        fits_outlook=outlook,
        fits_notes=tuple(notes),
    )
