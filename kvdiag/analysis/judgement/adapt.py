"""Findings about the adaptive partition: ``partition-thrash``, ``ring-starved``,
``overprovisioned`` (brief §1.10, §5.3).

They read the controller's own record — ``repartition`` events (the boundary moved) and
``adapt`` events (one evaluation's active tokens, partition and feedback) — whoever wrote them:
the model, a fork through kvtrace.h, or ``kvdiag import`` of ``kv_stream_adapt`` log lines.

- ``partition-thrash``: more than 20 repartitions in one decode loop (a run of consecutive
  decode steps), the porting guide's red flag ([ARM]); each repartition invalidates every
  resident page, so the pool is refilled over PCIe again and again.
- ``ring-starved``: the deadline miss ratio stays above 1 % (the controller's own starvation
  threshold, [PLAN]) for at least 8 evaluations in a row — longer than the grow hysteresis
  (3), so the controller had the chance to react. With the copy engine at ≥ 80 % busy more
  ring cannot help (the link is the limit); below that the controller should have grown the
  ring (a fixed ring or a long cooldown keeps it from doing so).
- ``overprovisioned``: misses ≤ 1 %, copy busy < 50 % and ring peak occupancy < 50 % for at
  least 8 evaluations in a row (the shrink hysteresis) while pages still stream: ring slots
  could have been resident pages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence, Finding, Severity

THRASH_REPARTITIONS = 20
SUSTAINED = 8
MISS_THRESHOLD = 0.01
COPY_SATURATED = 0.80
COPY_LIGHT = 0.50
RING_LIGHT = 0.50
MAX_EVIDENCE = 20


@dataclass
class _Streak:
    """The current run of evaluations in one condition, and the longest seen."""

    length: int = 0
    first: ev.Adapt | None = None
    best: int = 0
    best_first: ev.Adapt | None = None
    best_last: ev.Adapt | None = None
    busy_max: float = 0.0
    miss_max: float = 0.0
    runs: int = 0

    def hit(self, e: ev.Adapt, miss: float) -> None:
        if self.length == 0:
            self.first = e
        self.length += 1
        if self.length == SUSTAINED:
            self.runs += 1
        if self.length >= self.best:
            self.best, self.best_first, self.best_last = self.length, self.first, e
        self.busy_max = max(self.busy_max, e.busy_pct or 0.0)
        self.miss_max = max(self.miss_max, miss)

    def miss(self) -> None:
        self.length = 0


@dataclass
class _Loop:
    """One decode loop: its number, its repartitions counted, the first ones kept."""

    number: int
    count: int = 0
    shown: list[ev.Repartition] = field(default_factory=list)


@dataclass
class AdaptAnalyzer:
    """Feed events in file order; ask for findings at the end."""

    loops: list[_Loop] = field(default_factory=list)
    """Decode loops that thrashed, and the current one (memory stays bounded however long
    the run: a finished loop that did not thrash is dropped, a loop keeps its first
    repartitions as evidence and counts the rest)."""
    _loop_number: int = 0
    starved: _Streak = field(default_factory=_Streak)
    light: _Streak = field(default_factory=_Streak)
    repartitions: int = 0
    evaluations: int = 0
    _in_decode: bool = False
    _handlers: dict[type, Callable[[Any], None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._handlers = {ev.Step: self._step, ev.Repartition: self._repartition,
                          ev.Adapt: self._adapt}

    def feed(self, event: object) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _new_loop(self) -> None:
        if self.loops and self.loops[-1].count <= THRASH_REPARTITIONS:
            self.loops.pop()
        self._loop_number += 1
        self.loops.append(_Loop(self._loop_number))

    def _step(self, e: ev.Step) -> None:
        decode = e.phase == "decode"
        if decode and not self._in_decode:
            self._new_loop()
        self._in_decode = decode

    def _repartition(self, e: ev.Repartition) -> None:
        self.repartitions += 1
        if not self.loops:
            self._new_loop()  # a log without step boundaries: one loop
        loop = self.loops[-1]
        loop.count += 1
        if len(loop.shown) < MAX_EVIDENCE:
            loop.shown.append(e)

    def _adapt(self, e: ev.Adapt) -> None:
        if not e.samples:
            return  # no feedback this evaluation: neither condition is measured
        self.evaluations += 1
        miss = (e.misses or 0) / e.samples
        busy = (e.busy_pct or 0.0) / 100.0
        peak = (e.peak or 0) / e.ring if e.ring else 0.0
        if miss > MISS_THRESHOLD:
            self.starved.hit(e, miss)
        else:
            self.starved.miss()
        streaming = e.active > e.resident * 256
        if streaming and miss <= MISS_THRESHOLD and busy < COPY_LIGHT and peak < RING_LIGHT:
            self.light.hit(e, miss)
        else:
            self.light.miss()

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for loop in self.loops:
            if loop.count <= THRASH_REPARTITIONS:
                continue
            shown = loop.shown
            more = f" (first {len(shown)} of {loop.count})" if loop.count > len(shown) else ""
            i = loop.number - 1
            out.append(Finding(
                rule="partition-thrash", severity=Severity.WARNING,
                title=(f"{loop.count} repartitions in decode loop {i + 1} (more than "
                       f"{THRASH_REPARTITIONS}): every one invalidates the resident pages{more}"),
                evidence=tuple(Evidence(seq=r.seq, step=r.step, text=(
                    f"resident {r.resident[0]} -> {r.resident[1]}, ring {r.ring[0]} -> "
                    f"{r.ring[1]}")) for r in shown),
                fix=("raise the hysteresis/cooldown, or pin the boundary with "
                     "GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS; check that the feedback is not "
                     "noisy (deadline samples per evaluation)"),
                details={"loop": i + 1, "repartitions": loop.count}))
        s = self.starved
        if s.best >= SUSTAINED and s.best_first and s.best_last:
            saturated = s.busy_max >= COPY_SATURATED * 100
            out.append(Finding(
                rule="ring-starved", severity=Severity.WARNING,
                title=(f"deadline misses above 1% for {s.best} evaluations in a row (steps "
                       f"{s.best_first.step}-{s.best_last.step}, worst {s.miss_max:.1%}); "
                       + ("the copy engine is saturated" if saturated else
                          "the copy engine had headroom")),
                evidence=(_adapt_evidence(s.best_first), _adapt_evidence(s.best_last)),
                fix=("the PCIe link is the limit: give the pool more pages (--kv-stream-stage-mib) "
                     "or shorten the context" if saturated else
                     "the ring should have grown: check GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS and "
                     "the repartition cooldown"),
                details={"evaluations": s.best, "runs": s.runs, "max_miss_ratio": s.miss_max,
                         "max_busy_pct": s.busy_max}))
        light = self.light
        if light.best >= SUSTAINED and light.best_first and light.best_last:
            out.append(Finding(
                rule="overprovisioned", severity=Severity.INFO,
                title=(f"the ring was lightly used for {light.best} evaluations in a row "
                       f"(steps {light.best_first.step}-{light.best_last.step}) while pages "
                       "streamed: ring slots could have been resident pages"),
                evidence=(_adapt_evidence(light.best_first), _adapt_evidence(light.best_last)),
                fix="shorter shrink hysteresis/cooldown, or fewer fixed ring slots",
                details={"evaluations": light.best, "runs": light.runs}))
        return out


def _adapt_evidence(e: ev.Adapt) -> Evidence:
    return Evidence(seq=e.seq, step=e.step, text=(
        f"active {e.active}, resident {e.resident}, ring {e.ring}, samples {e.samples}, "
        f"misses {e.misses}, copy busy {e.busy_pct}%, peak {e.peak}"))
