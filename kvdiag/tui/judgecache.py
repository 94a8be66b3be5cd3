"""The judgement of a big trace as a file: how it reaches the viewer, and how a reopened trace
has its findings at once (no textual import).

Issue 15 §5: the judgement is computed once per trace, in one streaming pass, and cached for
the viewer. The judging process (:mod:`kvdiag.tui.judgeproc`) writes each ledger block it seals
to a *ledger file* and sends the viewer only where the block lies (:class:`BlockRef`); the
viewer maps those bytes read-only instead of receiving and keeping a copy, so the ledger is
file pages the OS shares and reclaims, and the viewer's own memory holds only what it looks at.
At the end the process writes the rest of the judgement (findings, counts, completeness,
telemetry, problems, scrubber marks) as a footer; the viewer then renames the file into the
cache (:func:`kvdiag.files.outputs.open_output`: a temporary ``.part`` file beside it, synced
and renamed when complete, removed when the pass did not finish).

File layout (little-endian)::

    b"KVJUDGE1"                        magic
    blocks                             ledger rows, each block at a multiple of 64 bytes
    footer                             msgpack (:class:`Footer`)
    footer offset, footer length, b"KVJUDGE1"   the trailer (8 + 8 + 8 bytes)

The cache is keyed by the trace's resolved path, size, modification time and a hash of its
first and last 64 KiB, and by the judging code (a hash of :mod:`kvdiag.analysis.judgement`'s
sources and the ledger's columns): a file whose key differs is never used, and a damaged one is
ignored with a note, never trusted (its footer is decoded with msgspec into fixed types, its
arrays get the code's own dtypes, and every block must lie inside the file). A cache file is
never written in place — a new one is renamed over it — so a viewer that mapped it keeps the
bytes it mapped. Where is the cache:
``$KVDIAG_CACHE_DIR/judgements`` or the user's cache folder (the symbolizer's,
:func:`kvdiag.files.cache.cache_root`); at most :data:`MAX_FILES` traces are kept, the
least recently judged removed first. A trace that is not one plain file (a segment set, a
compressed trace) is not cached: its ledger file is an anonymous temporary file.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from kvdiag import __version__
from kvdiag.analysis.judgement import Judgement
from kvdiag.files.outputs import OutputError, open_output, plan_output
from kvdiag.model import events as ev
from kvdiag.trace.problems import Problem
from kvdiag.tui.digest import (
    DTYPES,
    MARKS,
    MAX_KEPT,
    PARTITION_FIELDS,
    TELEMETRY_FIELDS,
    BlockRef,
    Delta,
    TableDelta,
    TelemetrySeries,
)

CACHE_VERSION = 2
MAGIC = b"KVJUDGE1"
TRAILER = struct.Struct("<QQ8s")
ALIGN = 64
EDGE_BYTES = 64 << 10
"""Bytes hashed at each end of the trace for its key."""
MAX_FILES = 32
"""Judgements kept in the cache (the least recently written go first)."""
STALE_PART_S = 24 * 3600.0
"""A ``.part`` file this old was left by a viewer killed outright: removed."""
SUFFIX = ".kvjudge"
BLOCK_ROWS = 1 << 15
"""Ledger rows written as one block (about 1.4 MiB of reads)."""


class CacheKey(msgspec.Struct, frozen=True):
    """What a cached judgement must match to be used."""

    path: str
    size: int
    mtime_ns: int
    edges: str
    """sha256 of the trace's first and last :data:`EDGE_BYTES`."""
    code: str
    """:func:`code_hash`: the judgement's code and the ledger's columns."""


class Series(msgspec.Struct, frozen=True):
    step: list[int]
    t_ns: list[int]
    values: dict[str, list[float]]


class Footer(msgspec.Struct, frozen=True):
    key: CacheKey
    dtypes: list[str]
    tables: list[list[tuple[int, int]]]
    """Per ledger table (:data:`~kvdiag.tui.digest.TABLES`), its blocks: (offset, rows)."""
    judgement: dict[str, Any]
    rows: int
    position: int
    truncated: bool
    done: bool
    marks: dict[str, list[int]]
    telemetry: Series
    partition: Series
    aborts: list[ev.Abort]
    aborts_more: int
    problems: list[Problem]
    problems_more: int
    costs: dict[str, float]
    written: float
    """When the judgement was written (time.time())."""
    widest_page: int = 0


