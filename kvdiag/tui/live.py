"""Following a file that is still being written into the viewer (``kvdiag tui --follow``; no
textual import).

The bytes come from :class:`~kvdiag.follow.tail.Tail`, the follower ``kvdiag check --follow``
uses: the file may not exist yet, and a rotation or truncation starts the new file from its
start (a new document, as ``check --follow`` starts a new Judge). A segment set (kvtrace.h's
``KVTRACE_MAX_MB``) is followed segment by segment (:class:`~kvdiag.follow.segtail.
SegmentTail`): each starts with its snapshot, so each is judged on its own, and the viewer
shows the segment being written. What arrives takes the path a
whole trace takes in :mod:`kvdiag.tui.loading`, one block of whole lines at a time:

- a trace: the block is appended to the :class:`~kvdiag.analysis.trace_index.IndexBuilder` and
  fed to the :class:`~kvdiag.tui.judging.JudgingPass` (the trace's one Judge); every
  :data:`PUBLISH_EVERY_S` a :class:`~kvdiag.tui.document.TraceDoc` is published with the index
  so far, the judgement of all of it, and the Pages query grown by the new rows
  (:meth:`~kvdiag.analysis.pages_query.PagesQuery.grown`). Lines are read back through a
  :class:`~kvdiag.analysis.linesource.GrowingSource`. While the run goes on, the Findings are
  those :meth:`~kvdiag.analysis.judgement.Judge.arisen` has reported (with their evidence as
  it stands now): what later events could withdraw (what the trace does not record, the run not
  completing) waits for the End event, as in ``check --follow``.
- a log: its complete lines go to the post-mortem scanner (:class:`~kvdiag.postmortem.parse.
  LogParser`, fed as ``check --follow`` feeds it), and a :class:`~kvdiag.tui.document.LogDoc`
  is rebuilt from the scan, its lines held in memory (a log grows far slower than a trace).

The run is over (:attr:`~kvdiag.tui.document.Live.ended`) at the trace's End event, or when its
writer is gone by what the file says: an abort event (a trace) or a crash (a log) after which
the file stopped growing. A writer killed without a word cannot be told from a quiet one; the
viewer then says how long the file has been quiet.
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvdiag.analysis.judgement.findings import identity
from kvdiag.analysis.linesource import GrowingSource, LineSource, OwnedFd
from kvdiag.analysis.log_index import build_log_index
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import PagesGeometry, geometry_from_header
from kvdiag.analysis.trace_index import FITS, IndexBuilder
from kvdiag.errors import InputError
from kvdiag.follow.livelog import MAX_LINE
from kvdiag.follow.segtail import SegmentTail, is_set_name
from kvdiag.follow.tail import Reset, Tail
from kvdiag.follow.watch import GZIP_MAGIC, INTERVAL, QUIET
from kvdiag.model.events import Header
from kvdiag.trace.reader import TraceReader
from kvdiag.trace.segments import ZSTD_MAGIC
from kvdiag.trace.version import looks_like_trace
from kvdiag.tui.clip import clip, clip_deep
from kvdiag.tui.digest import Delta, DigestBuilder
from kvdiag.tui.document import (
    ErrorDoc,
    Live,
    LogDoc,
    PendingDoc,
    Publish,
    TraceDoc,
    detect_kind,
)
from kvdiag.tui.judging import JudgingPass
from kvdiag.tui.loading import seen_shape

PUBLISH_EVERY_S = 0.1
"""Seconds between two snapshots while the file grows (the write → display budget is 1 s)."""
LOG_REBUILD_SHARE = 0.25
"""A log's document is rebuilt whole: at most this share of the time goes to rebuilding."""
CRASH_TAIL_LINES = 400
"""A log whose last crash began at most this many lines before its end ended with it."""

Cancelled = Callable[[], bool]


def _nothing() -> None:
    pass


def follow(path: str, publish: Publish, cancelled: Cancelled,
           painted: Callable[[], object] = _nothing, *, interval: float = INTERVAL) -> None:
    """Follow ``path`` until ``cancelled()``, publishing snapshots; a file that cannot be
    followed is published as an :class:`ErrorDoc`."""
    tail = SegmentTail(path)
    try:
        _Following(path, tail, publish, cancelled, painted, interval).run()
    except InputError as exc:
        publish(ErrorDoc(path, clip(str(exc))))
    except (OSError, MemoryError) as exc:
        publish(ErrorDoc(path, clip(f"{path}: {type(exc).__name__}: {exc}")))
    finally:
        tail.close()


