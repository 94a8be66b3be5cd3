"""What a run recorded about the kv-stream partition in one depth range, and the causes that
evidence names (``kvdiag perf``, docs/perf.md "Causes").

Evidence in a range: the ``kv_stream_adapt`` trace lines whose active pages fall in it (brief
§5.3: active tokens, resident pages per layer, ring slots, deadline samples and misses, copy
busy, ring peak), and the discrete lines — repartitions, fallback warnings, ``fits=false`` —
logged while one of the range's requests was in flight (or, outside any request, at an active
depth in the range). Active pages at a depth are ceil(depth / 256) (brief §1.10), the depth
being the requests' own ``new prompt``/``stop processing`` lines.

A cause is named only from evidence in the same range; a range without any is "not explained
by what the log records" — never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from kvdiag.analysis.perf import DepthBin, RequestRow
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.model.perf import PerfRun, RequestTiming, StreamNote

NOT_EXPLAINED = "not explained by what the log records"
_STARTED = attrgetter("started")
GRAPHS_OFF = 0.1
"""Graphs reused per decoded token at or below which graphs count as not reused."""
GRAPHS_ON = 0.5
"""… and at or above which they count as reused (one graph per decode step when they are)."""

RESIDENT_BELOW = "resident window below the active pages"
RING_STARVED = "ring starved"
THRASH = "partition thrash"
HOST_READS = "fallback to host reads"
GRAPHS_DISABLED = "CUDA graphs disabled (§1.11)"
CAUSE_NAMES = (RESIDENT_BELOW, RING_STARVED, THRASH, HOST_READS, GRAPHS_DISABLED)


@dataclass(frozen=True)
class Cause:
    name: str
    evidence: tuple[str, ...]
    """What was recorded, each citing its line (log) or event (trace)."""


@dataclass(frozen=True)
class PartitionState:
    """The partition and feedback a run recorded at one depth range."""

    lo: int
    hi: int
    active_pages: tuple[int, int] | None
    """Active pages per layer over the range's decodes, from the requests' depths."""
    evaluations: int = 0
    resident: tuple[int, int] | None = None
    ring: tuple[int, int] | None = None
    below: int = 0
    samples: int = 0
    misses: int = 0
    starved: int = 0
    busy_max: float | None = None
    peak_max: int | None = None
    first_adapt_line: int | None = None
    notes: tuple[StreamNote, ...] = ()
    carried: StreamNote | None = None
    """The last repartition logged before the range (same boot): the partition in force when it
    began, recorded outside it."""
    graphs_reused: int | None = None
    graphs_tokens: int = 0
    """Decoded tokens of the range's requests that printed ``graphs reused``."""
    source: str = ""
    unit: str = "line"
    requests: int = 0
    repartitions_max: int = 0
    """The most repartitions logged while one of the range's requests was in flight."""

    def of(self, kind: str) -> tuple[StreamNote, ...]:
        return tuple(n for n in self.notes if n.kind == kind)

    @property
    def miss_ratio(self) -> float | None:
        return self.misses / self.samples if self.samples else None

    @property
    def graphs_per_token(self) -> float | None:
        if self.graphs_reused is None or not self.graphs_tokens:
            return None
        return self.graphs_reused / self.graphs_tokens

    @property
    def recorded(self) -> bool:
        """Anything kv-stream at all in the range."""
        return bool(self.evaluations or self.notes)


def unattached(run: PerfRun) -> frozenset[int]:
    """Notes logged while no request was in flight (attributed by their depth instead)."""
    held = {i for r in run.requests for i in r.notes}
    return frozenset(i for i in range(len(run.notes)) if i not in held)


