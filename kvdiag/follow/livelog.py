"""A llama-server log judged while it grows: the lines ``kvdiag import`` turns into events, fed
to one Judge as they arrive.

The same two readers as ``kvdiag import`` (docs/log-import.md), run side by side instead of in
two passes: the post-mortem scanner (:class:`~kvdiag.postmortem.parse.LogParser`, fed complete
lines) finds crashes, and the :class:`~kvdiag.logimport.convert.Converter` turns lines into
events. A crash is finished only when its backtrace has ended, so lines from the first line of
a crash still being read wait (at most the scanner's crash window) until it is: when the
scanner's quiet rule ends it, or when the log has been quiet for a while (:meth:`LiveLog.quiet`:
a dying server prints its abort and backtrace at once). Unlike an import, the header cannot
wait for the whole log: events are judged with the header an import writes for a log without
boot lines (fits conditions that need the boot's sizes are unknown, as they say).
"""

from __future__ import annotations

from typing import Any

from kvdiag.analysis.judgement import Judge
from kvdiag.logimport.convert import UNKNOWN_FIELDS, Converter
from kvdiag.logimport.header import BootSniffer, build_header
from kvdiag.model import events as ev
from kvdiag.postmortem.parse import LogParser

#: A line longer than this is cut (the scanner's own cap on one raw line).
MAX_LINE = 1 << 20


class _Feed:
    """The Converter's writer: numbers events and hands them to the Judge."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.seq = 0

    def emit(self, cls: type[ev.Event], step: int, *, t_ns: int | None = None,
             **fields: Any) -> ev.Event:
        self.seq += 1
        event = cls(seq=self.seq, t_ns=t_ns or 0, step=step, **fields)
        self.judge.feed(event)  # type: ignore[arg-type]
        return event


class LiveLog:
    def __init__(self, name: str) -> None:
        self.name = name
        self.header = build_header(name, (), BootSniffer(), 0, UNKNOWN_FIELDS)
        self.judge = Judge(self.header, name=name)
        self.feed_out = _Feed(self.judge)
        self.parser = LogParser()
        self.parser.begin(name)
        self.conv = Converter(self.feed_out, name, (), (), None, 0)
        self._crashes = 0
        self._lines = 0
        self._partial = b""
        self._waiting: list[tuple[int, bytes]] = []

    @property
    def lines(self) -> int:
        return self._lines

    @property
    def events(self) -> int:
        return self.feed_out.seq

    def feed(self, data: bytes) -> None:
        """Bytes appended to the log; a last line without its newline waits for it."""
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if len(self._partial) > MAX_LINE:  # a line this long is cut, as the scanner cuts it
            data, cut, self._partial = data + b"\n", len(data) + 1, b""
        if not cut:
            return
        block = data[:cut]
        self.parser.feed_lines(block)
        raws = block.split(b"\n")
        raws.pop()
        first = self._lines + 1
        self._lines += len(raws)
        self._waiting.extend(zip(range(first, first + len(raws)), raws, strict=True))
        self._convert()

    def quiet(self) -> None:
        """The log has not grown for a while: a crash being read is complete."""
        if self.parser.open_crash_line is not None:
            self.parser.close_crash()
            self._convert()

    def finish(self) -> None:
        """No more lines will come (following stopped)."""
        self.quiet()
        self.conv.finish()

    def _convert(self) -> None:
        crashes = self.parser.crashes
        if len(crashes) > self._crashes:
            self.conv.add_crashes(crashes[self._crashes:])
            self._crashes = len(crashes)
        hold = self.parser.open_crash_line
        waiting = self._waiting
        n = 0
        for lineno, raw in waiting:
            if hold is not None and lineno >= hold:
                break
            self.conv.line(lineno, raw.rstrip(b"\r"))
            n += 1
        del waiting[:n]
