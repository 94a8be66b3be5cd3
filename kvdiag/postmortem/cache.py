"""The symbolizer's on-disk index cache, one directory per ELF build-id.

Each compilation unit the symbolizer had to open leaves one msgpack file: its decoded line
table, the address ranges of every concrete function in it, and the inline trees of the
functions that were queried. A later run over the same build reads those instead of parsing
DWARF again. Files are written whole to a temporary name and renamed, so a crash mid-write
leaves either the old or the new file; unreadable files are ignored and rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import msgspec

from kvdiag.files.cache import cache_root
from kvdiag.postmortem.lineprog import LineTable

CACHE_VERSION = 2

#: One inline-tree node: ranges, depth (0 = the function itself), name, call file, call line.
Node = tuple[list[tuple[int, int]], int, str, str | None, int]


class CuIndex(msgspec.Struct, array_like=True):
    """What is known about one compilation unit."""

    line: LineTable | None = None
    functions: list[tuple[int, int, int]] = msgspec.field(default_factory=list)
    trees: dict[int, list[Node]] = msgspec.field(default_factory=dict)


class UnitRanges(msgspec.Struct, array_like=True):
    """Sorted ``(low, high, cu_offset)`` for the whole file."""

    ranges: list[tuple[int, int, int]]


class DiskCache:
    """Reads and writes the cache of one build (``key`` is its build-id or a file digest)."""

    def __init__(self, key: str, root: str | None = None) -> None:
        base = root if root is not None else cache_root()
        self.dir = os.path.join(base, "symbols", f"v{CACHE_VERSION}", key)

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _read(self, name: str, typ: type[msgspec.Struct]) -> msgspec.Struct | None:
        try:
            with open(self._path(name), "rb") as fh:
                return msgspec.msgpack.decode(fh.read(), type=typ)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def _write(self, name: str, value: msgspec.Struct) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(msgspec.msgpack.encode(value))
            os.replace(tmp, self._path(name))
        except OSError:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def load_units(self) -> UnitRanges | None:
        got = self._read("units.msgpack", UnitRanges)
        return got if isinstance(got, UnitRanges) else None

    def save_units(self, units: UnitRanges) -> None:
        self._write("units.msgpack", units)

    def load_cu(self, offset: int) -> CuIndex | None:
        got = self._read(f"cu-{offset:x}.msgpack", CuIndex)
        return got if isinstance(got, CuIndex) else None

    def save_cu(self, offset: int, index: CuIndex) -> None:
        self._write(f"cu-{offset:x}.msgpack", index)