class CacheError(Exception):
    """A cache file that cannot be used (the message says why)."""


# -- the key -------------------------------------------------------------------------------

_CODE: list[str] = []


_JUDGED_BY = ("analysis/judgement/*.py", "analysis/judgement/*.c", "analysis/judgement/*.h",
              "trace/*.py", "trace/*.c",
              "model/*.py", "compiled/*.h", "tui/judging.py", "tui/judgeproc.py",
              "tui/digest.py", "tui/judgecache.py")
"""The sources a cached judgement was made by (the C helpers too: a judgement made by an older
walk or reader is not this one's)."""


def code_hash() -> str:
    """A hash of what a cached judgement depends on besides the trace: kvdiag's version, the
    sources that read and judge it (:data:`_JUDGED_BY`), the ledger's columns and this format's
    version."""
    if not _CODE:
        h = hashlib.sha256(f"{__version__}\0{CACHE_VERSION}\0".encode())
        h.update(repr([d.descr for d in DTYPES]).encode())
        package = Path(__file__).resolve().parents[1]
        for pattern in _JUDGED_BY:
            for src in sorted(package.glob(pattern)):
                h.update(str(src.relative_to(package)).encode())
                h.update(src.read_bytes())
        _CODE.append(h.hexdigest())
    return _CODE[0]


def key_of(path: str | os.PathLike[str]) -> CacheKey | None:
    """The cache key of the plain trace file at ``path`` (None: it cannot be read as one)."""
    try:
        real = os.path.realpath(path)
        with open(real, "rb") as fh:
            st = os.fstat(fh.fileno())
            h = hashlib.sha256(fh.read(EDGE_BYTES))
            if st.st_size > EDGE_BYTES:
                fh.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
                h.update(fh.read(EDGE_BYTES))
    except OSError:
        return None
    return CacheKey(real, st.st_size, st.st_mtime_ns, h.hexdigest(), code_hash())


def cache_folder() -> Path:
    # imported here: the viewer's first frame does not wait for the symbolizer's modules
    from kvdiag.files.cache import cache_root

    return Path(cache_root()) / "judgements" / f"v{CACHE_VERSION}"


def cache_file(key: CacheKey) -> Path:
    """Where the judgement of the trace at ``key.path`` is kept (one file per trace path: a
    new judgement of it replaces the old)."""
    name = hashlib.sha256(key.path.encode()).hexdigest()[:32]
    return cache_folder() / f"{name}{SUFFIX}"


def prune(folder: Path, keep: int = MAX_FILES - 1) -> None:
    """Leave room for one more judgement: at most ``keep`` cached, and no ``.part`` file of a
    viewer killed long ago."""
    try:
        entries = [(e.stat().st_mtime, Path(e.path)) for e in os.scandir(folder)
                   if e.is_file(follow_symlinks=False)]
    except OSError:
        return
    now = time.time()
    done = sorted((e for e in entries if e[1].name.endswith(SUFFIX)), reverse=True)
    old = [p for _, p in done[keep:]]
    old += [p for t, p in entries if p.name.endswith(".part") and now - t > STALE_PART_S]
    for p in old:
        with contextlib.suppress(OSError):
            p.unlink()


# -- the file, written by the judging process ------------------------------------------------

