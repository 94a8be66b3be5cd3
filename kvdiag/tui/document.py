"""What the viewer shows of one input file, as immutable snapshots (no textual import).

A file is a trace or a log, told apart by its content (a kvtrace header on line 1, else text).
The loader (:mod:`kvdiag.tui.loading`) publishes a new snapshot at each stage, so the screens
always draw from a consistent value and never from a half-built one.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from kvdiag.analysis.linesource import GZIP_MAGIC, LineSource
from kvdiag.analysis.log_index import LogIndex
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import PagesGeometry
from kvdiag.analysis.trace_index import TraceIndex
from kvdiag.errors import InputError, open_input
from kvdiag.model.events import Header
from kvdiag.model.findings import Finding
from kvdiag.model.logrecords import LogScan
from kvdiag.model.perf import PerfRun
from kvdiag.tui.digest import TraceDigest

Stage = Literal["opening", "indexing", "analysing", "ready"]
FileKind = Literal["trace", "log"]
_TRACE_START = b'{"format":"kvtrace"'


@dataclass(frozen=True, eq=False)
class TraceDoc:
    path: str
    source: LineSource
    header: Header
    index: TraceIndex
    stage: Stage = "indexing"
    progress: float = 0.0
    geometry: PagesGeometry | None = None
    pages: PagesQuery | None = None
    digest: TraceDigest | None = None
    fits_rows: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)
    perf: PerfRun | None = None
    """Its ``timing`` events as a run (the Perf screen), when it has any."""

    kind: Literal["trace"] = "trace"

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.digest.findings if self.digest is not None else ()


@dataclass(frozen=True, eq=False)
class LogDoc:
    path: str
    source: LineSource
    scan: LogScan
    findings: tuple[Finding, ...]
    index: LogIndex
    stage: Stage = "ready"
    progress: float = 1.0
    notes: tuple[str, ...] = ()
    """What went wrong around the log itself (a binary that could not be used, ...)."""
    perf: PerfRun | None = None
    """Its requests' timing and the kv-stream lines around them (the Perf screen)."""
    kind: Literal["log"] = "log"

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True, eq=False)
class PendingDoc:
    """A file being opened or read before it has anything to show (``message`` says what)."""

    path: str
    message: str = "opening…"
    stage: Stage = "opening"
    progress: float = 0.0
    kind: Literal["pending"] = "pending"

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True, eq=False)
class ErrorDoc:
    path: str
    message: str
    stage: Stage = "ready"
    progress: float = 1.0
    kind: Literal["error"] = "error"

    @property
    def name(self) -> str:
        return Path(self.path).name


Document = TraceDoc | LogDoc | ErrorDoc | PendingDoc
Publish = Callable[[Document], None]


def _refuse_special(p: Path) -> None:
    """A FIFO, socket or device is an :class:`InputError` before anything opens it: opening a
    FIFO blocks until a writer comes, and none of them is a file the viewer can index."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return  # open_input words a missing or unreadable path
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    raise InputError(f"{p}: {what}, not a file (save the stream to a file first)")


def detect_kind(path: str | Path) -> FileKind:
    """``trace`` when line 1 starts a kvtrace header, ``log`` for text (or gzip); binary data,
    empty files, FIFOs and other non-regular files and unreadable paths are an
    :class:`InputError`."""
    p = Path(path)
    _refuse_special(p)
    with open_input(p) as fh:
        try:
            head = fh.read(4096)
        except OSError as exc:
            raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    if head.startswith(GZIP_MAGIC):
        return "log"
    stripped = head.lstrip(b"\xef\xbb\xbf")
    if stripped.startswith(_TRACE_START) or (stripped.startswith(b"{") and b'"kvtrace"' in
                                             stripped.split(b"\n", 1)[0]):
        return "trace"
    if not head:
        raise InputError(f"{p}: empty file")
    if b"\x00" in head:
        raise InputError(f"{p}: binary data, neither a kvtrace trace nor a text log")
    return "log"
