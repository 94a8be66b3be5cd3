"""Read-only bytes of one input file, addressed by line start offsets.

The TUI never holds every decoded line: it indexes a file once (byte offset of each line) and
reads back only the lines on screen, so the bytes must be randomly addressable. A plain file is
memory-mapped (the OS pages in what is touched); a gzip-compressed log is decompressed into
memory first, since a gzip stream cannot be addressed by offset.
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import os
import zlib
from pathlib import Path
from typing import BinaryIO

from kvdiag.errors import InputError, open_input

GZIP_MAGIC = b"\x1f\x8b"


class LineSource:
    """The bytes of one file. ``data`` is never written; views of it may be shared by threads."""

    def __init__(self, data: bytes | mmap.mmap, name: str, *, compressed: bool = False,
                 fd: int | None = None) -> None:
        self.data = data
        self.name = name
        self.compressed = compressed
        self._fd = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LineSource:
        """Map ``path`` (or decompress it when it is gzip); failures are :class:`InputError`."""
        p = Path(path)
        with open_input(p) as fh:
            head = fh.read(2)
            if head == GZIP_MAGIC:
                fh.seek(0)
                return cls(_gunzip(fh, str(p)), str(p), compressed=True)
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


def _gunzip(fh: BinaryIO, name: str) -> bytes:
    """Decompress as much as can be read; a cut stream keeps what decoded before the break."""
    out = bytearray()
    with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
        while True:
            try:
                block = gz.read1(1 << 20)
            except (EOFError, OSError, zlib.error):
                break
            if not block:
                break
            out += block
    if not out:
        raise InputError(f"{name}: gzip data that does not decompress")
    return bytes(out)
