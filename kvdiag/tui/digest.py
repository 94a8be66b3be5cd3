"""What the viewer draws of a trace's judgement, as immutable prefixes (no textual import).

The judging pass (:mod:`kvdiag.tui.judging`) runs the one :class:`~kvdiag.analysis.judgement.
Judge` behind the indexer over the same bytes and hands over :class:`Delta` values: the
judgement so far, the ledger rows added since the last delta, and what the screens show beside
it that the Judge does not keep (telemetry samples, kv_stream_adapt's partition, abort events,
the reader's line-numbered problems). :class:`DigestBuilder` folds deltas into a
:class:`TraceDigest`, the read-only prefix every screen draws from: ``rows`` index rows are
judged, later rows are "judging…" until ``done``. Nothing here decides a class, a condition or
a count — it only assembles what the Judge concluded.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvdiag.analysis.judgement import Judgement, LedgerSnapshot, ledger
from kvdiag.analysis.judgement.ledger import TableSnapshot
from kvdiag.model import events as ev
from kvdiag.model.findings import Finding
from kvdiag.trace.problems import Problem
from kvdiag.tui.clip import clip_deep

TELEMETRY_FIELDS: tuple[str, ...] = (
    "mem_used", "mem_total", "gpu_util", "mem_util", "pcie_rx_kbps", "pcie_tx_kbps",
    "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_mw",
)


PARTITION_FIELDS: tuple[str, ...] = ("resident", "ring", "miss_pct", "busy_pct", "active", "peak")
"""kv_stream_adapt's partition (``adapt`` and ``repartition`` events, 1.1)."""

MARKS: tuple[str, ...] = ("stale", "foreign", "diverged", "fallback", "mismatch")
"""Scrubber marks taken from the ledger (:meth:`LedgerSnapshot.steps_with`); ``abort`` comes
from the abort events."""

MAX_KEPT = 10_000
"""Abort events and problems kept for display (a damaged or hostile file can have millions;
the rest are counted)."""

TABLES: tuple[str, ...] = ("reads", "pieces", "flows", "fits", "outputs")
"""The ledger's tables, in :class:`LedgerSnapshot`'s order."""
DTYPES = tuple(np.dtype(c) for c in (ledger.READS, ledger.PIECES, ledger.FLOWS, ledger.FITS,
                                      ledger.OUTPUTS))


@dataclass(frozen=True, eq=False)
class TelemetrySeries:
    """Samples in file order: ``step`` and ``t_ns`` per sample and one float array per field
    (NaN where the sample has no value)."""

    step: np.ndarray
    t_ns: np.ndarray
    values: dict[str, np.ndarray] = field(default_factory=dict)
    fields: tuple[str, ...] = TELEMETRY_FIELDS

    @property
    def n(self) -> int:
        return len(self.step)

    def present(self) -> list[str]:
        """Fields with at least one sample."""
        return [k for k in self.fields if k in self.values
                and bool(np.any(~np.isnan(self.values[k])))]

    def sample_at_step(self, step: int) -> int | None:
        """The last sample taken at or before ``step`` (the first one before any)."""
        if self.n == 0:
            return None
        i = int(np.searchsorted(self.step, step, side="right")) - 1
        return max(i, 0)


def telemetry_series(samples: Sequence[ev.Telemetry]) -> TelemetrySeries:
    step = np.array([s.step for s in samples], dtype=np.int64)
    t_ns = np.array([s.t_ns for s in samples], dtype=np.int64)
    values = {
        name: np.array([np.nan if getattr(s, name) is None else float(getattr(s, name))
                        for s in samples], dtype=np.float64)
        for name in TELEMETRY_FIELDS
    }
    return TelemetrySeries(step, t_ns, values)


def _nan(v: float | None) -> float:
    return np.nan if v is None else float(v)


def partition_series(samples: Sequence[ev.Adapt | ev.Repartition]) -> TelemetrySeries:
    """One sample per adapt line (the partition it ran with) and per repartition (the
    partition after it). An adapt line's miss % is misses / samples: the deadline miss ratio
    the controller compares with its 1 % threshold (brief §1.10)."""
    rows: list[tuple[float, ...]] = []
    for e in samples:
        if isinstance(e, ev.Adapt):
            miss = (100.0 * e.misses / e.samples if e.misses is not None and e.samples
                    else np.nan)
            rows.append((e.resident, e.ring, miss, _nan(e.busy_pct), e.active, _nan(e.peak)))
        else:
            rows.append((e.resident[1], e.ring[1], _nan(e.miss_pct), _nan(e.busy_pct),
                         np.nan, np.nan))
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(PARTITION_FIELDS))
    return TelemetrySeries(
        np.array([e.step for e in samples], dtype=np.int64),
        np.array([e.t_ns for e in samples], dtype=np.int64),
        {name: table[:, i] for i, name in enumerate(PARTITION_FIELDS)},
        PARTITION_FIELDS,
    )


