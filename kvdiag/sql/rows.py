"""Traces and logs as table rows, streamed: one pass, memory independent of the input's length.

A trace is read once by :class:`~kvdiag.trace.reader.TraceReader` and fed to one
:class:`~kvdiag.analysis.judgement.Judge`; right after the Judge has taken an event, the rows
that event gives are handed to a :class:`Sink` (the judgement's verdicts, never recomputed:
a read's non-exact runs are :attr:`Judge.last`'s pieces, the rest of its served pages are
exact, as the ledger defines it; a fits decision is :meth:`Judge.fits_verdict`). Findings
are the judgement's at the end, as ``kvdiag check`` reports them.

A log is read by the post-mortem scanner (crashes with their frames, the signatures'
findings, as ``kvdiag postmortem`` reports them) and by ``kvdiag perf``'s request reader
(:mod:`kvdiag.postmortem.perfscan`: the timings). A log's kv-stream lines become events
only through ``kvdiag import`` (docs/sql.md says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

from kvdiag.analysis.judgement import Judge, batches, trace_judge
from kvdiag.analysis.judgement.classes import CLASSES, SOURCES, WHY
from kvdiag.model import events as ev
from kvdiag.model.findings import Finding
from kvdiag.model.fits import Condition
from kvdiag.model.logrecords import Crash
from kvdiag.trace.reader import TraceReader

MAX_PAGE = 1 << 20
"""As the Judge: a served run beyond this is out of range and not judged (classes.MAX_PAGE)."""


class Sink(Protocol):
    def row(self, table: str, values: tuple[Any, ...]) -> None: ...

    def event(self, event: ev.AnyEvent | ev.Unknown) -> None: ...


class _Conditions:
    """Ids of distinct condition sets of one file (decisions of one graph repeat them)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.ids: dict[tuple[Condition, ...], int] = {}

    def id(self, conds: tuple[Condition, ...]) -> int:
        got = self.ids.get(conds)
        if got is None:
            got = self.ids[conds] = len(self.ids)
            for i, c in enumerate(conds):
                self.sink.row("conditions", (got, i, c.name, c.state, c.values or None,
                                             c.why or None))
        return got


def _pages_rows(judge: Judge, e: ev.Read, sink: Sink) -> None:
    """One row per run of pages with one verdict (module docstring)."""
    v = judge.verdict(e)
    assert v is not None and v.seq == e.seq  # e is a read of the chunk fed last
    layer, stream, seq, step = e.layer, e.stream, e.seq, e.step
    if not e.served:
        n = e.pool + e.ring + e.host
        if n:
            sink.row("pages", (seq, step, layer, stream, None, None, None, None, n, "not judged",
                               None, None, None, None, None, None, WHY[1]))
        return
    bad = sorted(v.pieces)
    for s in e.served:
        b, end = s.begin, s.end
        if end <= b or b < 0 or end > MAX_PAGE:
            continue
        src = SOURCES.index(s.source)
        at = b
        for p in bad:
            if p[2] != src or p[0] < b or p[1] > end:
                continue
            if p[0] > at:
                _exact(sink, seq, step, layer, stream, s, at, p[0])
            at = max(at, p[1])
            held = p[6] >= 0
            sink.row("pages", (
                seq, step, layer, stream, s.source, p[3] if p[3] >= 0 else None, p[0], p[1],
                p[1] - p[0], CLASSES[p[4]], p[5] if p[4] == 1 else None,
                p[6] if held else None, p[7] if held else None, p[8] if held else None,
                p[10] if held else None, p[11] if held else None, WHY[p[12]] or None))
        if at < end:
            _exact(sink, seq, step, layer, stream, s, at, end)


def _exact(sink: Sink, seq: int, step: int, layer: int, stream: int, s: ev.Served,
           begin: int, end: int) -> None:
    slot = s.slot + begin - s.begin if s.slot >= 0 else None
    sink.row("pages", (seq, step, layer, stream, s.source, slot, begin, end, end - begin,
                       "exact", None, None, None, None, None, None, None))


