"""Read-only bytes of one input file, addressed by line start offsets.

The TUI never holds every decoded line: it indexes a file once (byte offset of each line) and
reads back only the lines on screen, so the bytes must be randomly addressable. A plain file is
memory-mapped (the OS pages in what is touched); a gzip-compressed log is decompressed into
memory first, since a gzip stream cannot be addressed by offset. Which files may be opened and
what counts as gzip are the rules every reader shares (:mod:`kvdiag.files`); a gzip stream that
breaks keeps what decoded before the break and says why in ``broken``.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import mmap
import os
from pathlib import Path
from typing import BinaryIO

from kvdiag.errors import InputError
from kvdiag.files.inputs import is_gzip, open_input
from kvdiag.files.logs import READ_ERRORS, describe_break


class LineSource:
    """The bytes of one file. ``data`` is never written; views of it may be shared by threads."""

    def __init__(self, data: bytes | mmap.mmap, name: str, *, compressed: bool = False,
                 fd: int | None = None, broken: str | None = None) -> None:
        self.data = data
        self.name = name
        self.compressed = compressed
        self.broken = broken
        """Why a compressed file could not be read to its end (None: it could)."""
        self._fd = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LineSource:
        """Map ``path`` (or decompress it when it is gzip); failures are :class:`InputError`."""
        p = Path(path)
        with open_input(p) as fh:
            head = fh.read(2)
            if is_gzip(head):
                fh.seek(0)
                data, broken = _gunzip(fh, str(p))
                return cls(data, str(p), compressed=True, broken=broken)
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return cls(b"", str(p))
            try:
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                # Pipes and some special files cannot be mapped; read them whole instead.
                fh.seek(0)
                return cls(fh.read(), str(p))
            fd = os.dup(fh.fileno())
        return cls(mapped, str(p), fd=fd)

    @property
    def size(self) -> int:
        return len(self.data)

    @functools.cached_property
    def text_start(self) -> int:
        """Offset of the first byte that is not NUL: a log whose start ``logrotate``'s
        ``copytruncate`` left NUL-filled begins its line 1 there (as every log reader drops
        those NULs, kvdiag.files.text). Holes of a mapped file are skipped with SEEK_DATA."""
        data = self.data
        if not len(data) or data[0] != 0:
            return 0
        pos = 0
        if self._fd is not None and hasattr(os, "SEEK_DATA"):
            try:
                pos = os.lseek(self._fd, 0, os.SEEK_DATA)
            except OSError:
                pos = len(data)  # ENXIO: no data at all
        while pos < len(data):
            chunk = self.read(pos, 1 << 20)
            rest = chunk.lstrip(b"\0")
            if rest:
                return pos + len(chunk) - len(rest)
            pos += len(chunk)
        return len(data)

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer at the end). A whole-file pass reads this way
        rather than through the map, so the pages it touches are not mapped into this process
        (they would count in its resident memory)."""
        if self._fd is not None:
            return os.pread(self._fd, size, offset)
        return bytes(self.data[offset : offset + size])

    def line(self, offset: int) -> bytes:
        """The line starting at ``offset``, without its newline (or carriage return)."""
        data = self.data
        end = data.find(b"\n", offset)
        if end < 0:
            end = len(data)
        if end > offset and data[end - 1 : end] == b"\r":
            end -= 1
        return bytes(data[offset:end])

    def find(self, needle: bytes, start: int, end: int | None = None) -> int:
        return self.data.find(needle, start, len(self.data) if end is None else end)

    def rfind(self, needle: bytes, start: int, end: int) -> int:
        return self.data.rfind(needle, start, end)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if isinstance(self.data, mmap.mmap):
            # A numpy view made while indexing may still point into the map; the OS frees it at
            # exit then.
            with contextlib.suppress(BufferError):
                self.data.close()


class OwnedFd:
    """A file descriptor closed when the last holder drops it (the snapshots of one growing
    file share it; none of them knows which is last)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class GrowingSource(LineSource):
    """The first ``size`` bytes of a file still being written (``kvdiag tui --follow``): one
    value per published snapshot, all reading through one descriptor of the file (closed when
    the last snapshot holding it is dropped).

    Read with ``os.pread``, not mapped: a followed file can be truncated under the viewer, and
    touching a map past the new end kills the process (SIGBUS) where ``pread`` reads short.
    """

    _LINE = 4096
    _FIND = 1 << 20

    def __init__(self, fd: OwnedFd, name: str, size: int) -> None:
        # not LineSource.__init__: there is no ``data`` to hold
        self.owned = fd
        self.name = name
        self.compressed = False
        self.broken = None
        self._fd = None  # nothing for close() to close: the descriptor is shared
        self._file = fd.fd
        self._size = size

    def grown(self, size: int) -> GrowingSource:
        """The same file with its first ``size`` bytes."""
        return GrowingSource(self.owned, self.name, size)

    @property
    def data(self) -> bytes:
        """The whole of it, read (a log's indexer reads ``data``; a trace's never does)."""
        return self.read(0, self._size)

    @data.setter
    def data(self, value: bytes | mmap.mmap) -> None:
        raise AttributeError("a growing file's bytes are read from it, not set")

    @property
    def size(self) -> int:
        return self._size

    @functools.cached_property
    def text_start(self) -> int:
        return 0  # a followed trace starts with its header

    def read(self, offset: int, size: int) -> bytes:
        size = min(size, self._size - offset)
        if size <= 0:
            return b""
        return os.pread(self._file, size, offset)

    def line(self, offset: int) -> bytes:
        out = b""
        pos = offset
        while pos < self._size:
            chunk = self.read(pos, self._LINE)
            if not chunk:
                break
            nl = chunk.find(b"\n")
            if nl >= 0:
                out += chunk[:nl]
                break
            out += chunk
            pos += len(chunk)
        return out[:-1] if out.endswith(b"\r") else out

    def find(self, needle: bytes, start: int, end: int | None = None) -> int:
        end = self._size if end is None else min(end, self._size)
        pos, keep = start, max(len(needle) - 1, 0)
        while pos < end:
            chunk = self.read(pos, min(self._FIND + keep, end - pos))
            hit = chunk.find(needle)
            if hit >= 0:
                return pos + hit
            if pos + len(chunk) >= end or not chunk:
                return -1
            pos += max(len(chunk) - keep, 1)
        return -1

    def rfind(self, needle: bytes, start: int, end: int) -> int:
        end = min(end, self._size)
        keep = max(len(needle) - 1, 0)
        hi = end
        while hi > start:
            lo = max(start, hi - self._FIND - keep)
            hit = self.read(lo, hi - lo).rfind(needle)
            if hit >= 0:
                return lo + hit
            if lo == start:
                return -1
            hi = lo + keep
        return -1

    def close(self) -> None:
        pass  # other snapshots of the file may still read it; it closes with the last


def _gunzip(fh: BinaryIO, name: str) -> tuple[bytes, str | None]:
    """Decompress as much as can be read: ``(bytes, why it broke or None)``. gzip data that
    yields no byte at all is refused, as every log reader refuses it (kvdiag.files.logs)."""
    out = bytearray()
    broken: str | None = None
    with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
        while True:
            try:
                block = gz.read1(1 << 20)
            except READ_ERRORS as exc:
                broken = describe_break(exc)
                break
            if not block:
                break
            out += block
    if not out:
        if broken is not None:
            raise InputError(f"{name}: gzip data that does not decompress ({broken})")
        raise InputError(f"{name}: empty file (the gzip data holds no bytes)")
    return bytes(out), broken
