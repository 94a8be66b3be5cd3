"""The adaptive half of the runtime in the model: after each evaluation the controller
(:mod:`kvdiag.kvstream.adapt`) gets timing feedback and may move the resident/ring boundary or
switch the decode layout, which reshapes and clears the resident cache (brief §1.5, §1.10).

Feedback comes from a :class:`~kvdiag.kvstream.timing.DeviceProfile` played through
:func:`~kvdiag.kvstream.timing.evaluation` (the NumPy executor), or from measurements an
executor supplies (the CuPy executor, once it reads the ring's ready flags). Every evaluation
is recorded as an ``adapt`` event (the runtime's ``LLAMA_KV_STREAM_TRACE`` line), a moved
boundary as ``repartition``, and each wholesale clear as ``invalidate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvdiag.kvstream.adapt import Controller, Counters, Evaluation
from kvdiag.kvstream.partition import Partition, PoolShape, Tuning
from kvdiag.kvstream.pool import PoolPlan
from kvdiag.kvstream.resident import ResidentCache
from kvdiag.kvstream.timing import DeviceProfile, EvalTiming, evaluation
from kvdiag.model import events as ev
from kvdiag.model.decode_layout import DecodeLayout
from kvdiag.model.pages import PAGE_TOKENS

Emit = tuple[type[Any], dict[str, Any]]


@dataclass
class AdaptiveRuntime:
    """Owns the controller for one capture and applies its decisions to the cache."""

    cache: ResidentCache
    pool: PoolPlan
    profile: DeviceProfile
    fixed_ring: bool = False
    tuning: Tuning = field(default_factory=Tuning)

    def __post_init__(self) -> None:
        shape = PoolShape(total=self.pool.pool_pages, layers=self.pool.layer_count,
                          minimum_ring=self.pool.min_ring_slots)
        start = Partition(self.pool.resident_pages_per_layer, self.pool.ring_slots)
        self.controller = Controller(shape, start, self.tuning, fixed_ring=self.fixed_ring)
        self.samples = 0
        self.misses = 0
        self.last: EvalTiming | None = None

    def capacities(self) -> tuple[int, ...]:
        """Resident pages of each layer's view now (the window the cache serves)."""
        return tuple(self.cache.window(layer) for layer in range(self.cache.layer_count))

    def after_evaluation(self, n_kv: int, query_tokens: int, streams: int,
                         measured: Mapping[str, float] | None = None,
                         ring_peak: int = 0) -> list[Emit]:
        """Feed one evaluation to the controller; return the events to record.

        ``measured`` is the executor's own feedback (samples, misses, busy ratio, eval_us:
        the CuPy executor's deadline-sampling kernel and copy-stream events); without it the
        device profile models the evaluation. ``ring_peak`` is the ring occupancy the runner
        saw, used with measured feedback."""
        active = -(-n_kv // PAGE_TOKENS)
        if measured is not None:
            timing = EvalTiming(eval_us=float(measured["eval_us"]),
                                copy_busy=float(measured["busy"]),
                                samples=int(measured["samples"]), misses=int(measured["misses"]),
                                peak_slots=min(ring_peak, self.cache.ring_slots), h2d_bytes=0)
        else:
            timing = evaluation(self.profile, self.pool.page_bytes, active,
                                self.capacities() * streams, max(1, self.cache.ring_slots))
        self.last = timing
        self.samples += timing.samples
        self.misses += timing.misses
        ring_before = self.controller.partition.ring
        result = self.controller.evaluate(n_kv, query_tokens, Counters(self.samples, self.misses),
                                          timing.copy_busy, timing.peak_slots)
        out: list[Emit] = [(ev.Adapt, dict(
            active=n_kv, resident=result.after.resident, ring=result.after.ring,
            samples=timing.samples, misses=timing.misses,
            busy_pct=round(timing.copy_busy * 100, 2), peak=timing.peak_slots,
            layout=result.layout.active if result.layout.splits else None,
            eval_us=round(timing.eval_us, 3)))]
        for warning in result.warnings:
            out.append((ev.Warn, dict(message=f"kv_stream_adapt: {warning}",
                                      code="kv-stream-feedback")))
        if result.repartitioned:
            out.append((ev.Repartition, dict(
                resident=(result.before.resident, result.after.resident),
                ring=(ring_before, result.after.ring),
                miss_pct=None if result.miss_ratio is None else round(result.miss_ratio * 100, 2),
                busy_pct=round(timing.copy_busy * 100, 2), reason=_reason(result))))
        if result.invalidates:
            self._apply(result.layout, result.after.ring)
            out.append((ev.Invalidate, dict(
                reason="repartition" if result.repartitioned else "layout")))
        return out

    def _apply(self, layout: DecodeLayout, ring: int) -> None:
        """Reshape the cache to the new per-layer capacities and clear it (brief §1.5)."""
        cache = self.cache
        caps = [layout.capacity(layer) for layer in range(cache.layer_count)]
        cache.layer_pages = caps
        cache.layer_offsets = [sum(caps[:layer]) for layer in range(cache.layer_count)]
        cache.ring_slots = ring
        cache.invalidate()


def _reason(result: Evaluation) -> str:
    if result.after.resident < result.before.resident:
        return "grow-ring"
    return "shrink-ring"