def check_followable(path: str) -> None:
    """Refuse, before the viewer starts, what cannot be followed: a directory, a FIFO or
    device, a compressed file, binary data (:class:`InputError`). A path that does not exist
    yet is waited for."""
    if is_set_name(path):
        seg = SegmentTail(path)
        try:
            seg.poll(0)  # a folder without a set, or with several, is refused
        finally:
            seg.close()
        return
    if not os.path.lexists(path):
        return
    tail = Tail(path)
    try:
        got = tail.poll(4096)  # opening refuses what is not a regular file
    finally:
        tail.close()
    if isinstance(got, bytes) and got:
        if got.startswith(GZIP_MAGIC) or got.startswith(ZSTD_MAGIC):
            raise InputError(f"{path}: compressed; only a file being written as plain text "
                             "can be followed")
        if not looks_like_trace(got):
            detect_kind(path)  # the rule every log reader shares: mostly text


class _Following:
    def __init__(self, path: str, tail: SegmentTail, publish: Publish, cancelled: Cancelled,
                 painted: Callable[[], object], interval: float) -> None:
        self.path = path
        self.tail = tail
        self.publish = publish
        self.cancelled = cancelled
        self.painted = painted
        self.interval = interval
        self.files = 0
        self.note = ""
        self._painted = False

    def show(self, doc: TraceDoc | LogDoc | PendingDoc) -> None:
        self.publish(doc)
        if not self._painted:
            self._painted = True
            self.painted()

    def live(self, *, ended: str = "", grown_at: float) -> Live:
        return Live(ended=ended, files=self.files, note=self.note, grown_at=grown_at)

    def run(self) -> None:
        while not self.cancelled():
            head = self._first_line()
            if head is None:
                return
            if isinstance(head, Reset):
                self.note = head.why
                continue
            if head.startswith(GZIP_MAGIC):
                raise InputError(f"{self.path}: compressed; only a file being written as plain "
                                 "text can be followed")
            self.files += 1
            if looks_like_trace(head):
                reset = _TraceGeneration(self).run(head)
            else:
                reset = _LogGeneration(self).run(head)
            if reset is None:
                return
            self.note = reset.why

    def _first_line(self) -> bytes | Reset | None:
        """The bytes of the next file up to its first newline at least (a trace's header
        line); None once cancelled."""
        said = False
        buf = b""
        while not self.cancelled():
            got = self.tail.poll()
            if isinstance(got, Reset):
                if buf:
                    return got
                self.note = got.why
                continue
            if got:
                buf += got
                if b"\n" in buf or len(buf) > MAX_LINE:
                    return buf
                continue
            if not said:
                said = True
                what = (f"waiting for {self.path} to be created" if not self.tail.opened else
                        f"waiting for the first line of {self.path}")
                self.show(PendingDoc(self.path, what + (f" ({self.note})" if self.note else "")))
            time.sleep(self.interval)
        return None


class _TraceGeneration:
    """One file of a followed trace, from its header line on."""

    def __init__(self, f: _Following) -> None:
        self.f = f
        self.digests = DigestBuilder()
        self.arisen: set[tuple[Any, ...]] = set()
        self.pages: PagesQuery | None = None
        self.geometry: PagesGeometry | None = None
        self.shape: dict[str, Any] = {"layers": 0, "streams": [], "pages": 0}
        self.fits_rows = np.zeros(0, np.intp)
        self._high = np.zeros(0, np.int32)

    def run(self, head: bytes) -> Reset | None:
        f = self.f
        header_line = head[:head.find(b"\n") + 1]
        reader = TraceReader(io.BytesIO(header_line), f.path)  # InputError: not a trace
        header: Header = clip_deep(reader.header)
        fd = f.tail.reopen()
        assert fd is not None  # the tail has read this file's first bytes
        start = len(header_line)
        source = GrowingSource(OwnedFd(fd), f.path, start)
        builder = IndexBuilder(source, start)
        judging = JudgingPass(f.path, reader=reader)
        buf, pos = head[start:], start
        grown_at = time.monotonic()
        last, changed, ended_shown = 0.0, True, ""
        while not f.cancelled():
            got = f.tail.poll()
            if isinstance(got, Reset):
                return got
            now = time.monotonic()
            if got:
                buf += got
                grown_at = now
            cut = buf.rfind(b"\n") + 1
            if cut:
                block, buf = buf[:cut], buf[cut:]
                source = source.grown(pos + cut)
                builder.source = source
                builder.add(block, pos)
                judging.feed(block, pos)
                pos += cut
                changed = True
            ended = self._ended(judging, now - grown_at)
            if (changed or ended != ended_shown) and now - last >= PUBLISH_EVERY_S:
                f.show(self._doc(header, source, builder, judging,
                                 f.live(ended=ended, grown_at=grown_at)))
                last, changed, ended_shown = now, False, ended
            if not got:
                time.sleep(f.interval)
        return None

    def _ended(self, judging: JudgingPass, quiet: float) -> str:
        end = judging.judge.end
        if end is not None:
            return f"End event (status {end.status})"
        d = self.digests.latest
        if d is not None and d.aborts and quiet >= QUIET:
            return (f"the writer aborted (abort event at step {d.aborts[-1].step}) and the "
                    "file stopped growing")
        return ""

    def _doc(self, header: Header, source: GrowingSource, builder: IndexBuilder,
             judging: JudgingPass, live: Live) -> TraceDoc:
        before = self.pages.index.n if self.pages is not None else 0
        index = builder.snapshot(self._step_high(builder, before))
        delta = judging.delta(done=True)
        if judging.judge.end is None:
            delta = self._arisen_only(judging, delta)
        digest = self.digests.add(delta)
        shape = seen_shape(index, before)
        s = self.shape
        s["layers"] = max(s["layers"], shape["layers"])
        s["pages"] = max(s["pages"], shape["pages"])
        s["streams"] = sorted({*s["streams"], *shape["streams"]})
        geometry = geometry_from_header(header, **s)
        if self.pages is None:
            self.pages = PagesQuery(index, source, geometry)
        else:
            self.pages = self.pages.grown(index, source, geometry)
        kinds = index.columns["kind"][before:]
        self.fits_rows = np.concatenate((self.fits_rows, np.flatnonzero(kinds == FITS) + before))
        return TraceDoc(self.f.path, source, header, index, stage="ready", progress=1.0,
                        geometry=geometry, pages=self.pages, digest=digest,
                        fits_rows=self.fits_rows, live=live)

    def _step_high(self, builder: IndexBuilder, before: int) -> np.ndarray:
        """The running maximum of the steps (TraceIndex.step_high), extended by the rows since
        ``before`` in a buffer with room to grow (the views handed out stay as they are): a
        screen would otherwise compute it over every row of each snapshot."""
        n = builder.n
        new = builder.snapshot().columns["step"][before:n]
        high = self._high
        if len(high) < n:
            grown = np.empty(max(2 * n, 1024), np.int32)
            grown[:before] = high[:before]
            high = self._high = grown
        if len(new):
            start = high[before - 1] if before else new[0]
            high[before:n] = np.maximum.accumulate(np.maximum(new, start))
        view = high[:n]
        view.flags.writeable = False
        return view

    def _arisen_only(self, judging: JudgingPass, delta: Delta) -> Delta:
        """The findings :meth:`Judge.arisen` has reported so far, as the judgement has them
        now (what later events could withdraw waits for the End event)."""
        self.arisen.update(identity(x) for x in judging.judge.arisen())
        kept = tuple(x for x in delta.judgement.findings if identity(x) in self.arisen)
        return dataclasses.replace(
            delta, judgement=dataclasses.replace(delta.judgement, findings=kept))