def _fits_row(judge: Judge, e: ev.Fits, sink: Sink, conds: _Conditions) -> None:
    v = judge.fits_verdict(e)
    sink.row("fits", (e.seq, e.step, e.layer, e.node or None, e.route, e.result, v.outcome,
                      list(v.failed), v.by, v.note or None, conds.id(v.conditions)))


def _timing_row(e: ev.Timing, sink: Sink) -> None:
    sink.row("timings", (e.seq, None, e.t_ns, e.boot, e.slot, e.task, e.prompt_tokens,
                         e.prompt_ms, e.prompt_tps, e.decode_tokens, e.decode_ms, e.decode_tps,
                         e.ms_per_token, e.depth_start, e.depth_end, e.cached, e.n_ctx_slot,
                         e.truncated, e.graphs_reused))


def _abort_rows(e: ev.Abort, crash: int, sink: Sink) -> None:
    sink.row("crashes", (crash, None, e.seq, "abort", None, None, None, e.file or None,
                         e.line or None, e.condition or None, e.message, None, e.cuda_error,
                         None, None, len(e.backtrace)))
    for i, text in enumerate(e.backtrace):
        sink.row("frames", (crash, i, None, None, None, text, None, None, None, None, text))
    # an imported log's faulthandler stacks (format 1.3): the rows the log gives
    for s, stack in enumerate(e.python_stacks):
        for f in stack.as_frames():
            sink.row("python_frames", (crash, s, stack.thread, stack.name, stack.current,
                                       f.index, f.file, f.line, f.function, f.in_app))


def findings_rows(findings: Iterable[Finding], sink: Sink) -> None:
    for n, f in enumerate(findings):
        d = f.details
        first = d.get("first_step")
        stream = d.get("stream")
        count = d.get("count")
        sink.row("findings", (
            n, f.rule, f.severity.label, int(f.severity), f.title,
            first if type(first) is int else None, count if type(count) is int else None,
            stream if type(stream) is int else None, f.fix or None,
            msgspec.json.encode(d).decode()))
        for i, x in enumerate(f.evidence):
            sink.row("evidence", (n, i, x.seq, x.step, x.layer, x.stream, x.page, x.source,
                                  x.line, x.text))


def _rows(chunk: list[ev.AnyEvent | ev.Unknown], judge: Judge, sink: Sink,
          tables: frozenset[str], conds: _Conditions, aborts: int) -> int:
    """The rows of ``chunk``, which the Judge was fed last (it answers about its reads);
    returns the number of aborts seen so far."""
    events = any(t.startswith("events_") for t in tables)
    pages, fits = "pages" in tables, "fits" in tables
    timings = "timings" in tables
    crashes = not tables.isdisjoint(("crashes", "frames", "python_frames"))
    row_event = sink.event
    for e in chunk:
        t = type(e)
        if events:
            row_event(e)
        if t is ev.Read:
            if pages:
                _pages_rows(judge, e, sink)  # type: ignore[arg-type]
        elif t is ev.Fits:
            if fits:
                _fits_row(judge, e, sink, conds)  # type: ignore[arg-type]
        elif t is ev.Timing:
            if timings:
                _timing_row(e, sink)  # type: ignore[arg-type]
        elif t is ev.Abort and crashes:
            _abort_rows(e, aborts, sink)  # type: ignore[arg-type]
            aborts += 1
    return aborts


