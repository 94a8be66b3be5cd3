"""A run against a baseline run, aligned on depth (``kvdiag perf RUN --baseline BASE``,
docs/perf.md "Comparison").

- Requests are paired in the order they began: a request pairs with the next baseline request
  at the same depth at start (within ``DEPTH_MATCH`` of it, or 256 tokens); the others stay
  unpaired and are listed.
- The **mean cost** is the mean decode rate of the run over the pairs neither run capped
  (``truncated = 0`` on both), against the baseline's over the same pairs, minus one: the
  figure a multi-turn harness reports as "mean tok/s" per run.
- **Turn-1 parity** is the first such pair's ratio; within ``PARITY`` of 1 it is parity (the
  shallow-context path is unchanged).
- **Depth bins**: both runs' uncapped requests in bins of the same width; a bin's ratio is the
  run's token-weighted rate over the baseline's. The **worst bin** has the lowest ratio; every
  bin more than 10 % below (``SLOW``) gets the run's partition state there and its causes
  (:mod:`kvdiag.analysis.perf_evidence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvdiag.analysis.perf import (
    DEFAULT_BIN_TOKENS,
    DepthBin,
    RequestRow,
    depth_bins,
    mean,
    rows,
)
from kvdiag.analysis.perf_evidence import (
    Cause,
    PartitionState,
    causes,
    state_at,
    unattached,
)
from kvdiag.model.perf import PerfRun

PARITY = 0.02
SLOW = 0.90
DEPTH_MATCH = 0.05


@dataclass(frozen=True)
class Pair:
    run: RequestRow
    base: RequestRow

    @property
    def ratio(self) -> float | None:
        a, b = self.run.decode_tps, self.base.decode_tps
        return a / b if a is not None and b else None

    @property
    def uncapped(self) -> bool:
        return not self.run.capped and not self.base.capped


@dataclass(frozen=True)
class BinComparison:
    lo: int
    hi: int
    run: DepthBin | None
    base: DepthBin | None
    state: PartitionState | None = None
    base_state: PartitionState | None = None
    causes: tuple[Cause, ...] = ()

    @property
    def ratio(self) -> float | None:
        a = self.run.decode_tps if self.run else None
        b = self.base.decode_tps if self.base else None
        return a / b if a is not None and b else None

    @property
    def slow(self) -> bool:
        return self.ratio is not None and self.ratio < SLOW

    @property
    def label(self) -> str:
        return (self.run or self.base or DepthBin(self.lo, self.hi, (), 0, 0.0, 0)).label


@dataclass(frozen=True)
class Comparison:
    width: int
    pairs: tuple[Pair, ...]
    unpaired_run: tuple[RequestRow, ...]
    unpaired_base: tuple[RequestRow, ...]
    bins: tuple[BinComparison, ...]

    @property
    def uncapped(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.pairs if p.uncapped and p.ratio is not None)

    @property
    def mean_run(self) -> float | None:
        return mean([p.run.decode_tps or 0.0 for p in self.uncapped])

    @property
    def mean_base(self) -> float | None:
        return mean([p.base.decode_tps or 0.0 for p in self.uncapped])

    @property
    def cost(self) -> float | None:
        """Mean decode rate of the run over the baseline's, minus one (−0.289 is −28.9 %)."""
        a, b = self.mean_run, self.mean_base
        return a / b - 1 if a is not None and b else None

    @property
    def first(self) -> Pair | None:
        return self.uncapped[0] if self.uncapped else None

    @property
    def parity(self) -> bool | None:
        first = self.first
        if first is None or first.ratio is None:
            return None
        return abs(first.ratio - 1) <= PARITY

    @property
    def worst(self) -> BinComparison | None:
        rated = [b for b in self.bins if b.ratio is not None]
        return min(rated, key=lambda b: b.ratio or 0.0) if rated else None

    @property
    def slow_bins(self) -> tuple[BinComparison, ...]:
        return tuple(b for b in self.bins if b.slow)


def _same_depth(a: RequestRow, b: RequestRow) -> bool:
    if a.depth_start is None or b.depth_start is None:
        return False
    return abs(a.depth_start - b.depth_start) <= max(256, DEPTH_MATCH * b.depth_start)


def pair_requests(run: Sequence[RequestRow], base: Sequence[RequestRow]
                  ) -> tuple[list[Pair], list[RequestRow], list[RequestRow]]:
    """Pairs in the order the requests began; a request the other run has no counterpart for
    at its depth stays unpaired (the one that is shallower is skipped first)."""
    a = sorted(run, key=lambda r: r.order)
    b = sorted(base, key=lambda r: r.order)
    pairs: list[Pair] = []
    lone_a: list[RequestRow] = []
    lone_b: list[RequestRow] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if _same_depth(a[i], b[j]):
            pairs.append(Pair(a[i], b[j]))
            i += 1
            j += 1
        elif (a[i].depth_start or 0) < (b[j].depth_start or 0):
            lone_a.append(a[i])
            i += 1
        else:
            lone_b.append(b[j])
            j += 1
    return pairs, lone_a + list(a[i:]), lone_b + list(b[j:])


def _graphs_per_token(table: Sequence[RequestRow], skip: set[int]) -> float | None:
    rs = [r for r in table if r.graphs_delta is not None and r.index not in skip]
    tokens = sum(r.request.decode_tokens or 0 for r in rs)
    return sum(r.graphs_delta or 0 for r in rs) / tokens if tokens else None


def compare(run: PerfRun, base: PerfRun, width: int = DEFAULT_BIN_TOKENS) -> Comparison:
    run_rows, base_rows = rows(run), rows(base)
    pairs, lone_run, lone_base = pair_requests(run_rows, base_rows)
    run_bins = {b.lo: b for b in depth_bins(run_rows, width, include_capped=False)}
    base_bins = {b.lo: b for b in depth_bins(base_rows, width, include_capped=False)}
    out = []
    loose, base_loose = unattached(run), unattached(base)
    for lo in sorted(run_bins.keys() | base_bins.keys()):
        rb, bb = run_bins.get(lo), base_bins.get(lo)
        state = state_at(run, run_rows, rb, loose) if rb is not None else None
        base_state = state_at(base, base_rows, bb, base_loose) if bb is not None else None
        comp = BinComparison(lo, lo + width, rb, bb, state, base_state)
        if comp.slow and state is not None:
            found = causes(state, base_state,
                           _graphs_per_token(run_rows, set(rb.requests) if rb else set()))
            comp = BinComparison(lo, lo + width, rb, bb, state, base_state, tuple(found))
        out.append(comp)
    return Comparison(width, tuple(pairs), tuple(lone_run), tuple(lone_base), tuple(out))
