"""Crashes as the Backtrace screen shows them, from a log scan or a trace's abort events, and
source snippets for frames whose file exists on this machine (no textual import).

Files are only read, never run; the snippet is plain text around the cited line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvdiag.model import events as ev
from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import Crash
from kvdiag.postmortem.backtrace import frames_of_names
from kvdiag.tui.clip import clip

SNIPPET_CONTEXT = 5
MAX_SOURCE_BYTES = 8 << 20


@dataclass(frozen=True)
class CrashView:
    """One crash occurrence: its headline lines, its frames and where it was reported."""

    index: int
    """Position in the document's crashes (or aborts)."""
    kind: str
    title: str
    details: tuple[str, ...]
    frames: tuple[Frame, ...]
    fingerprint: str
    where: str
    line: int | None
    """Log line (1-based) of the crash, for the Timeline."""
    thread: str | None = None
    file: str | None = None
    file_line: int | None = None
    """The assert's source location, when the crash has one."""
    python_from: int | None = None
    """Where in ``frames`` the Python stack of the thread the signal hit begins (after the
    native frames), when the log printed one (``postmortem.pystack``)."""
    python_thread: str | None = None


def from_crash(i: int, crash: Crash) -> CrashView:
    details: list[str] = []
    title: str = crash.kind
    file = line = None
    if crash.abort is not None:
        ab = crash.abort
        title = ab.condition or ab.message or crash.kind
        details.append(f"{ab.file}:{ab.line}: {ab.message}" if ab.file else ab.message)
        file, line = ab.file, ab.line
    if crash.error is not None:
        err = crash.error
        title = err.message if crash.abort is None else title
        details.append(f"{err.backend} error: {err.message}")
        if err.place():
            details.append(err.place())
        if err.statement:
            details.append(err.statement)
    if crash.signal is not None:
        if crash.abort is None and crash.error is None:
            title = crash.signal.signal
        details.append(f"signal: {crash.signal.signal}" + (
            f" (Windows fatal exception: {crash.signal.exception})"
            if crash.signal.exception else ""))
    if crash.active_slots:
        details.append(f"slots busy at the crash: {', '.join(map(str, crash.active_slots))}")
    bt = crash.backtrace
    py = crash.python[0] if crash.python and crash.python[0].current else None
    frames, python_from = _with_python(bt.frames if bt is not None else (),
                                       py.frames if py is not None else (), details,
                                       py.notes if py is not None else ())
    return CrashView(
        index=i, kind=crash.kind, title=title, details=tuple(d for d in details if d),
        frames=frames, fingerprint=crash.fingerprint,
        where=f"{crash.where.source}:{crash.where.line}", line=crash.where.line,
        thread=bt.thread if bt is not None else None, file=file, file_line=line,
        python_from=python_from, python_thread=py.thread if py is not None else None,
    )


def _with_python(native: tuple[Frame, ...], python: tuple[Frame, ...], details: list[str],
                 notes: tuple[str, ...]) -> tuple[tuple[Frame, ...], int | None]:
    """The native frames, then the Python stack of the thread the signal hit, and where that
    stack begins (None without Python frames); its notes join ``details``."""
    details.extend(notes)
    return native + python, (len(native) if python else None)


def from_abort(i: int, abort: ev.Abort) -> CrashView:
    frames = frames_of_names(abort.backtrace)
    details = [abort.message]
    if abort.cuda_error:
        details.append(f"CUDA error {abort.cuda_error}")
    py = (abort.python_stacks[0] if abort.python_stacks and abort.python_stacks[0].current
          else None)
    frames, python_from = _with_python(frames, py.as_frames() if py is not None else (),
                                       details, py.notes if py is not None else ())
    return CrashView(
        # the event records no crash kind: an assert has its condition, a GPU error its name;
        # the rest (a signal, GGML_ABORT's message) is the abort it is
        index=i, kind="cuda_error" if abort.cuda_error else "assert" if abort.condition else
        "abort",
        title=abort.condition or abort.message, details=tuple(details), frames=frames,
        fingerprint=f"{Path(abort.file).name}:{abort.line}" if abort.file else abort.message,
        where=f"event #{abort.seq}, step {abort.step}", line=None,
        file=abort.file or None, file_line=abort.line or None,
        python_from=python_from, python_thread=py.thread if py is not None else None,
    )


def group(views: Sequence[CrashView]) -> list[list[CrashView]]:
    """Occurrences grouped by fingerprint, groups in order of first appearance."""
    groups: dict[str, list[CrashView]] = {}
    for v in views:
        groups.setdefault(v.fingerprint or f"#{v.index}", []).append(v)
    return list(groups.values())


def resolve_source(file: str, bases: Sequence[Path]) -> Path | None:
    """``file`` if it exists as given; else the longest tail of it (two components at least,
    so a bare file name never matches) that exists under one of ``bases``: a build path like
    ``/home/ci/src/llama.cpp/ggml/src/ggml.c`` resolves in a local checkout."""
    p = Path(file)
    parts = p.parts[1:] if p.is_absolute() else p.parts
    candidates = [p] if p.is_absolute() else []
    for i in range(len(parts) - 1):
        tail = Path(*parts[i:])
        candidates += [b / tail for b in bases]
    for c in candidates:
        try:
            if c.is_file() and c.stat().st_size <= MAX_SOURCE_BYTES:
                return c
        except OSError:
            continue
    return None


def snippet(path: Path, line: int, context: int = SNIPPET_CONTEXT) -> list[tuple[int, str]]:
    """Lines ``line ± context`` of ``path`` as (number, text)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    lo = max(1, line - context)
    hi = min(len(lines), line + context)
    return [(n, clip(lines[n - 1])) for n in range(lo, hi + 1)]
