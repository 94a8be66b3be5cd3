"""``kvdiag check --follow``: judge a trace or a server log while it is written, and report each
finding when it first appears (:meth:`~kvdiag.analysis.judgement.Judge.arisen`).

A trace is read by the ordinary :class:`~kvdiag.trace.reader.TraceReader` over a stream that
waits for the file to grow (:class:`_Growing`), so every rule of the reader holds (a partial
last line waits for its newline; damage is a problem, not a stop). The reader asks the stream
for more bytes only once it has handed every event before them to the Judge, so that is
where the stream looks for new findings — and at least every ``interval`` while bytes keep
coming, which bounds the time from an event's line to its report. A log goes through
:class:`~kvdiag.follow.livelog.LiveLog`. Following ends at the trace's End event, when the
caller's ``report`` raises :class:`Stop` (``--exit-on``), or by ``KeyboardInterrupt``.
When the file is replaced or truncated (:mod:`~kvdiag.follow.tail`), the new file is judged
from its start by a new Judge, and ``notice`` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvdiag.analysis.judgement import Judge, trace_judge
from kvdiag.analysis.judgement.findings import identity
from kvdiag.errors import InputError
from kvdiag.follow.livelog import LiveLog
from kvdiag.follow.segtail import SegmentTail
from kvdiag.follow.tail import Reset
from kvdiag.model.findings import Finding
from kvdiag.trace.reader import TraceReader
from kvdiag.trace.version import looks_like_trace

INTERVAL = 0.05
"""Seconds between polls of a file that did not grow, and at most between two looks for new
findings while it grows."""
QUIET = 0.5
"""Seconds without growth after which a crash being read in a log is taken as complete."""
GZIP_MAGIC = b"\x1f\x8b"


class Stop(Exception):
    """Raised by a ``report`` callback to end following (the ``--exit-on`` threshold)."""


@dataclass
class Followed:
    """What following saw so far (also while it runs)."""

    kind: str = ""
    events: int = 0
    findings: list[Finding] = field(default_factory=list)
    """Every finding reported, in the order they arose."""
    final: list[Finding] = field(default_factory=list)
    """At a trace's End: the findings only the whole trace settles (not recorded, incomplete)."""
    ended: bool = False
    """The trace's End event was read."""
    problems: list[str] = field(default_factory=list)


class _Growing:
    """A binary stream over a :class:`Tail` that waits (polling) for the file to grow; it
    reads empty at a :class:`Reset` (the reader then ends: a new file needs a new reader) or
    once ``done()`` says so."""

    def __init__(self, tail: SegmentTail, look: Callable[[], None], done: Callable[[], bool],
                 interval: float, pending: bytes = b"") -> None:
        self.tail = tail
        self.look = look
        self.done = done
        self.interval = interval
        self.buf = pending
        self.reset: Reset | None = None
        self._looked = time.monotonic()

    def _more(self) -> bool:
        """Wait for more bytes; False at a reset or when done."""
        while True:
            if self.reset is not None or self.done():
                return False
            got = self.tail.poll()
            if isinstance(got, Reset):
                self.reset = got
                return False
            if got:
                self.buf += got
                if time.monotonic() - self._looked >= self.interval:
                    self._looked = time.monotonic()
                    self.look()
                return True
            self._looked = time.monotonic()
            self.look()
            if self.done():
                return False
            time.sleep(self.interval)

    def readline(self, limit: int = -1) -> bytes:
        while b"\n" not in self.buf and (limit < 0 or len(self.buf) < limit):
            if not self._more():
                break
        cut = self.buf.find(b"\n") + 1 or len(self.buf)
        if limit >= 0:
            cut = min(cut, limit)
        line, self.buf = self.buf[:cut], self.buf[cut:]
        return line

    def read(self, n: int = -1) -> bytes:
        # the reader has judged everything it was given: a good moment to look
        self.look()
        if not self.buf and not self._more():
            return b""
        if n < 0 or n >= len(self.buf):
            data, self.buf = self.buf, b""
        else:
            data, self.buf = self.buf[:n], self.buf[n:]
        return data


class Follower:
    """Follow ``path``; ``report(finding)`` for each new one, ``notice(text)`` for what
    happens to the file (waiting for it, replaced, truncated)."""

    def __init__(self, path: str, report: Callable[[Finding], None],
                 notice: Callable[[str], None], *, interval: float = INTERVAL,
                 quiet: float = QUIET, stop: Callable[[], bool] | None = None) -> None:
        self.path = path
        self.report = report
        self.notice = notice
        self.interval = interval
        self.quiet = quiet
        self.stop = stop or (lambda: False)
        self.state = Followed()
        self.tail = SegmentTail(path)

    def run(self) -> Followed:
        try:
            reset: Reset | None = None
            first = True
            while not self.state.ended and not self.stop():
                head = self._first_bytes(first)
                first = False
                if head is None:
                    break
                if isinstance(head, Reset):
                    reset = head
                    self.notice(reset.why)
                    continue
                if head.startswith(GZIP_MAGIC):
                    raise InputError(f"{self.path}: compressed; only a file being written "
                                     "as plain text can be followed")
                reset = self._trace(head) if looks_like_trace(head) else self._log(head)
                if reset is not None:
                    self.notice(reset.why)
        except Stop:
            pass
        finally:
            self.tail.close()
        return self.state

    def _first_bytes(self, first: bool) -> bytes | Reset | None:
        """The first bytes of the (next) file; None when told to stop first."""
        said = False
        while not self.stop():
            got = self.tail.poll()
            if got:
                return got
            if first and not said and not self.tail.opened:
                self.notice(f"waiting for {self.path} to be created")
                said = True
            time.sleep(self.interval)
        return None

    # -- a trace ----------------------------------------------------------------------------

    def _trace(self, head: bytes) -> Reset | None:
        state = self.state
        judge: Judge | None = None

        def look() -> None:
            if judge is not None:
                state.events = judge.rows
                for f in judge.arisen():
                    state.findings.append(f)
                    self.report(f)

        def done() -> bool:
            return self.stop() or (judge is not None and judge.end is not None)

        stream = _Growing(self.tail, look, done, self.interval, head)
        state.kind = "trace"
        try:
            reader = TraceReader(stream, self.path)  # type: ignore[arg-type]
        except InputError:
            if stream.reset is not None:
                return stream.reset  # cut while its header was being read
            raise
        judge = trace_judge(reader, name=self.path)
        judge.feed_all(reader)  # streamed; arisen() (look) judges what waits when the file does
        look()
        if judge.end is not None:
            state.ended = True
            keys = {identity(f) for f in state.findings}
            state.final = [f for f in judge.snapshot().findings if identity(f) not in keys]
        state.problems += [f"line {p.line}: {p.message}" for p in reader.problems
                           if p.kind != "incomplete"]
        return stream.reset

    # -- a log ------------------------------------------------------------------------------

    def _log(self, head: bytes) -> Reset | None:
        state = self.state
        state.kind = "log"
        live = LiveLog(self.path)
        last_growth = time.monotonic()
        quiet_done = False

        def look() -> None:
            state.events = live.events
            for f in live.judge.arisen():
                state.findings.append(f)
                self.report(f)

        live.feed(head)
        look()
        while not self.stop():
            got = self.tail.poll()
            if isinstance(got, Reset):
                live.finish()
                look()
                return got
            if got:
                live.feed(got)
                last_growth, quiet_done = time.monotonic(), False
                look()
                continue
            if not quiet_done and time.monotonic() - last_growth >= self.quiet:
                live.quiet()
                quiet_done = True
                look()
            time.sleep(self.interval)
        live.finish()
        look()
        return None
