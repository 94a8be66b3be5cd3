"""Reading a log twice, line by line, and telling where it breaks.

``kvdiag import`` reads its input in two passes (the header, line 1 of the trace, needs the boot
facts before any event is written): the post-mortem scanner first, then the converter. Stdin
cannot be read twice, so it is spooled to a temporary file. Files are opened with
:func:`kvdiag.postmortem.lines.open_log` (gzip detected by its magic bytes).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from kvdiag.errors import InputError
from kvdiag.postmortem.lines import open_log

BLOCK = 4 << 20
#: A run of bytes this long without a newline is not a text log (or a line to keep whole).
MAX_LINE_BYTES = 1 << 20
#: The first bytes, checked for NUL bytes and for text at all.
SNIFF_BYTES = 64 << 10


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
            fd, spool = tempfile.mkstemp(prefix="kvdiag-import-", suffix=".log")
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(sys.stdin.buffer, out, BLOCK)
            self._spool = spool
            self.path = spool
        else:
            self.path = path
            if not os.path.exists(path):
                raise InputError(f"{path}: no such file")
        self._check_text()

    def _check_text(self) -> None:
        _name, stream, closers = open_log(self.path)
        try:
            try:
                head = stream.read(SNIFF_BYTES)
            except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
                raise InputError(f"{self.display}: cannot read: {exc}") from None
        finally:
            for c in closers:
                c.close()
        # A log cut by a crash may carry a few NUL bytes; a binary file is full of them.
        text = head.decode("utf-8", errors="replace")
        if head.count(b"\0") > len(head) // 100 or text.count("\ufffd") > len(text) // 20:
            raise InputError(f"{self.display}: not a text log (binary data in the first "
                             f"{len(head) // 1024 or 1} KiB)")
        if not head:
            raise InputError(f"{self.display}: empty file")

    def open(self) -> tuple[BinaryIO, list[BinaryIO]]:
        _name, stream, closers = open_log(self.path)
        return stream, closers

    def close(self) -> None:
        if self._spool is not None:
            os.unlink(self._spool)
            self._spool = None


def iter_lines(stream: BinaryIO, breaks: Breaks) -> Iterator[bytes]:
    """Every complete line of ``stream`` without its ``\\n``, in order, up to where it breaks
    (recorded in ``breaks``). A line longer than ``MAX_LINE_BYTES`` is cut to that length."""
    read: Callable[[int], bytes] = getattr(stream, "read1", None) or stream.read
    carry = b""
    skipping = False
    while True:
        try:
            data = read(BLOCK)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            breaks.error = str(exc) or type(exc).__name__
            break
        if not data:
            break
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
