"""Standard output and standard error whose failed writes are errors, not silence.

``kvdiag check F > /dev/full`` must not exit 0: Python buffers standard output and would
only notice the failure while shutting down (or in an ``except OSError`` somewhere inside a
library). :func:`checked_streams` puts the process's real streams behind a writer that turns a
failed ``write(2)`` (ENOSPC, EIO, EPIPE, ...) into :class:`StreamWriteError`, a one-line
error with exit code 2; once a stream has failed, later writes to it are dropped so that the
interpreter's own flush at exit stays quiet. A stream that is not a real file descriptor (a
test's capture buffer) is left as it is.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from kvdiag.errors import EXIT_USAGE, KvdiagError


class StreamWriteError(KvdiagError):
    """A write to standard output or standard error failed."""

    exit_code = EXIT_USAGE

    def __init__(self, stream: str, exc: OSError) -> None:
        why = exc.strerror or str(exc)
        if isinstance(exc, BrokenPipeError):
            why += " (the reader closed it before the end)"
        super().__init__(f"cannot write to standard {stream}: {why}")
        self.stream = stream


class _CheckedFile(io.FileIO):
    """A descriptor of the process's own (not closed by us) that raises
    :class:`StreamWriteError` once and then drops what it is given."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__(fd, "wb", closefd=False)
        self.stream_name = name
        self.failed: StreamWriteError | None = None

    def write(self, data: Any) -> int:
        if self.failed is not None:
            return len(memoryview(data))
        try:
            return super().write(data) or 0
        except BlockingIOError:
            raise
        except OSError as exc:
            self.failed = StreamWriteError(self.stream_name, exc)
            raise self.failed from None


def _checked(stream: TextIO | Any, name: str) -> tuple[TextIO, _CheckedFile] | None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    raw = _CheckedFile(fd, name)
    buffered = io.BufferedWriter(raw)
    text = io.TextIOWrapper(buffered, encoding=stream.encoding, errors=stream.errors,
                            line_buffering=bool(stream.line_buffering),
                            write_through=getattr(stream, "write_through", False))
    return text, raw


@contextlib.contextmanager
def checked_streams() -> Iterator[list[_CheckedFile]]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` raise :class:`StreamWriteError`
    when a write fails; on the way out both are flushed (which may raise it too) and the
    original objects put back. Yields the checked raw files (empty when nothing was
    replaced), whose ``failed`` says which stream broke."""
    saved = (sys.stdout, sys.stderr)
    made: list[_CheckedFile] = []
    for attr, name in (("stdout", "output"), ("stderr", "error")):
        current = getattr(sys, attr)
        if current is None or current is not getattr(sys, f"__{attr}__"):
            continue  # redirected by the caller (a test capture, contextlib.redirect_*)
        wrapped = _checked(current, name)
        if wrapped is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            current.flush()
        setattr(sys, attr, wrapped[0])
        made.append(wrapped[1])
    try:
        yield made
        for attr in ("stdout", "stderr"):
            getattr(sys, attr).flush()
    finally:
        for attr in ("stdout", "stderr"):
            with contextlib.suppress(KvdiagError, OSError, ValueError):
                getattr(sys, attr).flush()
        sys.stdout, sys.stderr = saved
