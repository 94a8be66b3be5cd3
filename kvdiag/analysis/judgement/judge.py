"""The streaming Judge: feed raw events in file order, read the judgement at any point.

One pass, one event at a time; memory is bounded by the trace's geometry (host pages, slots,
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
  every decision that makes a finding;
- ``output``: diverged / within tolerance / no reference;
- ``step`` and every event's ``step``: the steps (:class:`Steps`);
- ``abort``, ``end``, ``adapt``, ``repartition``: as recorded.

Reads change no state, so right after ``feed(read)`` :attr:`Judge.last` holds that read's
verdict and :meth:`Judge.pages` / :meth:`Judge.missed_writes` can be asked about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvdiag.analysis.judgement import findings as fnd
from kvdiag.analysis.judgement.adapt import AdaptAnalyzer
from kvdiag.analysis.judgement.classes import (
    CLASSES,
    EXACT,
    FOREIGN,
    HOST,
    MAX_PAGE,
    MAX_SLOT,
    NO_SERVED,
    NO_UPLOAD,
    NO_WRITE,
    NOT_JUDGED,
    OUT_OF_RANGE,
    POOL,
    RING,
    SOURCE_CODE,
    SOURCES,
    STALE,
    WHY,
    WHY_KEY,
)
from kvdiag.analysis.judgement.completeness import Completeness, CompletenessTracker
from kvdiag.analysis.judgement.fits import BAD, FitsJudge, FitsVerdict, outcome
from kvdiag.analysis.judgement.ledger import OUTCOME_CODE, Ledger, LedgerSnapshot
from kvdiag.analysis.judgement.slots import Copy, HostPages, Piece, Ring, Slots
from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence, Finding
from kvdiag.model.pages import PAGE_TOKENS


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
    every page with its ubatch's mark (:meth:`last_write`; memory bounded by the pages)."""

    def __init__(self, header: ev.Header | None = None, *, ledger: bool = False,
                 name: str | None = None, records: Iterable[str] | None = None,
                 keep_writes: bool = False) -> None:
        self.header = header
        self.name = name
        declared = records if records is not None else getattr(header, "records", None)
        self.completeness = CompletenessTracker(declared)
        self.fits_judge = FitsJudge(header)
        self.ledger = Ledger() if ledger else None
        canon: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        self.host = HostPages()
        self.pool = Slots(canon)
        self.ring = Ring(canon)
        self._canon = canon
        self._writes: bool | None = self.completeness.is_declared("write")
        self._uploads: dict[str, bool | None] = dict.fromkeys(
            ("resident", "ring"), self.completeness.is_declared("upload"))
        self.groups = fnd.Groups()
        self.adapt = AdaptAnalyzer()
        self.keep_writes = keep_writes
        self.mark: ev.Mark | None = None
        """The latest mark event (kept with writes when ``keep_writes``)."""
        self.rows = 0
        """Events fed (and rows skipped): the ledger's row numbers."""
        self.last: ReadVerdict | None = None
        self.last_seq = 0
        self.end: ev.End | None = None
        self._first_step: int | None = None
        self._last_step: int | None = None
        self.classes = [[0, 0, 0, 0] for _ in SOURCES]
        """Pages by source (pool, ring, host) and class (exact, stale, foreign, not judged)."""
        self.not_judged_why: Counter[int] = Counter()
        self.pages_read = [0, 0, 0]
        """Pages the reads' own counts say (pool, ring, host)."""
        self.reads = [0, 0]
        """Reads judged (with served), reads without served."""
        self.uploads: dict[tuple[str, str], list[int]] = {}
        """Per (target, reason): uploads, pages, bytes."""
        self.evictions = 0
        self.invalidations = 0
        self.routes: Counter[str] = Counter()
        self.out_of_range = 0
        self._arisen: set[tuple[Any, ...]] = set()
        self._table: dict[type, list[Any]] = {}
        self._unknown: Counter[str] = Counter()
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.Step: self._step, ev.Fits: self._fits, ev.Read: self._read,
            ev.Upload: self._upload, ev.Write: self._write, ev.Evict: self._evict,
            ev.Invalidate: self._invalidate, ev.Abort: self.groups.aborts.append,
            ev.Output: self._output, ev.End: self._end, ev.Repartition: self.adapt.feed,
            ev.Adapt: self.adapt.feed, ev.Unknown: self._unknown_event,
            ev.Records: self._records,
        }
        if keep_writes:
            self._handlers[ev.Mark] = self._mark

    # -- feeding ---------------------------------------------------------------------------

    def _entry(self, cls: type) -> list[Any]:
        entry = self._table.get(cls)
        if entry is None:
            entry = self._table[cls] = [0, self._handlers.get(cls)]
        return entry

    def feed(self, event: ev.AnyEvent | ev.Unknown) -> None:
        entry = self._table.get(type(event)) or self._entry(type(event))
        entry[0] += 1
        self.last_seq = event.seq
        if type(event) is not ev.End:
            step = event.step
            if self._first_step is None:
                self._first_step = self._last_step = step
            elif step > self._last_step:  # type: ignore[operator]
                self._last_step = step
            elif step < self._first_step:
                self._first_step = step
        if entry[1] is not None:
            entry[1](event)
        self.rows += 1

    def feed_all(self, events: Iterable[ev.AnyEvent | ev.Unknown]) -> Judge:
        # feed() inlined: a method call per event is a tenth of the judgement of a big trace
        table, entry_of = self._table, self._entry
        first, last = self._first_step, self._last_step
        rows = self.rows
        end = ev.End
        e: Any = None
        try:
            for e in events:
                t = type(e)
                entry = table.get(t) or entry_of(t)
                entry[0] += 1
                if t is not end:
                    step = e.step
                    if last is None or first is None:
                        first = last = step
                    elif step > last:
                        last = step
                    elif step < first:
                        first = step
                # the row must be right while the handler runs (the ledger records it)
                self.rows = rows
                rows += 1
                if entry[1] is not None:
                    entry[1](e)
        finally:
            self.rows = rows
            self._first_step, self._last_step = first, last
            if e is not None:
                self.last_seq = e.seq
        return self

    def skip(self, n: int = 1) -> None:
        """Rows that are not events (an index's corrupt lines): keeps ledger rows aligned."""
        self.rows += n

    # -- events ----------------------------------------------------------------------------

    def _unknown_event(self, e: ev.Unknown) -> None:
        self._unknown[e.kind] += 1
        if e.kind == "records":  # a declaration of more recorded kinds (format 1.2)
            kinds = e.fields.get("kinds")
            if isinstance(kinds, list):
                self._declare(kinds)

    def _records(self, e: ev.Records) -> None:
        self._declare(list(e.kinds))

    def _declare(self, kinds: list[Any]) -> None:
        self.completeness.declare(kinds)
        self._writes = self.completeness.is_declared("write") or self._writes
        up = self.completeness.is_declared("upload")
        for target in self._uploads:
            self._uploads[target] = up or self._uploads[target]

    def _mark(self, e: ev.Mark) -> None:
        self.mark = e

    def _step(self, e: ev.Step) -> None:
        self.adapt.feed(e)

    def _end(self, e: ev.End) -> None:
        if self.end is None:
            self.end = e

    def _evict(self, e: ev.Evict) -> None:
        self.evictions += 1
        self.pool.empty(e.slot)

    def _invalidate(self, e: ev.Invalidate) -> None:
        self.invalidations += 1
        self.pool.clear()
        self.ring.clear()

    def _write(self, e: ev.Write) -> None:
        c0, c1 = e.cells
        if c1 <= c0:
            return
        p0, p1 = c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1
        if p0 < 0 or p1 > MAX_PAGE:
            self.out_of_range += 1
            return
        if self._writes is None:
            self._writes = True
        view = (e.layer, e.stream)
        v = self.host.ver.get(view)
        if v is None or len(v) < p1:
            v, w = self.host.views(view, p1)
        else:
            w = self.host.wseq[view]
        if p1 - p0 == 1:
            v[p0] += 1
            w[p0] = e.seq
        else:
            for page in range(p0, p1):
                v[page] += 1
            w[p0:p1] = [e.seq] * (p1 - p0)
        if e.versions:
            self._check_versions(e, v)
        if self.keep_writes:
            kept = self.host.wevent.setdefault(view, [])
            if len(kept) < p1:
                kept.extend([None] * (p1 - len(kept)))
            kept[p0:p1] = [(e, self.mark)] * (p1 - p0)

    def last_write(self, layer: int, stream: int, page: int
                   ) -> tuple[ev.Write, ev.Mark | None] | None:
        """The last write of a host page and the mark of its ubatch (``keep_writes`` only)."""
        kept = self.host.wevent.get((layer, stream))
        got = kept[page] if kept is not None and 0 <= page < len(kept) else None
        return got  # type: ignore[return-value]

    def _check_versions(self, e: ev.Write, v: list[int]) -> None:
        for page, version in e.versions:
            if not 0 <= page < len(v) or v[page] != version:
                self.groups.versions.add(Evidence(
                    seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer), stream=e.stream,
                    page=page, text=f"annotated version {version}, judged "
                                    f"{v[page] if 0 <= page < len(v) else 0}"))
                return

    def _upload(self, e: ev.Upload) -> None:
        p0, p1 = e.pages
        n = p1 - p0
        acc = self.uploads.get((e.target, e.reason))
        if acc is None:
            acc = self.uploads[(e.target, e.reason)] = [0, 0, 0]
        acc[0] += 1
        acc[1] += n
        acc[2] += e.bytes
        if n <= 0:
            return
        if p0 < 0 or p1 > MAX_PAGE or not 0 <= e.slot <= MAX_SLOT - n:
            self.out_of_range += 1
            return
        view = (e.layer, e.stream)
        v = self.host.ver.get(view)
        if v is None or len(v) < p1:
            v = self.host.views(view, p1)[0]
        if e.target == "ring":
            if self._uploads["ring"] is None:
                self._uploads["ring"] = True
            self.ring.copy_ring(e.seq, e.step, e.layer, e.stream, p0, e.slot, v[p0:p1])
        else:
            if self._uploads["resident"] is None:
                self._uploads["resident"] = True
            self.pool.copy(e.layer, e.stream, p0, e.slot, v[p0:p1], (e.step, e.seq))

    def _output(self, e: ev.Output) -> None:
        diverged = e.diverged
        if self.ledger is not None:
            self.ledger.outputs.append((self.rows, e.seq, e.step, e.stream,
                                        -1 if diverged is None else int(diverged)))
        if diverged is None:
            self.groups.no_reference.add(Evidence(seq=e.seq, step=e.step, stream=e.stream,
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

    def _fits(self, e: ev.Fits) -> None:
        self.routes[e.route] += 1
        if e.route in ("streamed", "fallback"):
            self.completeness.attention += 1
        kind = outcome(e)
        if kind not in BAD:
            if self.ledger is not None:
                self.ledger.fits.append((self.rows, e.seq, e.step, e.layer,
                                         OUTCOME_CODE[kind], 0))
            return
        v = self.fits_judge.verdict(e)
        assert v.outcome in BAD
        if self.ledger is not None:
            self.ledger.fits.append((self.rows, e.seq, e.step, e.layer,
                                     OUTCOME_CODE[v.outcome], len(v.failed)))
        shown = v.shown()
        text = f"{e.node or 'FA node'}: failed: {shown}" if v.failed else (e.node or "FA node")
        if v.by == "kvdiag":
            text += " (evaluated by kvdiag from the logged geometry"
            text += f"; {v.note})" if v.note else ")"
        elif v.note:
            text += f" ({v.note})"
        unknown = v.unknown
        if unknown and v.by != "writer":
            text += "; not evaluable: " + ", ".join(
                dict.fromkeys(c.why for c in unknown))
        groups = self.groups.fallback if v.outcome == "fallback" else self.groups.mismatch
        key = (v.failed, v.by)
        g = groups.get(key)
        if g is None:
            g = groups[key] = fnd.Group()
            g.extra.update(shown=shown, unknown=len(unknown) if v.by != "writer" else 0,
                           not_evaluable=[c.name for c in unknown] if v.by != "writer" else [])
        g.add(Evidence(seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer), text=text))

    # -- reads -----------------------------------------------------------------------------

    def _known(self, source: str) -> bool:
        """Is what a slot of this kind holds known (an upload of its target recorded, or
        declared)? Without it no page read from such a slot is judged."""
        return bool(self._uploads["ring" if source == "ring" else "resident"])

    def _read(self, e: ev.Read) -> None:
        pr = self.pages_read
        pr[0] += e.pool
        pr[1] += e.ring
        pr[2] += e.host
        layer, stream = e.layer, e.stream
        served = e.served
        self.ring.read_done(layer, stream)
        if not served:
            self._unserved(e)
            return
        self.reads[0] += 1
        classes = self.classes
        view = (layer, stream)
        writes = bool(self._writes)
        pieces: list[Piece] = []
        exact_runs: list[tuple[int, int, int]] | None = [] if e.ranges else None
        for s in served:
            b, end = s.begin, s.end
            n = end - b
            if n <= 0:
                continue
            if b < 0 or end > MAX_PAGE:
                self.out_of_range += 1
                continue
            src = s.source
            if src == "host":
                classes[HOST][EXACT] += n
                if exact_runs is not None:
                    exact_runs.append((b, end, HOST))
                continue
            code = POOL if src == "pool" else RING
            q = s.slot
            if q < 0 or q > MAX_SLOT - n:
                pieces.append((b, end, code, q, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                               OUT_OF_RANGE))
                continue
            if not self._known(src):
                pieces.append((b, end, code, q, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                               NO_UPLOAD))
                continue
            slots = self.pool if code == POOL else self.ring
            v = self.host.ver.get(view)
            if v is None or len(v) < end:
                v = self.host.views(view, end)[0]
            ident = self._canon.get((layer, stream, b - q))
            if (writes and ident is not None and len(slots.ident) >= q + n
                    and slots.ident[q:q + n].count(ident) == n
                    and slots.ver[q:q + n] == v[b:end]):
                classes[code][EXACT] += n
                if exact_runs is not None:
                    exact_runs.append((b, end, code))
                continue
            slots.pieces(layer, stream, b, q, v[b:end], code, writes, pieces)
        bad: list[Piece] = []
        counts = [0, 0, 0, 0]
        for p in pieces:
            k = p[1] - p[0]
            cls = p[4]
            classes[p[2]][cls] += k
            if cls == EXACT:
                if exact_runs is not None:
                    exact_runs.append((p[0], p[1], p[2]))
                continue
            counts[cls] += k
            bad.append(p)
        if bad:
            counts[EXACT] = sum(s.end - s.begin for s in served) - counts[1] - counts[2] \
                - counts[3]
            self._bad_read(e, bad, counts)
        else:
            counts[EXACT] = sum(s.end - s.begin for s in served if s.end > s.begin)
        self.last = ReadVerdict(e.seq, e.step, layer, stream, (counts[0], counts[1],
                                counts[2], counts[3]), tuple(bad))
        if exact_runs is not None:
            self._check_ranges(e, exact_runs, bad)
        if self.ledger is not None:
            self._ledger_read(e, counts, bad)
        self.completeness.slot_pages += e.pool + e.ring

    def _bad_read(self, e: ev.Read, bad: list[Piece], counts: list[int]) -> None:
        self.groups.read(e, bad)
        if counts[NOT_JUDGED]:
            by_why: dict[int, int] = {}
            for p in bad:
                if p[4] == NOT_JUDGED:
                    by_why[p[12]] = by_why.get(p[12], 0) + p[1] - p[0]
            for why, n in by_why.items():
                self.not_judged_why[why] += n
                g = self.groups.not_judged.get(why)
                if g is None:
                    g = self.groups.not_judged[why] = fnd.Group()
                g.add(Evidence(seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer),
                               stream=e.stream, text=f"{n} page(s)"), n)

    def _unserved(self, e: ev.Read) -> None:
        self.reads[1] += 1
        n = e.pool + e.ring + e.host
        for code, k in ((POOL, e.pool), (RING, e.ring), (HOST, e.host)):
            self.classes[code][NOT_JUDGED] += k
        self.not_judged_why[NO_SERVED] += n
        self.completeness.slot_pages += e.pool + e.ring
        self.groups.no_served.add(Evidence(seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer),
                                           stream=e.stream), n)
        said = self.groups.annotated_classes
        for r in e.ranges:
            said[r.cls] = said.get(r.cls, 0) + r.end - r.begin
        piece = (0, n, POOL, -1, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1, NO_SERVED)
        self.last = ReadVerdict(e.seq, e.step, e.layer, e.stream, (0, 0, 0, n),
                                (piece,) if n else ())
        if self.ledger is not None:
            self._ledger_read(e, [0, 0, 0, n], [])

    def _ledger_read(self, e: ev.Read, counts: list[int], bad: list[Piece]) -> None:
        led = self.ledger
        assert led is not None
        index = led.reads.n
        led.reads.append((self.rows, e.seq, e.step, e.layer, e.stream, *counts))
        for p in bad:
            led.pieces.append((index, *p))
        for write, cls in self._missed(e.layer, e.stream, bad):
            led.flows.append((write, e.seq, index, cls))

    def _missed(self, layer: int, stream: int, bad: Iterable[Piece]) -> list[tuple[int, int]]:
        """(write seq, class) of the last writes of the stale and foreign pages: the flows."""
        w = self.host.wseq.get((layer, stream))
        if w is None:
            return []
        out: dict[int, int] = {}
        for p in bad:
            if p[4] in (STALE, FOREIGN):
                for seq in set(w[p[0]:p[1]]):
                    if seq > 0:
                        out.setdefault(seq, p[4])
        return sorted(out.items())

    def missed_writes(self, verdict: ReadVerdict | None = None) -> list[int]:
        """The writes whose bytes the read (default: the last one fed) did not get: for each
        stale or foreign page, the last write of that page before the read (flows start
        there). Ask right after feeding the read."""
        v = verdict or self.last
        if v is None:
            return []
        return [seq for seq, _ in self._missed(v.layer, v.stream, v.pieces)]

    def _check_ranges(self, e: ev.Read, exact: list[tuple[int, int, int]],
                      bad: list[Piece]) -> None:
        """Compare the model's annotated ranges with the verdicts, page by page."""
        if not bad:
            if all(r.cls == "exact" for r in e.ranges):
                return
        elif any(p[4] == NOT_JUDGED for p in bad):
            return
        derived = _as_ranges(e.stream, exact, bad)
        if derived != _merge(e.ranges):
            self.groups.annotation.add(Evidence(
                seq=e.seq, step=e.step, layer=fnd.layer_of(e.layer), stream=e.stream,
                text="annotated " + _ranges_text(e.ranges) + "; judged "
                     + _ranges_text(derived)))

    def pages(self, e: ev.Read) -> list[PageVerdict]:
        """Every page of the read's ``served`` runs, judged (ask right after feeding it; a
        read without served has no pages to list: :attr:`last` counts them not judged)."""
        out: list[PageVerdict] = []
        layer, stream, view = e.layer, e.stream, (e.layer, e.stream)
        if not e.served:
            return out  # no page numbers to judge: the read's verdict says why
        writes = bool(self._writes)
        for s in e.served:
            b, end = s.begin, s.end
            if end <= b or b < 0 or end > MAX_PAGE:
                continue
            v = self.host.views(view, end)[0]
            pieces: list[Piece] = []
            code = SOURCE_CODE[s.source]
            q = s.slot
            if code == HOST:
                pieces.append((b, end, HOST, -1, EXACT, 0, -1, -1, -1, -1, -1, -1, 0))
            elif q < 0 or q > MAX_SLOT - (end - b):
                pieces.append((b, end, code, q, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                               OUT_OF_RANGE))
            elif not self._known(s.source):
                pieces.append((b, end, code, q, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                               NO_UPLOAD))
            else:
                (self.pool if code == POOL else self.ring).pieces(
                    layer, stream, b, q, v[b:end], code, writes, pieces)
            for p in pieces:
                slots = self.pool if p[2] == POOL else self.ring
                for i in range(p[1] - p[0]):
                    page = p[0] + i
                    slot = p[3] + i if p[3] >= 0 else -1
                    holder: Copy | None = None
                    if p[6] >= 0:
                        if p[1] - p[0] == 1:
                            holder = Copy(p[6], p[7], p[8], p[9], p[10], p[11])
                        else:
                            held = slots.held(slot)
                            holder = held if held is not None else None
                    out.append(PageVerdict(e.seq, e.step, layer, stream, page,
                                           SOURCES[p[2]], slot, CLASSES[p[4]], p[5], v[page],
                                           holder, WHY[p[12]]))
        return out

    # -- the judgement ---------------------------------------------------------------------

    @property
    def steps(self) -> Steps:
        return Steps(self._first_step, self._last_step,
                     self._table.get(ev.Step, [0])[0])

    @property
    def counts(self) -> dict[str, int]:
        """Events per kind."""
        out: Counter[str] = Counter(self._unknown)
        for cls, (n, _) in self._table.items():
            if n and cls is not ev.Unknown:
                out[cls.__struct_config__.tag] += n  # type: ignore[attr-defined]
        return dict(out)

    def snapshot(self) -> Judgement:
        """The judgement of everything fed so far (an immutable value)."""
        counts = self.counts
        completeness = self.completeness.result(counts)
        return Judgement(
            counts=counts, steps=self.steps, end=self.end, last_seq=self.last_seq,
            rows=self.rows, completeness=completeness,
            findings=tuple(self._findings(completeness)), residency=self._residency(),
            ledger=self.ledger.snapshot() if self.ledger is not None else None)

    def arisen(self) -> list[Finding]:
        """The findings that first appeared since the last call, each once (by
        :func:`~kvdiag.analysis.judgement.findings.identity`), as they stand now: for a caller
        that follows a growing trace (``kvdiag check --follow``). Findings that later events
        could withdraw are not among them — what the trace does not record (a later event or
        ``records`` declaration may show it), the run not completing (the End event may
        come) — :meth:`snapshot` has those once the trace has ended."""
        command = f"kvdiag trace pages {self.name} --json" if self.name else None
        found = fnd.build(self.groups, pages_command=command) + self.adapt.findings()
        found += fnd.cross_check(self.groups)
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
        kind_pages = {"upload": NO_UPLOAD, "write": NO_WRITE}
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
        if self.end is None or self.end.status == "error":
            out.append(fnd.incomplete(self.end, self.last_seq, self._last_step))
        return out

    def _residency(self) -> dict[str, Any]:
        up_count: Counter[str] = Counter()
        up_pages: Counter[str] = Counter()
        up_bytes: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for (target, reason), (count, pages, nbytes) in self.uploads.items():
            up_count[target] += count
            up_pages[target] += pages
            up_bytes[target] += nbytes
            reasons[reason] += pages
        pool_read = self.pages_read[0]
        total = [sum(c[i] for c in self.classes) for i in range(4)]
        return {
            "pages_read": dict(zip(SOURCES, self.pages_read, strict=True)),
            "read_classes": {"exact": total[EXACT], "stale": total[STALE],
                             "foreign": total[FOREIGN], "not_judged": total[NOT_JUDGED]},
            "read_classes_by_source": {
                src: {"exact": c[EXACT], "stale": c[STALE], "foreign": c[FOREIGN],
                      "not_judged": c[NOT_JUDGED]} for src, c in zip(SOURCES, self.classes,
                                                                      strict=True)},
            "not_judged": {WHY_KEY[w]: n for w, n in sorted(self.not_judged_why.items())},
            "reads": {"judged": self.reads[0], "without_served": self.reads[1]},
            "cross_check": {"annotation_disagrees": self.groups.annotation.count,
                            "versions_disagree": self.groups.versions.count},
            "out_of_range": self.out_of_range,
            "resident_hits": pool_read - up_pages["resident"],
            "resident_hit_rate": (max(0.0, 1.0 - up_pages["resident"] / pool_read)
                                  if pool_read else None),
            "uploads": dict(up_count),
            "upload_pages": dict(up_pages),
            "upload_bytes": dict(up_bytes),
            "upload_reasons": dict(reasons),
            "ring_pages": up_pages["ring"],
            "evictions": self.evictions,
            "invalidations": self.invalidations,
            "routes": dict(self.routes),
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
        }


