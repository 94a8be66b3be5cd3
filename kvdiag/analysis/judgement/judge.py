"""The streaming Judge: feed raw events in file order, read the judgement at any point.

One pass, a chunk of events at a time (:mod:`~kvdiag.analysis.judgement.columns` takes the fields
the pages need out of the events, :mod:`~kvdiag.analysis.judgement.batch` judges a chunk's pages
from them with array operations); memory is bounded by the trace's geometry (host pages, slots,
open findings' capped evidence), not its length — unless a ledger is asked for
(:mod:`~kvdiag.analysis.judgement.ledger`), which keeps a compact row per read.

Per event kind:

- ``write``: host versions (:mod:`~kvdiag.analysis.judgement.slots`), the last write per page;
  ``versions`` (the model's annotation) is compared, never used;
- ``upload`` / ``evict`` / ``invalidate``: slot contents; upload statistics;
- ``read``: every page of its ``served`` runs judged (:mod:`~kvdiag.analysis.judgement.classes`);
  its ``ranges`` (the model's annotation) compared, never used; a read without ``served`` is
  not judged;
- ``fits``: outcome and conditions (:mod:`~kvdiag.analysis.judgement.fits`), evaluated for
  every decision that makes a finding; routes counted by name (one outside the four too:
  :func:`~kvdiag.analysis.judgement.fits.route_name`);
- ``output``: diverged / within tolerance / no reference;

Fits and outputs are counted and tabled from their columns however the events came (a list,
a stream taken out in Python or by the C accumulator: :meth:`Judge._fits_cols`,
:meth:`Judge._outputs_cols`); the few the columns cannot settle are seen as they come.
- ``step`` and every event's ``step``: the steps (:class:`Steps`);
- ``abort``, ``end``, ``adapt``, ``repartition``: as recorded;
- every event's ``seq``: a jump is events lost (:mod:`.gaps`): an ``events-lost`` finding, and
  from there on what every slot holds is unknown until an upload fills it again; the End's
  ``events`` above what the seqs account for is events lost whose place is unknown (said by
  the same finding; the classes stay, said to rest possibly on them).

The reads of the last chunk fed keep their verdicts: :attr:`Judge.last`, :meth:`Judge.verdict`,
:meth:`Judge.pages` and :meth:`Judge.missed_writes` answer for them (feed a step or a layer's
events with :meth:`Judge.feed_all`, then ask).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from kvdiag.analysis.judgement import crosscheck
from kvdiag.analysis.judgement import findings as fnd
from kvdiag.analysis.judgement.adapt import AdaptAnalyzer
from kvdiag.analysis.judgement.batch import (
    REASONS,
    Chunk,
    State,
    judge_chunk,
)
from kvdiag.analysis.judgement.classes import (
    CLASSES,
    EXACT,
    FOREIGN,
    HOST,
    LOST_EVENTS,
    MAX_PAGE,
    NO_DISPATCH,
    NO_SERVED,
    NO_UPLOAD,
    NO_WRITE,
    NOT_JUDGED,
    POOL,
    RING,
    SOURCES,
    STALE,
    WHY,
    WHY_KEY,
)
from kvdiag.analysis.judgement.columns import (
    FITS,
    OTHER,
    OUTPUT,
    STEP,
    TYPE_OF,
    Cols,
    accumulator,
    concat,
    extract,
    taken,
)
from kvdiag.analysis.judgement.completeness import Completeness, CompletenessTracker
from kvdiag.analysis.judgement.fits import (
    OTHER_ROUTE,
    OUTCOME_CODE,
    ROUTES,
    UNKNOWN_ROUTE,
    FitsJudge,
    FitsVerdict,
    outcome_of,
    route_code,
    route_name,
)
from kvdiag.analysis.judgement.gaps import Gap, SeqGaps, one_by_one
from kvdiag.analysis.judgement.ledger import Ledger, LedgerSnapshot
from kvdiag.analysis.judgement.linescan import ready as scan_ready
from kvdiag.analysis.judgement.seqjudge import available as walk_available
from kvdiag.analysis.judgement.seqjudge import judge_streamed
from kvdiag.analysis.judgement.slots import Copy, Piece
from kvdiag.analysis.judgement.snapshot import matches, seed
from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence, Finding
from kvdiag.model.pages import PAGE_TOKENS

CHUNK = 2048
"""Events of a list judged together (:meth:`Judge.feed_all`): array operations cost per call,
and a chunk's events are read several times over, so it should stay in the processor's cache
(measured: 2048 beats 512 and 8192)."""
SUB = 256
"""Events of a stream whose fields are taken out together (:mod:`.columns`), right after they
are decoded."""
SUB_C = 1024
"""The same where they are taken out in C: the Python per run of events weighs more than the
events left in the cache (bench_check's native and served-only traces, alternated on a quiet
machine: 1.85 and 2.69 s best CPU against 2.11 and 2.95 s with 256; 4096 was slower)."""
STREAM_CHUNK = 4096
"""Events of a stream judged together by the array judgement, from their columns: 4096 and
8192 judged the benchmark traces equally fast, and 4096 keeps a streamed check's peak memory
where 2048 had it (46.6 against 45.5 MiB; 8192: 51.3 MiB; benchmarks/results/bench_check.txt)."""
STREAM_CHUNK_C = 16384
"""The same where the C walk judges them (:mod:`.seqjudge`): its cost is per event, the
Python around it per chunk (bench_check's native trace: 2.16 s best and 2.39 s mean CPU
against 2.50 and 2.62 s with 4096 chunks, alternated on a quiet machine)."""
STREAM_CHUNK_LEDGER_C = 8192
"""The same for a Judge that keeps a ledger (the TUI's judging process): its rows per chunk
cost memory, and on bench_tui's 5M-event trace 8192 judged as fast as 16384 (26.1 against 26.2
s CPU, the same minutes) with a peak RSS of 93 against 120 MiB."""
_SPECIAL = frozenset({ev.Records, ev.Unknown, ev.Snapshot})
"""Kinds that change how the events after them are judged: a stream is judged up to them
first."""
_FIRST = operator.itemgetter(0)


class _Annotated(NamedTuple):
    """What the cross-check reads of a read event (:func:`.crosscheck.disagrees`)."""

    stream: int
    served: tuple[ev.Served, ...]
    ranges: tuple[ev.ReadRange, ...]




FITS_ASSERT = "ggml_cuda_kv_stream_fattn_fits"
"""The streamed kernel's assert (``GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst))``,
kv-stream-domain.md §2.3): its abort says a fits decision was made."""
FALLBACK_WARN = "kv-stream-fallback"
"""The fixed dispatcher's warning when fits() is false (docs/trace-format.md, ``warn``)."""


@dataclass(frozen=True)
class Steps:
    """How many steps: the span of step numbers the events carry (``end`` excluded), whether or
    not ``step`` events mark them — one rule for every surface. ``recorded`` counts the
    ``step`` events (0: the steps are only the writer's numbering)."""

    first: int | None
    last: int | None
    recorded: int

    @property
    def count(self) -> int:
        return 0 if self.first is None or self.last is None else self.last - self.first + 1

    def text(self) -> str:
        n = self.count
        if n == 0:
            return "no steps"
        head = f"{n} step(s)" if self.first == 0 else f"{n} step(s) ({self.first}-{self.last})"
        return head if self.recorded else f"{head}, numbered by the writer (no step events)"


class PageVerdict(NamedTuple):
    """One page of one read, judged (``kvdiag trace pages`` prints these)."""

    seq: int
    step: int
    layer: int
    stream: int
    page: int
    source: str
    slot: int
    cls: str
    lag: int
    """Writes the copy missed (stale only)."""
    version: int
    """The host page's version at the read."""
    holder: Copy | None
    """The copy the slot held (None: nothing, a host page, or not judged)."""
    why: str
    """Why it is not judged (empty otherwise)."""