class _LogGeneration:
    """One file of a followed server log."""

    def __init__(self, f: _Following) -> None:
        self.f = f
        from kvdiag.postmortem.parse import LogParser
        from kvdiag.postmortem.perfscan import PerfScanner

        self.parser = LogParser()
        self.parser.begin(f.path)
        self.requests = PerfScanner(f.path)
        """The requests' timing for the Perf screen, from the same lines."""
        self.data = bytearray()
        self.partial = b""

    def run(self, head: bytes) -> Reset | None:
        f = self.f
        self._feed(head)
        grown_at = time.monotonic()
        last, cost, changed, closed = 0.0, 0.0, True, False
        while not f.cancelled():
            got = f.tail.poll()
            if isinstance(got, Reset):
                return got
            now = time.monotonic()
            if got:
                self._feed(got)
                grown_at, changed, closed = now, True, False
            elif not closed and now - grown_at >= QUIET:
                # quiet: a crash being read is complete (a dying server prints it at once)
                closed = True
                if self.parser.open_crash_line is not None:
                    self.parser.close_crash()
                changed = True
            wait = max(PUBLISH_EVERY_S, cost / LOG_REBUILD_SHARE)
            if changed and now - last >= wait:
                t0 = time.perf_counter()
                f.show(self._doc(f.live(ended=self._ended(closed), grown_at=grown_at)))
                cost = time.perf_counter() - t0
                last, changed = now, False
            if not got:
                time.sleep(f.interval)
        return None

    def _feed(self, data: bytes) -> None:
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        if len(self.partial) > MAX_LINE:  # cut, as the scanner cuts a line this long
            data, cut, self.partial = data + b"\n", len(data) + 1, b""
        if cut:
            self.parser.feed_lines(data[:cut])
            self.requests.feed(data[:cut])
            self.data += data[:cut]

    def _ended(self, quiet: bool) -> str:
        crashes = self.parser.crashes
        if quiet and crashes and self.parser.lines - crashes[-1].where.line <= CRASH_TAIL_LINES:
            return (f"the server crashed (line {crashes[-1].where.line}) and the log stopped "
                    "growing")
        return ""

    def _doc(self, live: Live) -> LogDoc:
        from kvdiag.analysis.signatures import evaluate

        scan = clip_deep(self.parser.result())
        source = LineSource(bytes(self.data), self.f.path)
        findings = clip_deep(tuple(evaluate(scan)))
        perf = self.requests.snapshot()
        return LogDoc(self.f.path, source, scan, findings, build_log_index(source, scan,
                                                                          self.f.path),
                      live=live, perf=perf if perf.requests or perf.unfinished else None)