def _joined(parts: Sequence[TelemetrySeries], fields: tuple[str, ...]) -> TelemetrySeries:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        empty = np.zeros(0, np.int64)
        return TelemetrySeries(empty, empty, {f: np.zeros(0) for f in fields}, fields)
    return TelemetrySeries(np.concatenate([p.step for p in parts]),
                           np.concatenate([p.t_ns for p in parts]),
                           {f: np.concatenate([p.values[f] for p in parts]) for f in fields},
                           fields)


@dataclass(frozen=True)
class BlockRef:
    """Where a sealed ledger block lies in the judging process's ledger file
    (:mod:`kvdiag.tui.judgecache`): ``rows`` rows from byte ``offset``."""

    offset: int
    rows: int


@dataclass(frozen=True, eq=False)
class TableDelta:
    """Ledger rows of one table added since the previous delta: the blocks sealed since (final;
    from a judging process, :class:`BlockRef` values until the viewer maps them), a copy of the
    rows still open, and the table's row count.

    A judging process writes sealed rows to its ledger file only once enough have gathered
    (:class:`~kvdiag.tui.judgecache.LedgerWriter`); until then each delta carries the sealed
    rows new since the previous one as ``pending`` (final, sent once), which the viewer keeps
    after its mapped blocks. A written block holds every row pending before it: a delta whose
    ``sealed`` is not empty ends what the viewer keeps pending for the table."""

    sealed: tuple[np.ndarray | BlockRef, ...]
    open: np.ndarray | None
    n: int
    pending: tuple[np.ndarray, ...] = ()


@dataclass(frozen=True, eq=False)
class Delta:
    """What a judging pass hands over at one moment (picklable: it may come from another
    process). ``judgement`` has no ledger: the ledger travels as :class:`TableDelta` rows."""

    rows: int
    """Index rows judged (events and lines that are not events)."""
    position: int
    """Bytes of the file judged."""
    judgement: Judgement
    tables: tuple[TableDelta, ...]
    telemetry: TelemetrySeries
    partition: TelemetrySeries
    aborts: tuple[ev.Abort, ...]
    problems: tuple[Problem, ...]
    truncated: bool
    done: bool
    costs: dict[str, float] = field(default_factory=dict)
    """What the pass cost so far where it ran in a process of its own (``cpu_s``,
    ``peak_rss_mib``): a viewer's own figures do not include it."""
    marks_sealed: dict[str, np.ndarray] = field(default_factory=dict)
    """Scrubber marks (:data:`MARKS`) of the sealed rows this delta adds (:func:`marks_of`):
    made where the rows are, so that a viewer never reads a whole table for them."""
    marks_open: dict[str, np.ndarray] = field(default_factory=dict)
    """The marks of the rows still open (asked again until they are sealed)."""
    aborts_more: int = 0
    """Abort events beyond ``aborts`` (counted, not carried: a judgement read back)."""
    problems_more: int = 0
    widest_page: int = 0
    """One past the highest page any read so far got stale, foreign or not judged (the Pages
    grid covers it: such a read may lie beyond every write and upload)."""