class ReadVerdict(NamedTuple):
    """The last read fed: page counts by class and its non-exact runs (pieces)."""

    seq: int
    step: int
    layer: int
    stream: int
    counts: tuple[int, int, int, int]
    """Pages exact, stale, foreign, not judged."""
    pieces: tuple[Piece, ...]
    """Runs of pages that are not exact (:data:`~kvdiag.analysis.judgement.slots.Piece`)."""

    @property
    def worst(self) -> str:
        for cls in (FOREIGN, STALE, NOT_JUDGED):
            if self.counts[cls]:
                return CLASSES[cls]
        return "exact"


class Judge:
    """Feed events in file order (:meth:`feed`, :meth:`feed_all`); :meth:`snapshot` gives the
    judgement of what was fed so far.

    ``header``: what the writer declares it records, ``native_quants`` for fits conditions.
    ``ledger``: keep compact per-read tables (for viewers). ``name``: the trace's path, used in
    the command that lists every judged page. ``records``: a declaration of recorded kinds
    given by the caller (overrides the header's). ``keep_writes``: keep the last write event of
    every page with its ubatch's mark (:meth:`last_write`; memory bounded by the pages).
    ``flows``: find the writes each read missed (:meth:`missed_writes`). ``detail``: the copy
    behind every page :meth:`pages` lists, exact ones too (else only non-exact pages say which
    upload made their copy). ``kvdiag check`` needs none of these; each costs time."""

    def __init__(self, header: ev.Header | None = None, *, ledger: bool = False,
                 name: str | None = None, records: Iterable[str] | None = None,
                 keep_writes: bool = False, flows: bool = False, detail: bool = False
                 ) -> None:
        self.header = header
        self.name = name
        declared = records if records is not None else getattr(header, "records", None)
        self.completeness = CompletenessTracker(declared)
        self.fits_judge = FitsJudge(header)
        self.ledger = Ledger() if ledger else None
        self.state = State()
        self.state.writes = self.completeness.is_declared("write")
        up = self.completeness.is_declared("upload")
        self.state.uploads = [up, up]
        self.groups = fnd.Groups()
        self.adapt = AdaptAnalyzer()
        self.keep_writes = keep_writes
        self.flows = flows or keep_writes
        """Find the writes stale and foreign pages missed (:meth:`missed_writes`; the ledger
        always does)."""
        self.detail = detail or keep_writes
        """Keep the upload seq and step of every page's copy, exact ones too (what
        :meth:`pages` shows of them; non-exact pages always have it)."""
        self.mark: ev.Mark | None = None
        """The latest mark event (kept with writes when ``keep_writes``)."""
        self._writes: dict[tuple[int, int, int], tuple[ev.Write, ev.Mark | None]] = {}
        self.rows = 0
        """Events fed (and rows skipped): the ledger's row numbers."""
        self.last_seq = 0
        self.end: ev.End | None = None
        self._first_step: int | None = None
        self._last_step: int | None = None
        self.classes = np.zeros((3, 4), np.int64)
        """Pages by source (pool, ring, host) and class (exact, stale, foreign, not judged)."""
        self.not_judged_why: Counter[int] = Counter()
        self.pages_read = np.zeros(3, np.int64)
        """Pages the reads' own counts say (pool, ring, host)."""
        self.reads = [0, 0]
        """Reads judged (with served), reads without served."""
        self.routes: Counter[str] = Counter()
        self.out_of_range = 0
        self._arisen: set[tuple[Any, ...]] = set()
        self._types: Counter[type] = Counter()
        self._unknown: Counter[str] = Counter()
        self._chunk: Chunk | None = None
        self._unserved: dict[int, int] = {}
        """Reads of the last chunk without served pages: index → pages."""
        self._index: dict[int, int] | None = None
        self._flows_by_read: tuple[Chunk, np.ndarray, np.ndarray] | None = None
        self._pending: list[Cols] = []
        """Columns of streamed events not judged yet (:meth:`feed_all`)."""
        self._held = 0
        self._waiting: list[Any] = []
        """Streamed events not taken out yet, and their types."""
        self._waiting_types: list[type] = []
        self._waiting_lose: list[int] = []
        """Positions in :attr:`_waiting` after events lost from the trace (:mod:`.gaps`)."""
        self._acc: Any = None
        """The C accumulator of a stream's columns (:meth:`_accumulator`; False: none here)."""
        self._acc_from = (0, 0)
        """The Judge's row and the position of the first event it holds."""
        self._acc_others: list[tuple[int, type]] = []
        self._acc_failed: dict[int, int] = {}
        self._acc_routes: list[str] = []
        """Routes outside :data:`~.fits.ROUTES` the accumulator handed over since its last
        take, by name (:meth:`_fits_seen`)."""
        self._acc_unreferenced = 0
        """Outputs without a reference the accumulator handed over since its last take."""
        self._acc_lose: list[int] = []
        """Positions of what the accumulator holds after events lost from the trace."""
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.Abort: self._abort, ev.Warn: self._warn,
            ev.End: self._end, ev.Repartition: self.adapt.feed,
            ev.Adapt: self.adapt.feed, ev.Unknown: self._unknown_event,
            ev.Records: self._records,
        }
        if keep_writes:
            self._handlers[ev.Mark] = self._mark
        self.gaps = SeqGaps(header)
        """Events lost from the trace: jumps in seq (:mod:`.gaps`)."""
        self.snapshot_replaced: list[int] = []
        """Seqs of snapshots that replaced a state the events had built (a gap before them,
        or a writer that disagrees with the judgement): :mod:`.snapshot`."""

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, event: ev.AnyEvent | ev.Unknown) -> None:
        """One event (a chunk of one: :meth:`feed_all` is much faster for many)."""
        self._flush()
        self._judge_checked([event])

    def feed_all(self, events: Iterable[ev.AnyEvent | ev.Unknown], size: int = CHUNK, *,
                 hold: bool = False) -> Judge:
        """Feed every event of ``events``, judged with array operations
        (:mod:`~kvdiag.analysis.judgement.batch`). A list is judged ``size`` (:data:`CHUNK`)
        events at a time, and the reads of its last chunk can be asked about (:meth:`verdict`,
        :meth:`pages`, ...). Any other iterable (a reader: ``kvdiag check``) is streamed: the
        fields the judgement needs are taken out a block at a time (the blocks a
        :class:`~kvdiag.trace.reader.TraceReader` decodes, as it decodes them: anything with a
        ``blocks()`` method; else :data:`SUB` events), while the decoder has just made them,
        and judged :data:`STREAM_CHUNK` events at a time — or sooner, when :meth:`arisen` or
        :meth:`snapshot` is asked while the stream waits (``kvdiag check --follow``). The
        reads of a stream are asked about by seq (:meth:`verdict` finds them). ``hold``: a
        stream's last events are counted and handled but their pages wait to be judged with
        the next call's (or when :meth:`snapshot`, :meth:`arisen` or :meth:`skip` is asked),
        so that a caller feeding many small streams (the TUI, a block of lines at a time)
        still judges :data:`STREAM_CHUNK` events at a time."""
        if isinstance(events, list):
            self._flush()
            for chunk in batches(events, size):
                self._judge_checked(chunk)
            return self
        blocks = getattr(events, "blocks", None)
        if callable(blocks):
            # a reader that can (TraceReader.scans) lets the lines this Judge reads itself
            # into its columns (scan) pass undecoded
            scans = getattr(events, "scans", False) is True and self._walks
            source: Iterable[Any] = blocks(self.scan) if scans else blocks()
        else:
            it = iter(events)
            source = iter(lambda: list(itertools.islice(it, SUB)), [])
        acc = self._accumulator()
        for block in source:
            if not block:
                continue
            if acc is not None and self._accumulate(acc, block):
                del block
                if self._held >= self._stream_chunk:
                    self._flush()
                continue
            types = list(map(type, block))
            if not _SPECIAL.isdisjoint(types):
                # a declaration or a segment's snapshot changes how what follows is judged
                self._flush()
                for chunk in batches(block):
                    self._judge_checked(chunk)
                continue
            cuts = self.gaps.split(block)
            if cuts:  # events lost: from each gap on, what the slots hold is unknown
                at = len(self._waiting)
                self._waiting_lose += [at + i for g, i in cuts if not g.onto_snapshot]
            # a reader's blocks can be small (a pipe gives what was written): gathered to SUB
            self._take_acc()
            self._waiting += block
            self._waiting_types += types
            # freed before the next events are decoded, so the decoder reuses their memory
            del block, types
            if len(self._waiting) >= (SUB_C if self._walks else SUB):
                self._take_waiting()
                if self._held >= self._stream_chunk:
                    self._flush()
        if hold:
            self._take_waiting()
            self._take_acc()
        else:
            self._flush()
        return self

    def _accumulator(self) -> Any | None:
        """The C accumulator of a stream's columns, where the C walk judges them (None: the
        stream's events are gathered to :data:`SUB_C` and taken out together)."""
        if not self._walks:
            return None
        if self._acc is None:
            self._acc = accumulator(tuple(_SPECIAL)) or False
        return self._acc or None

    def _accumulate(self, acc: Any, block: list[Any]) -> bool:
        """Take out the columns of one decoded block as the decoder made it, so that its events
        are freed right away (measured: events held alive until a larger run was taken out cost
        the decoder and the deallocator their cache), and handle the few Python must see.
        False: the block holds a kind that changes how what follows is judged, or a value the
        C pass declines; nothing was taken."""
        if self._waiting:  # a block before was declined: its columns come first
            self._take_waiting()
        local, base, rows0 = acc.count, self._held, self.rows
        try:
            handed = acc.add(block, base, not self.groups.no_reference.full)
        except (TypeError, ValueError, OverflowError):
            return False  # the reference path below, for this block
        if handed is None:
            return False
        if not local:
            self._acc_from = (rows0, base)
        cuts = self.gaps.split(block)
        if cuts:  # events lost: from each gap on, what the slots hold is unknown
            self._acc_lose += [base + i for g, i in cuts if not g.onto_snapshot]
        n = len(block)
        self._held += n
        if handed:
            handler = self._handlers.get
            feed_adapt = self.adapt.feed
            for i in handed:
                e = block[i]
                t = type(e)
                if t is ev.Step:
                    feed_adapt(e)
                elif t is ev.Output:
                    d = e.diverged
                    self._acc_unreferenced += d is None
                    self._output(e, d)
                elif t is ev.Fits:
                    self._fits_seen(e, base + i, self._acc_failed, self._acc_routes)
                else:
                    self._acc_others.append((local + i, t))
                    h = handler(t)
                    if h is not None:
                        self.rows = rows0 + i
                        h(e)
        self.rows = rows0 + n
        self.last_seq = block[-1].seq
        return True

    def scan(self, data: bytes, start: int, last_seq: int) -> tuple[int, int, int]:
        """Take lines of ``data`` from byte ``start`` straight into the columns
        (:mod:`.linescan`: the fields read from their bytes, as :meth:`_accumulate` takes them
        from their decoded events), while the lines' seqs go on one by one from ``last_seq``
        (the reader's last) and :meth:`feed_all` streams. Returns ``(stop, count, resume)``:
        ``count`` lines taken, ending at byte ``stop`` where the first line declined begins
        (the caller decodes it, and the lines after it up to byte ``resume``, where one begins
        that may be taken again)."""
        acc = self._accumulator()
        expect = self.gaps.next
        if acc is None or expect is None or expect != last_seq + 1 or not scan_ready(acc):
            return start, 0, start
        if self._waiting:  # a block before was decoded and declined: its columns come first
            self._take_waiting()
        local, base, rows0 = acc.count, self._held, self.rows
        # no more than a judging chunk's worth: chunks stay the size streamed events make
        limit = max(self._stream_chunk - self._held, 1)
        stop, count, step, resume = acc.scan(data, start, base, expect, limit)
        if count:
            if not local:
                self._acc_from = (rows0, base)
            self._held += count
            self.rows = rows0 + count
            self.last_seq = expect + count - 1
            self.gaps.went_on(count, step)
            if self._held >= self._stream_chunk:
                self._flush()
        return stop, count, resume

    def _take_acc(self) -> None:
        """What the accumulator holds, counted and handed to the columns waiting to be
        judged."""
        acc = self._acc
        if not acc or not acc.count:
            return
        cols = taken(acc)
        rows0, base = self._acc_from
        cols.rows0 = rows0
        if self._acc_lose:
            cols.lose = np.array(self._acc_lose, np.int64)
            self._acc_lose = []
        others, self._acc_others = self._acc_others, []
        failed, self._acc_failed = self._acc_failed, {}
        names, self._acc_routes = self._acc_routes, []
        unreferenced, self._acc_unreferenced = self._acc_unreferenced, 0
        self._count(cols, others)
        self._step_range(cols.step, [i for i, t in others if t is ev.End])
        self._fits_cols(cols, base, failed, names)
        self._outputs_cols(cols, base, unreferenced)
        self._pending.append(cols)

    def _outputs_cols(self, cols: Cols, base: int, unreferenced: int) -> None:
        """The outputs of a run of events, from its columns (``base``: the position of its
        first event), however the events came (the one place they are counted and tabled):
        those that diverged, and those without a reference while their finding kept evidence,
        were judged as they came (:meth:`_output`; ``unreferenced``: how many of them had no
        reference); the rest are counted."""
        div = cols.o_div
        if not div.size:
            return
        self.groups.no_reference.count += int((div == -1).sum()) - unreferenced
        if self.ledger is not None:
            local = cols.o_pos - base
            self.ledger.outputs.extend([cols.rows0 + local, cols.o_seq, cols.step[local],
                                        cols.o_stream, div])

    @property
    def _stream_chunk(self) -> int:
        """Events of a stream judged together (:meth:`feed_all`)."""
        if not self._walks:
            return STREAM_CHUNK
        return STREAM_CHUNK_C if self.ledger is None else STREAM_CHUNK_LEDGER_C

    @property
    def _walks(self) -> bool:
        """A stream's chunks are judged by the C walk (:mod:`.seqjudge`)."""
        return not self.detail and walk_available()

    def _take_waiting(self) -> None:
        if self._waiting:
            block, types = self._waiting, self._waiting_types
            self._waiting, self._waiting_types = [], []
            cols = self._take(block, types, keep_reads=False, base=self._held)
            if self._waiting_lose:
                cols.lose = np.array(self._waiting_lose, np.int64) + self._held
                self._waiting_lose = []
            self._pending.append(cols)
            self._held += len(block)

    def _flush(self) -> None:
        """Judge the streamed events not judged yet."""
        self._take_waiting()
        self._take_acc()
        if self._pending:
            cols = concat(self._pending)
            self._pending, self._held = [], 0
            self._judge_cols(cols, int(cols.rows0), streamed=True)

    def skip(self, n: int = 1) -> None:
        """Rows that are not events (an index's corrupt lines): keeps ledger rows aligned."""
        self._flush()
        self.rows += n

    def _judge_checked(self, chunk: list[Any]) -> None:
        """:meth:`_judge` of the next events in file order, checked for lost events."""
        cuts = self.gaps.split(chunk)
        if cuts:
            self._judge_cut(chunk, cuts)
        else:
            self._judge(chunk)

    def _judge_cut(self, events: list[Any], cuts: list[tuple[Gap, int]]) -> None:
        """Judge ``events`` with the state made unknown at each gap (``cuts``: the gap before
        ``events[i]``): :meth:`.batch.State.lose`."""
        start = 0
        for gap, i in cuts:
            for part in batches(events[start:i]):
                self._judge(part)
            if not gap.onto_snapshot:  # a snapshot sets the state itself
                self.state.lose(self.rows)
            start = i
        for part in batches(events[start:]):
            self._judge(part)

    def _judge(self, chunk: list[Any]) -> None:
        types = list(map(type, chunk))
        if types.count(ev.Snapshot):
            # a segment's starting state (format 1.2): what follows is judged from it
            i = types.index(ev.Snapshot)
            if len(chunk) > 1:
                if i:
                    self._judge(chunk[:i])
                self._judge([chunk[i]])
                if i + 1 < len(chunk):
                    self._judge(chunk[i + 1:])
                return
            self._snapshot(chunk[0])
        if len(chunk) > 1 and (types.count(ev.Records) or types.count(ev.Unknown)):
            # a records event declares more kinds: what follows it is judged with them
            for i, e in enumerate(chunk):
                if _declares(e):
                    if i:
                        self._judge(chunk[:i])
                    self._judge([e])
                    if i + 1 < len(chunk):
                        self._judge(chunk[i + 1:])
                    return
        rows0 = self.rows
        cols = self._take(chunk, types, keep_reads=True)
        self._judge_cols(cols, rows0)

    def _take(self, chunk: list[Any], types: list[type], keep_reads: bool, base: int = 0
              ) -> Cols:
        """Everything of ``chunk`` but its pages (counts, steps, fits, the other kinds'
        handlers), and the columns its pages are judged from (rows from :attr:`rows` on;
        ``base``: the position of its first event in the columns it will be judged with)."""
        n = len(chunk)
        cols = extract(chunk, types, keep_reads, base)
        others = cols.of_kind(OTHER)
        self._count(cols, [(i, types[i]) for i in others])
        self._step_range(cols.step, [i for i in others if types[i] is ev.End]
                         if types.count(ev.End) else [])
        rows0 = self.rows
        cols.rows0 = rows0
        handler = self._handlers.get
        feed_adapt = self.adapt.feed
        steps = cols.of_kind(STEP)
        # in file order: a repartition belongs to the decode loop its steps say it is in
        for i in heapq.merge(others, steps) if others else steps:
            t = types[i]
            if t is ev.Step:
                feed_adapt(chunk[i])
                continue
            h = handler(t)
            if h is not None:
                self.rows = rows0 + i
                h(chunk[i])
        outputs = cols.of_kind(OUTPUT)
        if outputs:
            self._outputs_seen(chunk, outputs, cols, base)
        fits = cols.of_kind(FITS)
        if fits:
            self._fits_seen_all(chunk, fits, cols, base)
        if self.keep_writes:
            self._keep_writes(chunk, types)
        self.rows = rows0 + n
        self.last_seq = chunk[-1].seq
        return cols

    def _count(self, cols: Cols, others: list[tuple[int, type]]) -> None:
        """Events per kind, the kinds in the order they first appear (as
        ``Counter.update(types)`` would count them, without a step per event); ``others``:
        the index and type of each event of a kind the columns do not hold."""
        seen: list[tuple[int, type, int]] = []
        for code, t in TYPE_OF.items():
            n = cols.count(code)
            if n:
                seen.append((cols.first(code), t, n))
        if others:
            firsts: dict[type, int] = {}
            for i, t in others:
                firsts.setdefault(t, i)
            tally = Counter(t for _, t in others)
            seen += [(i, t, tally[t]) for t, i in firsts.items()]
        counted = self._types
        for _, t, n in sorted(seen, key=_FIRST):
            counted[t] += n

    def _step_range(self, steps: np.ndarray, ends: list[int]) -> None:
        """The first and last step run, from the steps of a run of events (``ends``: where
        its End events are: the End's step is not a step the run ran)."""
        ran = np.delete(steps, ends) if ends else steps
        if ran.size:
            lo, hi = int(ran.min()), int(ran.max())
            if self._first_step is None or lo < self._first_step:
                self._first_step = lo
            if self._last_step is None or hi > self._last_step:
                self._last_step = hi

    def _fits_cols(self, cols: Cols, base: int, failed_at: dict[int, int],
                   names: list[str]) -> None:
        """The fits decisions of a run of events, from its columns (``base``: the position of
        its first event), however the events came (the one place they are counted and
        tabled). Those the columns cannot settle were seen as they came (:meth:`_fits_seen`):
        ``failed_at`` holds the bad ones' conditions failed by position, ``names`` the routes
        outside :data:`~.fits.ROUTES`, counted under their names."""
        route = cols.f_route
        if not route.size:
            return
        counts = np.bincount(route, minlength=OTHER_ROUTE + 1).tolist()
        for name, k in zip(ROUTES, counts, strict=False):
            if k:
                self.routes[name] += k
        self.routes.update(names)
        if counts[OTHER_ROUTE] > len(names):  # never the case: said rather than dropped
            self.routes[UNKNOWN_ROUTE] += counts[OTHER_ROUTE] - len(names)
        self.completeness.attention += counts[0] + counts[1]
        if self.ledger is not None:
            failed = np.zeros(route.size, np.int64)
            if failed_at:
                at = np.fromiter(failed_at, np.int64, len(failed_at))
                failed[np.searchsorted(cols.f_pos, at)] = list(failed_at.values())
            local = cols.f_pos - base
            codes = outcome_of(route, cols.f_result).astype(np.int64)
            self.ledger.fits.extend([cols.rows0 + local, cols.f_seq, cols.step[local],
                                     cols.f_layer, codes, failed])

    def _judge_cols(self, cols: Cols, rows0: int, streamed: bool = False) -> None:
        flows = self.ledger is not None or self.flows
        if streamed and not self.detail:
            # a stream's reads are asked about by seq, never page by page (pages())
            result = judge_streamed(self.state, cols, rows0, flows)
        else:
            result = judge_chunk(self.state, cols, rows0, flows=flows, detail=self.detail)
        self._absorb(result)

    # -- events ----------------------------------------------------------------------------

    def _unknown_event(self, e: ev.Unknown) -> None:
        self._unknown[e.kind] += 1
        if e.kind == "records":  # from a reader that does not know the 1.2 kind
            kinds = e.fields.get("kinds")
            if isinstance(kinds, list):
                self._declare(kinds)

    def _records(self, e: ev.Records) -> None:
        self._declare(list(e.kinds))

    def _declare(self, kinds: list[Any]) -> None:
        """A ``records`` event (format 1.2): more kinds declared, for what follows it."""
        self.completeness.declare(kinds)
        st = self.state
        st.writes = st.writes or self.completeness.is_declared("write")
        up = self.completeness.is_declared("upload")
        st.uploads = [st.uploads[0] or up, st.uploads[1] or up]

    def _abort(self, e: ev.Abort) -> None:
        self.groups.aborts.append(e)
        self.completeness.aborts += 1
        if e.condition.startswith(FITS_ASSERT):
            self.completeness.decided += 1

    def _warn(self, e: ev.Warn) -> None:
        if e.code == FALLBACK_WARN:
            self.completeness.decided += 1

    def _snapshot(self, e: ev.Snapshot) -> None:
        """A segment's starting state (:mod:`.snapshot`): compared when the events before it
        built the same state, else taken as the state."""
        st = self.state
        if matches(st, e):
            return
        if self.rows > 0:
            self.snapshot_replaced.append(e.seq)
        seed(st, e, self.rows)
        if e.versions and st.writes is None:
            st.writes = True
        for target, runs in enumerate((e.pool, e.ring)):
            if runs and st.uploads[target] is None:
                st.uploads[target] = True

    def _mark(self, e: ev.Mark) -> None:
        self.mark = e

    def _end(self, e: ev.End) -> None:
        if self.end is None:
            self.end = e
            self.gaps.ended(e)  # events it counts that no seq accounts for: lost, place unknown

    def _keep_writes(self, chunk: list[Any], types: list[type]) -> None:
        mark = self.mark
        for e, t in zip(chunk, types, strict=True):
            if t is ev.Mark:
                mark = e
            elif t is ev.Write:
                c0, c1 = e.cells
                if c1 > c0 and c0 >= 0:
                    for page in range(c0 // PAGE_TOKENS,
                                      min((c1 - 1) // PAGE_TOKENS + 1, MAX_PAGE)):
                        self._writes[(e.layer, e.stream, page)] = (e, mark)
        self.mark = mark

    def last_write(self, layer: int, stream: int, page: int
                   ) -> tuple[ev.Write, ev.Mark | None] | None:
        """The last write of a host page and the mark of its ubatch (``keep_writes`` only)."""
        return self._writes.get((layer, stream, page))

    def _outputs_seen(self, chunk: list[Any], idx: list[int], cols: Cols, base: int) -> None:
        """The outputs of ``chunk`` (at ``idx``; ``cols``: its columns, from ``base``): the
        ones the C accumulator would hand to Python judged (:meth:`_output`), then all of
        them counted and tabled (:meth:`_outputs_cols`)."""
        div = cols.o_div
        seen = (div == 1) if self.groups.no_reference.full else (div != 0)
        unreferenced = 0
        for k in np.flatnonzero(seen).tolist():
            d = None if div[k] < 0 else True
            unreferenced += d is None
            self._output(chunk[idx[k]], d)
        self._outputs_cols(cols, base, unreferenced)

    def _output(self, e: ev.Output, diverged: bool | None) -> None:
        if diverged is None:
            nr = self.groups.no_reference
            if nr.full:
                nr.count_one()
            else:
                nr.add(Evidence(seq=e.seq, step=e.step, stream=e.stream,
                                text=f"checksum {e.checksum}, no reference"))
        elif diverged:
            assert e.max_abs_delta is not None
            g = self.groups.divergence.get(e.stream)
            if g is None:
                g = self.groups.divergence[e.stream] = fnd.Group()
            g.add(Evidence(seq=e.seq, step=e.step, stream=e.stream,
                           layer=fnd.layer_of(e.worst_layer),
                           text=f"max |Δ| {e.max_abs_delta:.3g}"))
            g.extra["max_abs_delta"] = max(g.extra.get("max_abs_delta", 0.0), e.max_abs_delta)
            g.extra["tolerance"] = e.tolerance

    def fits_verdict(self, e: ev.Fits) -> FitsVerdict:
        """The verdict of any fits event (pure; cached by geometry)."""
        return self.fits_judge.verdict(e)

    def _fits_seen_all(self, chunk: list[Any], idx: list[int], cols: Cols, base: int
                       ) -> None:
        """The fits decisions of ``chunk`` (at ``idx``; ``cols``: its columns, from ``base``):
        those the C accumulator would hand to Python seen (:meth:`_fits_seen`: a bad outcome,
        a route outside :data:`~.fits.ROUTES`), then all of them counted and tabled
        (:meth:`_fits_cols`)."""
        route = cols.f_route
        codes = outcome_of(route, cols.f_result)
        seen = ((codes == OUTCOME_CODE["mismatch"]) | (codes == OUTCOME_CODE["fallback"])
                | (route == OTHER_ROUTE))
        failed: dict[int, int] = {}
        names: list[str] = []
        for k in np.flatnonzero(seen).tolist():
            self._fits_seen(chunk[idx[k]], int(cols.f_pos[k]), failed, names)
        self._fits_cols(cols, base, failed, names)

    def _fits_seen(self, e: ev.Fits, at: int, failed: dict[int, int], names: list[str]
                   ) -> None:
        """A fits decision its columns cannot settle (at position ``at``): a route outside
        :data:`~.fits.ROUTES` is named in ``names`` (:func:`~.fits.route_name`: said, never
        dropped; its outcome is ``other``); a bad outcome makes its finding, its conditions
        failed kept in ``failed``."""
        if route_code(e.route) == OTHER_ROUTE:
            names.append(route_name(e.route))
        else:
            failed[at] = self._bad_fits(e)

    def _bad_fits(self, e: ev.Fits) -> int:
        v = self.fits_judge.verdict(e)
        shown = v.shown()
        text = f"{e.node or 'FA node'}: failed: {shown}" if v.failed else (e.node or "FA node")
        if v.by == "kvdiag":
            text += " (evaluated by kvdiag from the logged geometry"
            text += f"; {v.note})" if v.note else ")"
        elif v.note:
            text += f" ({v.note})"
        unknown = v.unknown if v.by != "writer" else ()
        if unknown:
            text += "; not evaluable: " + ", ".join(dict.fromkeys(c.why for c in unknown))
        groups = self.groups.fallback if v.outcome == "fallback" else self.groups.mismatch
        key = (v.failed, v.by)
        g = groups.get(key)
        if g is None:
            g = groups[key] = fnd.Group()
            g.extra.update(shown=shown, unknown=len(unknown),
                           not_evaluable=[c.name for c in unknown])
        if g.full:
            g.count_one()
        else:
            g.add(Evidence(seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer), text=text))
        return len(v.failed)

    # -- reads -----------------------------------------------------------------------------

    def _absorb(self, c: Chunk) -> None:
        """Count, group, cross-check and record the verdicts of one chunk's reads."""
        self._chunk, self._index = c, None
        self.classes += c.page_cls
        self.not_judged_why.update(c.not_judged)
        for seq, step_, layer_, stream_, page, said, judged in c.versions_disagree:
            self.groups.versions.add(Evidence(
                seq=seq, step=step_, layer=fnd.layer_of(layer_), stream=stream_,
                page=page, text=f"annotated version {said}, judged {judged}"))
        nr = c.r_seq.size
        self._unserved = {}
        if not nr:
            return
        self.pages_read += c.r_pages.sum(axis=0)
        layer, stream, step = c.r_layer, c.r_stream, c.r_step
        for k in np.flatnonzero(c.cols.r_runs == 0).tolist():
            self._unserved[k] = self._not_served(c, k)
        self.reads[0] += nr - len(self._unserved)
        self.groups.read_chunk(c.r_seq, c.pieces, layer, stream, step)
        nj = c.pieces[c.pieces[:, 5] == NOT_JUDGED] if c.pieces.size else c.pieces
        for why in (np.unique(nj[:, 13]).tolist() if nj.size else []):
            mine = nj[nj[:, 13] == why]
            g = self.groups.not_judged.get(why)
            if g is None:
                g = self.groups.not_judged[why] = fnd.Group()
            ids, first = np.unique(mine[:, 0], return_index=True)
            ids = ids[np.argsort(first)]
            per = np.bincount(mine[:, 0], weights=mine[:, 2] - mine[:, 1], minlength=nr)
            for r in ids.tolist():
                if g.full:
                    g.count_one(int(per[r]))
                else:
                    seq, step_, layer_, stream_ = self._read_at(c, r)
                    g.add(Evidence(seq=seq, step=step_, layer=fnd.layer_of(layer_),
                                   stream=stream_, text=f"{int(per[r])} page(s)"), int(per[r]))
        if c.cols.ann.shape[0]:
            self._check_ranges(c)
        if self.ledger is not None:
            self._ledger(c, layer, stream, step)

    @staticmethod
    def _read_at(c: Chunk, k: int) -> tuple[int, int, int, int]:
        """(seq, step, layer, stream) of read ``k`` of a chunk."""
        return (int(c.r_seq[k]), int(c.r_step[k]), int(c.r_layer[k]), int(c.r_stream[k]))

    def _not_served(self, c: Chunk, k: int) -> int:
        """A read without served pages: none of its pages can be judged (the pages it says
        it read count as read)."""
        self.reads[1] += 1
        counts = c.cols.r_counts
        assert counts is not None
        pool, ring, host = (int(x) for x in counts[k])
        n = pool + ring + host
        self.pages_read += (pool, ring, host)
        self.classes[POOL, NOT_JUDGED] += pool
        self.classes[RING, NOT_JUDGED] += ring
        self.classes[HOST, NOT_JUDGED] += host
        self.not_judged_why[NO_SERVED] += n
        g = self.groups.no_served
        if g.full:
            g.count_one(n)
        else:
            seq, step, layer, stream = self._read_at(c, k)
            g.add(Evidence(seq=seq, step=step, layer=fnd.layer_of(layer), stream=stream), n)
        said = self.groups.annotated_classes
        for b, e, _, _, _, cls in self._ann_of(c, k).tolist():
            name = CLASSES[cls] if cls >= 0 else "?"  # a decoded range names one of them
            said[name] = said.get(name, 0) + e - b
        return n

    @staticmethod
    def _ann_of(c: Chunk, k: int) -> np.ndarray:
        """The annotated ranges of read ``k`` of a chunk (:attr:`.columns.Cols.ann` rows)."""
        r_ann = c.cols.r_ann
        first = int(r_ann[:k].sum())
        out: np.ndarray = c.cols.ann[first:first + int(r_ann[k])]
        return out

    @staticmethod
    def _as_read(c: Chunk, k: int, stream: int) -> _Annotated:
        """Read ``k`` of a chunk as the cross-check's per-read comparison takes it, rebuilt
        from its columns (the decoded events are gone by the time it is judged)."""
        cols = c.cols
        first = int(cols.r_runs[:k].sum())
        runs = cols.runs[first:first + int(cols.r_runs[k])].tolist()
        src = cols.run_src[first:first + len(runs)].tolist()
        served = tuple(ev.Served(b, e, SOURCES[s], q)
                       for (b, e, q), s in zip(runs, src, strict=True))
        ranges = tuple(ev.ReadRange(b, e, SOURCES[s], h, CLASSES[cl], lag)
                       for b, e, h, lag, s, cl in Judge._ann_of(c, k).tolist())
        return _Annotated(stream, served, ranges)

    def _check_ranges(self, c: Chunk) -> None:
        """The model's annotated ranges against the verdicts (a cross-check): a read whose
        judged and annotated non-exact page counts are both 0 agrees without a closer look."""
        cols = c.cols
        nr = c.r_seq.size
        annotated = cols.r_ann
        owner = np.repeat(np.arange(nr), annotated)
        ann = cols.ann
        width = ann[:, 1] - ann[:, 0]
        bad = ann[:, 5] != EXACT  # a class the judgement does not use is not exact either
        said = np.bincount(owner[bad], weights=width[bad], minlength=nr)
        judged = c.r_counts[:, STALE] + c.r_counts[:, FOREIGN] + c.r_counts[:, NOT_JUDGED]
        candidates = np.flatnonzero((annotated > 0) & ((said > 0) | (judged > 0))
                                    & (cols.r_runs > 0))  # the unserved are not compared
        shown = crosscheck.agreeing(ann, owner, c.r_stream, cols.runs, cols.run_src,
                                    cols.r_runs, c.pieces, candidates)
        for k in candidates[~shown].tolist():
            seq, step, layer, stream = self._read_at(c, k)
            read = self._as_read(c, k, stream)
            diff = crosscheck.disagrees(read, self._pieces(c, k))  # type: ignore[arg-type]
            if diff is not None:
                self.groups.annotation.add(Evidence(
                    seq=seq, step=step, layer=fnd.layer_of(layer), stream=stream, text=diff))

    def _ledger(self, c: Chunk, layer: np.ndarray, stream: np.ndarray,
                step: np.ndarray) -> None:
        led = self.ledger
        assert led is not None
        base = led.reads.n
        rc = c.r_counts.copy()
        for k, n in self._unserved.items():
            rc[k, NOT_JUDGED] = n
        led.reads.extend([c.rows0 + c.r_pos, c.r_seq, step, layer, stream,
                          rc[:, 0], rc[:, 1], rc[:, 2], rc[:, 3]])
        if c.pieces.size:
            p = c.pieces
            led.pieces.extend([base + p[:, 0], *(p[:, i] for i in range(1, 14))])
        if c.flows.size:
            # by read, then write: the table's order is then the file's, whatever the chunks
            f = c.flows[np.lexsort((c.flows[:, 0], c.flows[:, 1]))]
            led.flows.extend([f[:, 0], c.r_seq[f[:, 1]], base + f[:, 1], f[:, 2]])

    def _pieces(self, c: Chunk, k: int) -> list[Piece]:
        if not c.pieces.size:
            return []
        rows = c.pieces[c.pieces[:, 0] == k]
        return [tuple(r[1:]) for r in rows.tolist()]

    def _read_index(self, e: ev.Read) -> int | None:
        c = self._chunk
        if c is None:
            return None
        reads = c.cols.reads
        if reads is None:  # a streamed chunk: its reads by seq
            found = np.flatnonzero(c.r_seq == e.seq)
            return int(found[0]) if found.size else None
        if self._index is None:
            self._index = {id(r): k for k, r in enumerate(reads)}
        return self._index.get(id(e))

    @property
    def last(self) -> ReadVerdict | None:
        """The verdict of the last read of the last chunk fed (None: that chunk had none)."""
        c = self._chunk
        if c is None or not c.r_seq.size:
            return None
        return self._verdict(c, c.r_seq.size - 1)

    def verdict(self, e: ev.Read) -> ReadVerdict | None:
        """The verdict of a read of the last chunk fed (None: not in it)."""
        k = self._read_index(e)
        return None if k is None else self._verdict(self._chunk, k)  # type: ignore[arg-type]

    def _verdict(self, c: Chunk, k: int) -> ReadVerdict:
        seq, step, layer, stream = self._read_at(c, k)
        if k in self._unserved:
            n = self._unserved[k]
            piece = (0, n, POOL, -1, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1, NO_SERVED)
            return ReadVerdict(seq, step, layer, stream, (0, 0, 0, n), (piece,) if n else ())
        counts = tuple(int(x) for x in c.r_counts[k])
        return ReadVerdict(seq, step, layer, stream, counts,  # type: ignore[arg-type]
                           tuple(self._pieces(c, k)))

    def missed_writes(self, verdict: ReadVerdict | None = None) -> list[int]:
        """The writes whose bytes a read of the last chunk fed (default: its last read) did
        not get: for each stale or foreign page, the last write of that page before the read
        (flows start there). Needs ``flows`` (or a ledger) on when the read is fed."""
        c = self._chunk
        if c is None or not c.r_seq.size:
            return []
        k = c.r_seq.size - 1
        if verdict is not None:
            found = np.flatnonzero(c.r_seq == verdict.seq)
            if not found.size:
                return []
            k = int(found[0])
        return sorted(set(c.flows[c.flows[:, 1] == k, 0].tolist())) if c.flows.size else []

    def missed(self, e: ev.Read) -> list[tuple[int, str]]:
        """(write seq, ``"stale"`` or ``"foreign"``) of each write a read of the last chunk
        fed missed — the ledger's ``flows`` rows of that read, for a surface that draws them
        as it goes (``trace export``). Needs ``flows`` (or a ledger) on when it is fed."""
        c, k = self._chunk, self._read_index(e)
        if c is None or k is None or not c.flows.size:
            return []
        if self._flows_by_read is None or self._flows_by_read[0] is not c:
            order = np.argsort(c.flows[:, 1], kind="stable")
            self._flows_by_read = (c, c.flows[order], c.flows[order, 1])
        _, rows, reads = self._flows_by_read
        lo, hi = np.searchsorted(reads, k, "left"), np.searchsorted(reads, k, "right")
        return [(w, CLASSES[cls]) for w, _, cls in rows[lo:hi].tolist()]

    def live_writes(self) -> set[int]:
        """Seqs of the writes that are still the last write of some page: the only writes a
        later read can miss, so a surface that remembers writes to draw flows may forget the
        others (memory bounded by the pages, not the trace's length)."""
        return set(np.unique(self.state.pages.wseq).tolist()) - {0}

    def pages(self, e: ev.Read) -> list[PageVerdict]:
        """Every page of a read of the last chunk fed, judged (a read without served pages
        has no pages to list: :meth:`verdict` counts them not judged). Without
        ``Judge(detail=True)`` an exact page's copy is not named (its holder's step and seq
        are -1)."""
        c = self._chunk
        k = self._read_index(e)
        if c is None or k is None or k in self._unserved:
            return []
        d = c.detail
        views = self.state.views
        run_ids = np.flatnonzero(d["run_read"] == k)
        mine = d["p_read"] == k
        p_run = d["p_run"][mine]
        cols = {name: d[name][mine] for name in ("p_page", "p_slot", "cls", "lag", "why",
                                                  "cur", "h_vid", "h_page", "h_ver",
                                                  "h_step", "h_seq")}
        nj = dict(zip(d["nj_runs"].tolist(), d["nj_why"].tolist(), strict=True))
        out: list[PageVerdict] = []
        for run in run_ids.tolist():
            if not d["keep"][run]:
                continue
            b, end, src = int(d["b"][run]), int(d["e"][run]), int(d["src"][run])
            slot0 = int(d["slot"][run])
            if d["host"][run]:
                for page in range(b, end):
                    out.append(PageVerdict(e.seq, e.step, e.layer, e.stream, page, "host", -1,
                                           "exact", 0, self._version_at(c, e, page), None, ""))
                continue
            if run in nj:
                why = WHY[nj[run]]
                for page in range(b, end):
                    out.append(PageVerdict(e.seq, e.step, e.layer, e.stream, page,
                                           SOURCES[src], slot0 + page - b, "not judged", 0,
                                           self._version_at(c, e, page), None, why))
                continue
            sel = np.flatnonzero(p_run == run)
            judged: list[PageVerdict] = []
            for i in sel.tolist():
                hv = int(cols["h_vid"][i])
                holder = None if hv < 0 else Copy(
                    int(views.layer[hv]), int(views.stream[hv]), int(cols["h_page"][i]),
                    int(cols["h_ver"][i]), int(cols["h_step"][i]), int(cols["h_seq"][i]))
                judged.append(PageVerdict(
                    e.seq, e.step, e.layer, e.stream, int(cols["p_page"][i]), SOURCES[src],
                    int(cols["p_slot"][i]), CLASSES[int(cols["cls"][i])], int(cols["lag"][i]),
                    int(cols["cur"][i]), holder, WHY[int(cols["why"][i])]))
            if len(judged) < end - b:
                # the run-level check found the other pages exact without expanding them
                # (batch._quick_runs, without ``detail``): listed too, their copy not named
                seen = {v.page for v in judged}
                judged += [PageVerdict(e.seq, e.step, e.layer, e.stream, page, SOURCES[src],
                                       slot0 + page - b, "exact", 0,
                                       self._version_at(c, e, page), None, "")
                           for page in range(b, end) if page not in seen]
                judged.sort(key=lambda v: v.page)
            out += judged
        return out

    def _version_at(self, c: Chunk, e: ev.Read, page: int) -> int:
        """A host page's version when a read of the last chunk read it."""
        view = self.state.views.one(e.layer, e.stream)
        now, _ = self.state.pages.get(view, page)
        if view is None or now == 0:
            return now
        d = c.detail
        flat = int(self.state.pages.flat(np.array([view]), np.array([page]))[0])
        wkey, R = d["wkey"], d["R"]
        t = int(c.r_pos[self._read_index(e) or 0])
        later = int(np.searchsorted(wkey, flat * R + d["n"] + 1)
                    - np.searchsorted(wkey, flat * R + t))
        return now - later

    # -- the judgement ---------------------------------------------------------------------

    @property
    def steps(self) -> Steps:
        return Steps(self._first_step, self._last_step, self._types[ev.Step])

    @property
    def counts(self) -> dict[str, int]:
        """Events per kind."""
        out: Counter[str] = Counter(self._unknown)
        for cls, n in self._types.items():
            if n and cls is not ev.Unknown:
                out[cls.__struct_config__.tag] += n  # type: ignore[attr-defined]
        return dict(out)

    def snapshot(self) -> Judgement:
        """The judgement of everything fed so far (an immutable value)."""
        self._flush()
        counts = self.counts
        self.completeness.slot_pages = int(self.pages_read[0] + self.pages_read[1])
        completeness = self.completeness.result(counts)
        return Judgement(
            counts=counts, steps=self.steps, end=self.end, last_seq=self.last_seq,
            rows=self.rows, completeness=completeness,
            findings=tuple(self._findings(completeness)), residency=self._residency(),
            ledger=self.ledger.snapshot() if self.ledger is not None else None,
            lost=self.gaps.as_json() if self.gaps.any else None)

    def _lost_finding(self) -> Finding:
        """``events-lost``, with the pages a loss of unknown place puts in question."""
        slots = self.classes[POOL] + self.classes[RING]
        return fnd.lost_events(self.gaps, self.groups.not_judged.get(LOST_EVENTS),
                               (int(slots[EXACT]), int(slots[STALE]), int(slots[FOREIGN])))

    def arisen(self) -> list[Finding]:
        """The findings that first appeared since the last call, each once (by
        :func:`~kvdiag.analysis.judgement.findings.identity`), as they stand now: for a caller
        that follows a growing trace (``kvdiag check --follow``). Findings that later events
        could withdraw are not among them — what the trace does not record (a later event or
        ``records`` declaration may show it), the run not completing (the End event may
        come) — :meth:`snapshot` has those once the trace has ended."""
        self._flush()
        command = f"kvdiag trace pages {self.name} --json" if self.name else None
        found = fnd.build(self.groups, pages_command=command) + self.adapt.findings()
        found += fnd.cross_check(self.groups)
        if self.gaps.any:  # no later event brings lost ones back
            found.append(self._lost_finding())
        out = []
        for f in found:
            key = fnd.identity(f)
            if key not in self._arisen:
                self._arisen.add(key)
                out.append(f)
        return out

    def _findings(self, completeness: Completeness) -> list[Finding]:
        command = f"kvdiag trace pages {self.name} --json" if self.name else None
        out = fnd.build(self.groups, pages_command=command)
        out += self.adapt.findings()
        counts = self.counts
        no_events = sum(n for k, n in counts.items() if k != "end") == 0
        kind_pages = {"upload": NO_UPLOAD, "write": NO_WRITE, "fits": NO_DISPATCH}
        missing = [(k.kind, k.hides, self.not_judged_why.get(kind_pages.get(k.kind, -1), 0))
                   for k in completeness.missing]
        covered = {kind_pages[k.kind] for k in completeness.missing if k.kind in kind_pages}
        saved = self.groups.not_judged
        self.groups.not_judged = {w: g for w, g in saved.items() if w not in covered}
        try:
            out += fnd.not_recorded(self.groups, missing, completeness.source, no_events,
                                    command, WHY)
        finally:
            self.groups.not_judged = saved
        out += fnd.cross_check(self.groups)
        if self.gaps.any:
            out.append(self._lost_finding())
        if self.end is None or self.end.status == "error":
            out.append(fnd.incomplete(self.end, self.last_seq, self._last_step))
        return out

    def _residency(self) -> dict[str, Any]:
        st = self.state.upload_stats
        targets = ("resident", "ring")
        up_count = {t: int(st[i, 0].sum()) for i, t in enumerate(targets) if st[i, 0].sum()}
        up_pages: Counter[str] = Counter(
            {t: int(st[i, 1].sum()) for i, t in enumerate(targets) if st[i, 0].sum()})
        up_bytes = {t: int(st[i, 2].sum()) for i, t in enumerate(targets) if st[i, 0].sum()}
        unknown = {t: int(st[i, 3].sum()) for i, t in enumerate(targets) if st[i, 3].sum()}
        reasons = {(REASONS[r] if r < len(REASONS) else "other"): int(st[:, 1, r].sum())
                   for r in range(st.shape[2]) if st[:, 0, r].sum()}
        pool_read = int(self.pages_read[0])
        total = [int(x) for x in self.classes.sum(axis=0)]
        self.evictions = self._types[ev.Evict]
        self.invalidations = self._types[ev.Invalidate]
        return {
            "pages_read": dict(zip(SOURCES, self.pages_read.tolist(), strict=True)),
            "read_classes": {"exact": total[EXACT], "stale": total[STALE],
                             "foreign": total[FOREIGN], "not_judged": total[NOT_JUDGED]},
            "read_classes_by_source": {
                src: {"exact": c[EXACT], "stale": c[STALE], "foreign": c[FOREIGN],
                      "not_judged": c[NOT_JUDGED]}
                for src, c in zip(SOURCES, self.classes.tolist(), strict=True)},
            "not_judged": {WHY_KEY[w]: n for w, n in sorted(self.not_judged_why.items())},
            "reads": {"judged": self.reads[0], "without_served": self.reads[1]},
            "cross_check": {"annotation_disagrees": self.groups.annotation.count,
                            "versions_disagree": self.groups.versions.count,
                            "snapshot_replaced": len(self.snapshot_replaced)},
            "out_of_range": self.state.out_of_range,
            "resident_hits": pool_read - up_pages["resident"],
            "resident_hit_rate": (max(0.0, 1.0 - up_pages["resident"] / pool_read)
                                  if pool_read else None),
            "uploads": dict(up_count),
            "upload_pages": dict(up_pages),
            "upload_bytes": dict(up_bytes),
            "upload_bytes_unknown": unknown,
            "upload_reasons": dict(reasons),
            "ring_pages": up_pages["ring"],
            "evictions": self.evictions,
            "invalidations": self.invalidations,
            "routes": dict(sorted(self.routes.items())),
        }


@dataclass(frozen=True)
class Judgement:
    """What a Judge concluded from the events it was fed (a prefix while it still runs)."""

    counts: dict[str, int]
    steps: Steps
    end: ev.End | None
    last_seq: int
    rows: int
    completeness: Completeness
    findings: tuple[Finding, ...]
    residency: dict[str, Any]
    ledger: LedgerSnapshot | None = None
    lost: dict[str, Any] | None = None
    """Events lost from the trace (:meth:`.gaps.SeqGaps.as_json`: events, gaps, the first
    gaps' seqs and steps); None: none."""

    @property
    def status(self) -> str:
        return self.end.status if self.end is not None else "incomplete"

    def summary(self) -> dict[str, Any]:
        """The JSON summary ``kvdiag check --json`` prints."""
        return {
            "events": sum(self.counts.values()),
            "counts": dict(self.counts),
            "steps": self.steps.count,
            "step_span": {"first": self.steps.first, "last": self.steps.last,
                          "step_events": self.steps.recorded},
            "status": self.status,
            "residency": self.residency,
            "completeness": self.completeness.as_json(),
            "lost_events": self.lost or {"events": 0, "gaps": 0},
        }


def _declares(e: object) -> bool:
    """Is ``e`` a ``records`` event (more kinds declared)?"""
    t = type(e)
    return t is ev.Records or (t is ev.Unknown and e.kind == "records")  # type: ignore[attr-defined]


def batches(events: Iterable[ev.AnyEvent | ev.Unknown], size: int = CHUNK
            ) -> Iterator[list[ev.AnyEvent | ev.Unknown]]:
    """``events`` in lists of at most ``size`` to feed with :meth:`Judge.feed_all`, each
    ``records`` event alone in its list, a ``snapshot`` or an event after a gap in seq first in
    its list. The Judge answers (:meth:`~Judge.verdict`,
    :meth:`~Judge.pages`, :meth:`~Judge.missed`) about the reads of the last list it was fed,
    and judges what follows a declaration with it, so a list that held one in its middle would
    leave the reads before it unanswered."""
    it = iter(events)
    top: int | None = None  # the highest seq so far: where SeqGaps.split finds gaps
    while True:
        block = list(itertools.islice(it, size))
        if not block:
            return
        types = set(map(type, block))  # a C pass: most blocks hold neither kind
        # one by one, a block has no gap but maybe before its first event, where it starts
        if (ev.Records not in types and ev.Unknown not in types and ev.Snapshot not in types
                and one_by_one(block)):
            last = block[-1].seq
            top = last if top is None else max(top, last)
            yield block
            continue
        chunk: list[ev.AnyEvent | ev.Unknown] = []
        for e in block:
            if _declares(e):
                if chunk:
                    yield chunk
                    chunk = []
                yield [e]
                top = e.seq if top is None else max(top, e.seq)
                continue
            if chunk and (type(e) is ev.Snapshot or (top is not None and e.seq > top + 1)):
                # a segment's snapshot, or the first event after a gap in seq (events lost:
                # a seq beyond every seq before it, as SeqGaps.split finds them), starts a
                # list: the Judge judges from there on from another state, so the reads after
                # it are then the list's own and can all be asked about
                yield chunk
                chunk = []
            chunk.append(e)
            top = e.seq if top is None else max(top, e.seq)
        if chunk:
            yield chunk


class Trace(Protocol):
    """A trace as the commands read it (:class:`kvdiag.trace.reader.TraceReader`): its header
    and its events in file order."""

    @property
    def header(self) -> ev.Header: ...

    def __iter__(self) -> Iterator[ev.AnyEvent | ev.Unknown]: ...


def trace_judge(trace: Trace, *, name: str | None = None, ledger: bool = False,
                keep_writes: bool = False, flows: bool = False, detail: bool = False) -> Judge:
    """The Judge of one trace file, as ``kvdiag check`` judges it and every command that
    judges a file must (``diff`` judged without the header once, and disagreed with check on
    what the writer declares it records and on ``native_quants``): built from the trace's own
    header; feed it the trace's events in file order (:meth:`Judge.feed_all`, or chunk by
    chunk from :func:`batches`). The keywords are :class:`Judge`'s."""
    return Judge(trace.header, name=name, ledger=ledger, keep_writes=keep_writes, flows=flows,
                 detail=detail)