class LedgerWriter:
    """Writes one judging pass's ledger file through the descriptor ``fd`` (from byte 0, which
    the viewer made): :meth:`put` each delta, :meth:`finish` with the last one."""

    def __init__(self, fd: int, key: CacheKey | None) -> None:
        self._out: BinaryIO = os.fdopen(fd, "wb", closefd=False)
        self._key = key
        self._pos = 0
        self._blocks: list[list[tuple[int, int]]] = [[] for _ in DTYPES]
        self._pending: list[list[np.ndarray]] = [[] for _ in DTYPES]
        self._marks: dict[str, np.ndarray] = {m: np.zeros(0, np.int64) for m in MARKS}
        self._telemetry: list[TelemetrySeries] = []
        self._partition: list[TelemetrySeries] = []
        self._aborts: list[ev.Abort] = []
        self._aborts_more = 0
        self._problems: list[Problem] = []
        self._problems_more = 0
        self._write(MAGIC)

    def _write(self, data: bytes | memoryview) -> int:
        at = self._pos
        self._out.write(data)
        self._pos += len(data)
        return at

    def _block(self, table: int, arr: np.ndarray) -> BlockRef:
        pad = -self._pos % ALIGN
        if pad:
            self._write(b"\0" * pad)
        data = np.ascontiguousarray(arr, DTYPES[table])
        at = self._write(data.tobytes())
        self._blocks[table].append((at, len(data)))
        return BlockRef(at, len(data))

    def _table(self, i: int, t: TableDelta) -> TableDelta:
        """Table ``i``'s rows of a delta: what it seals is written once :data:`BLOCK_ROWS` rows
        have gathered, and until then travels once as pending rows (:class:`TableDelta`: the
        rows are final, so only those new since the previous delta are sent; sent whole each
        time, they were up to 3.6 MB a delta on bench_tui's trace and the process waited on
        the pipe while the viewer read them). (The Judge seals a block per chunk of events, a
        few hundred rows; a viewer's lookups touch the first row of every block, and the pages
        around it — thousands of small blocks meant most of the file's pages in its resident
        memory, bench_tui.)"""
        pending = self._pending[i]
        new = [b for b in t.sealed if not isinstance(b, BlockRef) and len(b)]
        pending += new
        if sum(len(b) for b in pending) >= BLOCK_ROWS:
            ref = self._block(i, _joined(pending))
            pending.clear()
            return TableDelta((ref,), t.open, t.n)
        return TableDelta((), t.open, t.n, tuple(new))

    def put(self, delta: Delta) -> Delta:
        """Write the blocks ``delta`` seals (once enough have gathered); the same delta with
        :class:`BlockRef` in place of the sealed arrays written, and the rows not written yet
        as its open rows (arrays: they change)."""
        tables = tuple(self._table(i, t) for i, t in enumerate(delta.tables))
        self._out.flush()  # the viewer maps what the refs point at
        for m in MARKS:
            self._marks[m] = np.union1d(self._marks[m], delta.marks_sealed.get(m, ()))
        if delta.telemetry.n:
            self._telemetry.append(delta.telemetry)
        if delta.partition.n:
            self._partition.append(delta.partition)
        room = max(0, MAX_KEPT - len(self._aborts))
        self._aborts += delta.aborts[:room]
        self._aborts_more += max(0, len(delta.aborts) - room)
        room = max(0, MAX_KEPT - len(self._problems))
        self._problems += delta.problems[:room]
        self._problems_more += max(0, len(delta.problems) - room)
        return _with_tables(delta, tables)

    def finish(self, delta: Delta) -> Delta:
        """:meth:`put` the last delta, then the rows still pending and its open rows as final
        blocks, and the footer."""
        sent = self.put(delta)
        for i, t in enumerate(sent.tables):
            rest = [*self._pending[i], *(() if t.open is None else (t.open,))]
            self._pending[i].clear()
            if sum(len(b) for b in rest):
                self._block(i, _joined(rest))
        for m in MARKS:
            self._marks[m] = np.union1d(self._marks[m], delta.marks_open.get(m, ()))
        if self._key is not None:
            footer = Footer(
                key=self._key, dtypes=[repr(d.descr) for d in DTYPES], tables=self._blocks,
                judgement=msgspec.to_builtins(_fields(delta.judgement)), rows=delta.rows,
                position=delta.position, truncated=delta.truncated, done=delta.done,
                marks={m: v.tolist() for m, v in self._marks.items()},
                telemetry=_series(self._telemetry, TELEMETRY_FIELDS),
                partition=_series(self._partition, PARTITION_FIELDS),
                aborts=self._aborts, aborts_more=self._aborts_more, problems=self._problems,
                problems_more=self._problems_more, costs=dict(delta.costs),
                written=time.time(), widest_page=delta.widest_page)
            data = msgspec.msgpack.encode(footer)
            at = self._write(data)
            self._write(TRAILER.pack(at, len(data), MAGIC))
        self._out.flush()
        return sent


