"""A server session played through the adaptive controller for its timing only (``kvdiag perf
--predict``, docs/perf.md "Prediction").

The runner (:mod:`kvdiag.kvstream.runner`) makes every decision of every page; a prediction
needs only what the controller decides and what the device profile says it costs. This plays
the scenario's ubatches (the same :class:`~kvdiag.kvstream.scenarios.Scheduler`) and after each
evaluation hands the controller the same inputs the runner does — the view's KV cells, the query
tokens, the streams (brief §1.10) — through the same :class:`~kvdiag.kvstream.adaptive.AdaptiveRuntime`
and modelled feedback (:func:`~kvdiag.kvstream.timing.evaluation`). Per request it keeps the
modelled attention time of its decode steps, the partition, misses and repartitions, and the
same steps' attention with every page resident (what a server without streaming reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvdiag.kvstream.adaptive import AdaptiveRuntime
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.pages import view_n_kv
from kvdiag.kvstream.plan import Plan, make_plan
from kvdiag.kvstream.pool import PoolPlan
from kvdiag.kvstream.resident import ResidentCache
from kvdiag.kvstream.scenarios import Scenario, Scheduler
from kvdiag.kvstream.timing import DeviceProfile, evaluation
from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.model.perf import ModelledRequest


class SessionError(ValueError):
    """The session cannot be modelled on this configuration (the runtime would not boot)."""


@dataclass
class _Sums:
    steps: int = 0
    attention_us: float = 0.0
    resident_us: float = 0.0
    samples: int = 0
    misses: int = 0
    repartitions: int = 0
    resident: list[int] = field(default_factory=list)
    ring: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    first_cell: int | None = None
    last_cell: int = 0


@dataclass(frozen=True)
class AttentionCost:
    """What the modelled attention of one decode step costs under other mechanisms: the
    questions the prediction asks where it disagrees with a measurement (docs/perf.md)."""

    profile: DeviceProfile
    pool: PoolPlan
    layers: int

    def resident_us(self, active: int) -> float:
        """Every page of every streamed layer resident (read at HBM speed)."""
        return evaluation(self.profile, self.pool.page_bytes, active, (active,) * self.layers,
                          1).eval_us

    def window_us(self, active: int, resident: int) -> float:
        """A uniform resident window of ``resident`` pages per layer, the rest of the pool a
        ring (resident × layers + ring = pool pages, brief §1.10)."""
        ring = max(1, self.pool.pool_pages - resident * self.layers)
        return evaluation(self.profile, self.pool.page_bytes, active,
                          (min(resident, active),) * self.layers, ring).eval_us

    def host_us(self, active: int, layers_on_host: int) -> float:
        """``layers_on_host`` layers fall back to ordinary attention over the host buffer,
        read zero-copy over PCIe (brief §3); the others are resident."""
        k = max(0, min(layers_on_host, self.layers))
        host = k * (self.profile.launch_us
                    + active * self.pool.page_bytes / (self.profile.zero_copy_read_gbps * 1e3))
        read = self.pool.page_bytes / (self.profile.hbm_read_gbps * 1e3)
        return host + (self.layers - k) * (self.profile.launch_us + active * read)


@dataclass(frozen=True)
class SessionModel:
    plan: Plan
    profile: DeviceProfile
    requests: tuple[ModelledRequest, ...]
    cost: AttentionCost


def play(cfg: RuntimeConfig, scenario: Scenario, profile: DeviceProfile) -> SessionModel:
    """Play ``scenario`` on ``cfg`` under the adaptive controller (``cfg.adaptive`` or not: a
    prediction of a streaming server always has it, unless ``cfg.ring_slots`` froze it)."""
    plan = make_plan(cfg, allow_multiseq=True)
    pool = plan.pool
    if pool is None:
        raise SessionError(f"the runtime would refuse this pool: {plan.pool_error}")
    cache = ResidentCache(cfg.layout, cfg.n_streamed, pool.resident_pages_per_layer,
                          pool.ring_slots, cfg.n_stream, cfg.kv_size)
    adaptive = AdaptiveRuntime(cache, pool, profile, fixed_ring=cfg.ring_slots is not None)
    cost = AttentionCost(profile, pool, cfg.n_streamed)
    sched = Scheduler(scenario.requests, cfg.n_stream, cfg.n_ubatch, cfg.kv_size)
    last_cell: dict[int, int] = {}
    sums: dict[int, _Sums] = {}
    for ub in sched.ubatches():
        for lane in ub.lanes:
            for req, cell in zip(lane.requests, lane.cells, strict=True):
                last_cell[req] = max(last_cell.get(req, -1), cell)
        n_kv = view_n_kv(max(last_cell[r] for r in ub.requests) + 1, cfg.kv_size)
        emitted = adaptive.after_evaluation(n_kv, ub.tokens, len(ub.streams))
        fields = emitted[0][1]
        moved = sum(1 for cls, _ in emitted if cls is ev.Repartition)
        timing = adaptive.last
        assert timing is not None
        active = -(-n_kv // PAGE_TOKENS)
        for req in set(ub.requests):
            s = sums.setdefault(req, _Sums())
            s.repartitions += moved
            if ub.phase != "decode":
                continue
            if s.first_cell is None:
                s.first_cell = last_cell[req]
            s.last_cell = last_cell[req] + 1
            s.steps += 1
            s.attention_us += timing.eval_us
            s.resident_us += cost.resident_us(active)
            s.samples += timing.samples
            s.misses += timing.misses
            s.resident.append(int(fields["resident"]))
            s.ring.append(int(fields["ring"]))
            s.active.append(active)
    out = []
    for i, r in enumerate(scenario.requests):
        s = sums.get(i, _Sums())
        n = max(1, s.steps)
        out.append(ModelledRequest(
            index=i, slot=r.slot, decode_steps=s.steps,
            attention_us=s.attention_us / n, resident_us=s.resident_us / n,
            active_pages=(min(s.active, default=0), max(s.active, default=0)),
            resident_pages=(min(s.resident, default=0), max(s.resident, default=0)),
            ring_slots=(min(s.ring, default=0), max(s.ring, default=0)),
            samples=s.samples, misses=s.misses, repartitions=s.repartitions,
            depth_start=s.first_cell, depth_end=s.last_cell if s.steps else None,
            rejected=i in sched.rejected, truncated=i in sched.truncated))
    return SessionModel(plan, profile, tuple(out), cost)