def trace_rows(path: str, sink: Sink, tables: frozenset[str]) -> None:
    """Every row a trace gives, in one pass (``tables``: the ones wanted)."""
    with TraceReader.open(path) as reader:
        name = "FILE" if path == "-" else path
        judge = trace_judge(reader, name=name)
        conds = _Conditions(sink)
        aborts = 0
        for block in reader.blocks():
            for chunk in batches(block):
                judge.feed_all(chunk)  # one list: the Judge answers about its reads
                aborts = _rows(chunk, judge, sink, tables, conds, aborts)
        j = judge.snapshot()
        header = reader.header
        findings_rows(j.findings, sink)
        for p in reader.problems:
            sink.row("problems", (p.line, p.kind, p.message))
        cfg = header.scenario.get("config")
        cfg = cfg if isinstance(cfg, dict) else {}
        sink.row("files", (
            "trace", reader.version_text, sum(j.counts.values()), reader.lines_read, j.status,
            j.end.reason or None if j.end is not None else None, j.steps.count,
            len(reader.problems), header.device.name, header.backend,
            _text(cfg.get("layout")), _text(cfg.get("dispatch")),
            _text(header.scenario.get("name")), msgspec.json.encode(header).decode()))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def log_rows(path: str, sink: Sink, tables: frozenset[str]) -> None:
    """What a llama-server log gives: crashes, their native and Python frames and findings (the
    post-mortem scanner), timings (``kvdiag perf``'s request reader)."""
    from kvdiag.analysis.signatures import evaluate
    from kvdiag.files.logs import open_log
    from kvdiag.postmortem.parse import scan
    from kvdiag.postmortem.perfread import scan_stream

    with open_log(path) as log:
        logscan = scan([(log.name, log.stream)])
    problems = [(p.line, p.code or "log", p.message) for p in logscan.problems]
    requests = 0
    if "timings" in tables:
        with open_log(path) as log:
            run = scan_stream(log.name, log.stream)
        requests = len(run.requests)
        for r in run.requests:
            sink.row("timings", (None, r.line, None, r.boot, r.slot, r.task, r.prompt_tokens,
                                 r.prompt_ms, r.prompt_tps, r.decode_tokens, r.decode_ms,
                                 r.decode_tps, r.ms_per_token, r.depth_start, r.depth_end,
                                 r.cached, r.n_ctx_slot, r.truncated, r.graphs_reused))
        problems += [(p.line, p.code or "timing", p.message) for p in run.problems
                     if (p.line, p.code or "timing", p.message) not in problems]
    for i, crash in enumerate(logscan.crashes):
        _crash_rows(crash, i, sink)
    findings_rows(evaluate(logscan), sink)
    for p in problems:
        sink.row("problems", p)
    device = next((b.kv_stream_device for b in logscan.boots if b.kv_stream_device), None)
    status = "crashed" if logscan.crashes else None
    sink.row("files", ("log", None, requests, logscan.lines, status, None, None,
                       len(problems), device, None, None, None, None, None))


def _crash_rows(crash: Crash, index: int, sink: Sink) -> None:
    ab, err, sig = crash.abort, crash.error, crash.signal
    frames = crash.backtrace.frames if crash.backtrace is not None else ()
    sink.row("crashes", (
        index, crash.where.line, None, crash.kind, crash.boot_index,
        sig.signal if sig is not None else None, sig.exception if sig is not None else None,
        ab.file if ab is not None else None,
        ab.line if ab is not None else None, ab.condition if ab is not None else None,
        (ab.message if ab is not None else err.message if err is not None else
         sig.signal if sig is not None else crash.kind),
        err.backend if err is not None else None, err.message if err is not None else None,
        crash.fingerprint or None, list(crash.active_slots), len(frames)))
    for f in frames:
        sink.row("frames", (index, f.index, f.address, f.module, f.offset, f.function, f.file,
                            f.line, f.inlined, f.in_app, None))
    # faulthandler's stacks (postmortem.pystack): a frame of ``File ???`` has no file, line or
    # function, and a thread that printed no frame (``<no Python frame>``) has no row
    for s, stack in enumerate(crash.python):
        for f in stack.frames:
            sink.row("python_frames", (index, s, stack.thread, stack.name, stack.current,
                                       f.index, f.file, f.line, f.function, f.in_app))
