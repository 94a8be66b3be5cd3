"""Reading a log twice, line by line, and telling where it breaks.

``kvdiag import`` reads its input in two passes (the header, line 1 of the trace, needs the boot
facts before any event is written): the post-mortem scanner first, then the converter. Stdin
cannot be read twice, so it is spooled to a temporary file. Files are opened with
:func:`kvdiag.files.logs.open_log`, the rule every log reader shares (gzip detected by its
magic bytes, a NUL-filled start skipped, only files that are mostly not text refused); NUL
bytes are dropped before lines are split, as the post-mortem scanner drops them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from kvdiag.errors import InputError
from kvdiag.files.logs import READ_ERRORS, OpenLog, describe_break, open_log
from kvdiag.trace.segments import starts_a_trace

BLOCK = 4 << 20
#: A run of bytes this long without a newline is not a line to keep whole.
MAX_LINE_BYTES = 1 << 20


@dataclass
class Breaks:
    """How the input ended: ``error`` when a read failed (a cut gzip member, an I/O error),
    ``no_newline`` when bytes without a line end were left at the end (that partial line is
    not read); ``line`` is the last complete line read."""

    line: int = 0
    error: str | None = None
    no_newline: bool = False


class LogInput:
    """One log given on the command line, openable as many times as needed."""

    def __init__(self, path: str) -> None:
        self.display = "<stdin>" if path == "-" else path
        self._spool: str | None = None
        if path == "-":
            if sys.stdin is None or sys.stdin.isatty():
                raise InputError("-: standard input is a terminal; pipe or redirect a log "
                                 "into it")
            self.path = self._spool = _spool_stdin()
        else:
            self.path = path
        try:
            # refuse what is not a log before anything is written (the rule of files.logs)
            with open_log(self.path, name=self.display) as opened:
                head = _head(opened.stream, 4096)
            if starts_a_trace(head):
                # a trace's lines hold JSON that the log grammar half-matches (its abort
                # message): it would become a trace of one abort, the rest lost
                raise InputError(f"{self.display}: this is a kvtrace trace, not a server log: "
                                 "kvdiag check, trace and tui read it as it is")
        except BaseException:
            self.close()
            raise

    def open(self) -> OpenLog:
        return open_log(self.path, name=self.display)

    def close(self) -> None:
        if self._spool is not None:
            os.unlink(self._spool)
            self._spool = None


def _head(stream: BinaryIO, size: int) -> bytes:
    """Up to ``size`` first bytes, fewer where the input breaks (a cut ``.gz`` whose whole
    text is shorter than ``size``): the break is the passes' to report, at its line."""
    read: Callable[[int], bytes] = getattr(stream, "read1", None) or stream.read
    parts: list[bytes] = []
    got = 0
    while got < size:
        try:
            chunk = read(size - got)
        except READ_ERRORS:
            break
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _spool_stdin() -> str:
    """Standard input copied to a temporary file; a failure (a full disk) removes it and is
    one line."""
    fd, spool = tempfile.mkstemp(prefix="kvdiag-import-", suffix=".log")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, BLOCK)
    except BaseException as exc:
        os.unlink(spool)
        if isinstance(exc, OSError):
            raise InputError(f"<stdin>: cannot keep a copy to read twice: "
                             f"{exc.strerror or exc}") from None
        raise
    return spool


def iter_lines(stream: BinaryIO, breaks: Breaks) -> Iterator[bytes]:
    """Every complete line of ``stream`` without its ``\\n``, in order, up to where it breaks
    (recorded in ``breaks``). A line longer than ``MAX_LINE_BYTES`` is cut to that length."""
    read: Callable[[int], bytes] = getattr(stream, "read1", None) or stream.read
    carry = b""
    skipping = False
    while True:
        try:
            data = read(BLOCK)
        except READ_ERRORS as exc:
            breaks.error = describe_break(exc)
            break
        if not data:
            break
        if data.find(b"\0") >= 0:
            # counted by the scan pass (postmortem.parse); here they only must not glue a
            # NUL-filled start onto the first line
            data = data.replace(b"\0", b"")
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                if not skipping:
                    carry += data[start:]
                    if len(carry) > MAX_LINE_BYTES:
                        carry = carry[:MAX_LINE_BYTES]
                        skipping = True
                break
            piece = data[start:nl]
            line = piece if not carry and not skipping else (carry + piece if not skipping
                                                            else carry)
            if len(line) > MAX_LINE_BYTES:
                line = line[:MAX_LINE_BYTES]
            carry = b""
            skipping = False
            breaks.line += 1
            yield line
            start = nl + 1
    if carry:
        # not imported: a line cut short may end inside a number (``ring 1`` of ``ring 17``)
        breaks.no_newline = True