def state_at(run: PerfRun, table: Sequence[RequestRow], b: DepthBin,
             loose: frozenset[int] | None = None) -> PartitionState:
    """What ``run`` recorded in bin ``b`` (its requests are ``b.requests``); ``loose`` is
    :func:`unattached` of the run, computed once for many bins."""
    members = [table[i] for i in b.requests]
    starts = [r.depth_start for r in members if r.depth_start is not None]
    ends = [r.depth_end for r in members if r.depth_end is not None]
    active = ((-(-min(starts) // PAGE_TOKENS), -(-max(ends or starts) // PAGE_TOKENS))
              if starts else None)
    requests = [r.request for r in members]
    boots = {r.boot for r in requests}
    lo_page, hi_page = b.lo // PAGE_TOKENS + 1, b.hi // PAGE_TOKENS
    pages = [p for p in run.adapt if p.boot in boots and lo_page <= p.page <= hi_page]
    # a bin can hold millions of requests, few of them with notes: one pass picks those
    noted = [r for r in requests if r.notes]
    seen: set[int] = set()
    for r in noted:
        seen.update(r.notes)
    for i in (unattached(run) if loose is None else loose):
        n = run.notes[i]
        if n.boot in boots and n.depth is not None and b.lo <= n.depth < b.hi:
            seen.add(i)
    notes = tuple(run.notes[i] for i in sorted(seen))
    first = _first(requests, boots)
    carried = None
    if first is not None:
        for n in run.notes:
            if n.kind == "repartition" and n.boot == first[0] and n.line < first[1]:
                carried = n
    graphs = [r for r in members if r.graphs_delta is not None]
    busy = [p.busy_max for p in pages if p.busy_max is not None]
    peak = [p.peak_max for p in pages if p.peak_max is not None]
    return PartitionState(
        lo=b.lo, hi=b.hi, active_pages=active,
        evaluations=sum(p.evaluations for p in pages),
        resident=(min(p.resident_min for p in pages), max(p.resident_max for p in pages))
        if pages else None,
        ring=(min(p.ring_min for p in pages), max(p.ring_max for p in pages)) if pages else None,
        below=sum(p.below for p in pages), samples=sum(p.samples for p in pages),
        misses=sum(p.misses for p in pages), starved=sum(p.starved for p in pages),
        busy_max=max(busy) if busy else None, peak_max=max(peak) if peak else None,
        first_adapt_line=min((p.first_line for p in pages), default=None), notes=notes,
        carried=carried,
        graphs_reused=sum(r.graphs_delta or 0 for r in graphs) if graphs else None,
        graphs_tokens=sum(r.request.decode_tokens or 0 for r in graphs),
        source=run.source, unit="line" if run.kind == "log" else "event",
        requests=len(members),
        repartitions_max=max((sum(run.notes[i].kind == "repartition" for i in r.notes)
                              for r in noted), default=0))


def _first(requests: list[RequestTiming], boots: set[int]) -> tuple[int, int] | None:
    """The earliest :attr:`RequestRow.order` of ``requests`` (whose boots are ``boots``):
    computed without a tuple per request (a bin can hold millions)."""
    if not requests:
        return None
    boot = min(boots)
    of_boot = requests if len(boots) == 1 else [r for r in requests if r.boot == boot]
    started = list(map(_STARTED, of_boot))
    if None not in started:
        return boot, min(started)
    return boot, min(r.line if r.started is None else r.started for r in of_boot)


def _at(state: PartitionState, n: StreamNote) -> str:
    return f"{state.unit} {n.line}"


def causes(state: PartitionState, baseline: PartitionState | None = None,
           run_graphs_elsewhere: float | None = None) -> list[Cause]:
    """The causes ``state`` records evidence for (docs/perf.md, "Causes"); empty when none.

    ``baseline`` is the baseline's state at the same range (its graph reuse is the reference);
    ``run_graphs_elsewhere`` the run's own graph reuse per token outside the range, used when
    the baseline printed none."""
    # here, not at the top: the judgement package imports numpy (~0.13 s), which ``kvdiag
    # perf`` without a baseline never needs
    from kvdiag.analysis.judgement.adapt import MISS_THRESHOLD, THRASH_REPARTITIONS

    out: list[Cause] = []
    where = f"{state.unit} {state.first_adapt_line}" if state.first_adapt_line else ""
    # resident window below the active pages: pages stream through the ring
    ev: list[str] = []
    if state.below:
        lo, hi = state.resident or (0, 0)
        ev.append(f"{state.below} of {state.evaluations} kv_stream_adapt evaluations had fewer "
                  f"resident pages/layer ({lo}–{hi}) than active pages (from {where})")
    if state.active_pages is not None:
        for n in state.of("repartition"):
            if n.resident is not None and n.resident[1] < state.active_pages[0]:
                ev.append(f"{_at(state, n)}: repartition to {n.resident[1]} resident pages/layer "
                          f"< {state.active_pages[0]} active pages")
    if ev:
        out.append(Cause(RESIDENT_BELOW, tuple(ev[:4])))
    # ring starved: deadline misses above the controller's 1 % threshold
    ev = []
    if state.starved:
        ratio = state.miss_ratio or 0.0
        ev.append(f"{state.starved} evaluations missed more than {MISS_THRESHOLD:.0%} of their "
                  f"deadlines ({state.misses} of {state.samples} samples, {ratio:.1%}; copy busy "
                  f"up to {state.busy_max if state.busy_max is not None else '?'}%, from {where})")
    for n in state.of("repartition"):
        if n.miss_pct is not None and n.miss_pct > MISS_THRESHOLD * 100:
            ev.append(f"{_at(state, n)}: repartition at miss {n.miss_pct:g}%")
    if ev:
        out.append(Cause(RING_STARVED, tuple(ev[:4])))
    # partition thrash: more repartitions than the porting guide's red flag in one decode loop
    reps = state.of("repartition")
    if state.repartitions_max > THRASH_REPARTITIONS:
        out.append(Cause(THRASH, (f"{state.repartitions_max} repartitions while one request ran "
                                  f"(more than {THRASH_REPARTITIONS} in one decode loop), "
                                  f"{len(reps)} in the range, first at {_at(state, reps[0])}",)))
    # fallback to host reads: the dispatcher sent attention to the host buffer
    fb = state.of("fallback") + state.of("fits-false")
    if fb:
        out.append(Cause(HOST_READS, tuple(
            f"{_at(state, n)}: {n.message[:120]}" for n in fb[:4])
            + ((f"… {len(fb)} such lines",) if len(fb) > 4 else ())))
    # CUDA graphs disabled: a graph reads a kv-stream buffer it may not capture (§1.11)
    mine = state.graphs_per_token
    ref = baseline.graphs_per_token if baseline is not None else None
    ref_what = "the baseline at this depth"
    if ref is None:
        ref, ref_what = run_graphs_elsewhere, "this run's other requests"
    if mine is not None and ref is not None and mine <= GRAPHS_OFF and ref >= GRAPHS_ON:
        out.append(Cause(GRAPHS_DISABLED, (
            f"{state.graphs_reused} CUDA graphs reused over {state.graphs_tokens} decoded tokens "
            f"({mine:.2f}/token) against {ref:.2f}/token in {ref_what} (graphs reused lines)",)))
    return out