@dataclass(frozen=True, eq=False)
class TraceDigest:
    """The judgement of the first ``rows`` index rows of a trace, and what the screens draw
    beside it; ``done`` once the whole file is judged."""

    judgement: Judgement
    rows: int
    position: int
    done: bool
    marks: dict[str, np.ndarray]
    """Sorted unique steps per scrubber mark: ``stale``, ``foreign``, ``diverged``,
    ``fallback``, ``mismatch`` (from the ledger) and ``abort``."""
    aborts: tuple[ev.Abort, ...]
    aborts_total: int
    problems: tuple[Problem, ...]
    problems_total: int
    truncated: bool
    costs: dict[str, float] = field(default_factory=dict)
    widest_page: int = 0
    """:attr:`Delta.widest_page` of the last delta."""
    """The judging process's CPU time and peak memory (a pass in a child process)."""
    _telemetry: tuple[TelemetrySeries, ...] = ()
    _partition: tuple[TelemetrySeries, ...] = ()

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.judgement.findings

    @property
    def ledger(self) -> LedgerSnapshot:
        assert self.judgement.ledger is not None
        return self.judgement.ledger

    @property
    def complete(self) -> bool:
        """The trace has its End event."""
        return self.judgement.end is not None

    @functools.cached_property
    def telemetry(self) -> TelemetrySeries:
        return _joined(self._telemetry, TELEMETRY_FIELDS)

    @functools.cached_property
    def partition(self) -> TelemetrySeries:
        return _joined(self._partition, PARTITION_FIELDS)

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """``kvdiag check --json``'s summary of the judged prefix, with the problems kept."""
        out = self.judgement.summary()
        out["problems"] = [{"line": p.line, "kind": p.kind, "message": p.message}
                           for p in self.problems]
        return out


class DigestBuilder:
    """Folds the deltas of one judging pass, in order, into digests."""

    def __init__(self) -> None:
        self._sealed: list[list[np.ndarray]] = [[] for _ in TABLES]
        self._pending: list[list[np.ndarray]] = [[] for _ in TABLES]
        self._marks: dict[str, np.ndarray] = {m: np.zeros(0, np.int64) for m in MARKS}
        self._aborts: list[ev.Abort] = []
        self._aborts_total = 0
        self._problems: list[Problem] = []
        self._problems_total = 0
        self._telemetry: list[TelemetrySeries] = []
        self._partition: list[TelemetrySeries] = []
        self.latest: TraceDigest | None = None

    def add(self, delta: Delta) -> TraceDigest:
        tables = []
        for i, t in enumerate(delta.tables):
            pending = self._pending[i]
            if t.sealed:
                pending.clear()  # a written block holds them (TableDelta)
            for b in t.sealed:
                if isinstance(b, BlockRef):
                    raise ValueError("a ledger block not mapped yet")
                self._sealed[i].append(b)
            pending += t.pending
            blocks = [*self._sealed[i], *pending, *(() if t.open is None else (t.open,))]
            tables.append(TableSnapshot(DTYPES[i], blocks, t.n, len(self._sealed[i]) + len(pending)))
        # Marks of the rows this delta adds: sealed ones are final, open ones are asked
        # again until they are sealed.
        empty = np.zeros(0, np.int64)
        self._marks = {m: np.union1d(self._marks[m], delta.marks_sealed.get(m, empty))
                       for m in MARKS}
        marks = {m: np.union1d(self._marks[m], delta.marks_open.get(m, empty)) for m in MARKS}
        self._aborts_total += len(delta.aborts) + delta.aborts_more
        self._aborts += clip_deep(delta.aborts[:max(0, MAX_KEPT - len(self._aborts))])
        self._problems_total += len(delta.problems) + delta.problems_more
        self._problems += clip_deep(delta.problems[:max(0, MAX_KEPT - len(self._problems))])
        if delta.telemetry.n:
            self._telemetry.append(delta.telemetry)
        if delta.partition.n:
            self._partition.append(delta.partition)
        aborts = tuple(self._aborts)
        marks["abort"] = np.unique(np.array([a.step for a in aborts], dtype=np.int64))
        self.latest = TraceDigest(
            judgement=dataclasses.replace(clip_deep(delta.judgement),
                                          ledger=LedgerSnapshot(*tables)),
            rows=delta.rows, position=delta.position, done=delta.done, marks=marks,
            aborts=aborts, aborts_total=self._aborts_total, problems=tuple(self._problems),
            problems_total=self._problems_total, truncated=delta.truncated,
            costs=delta.costs, widest_page=delta.widest_page, _telemetry=tuple(self._telemetry), _partition=tuple(self._partition))
        return self.latest


def marks_of(blocks: Sequence[Sequence[np.ndarray]]) -> dict[str, np.ndarray]:
    """:meth:`LedgerSnapshot.steps_with` of some rows of each table (the rule of what makes a
    mark is the ledger's)."""
    part = LedgerSnapshot(*(TableSnapshot(d, b, sum(len(x) for x in b))
                            for d, b in zip(DTYPES, blocks, strict=True)))
    return {m: part.steps_with(m) for m in MARKS}
