"""Align two traces of one schedule and explain the first divergence that matters.

Two traces of the same request schedule (model vs native, upstream vs patched, shared vs
per-stream layout) are walked step by step, and within a step in the runtime's order: per
layer the writes, the FA node's route, the reads; then the outputs. Aligned by (step, layer,
stream), the first of these that differs is the divergence:

- ``key``: the same rows (a write of the same cells of the same stream) marked different
  bookkeeping keys. The shared layout's ``(layer, page)`` key is read as the writing stream's
  page, so stream 0 keys agree across layouts and stream 1's do not when the page differs;
- ``route``: the FA node of a layer took a different route (streamed, fallback, abort);
- ``provenance``: a read page got a different verdict (exact / stale / foreign; for pages
  that are not exact, also whose bytes the slot held), as each trace's judgement
  (:mod:`kvdiag.analysis.judgement`) has it, never the annotation; pages not judged in either
  trace are not compared, and an exact page agrees with an exact page whatever its source;
- ``output``: a stream's output diverged from its reference in one trace and not the other
  (or, for traces of the same backend, its checksum differs).

- ``abort``: one trace aborted where the other did not (or with another assert): found at the
  end, once each trace's judgement says how it ended; the other trace must have completed or
  reached that step, else whether it would have aborted too is not recorded.
- ``end``: with no other divergence, one run completed and the other stopped without
  completing (killed or cut: no End event; or an End with status error or aborted and no
  abort event): the steps both hold may agree, but a run that stops early is not equivalent to
  one that completes. Its step is the first one the stopped run lacks.

Events lost from either trace (gaps in seq: docs/trace-format.md, "Lost events") are not
compared: each side's judgement leaves what needs them not judged, and diff compares what both
traces hold. With no divergence there, the verdict is ``lost-events``, not equivalence: what
the lost events held may differ. A divergence found is reported as one (the events both hold
differ), and where events lost in a trace come before it, an earlier divergence may be among
them (:meth:`DiffResult.lost_before_first`).

A ``key`` or ``route`` divergence is a cause; the walk then goes on to its first effect (a
``provenance`` or ``output`` divergence) and explains it as a chain: the rows, the key they
marked in each trace, the upload the resident copy came from, the read.

Each trace is judged exactly as ``kvdiag check`` judges it: a Judge built from its own header
(:func:`~kvdiag.analysis.judgement.trace_judge`: what the writer declares it records, its
``native_quants``), fed every event in file order — a ring copy of a later layer that
overwrote a slot before an earlier layer's read is seen as check sees it — a block of whole
steps (up to a chunk of events) at a time. Memory is bounded by one block of each trace and the
two judgements' per-page state. The schedules
(step events: phase, streams, tokens) are compared for every step both traces have; a trace
that stopped early (an abort) is a prefix of the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvdiag.analysis.judgement import (
    CHUNK,
    CLASSES,
    SOURCES,
    WHY,
    Copy,
    Judgement,
    PageVerdict,
    ReadVerdict,
    Trace,
    batches,
    trace_judge,
)
from kvdiag.analysis.judgement.classes import MAX_PAGE, STALE
from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS

Key = tuple[int, int | None, int]


@dataclass(frozen=True)
class Divergence:
    kind: str
    """``key``, ``route``, ``provenance``, ``output``, ``abort`` (one trace aborted where
    the other did not, or with another assert) or ``end`` (one run completed, the other
    stopped without completing)."""
    step: int
    layer: int | None
    stream: int | None
    text: str
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "layer": self.layer,
                "stream": self.stream, "text": self.text, "a": self.a, "b": self.b}


@dataclass
class DiffResult:
    steps_compared: int = 0
    first: Divergence | None = None
    effect: Divergence | None = None
    """The first provenance/output divergence after a key or route divergence."""
    chain: list[str] = field(default_factory=list)
    schedule: str | None = None
    """Why the schedules differ (None: they agree)."""
    lengths: tuple[int, int] = (0, 0)
    compared: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("writes", "routes", "reads", "reads_not_recorded", "outputs", "outputs_not_recorded"),
        0))
    """What was compared (writes of the same rows, FA routes, reads page by page, outputs),
    and what could not be for want of recorded facts (a read without ``served`` in either
    trace, an output without a reference)."""

    ends: tuple[dict[str, Any], dict[str, Any]] = field(default_factory=lambda: ({}, {}))
    """How each trace ended, as its judgement says: ``status`` (completed, aborted, error,
    incomplete), the End's ``reason``, its ``last_step``, its ``aborts`` (seq, step, message of each ``abort`` finding) and its
    ``lost_events`` (events missing between those it holds: what was compared after the
    first gap rests on an incomplete record)."""

    @property
    def nothing_compared(self) -> bool:
        """No write, route, read or output of one trace had a counterpart in the other: the
        traces have nothing in common, which is not equivalence."""
        c = self.compared
        return self.first is None and not (c["writes"] or c["routes"] or c["reads"]
                                           or c["outputs"])

    @property
    def lost(self) -> tuple[bool, bool]:
        """Per trace: events are missing from it (gaps in seq, or counted by its End where no
        seq shows them: its judgement's ``lost_events``, docs/trace-format.md "Lost
        events")."""
        a, b = (bool(e.get("lost_events", {}).get("events")) for e in self.ends)
        return a, b

    @property
    def verdict(self) -> str:
        """``divergent`` (a divergence found), ``nothing-compared`` (nothing in common),
        ``lost-events`` (no divergence in what both traces hold, but events are missing from
        one or both: what they held is not compared, so equivalence is not shown), or
        ``equivalent``."""
        if self.first is not None:
            return "divergent"
        if self.nothing_compared:
            return "nothing-compared"
        if any(self.lost):
            return "lost-events"
        return "equivalent"

    @property
    def equivalent(self) -> bool:
        return self.verdict == "equivalent"

    def lost_before_first(self) -> list[str]:
        """The traces (``a``, ``b``) whose lost events may come before the first divergence:
        an earlier divergence may be among them (the first gap is the earliest; it is before
        the divergence when its first seq is below the divergence's event in that trace, or,
        for a divergence without one, when it is at or before the divergence's step; events
        lost where no seq shows it may lie anywhere, so before it too)."""
        d = self.first
        if d is None:
            return []
        out = []
        for name, end, mine in zip("ab", self.ends, (d.a, d.b), strict=True):
            lost = end.get("lost_events", {})
            if not lost.get("events"):
                continue
            if lost.get("unplaced"):  # where is unknown: before it as likely as after
                out.append(name)
                continue
            gap = lost["first"][0]
            seq = mine.get("seq")
            if seq is None and isinstance(mine.get("abort"), dict):
                seq = mine["abort"].get("seq")
            if isinstance(seq, int):
                before = gap["first_seq"] < seq
            else:
                before = gap["step_before"] is None or gap["step_before"] <= d.step
            if before:
                out.append(name)
        return out


class ScheduleMismatch(ValueError):
    """The traces do not run the same schedule: aligning them would compare unrelated steps."""


def _fmt_key(k: Key) -> str:
    return f"({k[0]}, page {k[2]})" if k[1] is None else f"({k[0]}, stream {k[1]}, page {k[2]})"


def _fmt_keys(keys: Iterable[Key]) -> str:
    keys = list(keys)
    return ", ".join(_fmt_key(k) for k in keys) if keys else "no key"


class _Side:
    """One trace's judgement, built and fed as ``kvdiag check`` builds and feeds it
    (:func:`~kvdiag.analysis.judgement.trace_judge`: the trace's header, its events in file
    order, a block of whole steps at a time), keeping what a cause chain needs: the last write
    of every page and the mark of its ubatch, as they stood before the block."""

    def __init__(self, name: str, trace: Trace) -> None:
        self.name = name
        self.judge = trace_judge(trace, keep_writes=True, detail=True)
        self.groups = _steps(trace)
        self.abort: ev.Abort | None = None
        self.block: list[Any] = []
        self._at: dict[int, int] = {}
        """id(event) → its index in the block."""
        self.verdicts: dict[int, ReadVerdict | None] = {}
        """id(read) → its verdict, for every read of the block."""
        self._answerable: set[int] = set()
        """id(read) of the reads of the last chunk fed: the Judge lists their pages."""
        self._pre_writes: dict[tuple[int, int, int], tuple[ev.Write, ev.Mark | None] | None] = {}
        self._pre_mark: ev.Mark | None = None

    def feed(self, groups: list[list[Any]]) -> None:
        """Judge a block of step groups, as one chunk where no ``records`` or ``snapshot``
        event splits it (the Judge then answers for every read of the block)."""
        block = [e for g in groups for e in g]
        if not block:
            return
        judge = self.judge
        self._pre_mark = judge.mark
        self._pre_writes = {}
        for e in block:
            if type(e) is ev.Write:
                for key in _written(e):
                    if key not in self._pre_writes:
                        self._pre_writes[key] = judge.last_write(*key)
        self.block, self._at, self.verdicts = block, {id(e): i for i, e in enumerate(block)}, {}
        for chunk in batches(block, max(CHUNK, len(block))):
            judge.feed_all(chunk, len(chunk))
            reads = [e for e in chunk if type(e) is ev.Read]
            self.verdicts.update((id(e), judge.verdict(e)) for e in reads)
            self._answerable = set(map(id, reads))
        for e in block:
            if type(e) is ev.Abort:
                self.abort = e

    def page(self, read: ev.Read, page: int) -> PageVerdict | None:
        """The judgement of one page of a read of the block."""
        if id(read) in self._answerable:
            return next((v for v in self.judge.pages(read) if v.page == page), None)
        return _from_pieces(read, self.verdicts.get(id(read)), page)

    def mark_before(self, e: Any) -> ev.Mark | None:
        """The mark of the ubatch an event of the block belongs to (the last one before it)."""
        for x in reversed(self.block[:self._at[id(e)]]):
            if type(x) is ev.Mark:
                return x
        return self._pre_mark

    def write_before(self, read: ev.Read, layer: int, stream: int, page: int
                     ) -> tuple[ev.Write, ev.Mark | None] | None:
        """The last write of a host page before a read of the block, and its ubatch's mark."""
        i = self._at[id(read)]
        for j in range(i - 1, -1, -1):
            w = self.block[j]
            if type(w) is ev.Write and (layer, stream, page) in _written(w):
                return w, self.mark_before(w)
        key = (layer, stream, page)
        return self._pre_writes[key] if key in self._pre_writes else self.judge.last_write(*key)


def _written(w: ev.Write) -> set[tuple[int, int, int]]:
    """(layer, stream, page) of the host pages a write's cells touch (as the Judge keeps
    them: :meth:`Judge.last_write`)."""
    c0, c1 = w.cells
    if not c1 > c0 >= 0:
        return set()
    return {(w.layer, w.stream, p)
            for p in range(c0 // PAGE_TOKENS, min((c1 - 1) // PAGE_TOKENS + 1, MAX_PAGE))}


def _classes(read: ev.Read, v: ReadVerdict | None) -> tuple[dict[int, tuple[str, Any]],
                                                            list[tuple[int, int]]]:
    """A read's pages that are not exact — page → (class, whose bytes: (layer, stream, page)
    or None) — from its verdict's pieces, and its served runs (every other page of them is
    exact)."""
    runs = [(r.begin, r.end) for r in read.served if 0 <= r.begin < r.end <= MAX_PAGE]
    out: dict[int, tuple[str, Any]] = {}
    for piece in (v.pieces if v is not None else ()):
        b, end, cls, hl, hs, hp = piece[0], piece[1], piece[4], piece[6], piece[7], piece[8]
        for page in range(b, end):
            out[page] = (CLASSES[cls], None if hl < 0 and hs < 0 else (hl, hs, hp + page - b))
    return out, runs


def _from_pieces(read: ev.Read, v: ReadVerdict | None, page: int) -> PageVerdict | None:
    """A page's verdict rebuilt from its read's pieces, where the Judge can no longer list the
    read's pages (a ``records`` or ``snapshot`` event split the block): the host version of
    an exact page and the upload of its copy are then unknown (-1)."""
    for piece in (v.pieces if v is not None else ()):
        b, end = piece[0], piece[1]
        if b <= page < end:
            src, slot, cls, lag = piece[2], piece[3], piece[4], piece[5]
            hl, hs, hp, hv, hstep, hseq = piece[6:12]
            holder = None if hl < 0 and hs < 0 else Copy(hl, hs, hp + page - b, hv, hstep, hseq)
            return PageVerdict(read.seq, read.step, read.layer, read.stream, page, SOURCES[src],
                               -1 if slot < 0 else slot + page - b, CLASSES[cls], lag,
                               hv + lag if cls == STALE else -1, holder, WHY[piece[12]])
    for r in read.served:
        if r.begin <= page < r.end:
            host = r.source == "host"
            return PageVerdict(read.seq, read.step, read.layer, read.stream, page, r.source,
                               -1 if host else r.slot + page - r.begin, "exact", 0, -1, None, "")
    return None


def _steps(events: Iterable[ev.AnyEvent | ev.Unknown]) -> Iterator[list[Any]]:
    """Every event, grouped by step in file order (a group starts at each ``step`` event;
    events before a step's ``step`` event with that step number belong to it). Kinds that
    belong to no step of the schedule (``end``, ``telemetry``, ``kernel``, unknown ones such as
    an older reader's ``records``) join the group they fall in: the Judge is fed them all."""
    group: list[Any] = []
    current: int | None = None
    for e in events:
        if not isinstance(e, (ev.End, ev.Telemetry, ev.Kernel, ev.Unknown)):
            if current is not None and e.step != current and group:
                yield group
                group = []
            current = e.step
        group.append(e)
    if group:
        yield group


def _schedule(group: list[Any]) -> tuple[Any, ...] | None:
    for e in group:
        if isinstance(e, ev.Step):
            return (e.phase, tuple(e.streams), e.tokens)
    return None


def _norm(key: Key, stream: int) -> tuple[int, int, int]:
    """A shared-layout key names the writing stream's page (stream 0 agrees across layouts)."""
    return key[0], stream if key[1] is None else key[1], key[2]


class Differ:
    def __init__(self, force: bool = False) -> None:
        self.force = force
        self.result = DiffResult()

    def run(self, a_trace: Trace, b_trace: Trace) -> DiffResult:
        """Compare two traces (each a :class:`~kvdiag.analysis.judgement.Trace`: its header
        and its events), judged as ``kvdiag check`` judges them."""
        self.a, self.b = _Side("A", a_trace), _Side("B", b_trace)
        ia, ib = self.a.groups, self.b.groups
        n_a = n_b = 0
        pending: list[tuple[list[Any], list[Any]]] = []
        size = [0, 0]
        while True:
            ga, gb = next(ia, None), next(ib, None)
            n_a += ga is not None
            n_b += gb is not None
            if ga is None or gb is None:
                self._block(pending)
                # one trace stopped: the rest of the other is judged (how it ends is part of
                # the result) and counted, not compared
                side, rest = (self.b, ib) if ga is None else (self.a, ia)
                last = [g for g in (ga, gb) if g is not None]
                extra = 0
                block: list[list[Any]] = []
                for g in itertools.chain(last, rest):
                    extra += 1
                    block.append(g)
                    if sum(map(len, block)) >= CHUNK:
                        side.feed(block)
                        block = []
                side.feed(block)
                extra -= len(last)
                n_a, n_b = (n_a, n_b + extra) if ga is None else (n_a + extra, n_b)
                break
            if pending and (size[0] + len(ga) > CHUNK or size[1] + len(gb) > CHUNK):
                # the Judge judges a chunk of events at once: whole steps of both traces,
                # aligned, up to a chunk (fed a layer at a time it took 78 s of CPU where
                # check takes 1.5 s)
                self._block(pending)
                pending, size = [], [0, 0]
            pending.append((ga, gb))
            size[0] += len(ga)
            size[1] += len(gb)
        self.result.lengths = (n_a, n_b)
        ja, jb = self.a.judge.snapshot(), self.b.judge.snapshot()
        self.result.ends = (_end(ja), _end(jb))
        last_steps = (ja.steps.last, jb.steps.last)
        crash = _abort_divergence(self.result.ends, last_steps)
        if crash is not None:
            self._found(crash, cause=False)
        stop = _end_divergence(self.result.ends, last_steps)
        if stop is not None and self.result.first is None:
            self._found(stop, cause=False)
        return self.result

    def _block(self, pairs: list[tuple[list[Any], list[Any]]]) -> None:
        """Aligned steps of both traces: the schedules checked, both judged, compared step by
        step (nothing is judged or compared once the first effect is found)."""
        for ga, gb in pairs:
            sa, sb = _schedule(ga), _schedule(gb)
            if sa != sb and self.result.schedule is None:
                self.result.schedule = (
                    f"step {_step_of(ga)}: A runs {_fmt_sched(sa)}, B runs {_fmt_sched(sb)}")
                if not self.force:
                    raise ScheduleMismatch(
                        f"the traces run different schedules ({self.result.schedule}); "
                        "use --force to compare them anyway")
        self.a.feed([ga for ga, _ in pairs])
        self.b.feed([gb for _, gb in pairs])
        for ga, gb in pairs:
            if self.result.effect is not None:
                return
            self._step(ga, gb)
            self.result.steps_compared += 1

    # -- one step ------------------------------------------------------------------------

    def _step(self, ga: list[Any], gb: list[Any]) -> None:
        """Compare both steps layer by layer, in the runtime's order (each trace was judged
        in its own file order)."""
        step = _step_of(ga)
        la, lb = _by_layer(ga), _by_layer(gb)
        for layer in sorted(set(la) | set(lb), key=lambda x: (x is not None, x)):
            if layer is None:
                continue
            ea, eb = la.get(layer, []), lb.get(layer, [])
            self._writes(step, layer, ea, eb)
            self._route(step, layer, ea, eb)
            self._reads(step, layer, ea, eb)
        self._outputs(step, ga, gb)

    def _found(self, d: Divergence, cause: bool) -> None:
        r = self.result
        if r.first is None:
            r.first = d
            if not cause:
                r.effect = d
        elif r.effect is None and not cause:
            r.effect = d

    def _writes(self, step: int, layer: int, ea: list[Any], eb: list[Any]) -> None:
        if self.result.first is not None:
            return
        wa = {(w.stream, w.cells): w for w in ea if isinstance(w, ev.Write)}
        wb = {(w.stream, w.cells): w for w in eb if isinstance(w, ev.Write)}
        for key in sorted(set(wa) & set(wb)):
            self.result.compared["writes"] += 1
            a, b = wa[key], wb[key]
            na = sorted(_norm(k, a.stream) for k in a.dirty)
            nb = sorted(_norm(k, b.stream) for k in b.dirty)
            if na != nb:
                text = (f"stream {a.stream} rows {a.rows[0]}-{a.rows[1] - 1} marked "
                        f"{_fmt_keys(a.dirty)} in A{_outside(self.a.mark_before(a))}, "
                        f"{_fmt_keys(b.dirty)} in B{_outside(self.b.mark_before(b))}")
                self._found(Divergence("key", step, layer, a.stream, text,
                                       {"seq": a.seq, "dirty": [list(k) for k in a.dirty]},
                                       {"seq": b.seq, "dirty": [list(k) for k in b.dirty]}),
                            cause=True)
                return

    def _route(self, step: int, layer: int, ea: list[Any], eb: list[Any]) -> None:
        if self.result.first is not None:
            return
        fa = next((e for e in ea if isinstance(e, ev.Fits)), None)
        fb = next((e for e in eb if isinstance(e, ev.Fits)), None)
        if fa is None or fb is None:
            return
        self.result.compared["routes"] += 1
        if fa.route == fb.route:
            return
        def side(f: ev.Fits, s: _Side) -> str:
            why = f"fits() {str(f.result).lower()}"
            if f.failed:
                why += f": {', '.join(f.failed)} failed"
            tail = f"; {s.abort.message}" if f.route == "abort" and s.abort else ""
            return f"{f.route} ({why}){tail}"
        text = f"the FA node of layer {layer} was routed {side(fa, self.a)} in A, {side(fb, self.b)} in B"
        self._found(Divergence("route", step, layer, None, text,
                               {"seq": fa.seq, "route": fa.route, "failed": list(fa.failed)},
                               {"seq": fb.seq, "route": fb.route, "failed": list(fb.failed)}),
                    cause=True)

    def _reads(self, step: int, layer: int, ea: list[Any], eb: list[Any]) -> None:
        if self.result.effect is not None:
            return
        ra = {e.stream: e for e in ea if isinstance(e, ev.Read)}
        rb = {e.stream: e for e in eb if isinstance(e, ev.Read)}
        for stream in sorted(set(ra) & set(rb)):
            if not ra[stream].served or not rb[stream].served:
                self.result.compared["reads_not_recorded"] += 1
                continue  # provenance not recorded: nothing derived to compare
            self.result.compared["reads"] += 1
            page = _first_difference(ra[stream], self.a.verdicts.get(id(ra[stream])),
                                     rb[stream], self.b.verdicts.get(id(rb[stream])))
            if page is None:
                continue
            pa, pb = self.a.page(ra[stream], page), self.b.page(rb[stream], page)
            assert pa is not None and pb is not None
            d = Divergence("provenance", step, layer, stream,
                           f"stream {stream} layer {layer} page {page} was read "
                           f"{_verdict(pa)} in A, {_verdict(pb)} in B",
                           _verdict_json(pa, ra[stream]), _verdict_json(pb, rb[stream]))
            self._found(d, cause=False)
            self.result.chain = self._chain(step, layer, stream, page, pa, pb,
                                            ra[stream], rb[stream])
            return

    def _chain(self, step: int, layer: int, stream: int, page: int, pa: PageVerdict,
               pb: PageVerdict, read_a: ev.Read, read_b: ev.Read) -> list[str]:
        """rows → key → upload → read, for the page whose verdicts differ."""
        out: list[str] = []
        wa, ma = self.a.write_before(read_a, layer, stream, page) or (None, None)
        wb, mb = self.b.write_before(read_b, layer, stream, page) or (None, None)
        if wa is not None:
            line = (f"rows: stream {stream} rows {wa.rows[0]}-{wa.rows[1] - 1} (cells "
                    f"{wa.cells[0]}-{wa.cells[1] - 1}) last wrote page {page} at step {wa.step}")
            if wb is not None and wb.cells == wa.cells and wb.step == wa.step:
                line += (f"; they marked {_fmt_keys(wa.dirty)} in A{_outside(ma)}, "
                         f"{_fmt_keys(wb.dirty)} in B{_outside(mb)}")
            else:
                line += f" in A and marked {_fmt_keys(wa.dirty)}{_outside(ma)}"
            out.append(line)
        for name, v in (("A", pa), ("B", pb)):
            if v.source == "host":
                out.append(f"{name}: page {page} was read zero-copy from the host store "
                           f"(version {v.version})")
            elif v.holder is None:
                out.append(f"{name}: {v.source} slot {v.slot} held no copy of any page "
                           f"when read at step {step}")
            else:
                c = v.holder
                what = (f"page {c.page} of stream {c.stream}"
                        if (c.layer, c.stream, c.page) != (layer, stream, page)
                        else f"page {c.page} version {c.version}")
                out.append(f"{name}: the {v.source} copy read at step {step} (slot {v.slot}, "
                           f"{what}) was last uploaded at step {c.step} (#{c.seq}); the host "
                           f"page is at version {v.version} → {v.cls}")
        return out

    def _outputs(self, step: int, ga: list[Any], gb: list[Any]) -> None:
        if self.result.effect is not None:
            return
        oa = {e.stream: e for e in ga if isinstance(e, ev.Output)}
        ob = {e.stream: e for e in gb if isinstance(e, ev.Output)}
        for stream in sorted(set(oa) & set(ob)):
            a, b = oa[stream], ob[stream]
            da, db = a.diverged, b.diverged
            recorded = da is not None and db is not None
            self.result.compared["outputs" if recorded else "outputs_not_recorded"] += 1
            differs = recorded and da != db
            if differs:
                text = (f"stream {stream} output {'diverges' if da else 'matches'} its reference "
                        f"in A (max |Δ| {a.max_abs_delta:.3g}), "
                        f"{'diverges' if db else 'matches'} in B (max |Δ| {b.max_abs_delta:.3g})")
                self._found(Divergence("output", step, None, stream, text,
                                       {"seq": a.seq, "checksum": a.checksum,
                                        "max_abs_delta": a.max_abs_delta},
                                       {"seq": b.seq, "checksum": b.checksum,
                                        "max_abs_delta": b.max_abs_delta}), cause=False)
                return


def _end(j: Judgement) -> dict[str, Any]:
    """How a judged trace ended: its status and its aborts, as ``kvdiag check`` reports them,
    and the events it lost on the way (gaps in seq: its ``lost_events`` summary)."""
    aborts = [{"seq": f.evidence[0].seq, "step": f.evidence[0].step, "message": f.title}
              for f in j.findings if f.rule == "abort"]
    return {"status": j.status, "reason": j.end.reason if j.end is not None else "",
            "last_step": j.steps.last, "aborts": aborts,
            "lost_events": j.summary()["lost_events"]}


_HOW = {"incomplete": "no End event: killed, or still running",
        "error": "End status error", "aborted": "End status aborted"}


def _end_divergence(ends: tuple[dict[str, Any], dict[str, Any]],
                    last: tuple[int | None, int | None]) -> Divergence | None:
    """``end``: one run completed and the other did not (killed, cut, ended with an error):
    a run that stops early is not equivalent to one that completes, however well the steps
    both hold agree. None when both completed or neither did (then what the one would have
    done where the other stopped is not recorded; an abort is :func:`_abort_divergence`'s)."""
    done = [e["status"] == "completed" for e in ends]
    if done[0] == done[1]:
        return None
    side = done.index(False)
    stopped = ends[side]
    name, o_name = "AB"[side], "AB"[1 - side]
    at = last[side]
    where = f"after step {at}" if at is not None else "before its first step"
    why = _HOW.get(stopped["status"], stopped["status"])
    if stopped.get("reason"):
        why += f": {stopped['reason']}"
    text = (f"{name} stopped {where} without completing ({why}); {o_name} completed "
            f"(last step {last[1 - side]}): a run that stops early is not equivalent to one "
            "that completes")
    sides = [{"status": e["status"], "last_step": s} for e, s in zip(ends, last, strict=True)]
    return Divergence("end", 0 if at is None else at + 1, None, None, text, *sides)


def _abort_divergence(ends: tuple[dict[str, Any], dict[str, Any]],
                      last: tuple[int | None, int | None]) -> Divergence | None:
    """The first abort one trace records and the other does not (a run that crashed is not
    equivalent to one that went on), or None: the aborts agree (step and text), or the other
    trace stops before that step without completing — whether it would have aborted too is
    not recorded, so nothing is said."""
    pairs = itertools.zip_longest(ends[0]["aborts"], ends[1]["aborts"])
    for x, y in pairs:
        if x is not None and y is not None and (x["step"], x["message"]) == (y["step"], y["message"]):
            continue
        steps = [a["step"] if a is not None else None for a in (x, y)]
        side = 0 if steps[1] is None or (steps[0] is not None and steps[0] <= steps[1]) else 1
        abort, other = (x, y)[side], (x, y)[1 - side]
        assert abort is not None
        o_end, o_last = ends[1 - side], last[1 - side]
        if other is None and o_end["status"] != "completed" and (
                o_last is None or o_last < abort["step"]):
            return None
        name, o_name = "AB"[side], "AB"[1 - side]
        said = (f"{o_name} aborted at step {other['step']} (#{other['seq']}): "
                f"{other['message']}" if other is not None else
                f"{o_name} did not abort there ({o_end['status']}, last step {o_last})")
        return Divergence("abort", abort["step"], None, None,
                          f"{name} aborted at step {abort['step']} (#{abort['seq']}): "
                          f"{abort['message']}; {said}",
                          *[{"status": e["status"], "abort": a}
                            for e, a in ((ends[0], x), (ends[1], y))])
    return None


def _first_difference(ra: ev.Read, va: ReadVerdict | None, rb: ev.Read,
                      vb: ReadVerdict | None) -> int | None:
    """The first page both reads served whose class differs (or, not exact on both, whose
    bytes the slot held), pages not judged in either left out; None: they agree. Exact pages
    agree whatever the source."""
    if (va is None or not va.pieces) and (vb is None or not vb.pieces):
        return None  # every page exact on both sides (most reads)
    bad_a, runs_a = _classes(ra, va)
    bad_b, runs_b = _classes(rb, vb)
    for page in sorted(set(bad_a) | set(bad_b)):
        sa = bad_a.get(page) or (("exact", None) if _inside(page, runs_a) else None)
        sb = bad_b.get(page) or (("exact", None) if _inside(page, runs_b) else None)
        if sa is None or sb is None or "not judged" in (sa[0], sb[0]):
            continue
        if sa != sb:
            return page
    return None


def _inside(page: int, runs: list[tuple[int, int]]) -> bool:
    return any(b <= page < e for b, e in runs)


def _step_of(group: list[Any]) -> int:
    step: int = next((e.step for e in group
                 if not isinstance(e, (ev.End, ev.Telemetry, ev.Kernel, ev.Unknown))),
                group[0].step)
    return step


def _outside(m: ev.Mark | None) -> str:
    """The ubatch's rows that fell outside every resident window (mark.outside), if any."""
    if m is None or not m.outside:
        return ""
    pages = ", ".join(f"page {p}" if s is None else f"stream {s} page {p}" for s, p in m.outside)
    return f" (its rows fall in {pages}, outside every layer's resident window)"


def _by_layer(group: list[Any]) -> dict[int | None, list[Any]]:
    """A step's events per layer (None: events of no layer: step, mark, output, abort)."""
    out: dict[int | None, list[Any]] = {}
    for e in group:
        layer = getattr(e, "layer", None)
        if isinstance(e, ev.Learn):
            layer = None
        out.setdefault(layer, []).append(e)
    return out


def _holder(v: PageVerdict) -> tuple[int, int, int] | None:
    return None if v.holder is None else (v.holder.layer, v.holder.stream, v.holder.page)


def _verdict(v: PageVerdict) -> str:
    if v.source == "host":
        return "exact from the host store"
    if v.cls == "stale":
        return f"stale from {v.source} slot {v.slot} ({v.lag} write(s) old)"
    if v.cls == "foreign":
        if v.holder is None:
            return f"foreign from {v.source} slot {v.slot} (never loaded)"
        layer = "" if v.holder.layer == v.layer else f"layer {v.holder.layer} "
        return (f"foreign from {v.source} slot {v.slot} (holding {layer}stream "
                f"{v.holder.stream} page {v.holder.page})")
    return f"exact from {v.source} slot {v.slot}"


def _verdict_json(v: PageVerdict, read: ev.Read) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": read.seq, "page": v.page, "source": v.source, "slot": v.slot,
                           "class": v.cls, "lag": v.lag, "version": v.version}
    if v.holder is not None:
        out["copy"] = {"layer": v.holder.layer, "stream": v.holder.stream,
                       "page": v.holder.page, "version": v.holder.version,
                       "uploaded_step": v.holder.step, "upload_seq": v.holder.seq}
    return out


def _fmt_sched(s: tuple[Any, ...] | None) -> str:
    if s is None:
        return "no step event"
    phase, streams, tokens = s
    return f"{phase} of streams {list(streams)} × {tokens} token(s)"
