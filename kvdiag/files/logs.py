"""Opening a log the same way in every reader (``postmortem``, ``import``, ``tui``).

One rule, in this order:

1. ``-`` is standard input; anything else must be a regular file (:mod:`kvdiag.files.inputs`).
2. gzip is told by its magic bytes, never by the name: a ``.gz`` that is not gzip is read as
   what it is. gzip data that yields no byte at all is refused ("gzip data that does not
   decompress", with why); gzip data that decompresses to nothing is an empty file; gzip
   data that breaks after some bytes is read up to the break, and the reader reports where.
3. A NUL-filled start is skipped for the text test (``logrotate``'s ``copytruncate``), and the
   next :data:`~kvdiag.files.text.TEXT_PROBE` bytes must be text
   (:func:`kvdiag.files.text.check_text`): an empty file, one of nothing but NULs, UTF-16, or
   one that is mostly not text is refused with one line.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kvdiag.errors import InputError
from kvdiag.files.inputs import STDIN_NAME, is_gzip, require_regular
from kvdiag.files.text import TEXT_PROBE, check_text

#: What a broken gzip stream or a failing read raises.
READ_ERRORS = (EOFError, OSError, zlib.error)
_SKIP_BLOCK = 1 << 20


@dataclass
class OpenLog:
    """A log opened for reading from its first byte: ``stream`` is what to read, ``closers``
    what to close afterwards. ``leading_nuls`` counts NUL bytes at the start that the stream
    no longer holds (standard input cannot be read twice, so its NUL-filled start is dropped
    rather than kept in memory); a reader adds them to what it reports as replaced."""

    name: str
    stream: BinaryIO
    closers: list[BinaryIO] = field(default_factory=list)
    compressed: bool = False
    leading_nuls: int = 0

    def close(self) -> None:
        for c in self.closers:
            c.close()

    def __enter__(self) -> OpenLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_log(path: str, *, name: str | None = None) -> OpenLog:
    """Open ``path`` (``-``: standard input) as a log; every refusal is one
    :class:`InputError` line naming it ``name`` (default: the path)."""
    if path == STDIN_NAME:
        return _open_stdin()
    shown = path if name is None else name
    require_regular(path, what="a regular log file", hint="; pipe it into '-' instead")
    try:
        fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed through OpenLog
    except OSError as exc:
        raise InputError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    try:
        stream, compressed = _maybe_gzip(fh)
        nuls, sample, error = _skip_nuls(stream, fh if not compressed else None)
        _check_start(shown, sample, nuls, error)
        stream.seek(0)
    except BaseException:
        fh.close()
        raise
    return OpenLog(shown, stream, [stream, fh] if compressed else [fh], compressed)


def _open_stdin() -> OpenLog:
    name = "<stdin>"
    stdin: BinaryIO = sys.stdin.buffer
    stream, compressed = _maybe_gzip(stdin)
    nuls, sample, error = _skip_nuls(stream, None)
    _check_start(name, sample, nuls, error)
    # stdin cannot seek back: what the probe read is handed out again first
    replay: BinaryIO = io.BufferedReader(_Replay(sample, stream))
    return OpenLog(name, replay, [replay], compressed, leading_nuls=nuls)


def _check_start(name: str, sample: bytes, nuls: int, error: BaseException | None) -> None:
    """``error``: what broke the read before its first byte (a gzip stream that does not
    decompress at all); a break after some bytes is the reader's to report where it is."""
    if not sample and not nuls and error is not None:
        if isinstance(error, EOFError | gzip.BadGzipFile | zlib.error):
            raise InputError(f"{name}: gzip data that does not decompress "
                             f"({describe_break(error)})")
        raise InputError(f"{name}: {describe_break(error)}")
    check_text(name, sample[:TEXT_PROBE], nuls_before=nuls)


def _maybe_gzip(stream: BinaryIO) -> tuple[BinaryIO, bool]:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    if is_gzip(head):
        return gzip.GzipFile(fileobj=stream, mode="rb"), True  # type: ignore[return-value]
    return stream, False


def _skip_nuls(stream: BinaryIO,
               plain: BinaryIO | None) -> tuple[int, bytes, BaseException | None]:
    """Read past a NUL-filled start; return ``(NUL bytes skipped, up to TEXT_PROBE bytes
    from the first other byte (more when the first read gave more), the error that stopped
    the read before any byte)``. A plain
    regular file jumps over holes with SEEK_DATA."""
    error: BaseException | None = None
    nuls = 0
    if plain is not None and hasattr(os, "SEEK_DATA"):
        try:
            # through the buffered file, so that its buffer follows
            nuls = plain.seek(0, os.SEEK_DATA)
        except OSError:
            nuls = plain.seek(0)  # no data at all (ENXIO), or no support: read from the start
    read = getattr(stream, "read1", None) or stream.read
    parts: list[bytes] = []
    got = 0
    while got < TEXT_PROBE:
        try:
            chunk = read(_SKIP_BLOCK if not parts else TEXT_PROBE - got)
        except READ_ERRORS as exc:
            if not parts and not nuls:
                error = exc
            break
        if not chunk:
            break
        if not parts:
            text = chunk.lstrip(b"\0")
            nuls += len(chunk) - len(text)
            chunk = text
            if not chunk:
                continue
        parts.append(chunk)
        got += len(chunk)
    return nuls, b"".join(parts), error


class _Replay(io.RawIOBase):
    """``head`` first, then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = memoryview(head)
        self._stream = stream
        self._read = getattr(stream, "read1", None) or stream.read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head.nbytes:
            n = min(len(view), self._head.nbytes)
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._stream is not sys.stdin.buffer:
            self._stream.close()
        super().close()


def describe_break(exc: BaseException) -> str:
    """A stream failure in the user's terms (Python's gzip and zlib texts name internals)."""
    text = str(exc)
    if isinstance(exc, EOFError) or "end-of-stream marker" in text:
        return "the gzip data ends early (the .gz file is truncated)"
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        if "CRC" in text:
            return "the gzip data is corrupt (CRC check failed)"
        if "Not a gzipped file" in text:
            return "a gzip member has a bad header (the .gz file is corrupt)"
        return f"the gzip data is corrupt ({text.split(': ', 1)[-1]})"
    return f"read error: {getattr(exc, 'strerror', None) or text}"