def _joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _with_tables(delta: Delta, tables: tuple[TableDelta, ...]) -> Delta:
    return replace(delta, tables=tables)


def _fields(j: Judgement) -> dict[str, Any]:
    """The judgement's fields but its ledger (which the blocks carry)."""
    return {f: getattr(j, f) for f in j.__dataclass_fields__ if f != "ledger"}


def _series(parts: Sequence[TelemetrySeries], fields: tuple[str, ...]) -> Series:
    return Series(
        step=[int(s) for p in parts for s in p.step.tolist()],
        t_ns=[int(s) for p in parts for s in p.t_ns.tolist()],
        values={f: [float(x) for p in parts for x in p.values[f].tolist()] for f in fields})


def _unseries(s: Series, fields: tuple[str, ...]) -> TelemetrySeries:
    n = len(s.step)
    values = {f: np.array(s.values.get(f, [np.nan] * n), np.float64) for f in fields}
    if len(s.t_ns) != n or any(len(v) != n for v in values.values()):
        raise CacheError("telemetry columns of different lengths")
    return TelemetrySeries(np.array(s.step, np.int64), np.array(s.t_ns, np.int64), values,
                           fields)


# -- the file, read by the viewer ----------------------------------------------------------

class LedgerMap:
    """The viewer's read-only view of a ledger file: arrays for :class:`BlockRef` values,
    mapped (not copied) from the file; a region is mapped once and shared by its blocks."""

    def __init__(self, fd: int) -> None:
        self._fd = os.dup(fd)

    def arrays(self, refs: Sequence[tuple[int, BlockRef]], size: int | None = None
               ) -> list[np.ndarray]:
        """The blocks ``(table, ref)`` as arrays; ``size``: the file's size, to check that
        they lie inside it (a cache file read back)."""
        if not refs:
            return []
        lo = min(r.offset for _, r in refs)
        hi = max(r.offset + r.rows * DTYPES[t].itemsize for t, r in refs)
        if size is not None and (lo < len(MAGIC) or hi > size):
            raise CacheError("a ledger block lies outside the file")
        start = lo - lo % mmap.ALLOCATIONGRANULARITY
        if hi <= start:
            return [np.empty(0, DTYPES[t]) for t, _ in refs]
        region = mmap.mmap(self._fd, hi - start, offset=start, access=mmap.ACCESS_READ)
        with contextlib.suppress(AttributeError, OSError):
            # a viewer asks about a few rows at a time: map the page it reads, not the
            # pages around it (they would count in its resident memory)
            region.madvise(mmap.MADV_RANDOM)
        out = []
        for t, r in refs:
            arr = np.frombuffer(region, DTYPES[t], r.rows, r.offset - start)
            out.append(arr)  # frombuffer of a read-only map: not writeable
        return out

    def resolve(self, delta: Delta) -> Delta:
        """``delta`` with its :class:`BlockRef` values mapped."""
        refs = [(i, r) for i, t in enumerate(delta.tables) for r in t.sealed
                if isinstance(r, BlockRef)]
        mapped = iter(self.arrays(refs))
        tables = tuple(TableDelta(tuple(next(mapped) if isinstance(r, BlockRef) else r
                                        for r in t.sealed), t.open, t.n, t.pending)
                       for t in delta.tables)
        return _with_tables(delta, tables)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass
class Cached:
    """A judgement read back from the cache (``delta``), or why there is none to use
    (``note``: a file that exists but cannot be used; None when there is no file)."""

    delta: Delta | None = None
    note: str | None = None
    file: Path | None = None
    written: float = 0.0
    """When the cached judgement was made (time.time())."""


