"""What the viewer shows of one input file, as immutable snapshots (no textual import).

A file is a trace or a log, told apart by its content (a kvtrace header on line 1, else text).
The loader (:mod:`kvdiag.tui.loading`) publishes a new snapshot at each stage, so the screens
always draw from a consistent value and never from a half-built one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.log_index import LogIndex
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import PagesGeometry, PagesSnapshot
from kvdiag.analysis.trace_index import TraceIndex
from kvdiag.errors import InputError
from kvdiag.files.inputs import open_input
from kvdiag.files.logs import open_log
from kvdiag.model.events import Header
from kvdiag.model.findings import Finding
from kvdiag.model.logrecords import LogScan
from kvdiag.model.perf import PerfRun
from kvdiag.trace.segments import ZSTD_MAGIC, open_trace, read_all
from kvdiag.tui.digest import TraceDigest

Stage = Literal["opening", "indexing", "judging", "ready"]
FileKind = Literal["trace", "log"]
_TRACE_START = b'{"format":"kvtrace"'


@dataclass(frozen=True)
class Live:
    """Where following a file that is still being written stands (``kvdiag tui --follow``,
    :mod:`kvdiag.tui.live`)."""

    ended: str = ""
    """Why the run is over ("" while it is not): the trace's End event, or the writer gone —
    an abort (a trace) or a crash (a log) after which the file stopped growing."""
    files: int = 1
    """Files read under the followed name so far (a rotation or truncation starts another)."""
    note: str = ""
    """What happened to the file last (replaced, truncated), if anything."""
    grown_at: float = 0.0
    """``time.monotonic()`` when the file last grew."""


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
    """The judgement of a prefix of the index (``digest.rows`` rows; all once ``done``)."""
    fits_rows: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)
    perf: PerfRun | None = None
    """Its ``timing`` events as a run (the Perf screen), when it has any."""
    judge_error: str | None = None
    """Why the judgement stopped before the end of the file (an internal error)."""
    live: Live | None = None
    """Set while the file is followed as it grows: the document holds what arrived so far."""
    notes: tuple[str, ...] = ()
    """What went wrong around the trace itself (a judgement cache that could not be used)."""

    kind: Literal["trace"] = "trace"

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def findings(self) -> tuple[Finding, ...]:
        """The findings of the judged prefix (of the whole trace once ``judged``)."""
        return self.digest.findings if self.digest is not None else ()

    def pages_at(self, step: int) -> PagesSnapshot:
        """The Pages state at the end of ``step`` with the reads the judgement has reached."""
        assert self.pages is not None
        d = self.digest
        return self.pages.snapshot(step, d.ledger if d is not None else None,
                                   d.rows if d is not None else 0)

    @property
    def judged(self) -> bool:
        """The whole trace is judged."""
        return self.digest is not None and self.digest.done


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
    live: Live | None = None
    """Set while the file is followed as it grows: the document holds what arrived so far."""
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


def _starts_with(p: Path, magic: bytes) -> bool:
    try:
        with p.open("rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def _detect_joined(path: str | Path) -> FileKind:
    """A segment set (its stem, folder or a glob) or a zstd-compressed file: only traces come
    that way (kvdiag.trace.segments); anything else is the error ``open_trace`` words."""
    opened = open_trace(path)
    try:
        head = opened.stream.read(4096)
    finally:
        opened.stream.close()
    if head.lstrip(b"\xef\xbb\xbf").startswith(_TRACE_START):
        return "trace"
    raise InputError(f"{path}: compressed data that is not a kvtrace trace")


def trace_source(path: str | Path) -> LineSource:
    """The bytes of a trace, addressable by line offset: a plain file mapped, a segment set or
    a zstd-compressed trace joined in memory (kvdiag.trace.segments)."""
    whole = read_all(path)
    if whole is None:
        return LineSource.open(path)
    return LineSource(whole[0], whole[1], compressed=True)


def detect_kind(path: str | Path) -> FileKind:
    """``trace`` when line 1 starts a kvtrace header, else ``log`` when it is one by the rule
    every log reader shares (kvdiag.files.logs: gzip by content, a NUL-filled start skipped,
    mostly text); anything else — empty, binary, a FIFO or other non-regular file, an
    unreadable path — is an :class:`InputError`."""
    p = Path(path)
    if not p.is_file() or _starts_with(p, ZSTD_MAGIC):
        return _detect_joined(path)
    with open_input(p, what="a regular file (a trace or a log)",
                    hint="; save the stream to a file first") as fh:
        try:
            head = fh.read(4096)
        except OSError as exc:
            raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    stripped = head.lstrip(b"\xef\xbb\xbf")
    if stripped.startswith(_TRACE_START) or (stripped.startswith(b"{") and b'"kvtrace"' in
                                             stripped.split(b"\n", 1)[0]):
        return "trace"
    open_log(str(p)).close()
    return "log"
