"""Append-only writer of ``.kvtrace`` files (format v1, docs/trace-format.md).

Crash safety comes from when bytes reach the kernel, not from fsync: events are encoded into
an in-process buffer and handed to ``os.write`` as whole lines by :meth:`TraceWriter.end_step`
(at least once per step), immediately for Abort and Warn, and by :meth:`TraceWriter.close`.
Once ``os.write`` returns, the lines survive the death of this process (SIGKILL, abort), so every
event of every completed step is on disk; only a machine crash can lose them, which is what the
optional ``fsync=True`` is for. If the process dies inside ``os.write`` itself, at most the last
line is cut short, and the reader reports it as truncated.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import msgspec

from kvdiag import __version__
from kvdiag.errors import Terminated
from kvdiag.model.events import Abort, Device, End, Event, Header, Warn
from kvdiag.trace.version import FORMAT_NAME, FORMAT_VERSION

E = TypeVar("E", bound=Event)
EndStatus = Literal["completed", "aborted", "error"]
MAX_REASON = 1000

_NEWLINE = 10


def make_header(
    backend: str,
    device: Device,
    *,
    scenario: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    created: datetime.datetime | None = None,
) -> Header:
    """A v1 header for this kvdiag version; ``created`` defaults to now (UTC, ISO 8601)."""
    when = created or datetime.datetime.now(datetime.UTC)
    return Header(
        format=FORMAT_NAME,
        version=FORMAT_VERSION,
        kvdiag_version=__version__,
        created=when.isoformat(timespec="seconds"),
        backend=backend,
        device=device,
        scenario=scenario or {},
        plan=plan or {},
        extra=extra or {},
    )


class TraceWriter:
    """Writes a header line, then one event per line, to a file it owns.

    Use :meth:`create`. ``emit`` numbers events (``seq`` from 1) and stamps ``t_ns``
    (monotonic nanoseconds since the writer was created). It is safe to call from several
    threads (a telemetry sampler beside the capture loop); events are numbered in the order
    their calls take the lock.
    """

    def __init__(self, fd: int, path: Path, *, fsync: bool = False, own_fd: bool = True) -> None:
        self.path = path
        self._fd = fd
        self._own_fd = own_fd
        self._fsync = fsync
        self._ended = False
        self._buf = bytearray()
        self._encoder = msgspec.json.Encoder()
        self._encode_into = self._encoder.encode_into
        self._lock = threading.Lock()
        self._t0 = time.monotonic_ns()
        self._seq = 0
        self._max_step = -1
        self._counts: dict[type[Event], int] = {}
        self._closed = False

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], header: Header, *, fsync: bool = False
    ) -> TraceWriter:
        """Create (or truncate) ``path``, write ``header`` as line 1 and flush it.

        ``header`` must carry this format's name and version (see :func:`make_header`).
        """
        _check_header(header)
        p = Path(path)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        return cls._start(cls(fd, p, fsync=fsync), header)

    @classmethod
    def create_on(cls, fd: int, name: str, header: Header, *, fsync: bool = False) -> TraceWriter:
        """Write the trace to ``fd``, which the caller opened and closes (the temporary file
        of an output, kvdiag.files.outputs, or standard output); ``name`` is for messages."""
        _check_header(header)
        return cls._start(cls(fd, Path(name), fsync=fsync, own_fd=False), header)

    @classmethod
    def _start(cls, writer: TraceWriter, header: Header) -> TraceWriter:
        try:
            writer._buf += msgspec.json.encode(header)
            writer._buf.append(_NEWLINE)
            writer._flush()
        except BaseException:
            writer.abandon()
            raise
        return writer

    @property
    def seq(self) -> int:
        """The ``seq`` of the last event emitted (0 before the first)."""
        return self._seq

    @property
    def count_by_kind(self) -> dict[str, int]:
        """Events emitted so far, by ``kind`` tag."""
        with self._lock:
            counts = list(self._counts.items())
        return {_tag(cls): n for cls, n in counts}

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ended(self) -> bool:
        """The End event reached the file: the trace is whole (whatever its status)."""
        return self._ended

    def emit(self, cls: type[E], step: int, *, t_ns: int | None = None, **fields: Any) -> E:
        """Build ``cls(seq, t_ns, step, **fields)``, buffer its line and return it.

        ``t_ns`` defaults to the time since the writer was created; a converter that knows when
        each event happened (``kvdiag import`` reads the log's timestamps) passes its own.

        The line reaches the file at the next :meth:`end_step`, or now for Abort and Warn:
        those are what a post-mortem looks for first, so they must not wait for the step's end.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"emit on closed trace writer ({self.path})")
            self._seq += 1
            # Positionally: seq, t_ns, step are Event's first fields in every kind, and msgspec
            # builds a Struct measurably faster without merging them into the keyword dict.
            when = time.monotonic_ns() - self._t0 if t_ns is None else t_ns
            event = cls(self._seq, when, step, **fields)
            buf = self._buf
            self._encode_into(event, buf, -1)
            buf.append(_NEWLINE)
            counts = self._counts
            counts[cls] = counts.get(cls, 0) + 1
            if step > self._max_step:
                self._max_step = step
            if cls is Abort or cls is Warn:
                self._flush()
        return event

    def end_step(self) -> None:
        """Hand every buffered line to the OS (and fsync when configured)."""
        with self._lock:
            if not self._closed:
                self._flush()

    def close(self, status: EndStatus = "completed", *, steps: int | None = None,
              reason: str = "", t_ns: int | None = None) -> End | None:
        """Write the End event, flush and close; a second call does nothing and returns None.

        ``steps`` defaults to the highest step emitted + 1; End's ``events`` counts the events
        before it; ``reason`` says why a run did not complete (1.1); ``t_ns`` as in ``emit``.
        """
        if self._closed:
            return None
        try:
            end = self.emit(
                End,
                max(self._max_step, 0),
                t_ns=t_ns,
                status=status,
                steps=self._max_step + 1 if steps is None else steps,
                events=self._seq,
                reason=reason[:MAX_REASON],
            )
            with self._lock:
                self._flush()
            self._ended = True
        finally:
            self.abandon()
        return end

    def abandon(self) -> None:
        """Stop without writing anything more (what is already written stays); the file
        descriptor is closed when this writer opened it."""
        with self._lock:
            if self._closed and self._fd < 0:
                return
            self._closed = True
            if self._own_fd and self._fd >= 0:
                os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close("completed")
            return
        try:
            self.close("error", reason=end_reason(exc))
        except OSError:
            # the write of End failed too (a full disk): the exception on its way out says
            # why the trace is cut; this one would hide it
            self.abandon()

    def _flush(self) -> None:
        """Write the whole buffer; called with the lock held."""
        buf = self._buf
        if buf:
            view = memoryview(buf)
            done = 0
            try:
                # os.write may write less than asked (signals, quotas); loop so that a line is
                # never left half on disk while the process is still alive.
                while done < len(view):
                    done += os.write(self._fd, view[done:])
            finally:
                view.release()
                try:
                    del buf[:done]
                except BufferError:
                    # a view of it outlived the failed write (held by the exception): keep
                    # the bytes not written in a new buffer rather than hide the failure
                    self._buf = bytearray(buf[done:])
        if self._fsync:
            os.fsync(self._fd)


def _check_header(header: Header) -> None:
    if header.format != FORMAT_NAME or header.version != FORMAT_VERSION:
        raise ValueError(
            f"header says {header.format} {header.version}; this writer writes "
            f"{FORMAT_NAME} {FORMAT_VERSION}"
        )


def end_reason(exc: BaseException | None) -> str:
    """End.reason for a run cut short by ``exc``: which signal, or the exception's one line."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(exc, Terminated):
        return f"terminated by {exc.signal_name}"
    if exc is None:
        return ""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _tag(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    return tag if isinstance(tag, str) else cls.__name__.lower()