def read_cached(key: CacheKey) -> Cached:
    """The cached judgement of the trace ``key`` names, when there is one to trust."""
    path = cache_file(key)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return Cached(file=path)
    except OSError as exc:
        return Cached(note=f"judgement cache {path} not read: {exc.strerror or exc}", file=path)
    try:
        return _read(fd, key, path)
    except (CacheError, OSError, ValueError, msgspec.DecodeError, msgspec.ValidationError,
            struct.error) as exc:
        return Cached(note=f"judgement cache {path} ignored (judged again): {exc}", file=path)
    finally:
        os.close(fd)


def _read(fd: int, key: CacheKey, path: Path) -> Cached:
    size = os.fstat(fd).st_size
    if size < len(MAGIC) + TRAILER.size:
        raise CacheError("too short")
    if os.pread(fd, len(MAGIC), 0) != MAGIC:
        raise CacheError("not a kvdiag judgement")
    at, length, magic = TRAILER.unpack(os.pread(fd, TRAILER.size, size - TRAILER.size))
    if magic != MAGIC or at < len(MAGIC) or at + length > size - TRAILER.size:
        raise CacheError("damaged trailer")
    footer = msgspec.msgpack.decode(os.pread(fd, length, at), type=Footer)
    if footer.key != key:
        return Cached(file=path)  # an older judgement of another file, or other code: unused
    if footer.dtypes != [repr(d.descr) for d in DTYPES] or len(footer.tables) != len(DTYPES):
        raise CacheError("ledger columns of another version")
    judgement = msgspec.convert(footer.judgement, Judgement)
    refs = [(i, BlockRef(o, n)) for i, blocks in enumerate(footer.tables) for o, n in blocks]
    if any(r.offset % ALIGN or r.rows < 0 or r.offset + r.rows * DTYPES[i].itemsize > at
           for i, r in refs):
        raise CacheError("a ledger block lies outside the file")
    ledger = LedgerMap(fd)
    arrays = ledger.arrays(refs, at)
    ledger.close()  # the maps keep the file open
    sealed: list[list[np.ndarray]] = [[] for _ in DTYPES]
    for (i, _), arr in zip(refs, arrays, strict=True):
        sealed[i].append(arr)
    tables = tuple(TableDelta(tuple(s), None, sum(len(b) for b in s)) for s in sealed)
    delta = Delta(
        rows=footer.rows, position=footer.position, judgement=judgement, tables=tables,
        telemetry=_unseries(footer.telemetry, TELEMETRY_FIELDS),
        partition=_unseries(footer.partition, PARTITION_FIELDS),
        aborts=tuple(footer.aborts), problems=tuple(footer.problems),
        truncated=footer.truncated, done=footer.done, costs=dict(footer.costs),
        marks_sealed={m: np.array(footer.marks.get(m, []), np.int64) for m in MARKS},
        aborts_more=footer.aborts_more, problems_more=footer.problems_more,
        widest_page=footer.widest_page)
    return Cached(delta=delta, file=path, written=footer.written)


# -- the file, made by the viewer ----------------------------------------------------------

@contextlib.contextmanager
def ledger_file(key: CacheKey | None) -> Iterator[tuple[int, Committer]]:
    """A ledger file for a judging process to write: ``(fd, committer)``. With a key it is
    the cache's temporary ``.part`` file, renamed into the cache when the block ends after
    :meth:`Committer.complete` and removed otherwise; without one (or where the cache folder
    cannot be written) an anonymous temporary file, gone when closed."""
    committer = Committer()
    if key is not None:
        target = cache_file(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            prune(target.parent)
            out = plan_output(target, force=True)
        except (OSError, OutputError):
            out = None
        if out is not None:
            try:
                with open_output(out) as sink:
                    yield sink.fileno(), committer
                    if not committer.completed:
                        raise _Unfinished
            except _Unfinished:
                pass
            except OutputError:
                pass  # the cache could not be written: the judgement was still shown
            return
    with tempfile.TemporaryFile(prefix="kvdiag-ledger-") as fh:
        yield fh.fileno(), committer


class Committer:
    """Says that the ledger file is whole (the judging process wrote its footer)."""

    def __init__(self) -> None:
        self.completed = False

    def complete(self) -> None:
        self.completed = True


class _Unfinished(Exception):
    """The judging pass did not finish: its ledger file is not kept."""