def _as_ranges(stream: int, exact: list[tuple[int, int, int]], bad: list[Piece]
               ) -> tuple[ev.ReadRange, ...]:
    """Verdicts in the model annotation's shape: runs of equal (source, holder stream, class,
    lag), in page order."""
    items: list[tuple[int, int, str, int, str, int]] = [
        (b, e, SOURCES[src], stream, "exact", 0) for b, e, src in exact]
    items += [(p[0], p[1], SOURCES[p[2]], p[7] if p[6] >= 0 else -1, CLASSES[p[4]],
               p[5]) for p in bad]
    items.sort()
    return _merge(ev.ReadRange(*i) for i in items)  # type: ignore[arg-type]


def _merge(ranges: Iterable[ev.ReadRange]) -> tuple[ev.ReadRange, ...]:
    out: list[ev.ReadRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if (last is not None and last.end == r.begin and last.source == r.source
                and last.holder == r.holder and last.cls == r.cls
                and last.version_lag == r.version_lag):
            out[-1] = ev.ReadRange(last.begin, r.end, r.source, r.holder, r.cls, r.version_lag)
        else:
            out.append(r)
    return tuple(out)


def _ranges_text(ranges: Iterable[ev.ReadRange]) -> str:
    return ", ".join(f"{r.begin}..{r.end - 1} {r.source} {r.cls}"
                     + (f" (stream {r.holder})" if r.cls == "foreign" else "")
                     + (f" -{r.version_lag}" if r.cls == "stale" else "") for r in ranges)
