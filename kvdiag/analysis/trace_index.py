"""A columnar index of a ``.kvtrace`` file: one row per event line, a few integers per row.

Built in one streaming pass so that a viewer can list, filter and jump through millions of
events without keeping them decoded: each row holds the line's byte offset and the fields that
filters and the page replay need (seq, step, kind, layer, stream, pool slot, a page or cell
range, flags). Everything else is decoded again from the bytes, for the few rows on screen.

Where a C compiler is at hand, one C pass (``indexscan.c``) reads each chunk's row fields
straight from its bytes; the reference path, and the one for any chunk holding a line that pass
is not sure of, decodes the chunk of complete lines with ``msgspec`` into a small Struct that
declares only those fields (msgspec skips the rest, tensors included, in C) and turns it into
numpy columns. A chunk that does not decode cleanly is indexed line by line, and a line that is
not an event becomes a ``corrupt`` row, so damage is visible where it is (the line-numbered
problem report comes from :class:`kvdiag.trace.reader.TraceReader`, which the digest pass runs).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from kvdiag import compiled
from kvdiag.analysis.linesource import LineSource
from kvdiag.model.events import KNOWN_KINDS, AnyEvent, Unknown

TraceItem = AnyEvent | Unknown


KINDS: tuple[str, ...] = (*KNOWN_KINDS, "unknown", "corrupt")
"""Kind names by code: the format's kinds in their documented order, then two of our own."""
KIND_CODE: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
UNKNOWN = KIND_CODE["unknown"]
CORRUPT = KIND_CODE["corrupt"]
STEP, FITS, WRITE, UPLOAD = KIND_CODE["step"], KIND_CODE["fits"], KIND_CODE["write"], KIND_CODE["upload"]
EVICT, READ, LEARN = KIND_CODE["evict"], KIND_CODE["read"], KIND_CODE["learn"]
TELEMETRY, ABORT = KIND_CODE["telemetry"], KIND_CODE["abort"]

ROUTES: tuple[str, ...] = ("streamed", "fallback", "abort", "ordinary")
ROUTE_CODE = {r: i for i, r in enumerate(ROUTES)}

# Row flags.
F_RING = 1
"""upload: to a ring slot (else to a resident pool slot)."""
F_FITS_FALSE = 2
"""fits: the predicate returned false."""
F_RELEARN = 4
"""learn: the layer maps were cleared."""

COLUMNS: dict[str, npt.DTypeLike] = {
    "offset": np.int64,  # byte offset of the line in the file
    "seq": np.int64,
    "step": np.int32,
    "kind": np.int8,
    "layer": np.int16,  # -1 when the kind has none
    "stream": np.int16,
    "slot": np.int32,  # upload/evict: pool or ring slot
    "a": np.int32,  # upload: first page; write: first cell; evict: page; fits: route code
    "b": np.int32,  # upload: end page; write: end cell (half-open)
    "key": np.int16,  # upload: stream part of the bookkeeping key (-1: none, shared layout)
    "flags": np.uint8,
}
BYTES_PER_ROW = sum(np.dtype(t).itemsize for t in COLUMNS.values())
CHUNK = 1 << 20


class _Row(msgspec.Struct, gc=False):
    """The fields of an event line that the index keeps (msgspec skips every other key)."""

    kind: str
    seq: int
    step: int
    layer: int = -1
    stream: int = -1
    slot: int = -1
    page: int = -1
    pages: tuple[int, int] = (-1, -1)
    cells: tuple[int, int] = (-1, -1)
    target: str = ""
    key_stream: int | None = None
    result: bool = True
    route: str = ""
    relearn: bool = False


_COMMON = tuple(operator.attrgetter(name) for name in ("seq", "step", "layer", "stream", "slot"))
_CELLS = operator.attrgetter("cells")
_KIND = operator.attrgetter("kind")
_CODE = defaultdict(lambda: UNKNOWN, KIND_CODE).__getitem__
_decode_rows = msgspec.json.Decoder(_Row).decode_lines
_decode_row = msgspec.json.Decoder(_Row).decode
_decode_any = msgspec.json.decode
_BAD = (msgspec.MsgspecError, ValueError, RecursionError, OverflowError, TypeError)


def _extras(code: int, row: _Row) -> tuple[int, int, int, int]:
    """``(a, b, flags, key)`` of one row, by kind (see :data:`COLUMNS`)."""
    if code == UPLOAD:
        key = -1 if row.key_stream is None else row.key_stream
        return row.pages[0], row.pages[1], F_RING if row.target == "ring" else 0, key
    if code == WRITE:
        return row.cells[0], row.cells[1], 0, -1
    if code == EVICT:
        return row.page, -1, 0, -1
    if code == FITS:
        return ROUTE_CODE.get(row.route, -1), -1, 0 if row.result else F_FITS_FALSE, -1
    if code == LEARN:
        return -1, -1, F_RELEARN if row.relearn else 0, -1
    return -1, -1, 0, -1


class TraceIndex:
    """An immutable view of the first ``n`` rows of an index (arrays are read-only)."""

    def __init__(self, columns: dict[str, np.ndarray], *, complete: bool, seq_sorted: bool,
                 bytes_indexed: int, size: int, counts: np.ndarray | None = None,
                 step_high: np.ndarray | None = None) -> None:
        if step_high is not None:  # kept as rows arrive by a caller that appends (--follow)
            self.__dict__["step_high"] = step_high
        self.columns = columns
        self._counts = counts
        self.n = len(columns["offset"])
        self.complete = complete
        self.seq_sorted = seq_sorted
        self.bytes_indexed = bytes_indexed
        self.size = size

    def __len__(self) -> int:
        return self.n

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["columns"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def fraction(self) -> float:
        return 1.0 if self.complete or self.size == 0 else self.bytes_indexed / self.size

    def kind_counts(self) -> dict[str, int]:
        counts = self._counts
        if counts is None:
            counts = np.bincount(self.columns["kind"], minlength=len(KINDS))
        return {KINDS[i]: int(c) for i, c in enumerate(counts) if c}

    @functools.cached_property
    def step_high(self) -> np.ndarray:
        """Running maximum of ``step``: equal to ``step`` in a well-ordered trace, and sorted
        in any trace, so that "everything up to step S" is a prefix of the rows."""
        steps = self.columns["step"]
        return steps if steps.size == 0 else np.maximum.accumulate(steps)

    @property
    def last_step(self) -> int:
        return int(self.step_high[-1]) if self.n else -1

    def _step_key(self, step: int) -> np.ndarray:
        # A key of the array's own dtype: with a Python int, searchsorted converts the whole
        # int32 array first (milliseconds at millions of rows).
        info = np.iinfo(np.int32)
        return np.asarray(min(max(step, info.min), info.max), dtype=np.int32)

    def cutoff(self, step: int) -> int:
        """Number of rows that belong to steps ``<= step`` (the prefix to replay)."""
        return int(np.searchsorted(self.step_high, self._step_key(step), side="right"))

    def step_rows(self, step: int) -> tuple[int, int]:
        """Row range ``[lo, hi)`` of ``step`` (exact for a trace whose steps never go back)."""
        high, key = self.step_high, self._step_key(step)
        return (int(np.searchsorted(high, key, side="left")),
                int(np.searchsorted(high, key, side="right")))

    def row_of_seq(self, seq: int) -> int | None:
        seqs = self.columns["seq"]
        if self.seq_sorted:
            i = int(np.searchsorted(seqs, seq))
            return i if i < self.n and int(seqs[i]) == seq else None
        hits = np.flatnonzero(seqs == seq)
        return int(hits[0]) if hits.size else None

    @functools.cached_property
    def slot_span(self) -> np.ndarray:
        """Slots each row covers from ``slot``: an upload's page count, else 1."""
        return self.slot_span_of(0, self.n)

    def slot_span_of(self, lo: int, hi: int) -> np.ndarray:
        """:attr:`slot_span` of rows ``[lo, hi)`` (without making it for every row)."""
        c = self.columns
        return np.where(c["kind"][lo:hi] == UPLOAD, np.maximum(c["b"][lo:hi] - c["a"][lo:hi], 1),
                        1)

    def row_at_offset(self, offset: int) -> int:
        """The row whose line contains byte ``offset``."""
        return max(0, int(np.searchsorted(self.columns["offset"], offset, side="right")) - 1)


TAIL = 1 << 16
"""Bytes read at a time while looking back for a block's last newline."""


def line_blocks(source: LineSource, start: int, chunk: int = CHUNK
                ) -> Iterator[tuple[int, bytes]]:
    """Runs of whole lines of ``source`` from byte ``start``, about ``chunk`` bytes each:
    ``(offset, block)``. A line longer than ``chunk`` is a run of its own; the file's last
    line may lack its newline.

    Each block is read once, at its exact length: the end of the chunk is read first, small,
    to find the last newline in it. (Reading a whole chunk and slicing off the partial line
    after it made two block-sized buffers per block, freed at once: the allocator handed
    their pages back to the system and faulted fresh ones in for the next block, 260k page
    faults and a second of system time per GB on this machine, measured.)"""
    size = source.size
    pos = start
    while pos < size:
        end = min(pos + chunk, size)
        if end < size:
            cut = _last_newline(source, pos, end)
            end = cut + 1 if cut >= 0 else _next_line_end(source, end, chunk)
        block = source.read(pos, end - pos)
        if not block:
            return
        yield pos, block
        pos += len(block)


def _last_newline(source: LineSource, lo: int, hi: int) -> int:
    """Offset of the last newline in ``[lo, hi)`` of ``source``, or -1."""
    while hi > lo:
        at = max(lo, hi - TAIL)
        k = source.read(at, hi - at).rfind(b"\n")
        if k >= 0:
            return at + k
        hi = at
    return -1


def _next_line_end(source: LineSource, pos: int, chunk: int) -> int:
    """One past the first newline at or after ``pos`` (the end of the file when none)."""
    size = source.size
    while pos < size:
        piece = source.read(pos, min(chunk, size - pos))
        if not piece:
            return pos
        k = piece.find(b"\n")
        if k >= 0:
            return pos + k + 1
        pos += len(piece)
    return size


class IndexBuilder:
    """Indexes the event lines of ``source`` from byte ``start`` (just after the header)."""

    def __init__(self, source: LineSource, start: int) -> None:
        self.source = source
        self.start = start
        self.pos = start
        self.n = 0
        self._cap = max(1024, (source.size - start) // 160)
        self._cols = {name: np.empty(self._cap, dtype) for name, dtype in COLUMNS.items()}
        self._last_seq = 0
        self._last_step = 0
        self._seq_sorted = True
        # kept as rows arrive: a count over millions of rows at every progress update would
        # take the UI thread tens of milliseconds each time
        self._counts = np.zeros(len(KINDS), np.int64)
        self.done = False

    def run(self, chunk: int = CHUNK) -> Iterator[int]:
        """Index chunk by chunk; yields the byte position reached after each chunk."""
        for offset, block in line_blocks(self.source, self.pos, chunk):
            self.add(block, offset)
            yield self.pos
        self.done = True

    def add(self, block: bytes, offset: int) -> None:
        """Index ``block``, the lines of the file from byte ``offset`` (the next ones: a caller
        that reads the blocks itself with :func:`line_blocks`, to use them for more than the
        index, calls this and sets :attr:`done` at the end)."""
        self._block(block, offset)
        self.pos = offset + len(block)

    def snapshot(self, step_high: np.ndarray | None = None) -> TraceIndex:
        """The rows so far (``step_high``: their :attr:`TraceIndex.step_high`, when the caller
        keeps it as rows arrive)."""
        cols = {}
        for name, arr in self._cols.items():
            view = arr[: self.n]
            view.flags.writeable = False
            cols[name] = view
        return TraceIndex(cols, complete=self.done, seq_sorted=self._seq_sorted,
                          bytes_indexed=self.pos, size=self.source.size,
                          counts=self._counts.copy(), step_high=step_high)

    # -- internals ------------------------------------------------------------------------

    def _reserve(self, extra: int) -> None:
        need = self.n + extra
        if need <= self._cap:
            return
        cap = max(need, self._cap * 2)
        for name, arr in self._cols.items():
            grown = np.empty(cap, arr.dtype)
            grown[: self.n] = arr[: self.n]
            self._cols[name] = grown
        self._cap = cap

    def _block(self, block: bytes, base: int) -> None:
        if self._scanned(block, base):
            return
        raw = np.frombuffer(block, np.uint8)
        ends = np.flatnonzero(raw == 10)
        if ends.size == 0 or ends[-1] != len(block) - 1:
            ends = np.append(ends, len(block))  # a last line without a newline
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        try:
            self._fast(block, starts, ends, base)
        except _BAD:
            self._slow(block, starts, ends, base)

    def _scanned(self, block: bytes, base: int) -> bool:
        """Index ``block`` in one C pass over its bytes (``indexscan.c``: the fields read where
        they lie and written into the columns, nothing decoded into objects; 1.9 -> 0.6 s of
        CPU per 1M events, measured on bench_tui's trace) where a compiler is at hand. False:
        no C helper, or the block holds a line the pass declines — it is indexed by the
        reference path below."""
        c = _indexscan()
        if c is None or not block:
            return False
        k = block.count(b"\n") + (block[-1:] != b"\n")
        self._reserve(k)
        i = self.n
        if c.scan_into(block, base, tuple(self._cols[name] for name in COLUMNS), i) is None:
            return False
        cols = self._cols
        self._settle(i, cols["seq"][i:i + k], cols["step"][i:i + k], cols["kind"][i:i + k])
        return True

    def _fast(self, block: bytes, starts: np.ndarray, ends: np.ndarray, base: int) -> None:
        rows: list[_Row] = _decode_rows(block)
        n = len(rows)
        if n != len(starts):  # a blank line, or a line holding two values
            raise ValueError("line count")
        cols = [np.fromiter(map(get, rows), np.int64, n) for get in _COMMON]
        kinds = np.fromiter(map(_CODE, map(_KIND, rows)), np.int8, n)
        a = np.full(n, -1, np.int32)
        b = np.full(n, -1, np.int32)
        flags = np.zeros(n, np.uint8)
        key = np.full(n, -1, np.int16)
        # Only a few kinds carry a/b/flags; pick those rows, then read one field per map.
        idx = np.flatnonzero(kinds == WRITE)
        if idx.size:
            cells = _pairs(map(_CELLS, _pick(rows, idx)), idx.size)
            a[idx] = cells[:, 0]
            b[idx] = cells[:, 1]
        for code in (UPLOAD, EVICT, FITS, LEARN):
            idx = np.flatnonzero(kinds == code)
            if idx.size:
                vals = np.array([_extras(code, r) for r in _pick(rows, idx)], dtype=np.int64)
                a[idx] = vals[:, 0]
                b[idx] = vals[:, 1]
                flags[idx] = vals[:, 2]
                key[idx] = vals[:, 3]
        seq, step, layer, stream, slot = cols
        self._append(base + starts, seq, step, kinds, layer, stream, slot, a, b, key, flags)

    def _slow(self, block: bytes, starts: np.ndarray, ends: np.ndarray, base: int) -> None:
        values = [self._line(block[s:e]) for s, e in zip(starts.tolist(), ends.tolist(),
                                                         strict=True)]
        arr = np.array(values, dtype=np.int64).reshape(-1, 10)
        self._append(base + starts, *(arr[:, i] for i in range(10)))

    def _line(self, text: bytes) -> tuple[int, ...]:
        """``(seq, step, kind, layer, stream, slot, a, b, key, flags)`` of a line, never failing."""
        if text.strip():
            row: _Row | None
            try:
                row = _decode_row(text)
            except _BAD:
                row = _from_dict(text)
            if row is not None:
                code = _CODE(row.kind)
                a, b, flags, key = _extras(code, row)
                vals = (row.seq, row.step, code, row.layer, row.stream, row.slot, a, b, key,
                        flags)
                if all(_fits_column(v, t) for v, t in zip(vals, _SLOW_TYPES, strict=True)):
                    return vals
        return (self._last_seq, self._last_step, CORRUPT, -1, -1, -1, -1, -1, -1, 0)

    def _append(self, offsets: np.ndarray, seq: np.ndarray, step: np.ndarray, kind: np.ndarray,
                layer: np.ndarray, stream: np.ndarray, slot: np.ndarray, a: np.ndarray,
                b: np.ndarray, key: np.ndarray, flags: np.ndarray) -> None:
        k = len(offsets)
        if k == 0:
            return
        self._reserve(k)
        i, j = self.n, self.n + k
        c = self._cols
        c["offset"][i:j] = offsets
        c["seq"][i:j] = seq
        c["step"][i:j] = step
        c["kind"][i:j] = kind
        c["layer"][i:j] = layer
        c["stream"][i:j] = stream
        c["slot"][i:j] = slot
        c["a"][i:j] = a
        c["b"][i:j] = b
        c["key"][i:j] = key
        c["flags"][i:j] = flags
        self._settle(i, seq, step, kind)

    def _settle(self, i: int, seq: np.ndarray, step: np.ndarray, kind: np.ndarray) -> None:
        """Count the rows written from row ``i`` (their ``seq``, ``step`` and ``kind``)."""
        k = len(seq)
        if self._seq_sorted and ((int(seq[0]) <= self._last_seq and self.n > 0)
                                 or (k > 1 and bool(np.any(np.diff(seq) <= 0)))):
            self._seq_sorted = False
        self._counts += np.bincount(kind.astype(np.intp), minlength=len(KINDS))
        self.n = i + k
        self._last_seq = int(seq[-1])
        self._last_step = int(step[-1])


_INDEXSCAN = Path(__file__).with_name("indexscan.c")


@functools.cache
def _indexscan() -> Any | None:
    """The C pass over a block's lines (:mod:`kvdiag.compiled`), told this module's kind and
    route names and flags; None without one."""
    c = compiled.load(_INDEXSCAN, f"{__package__}._indexscan")
    if c is not None:
        c.configure(KINDS, ROUTES, UNKNOWN, UPLOAD, WRITE, EVICT, FITS, LEARN, F_RING,
                    F_FITS_FALSE, F_RELEARN)
    return c


_SLOW_TYPES: tuple[type[np.integer[Any]], ...] = (np.int64, np.int32, np.int8, np.int16, np.int16, np.int32, np.int32, np.int32,
               np.int16, np.uint8)


def _pick(rows: list[_Row], idx: np.ndarray) -> tuple[_Row, ...]:
    if idx.size == 1:
        return (rows[int(idx[0])],)
    return operator.itemgetter(*idx.tolist())(rows)  # type: ignore[no-any-return]


def _pairs(values: Iterator[tuple[int, int]], n: int) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(values), np.int64, 2 * n).reshape(n, 2)


def _fits_column(value: int, dtype: type[np.integer[Any]]) -> bool:
    info = np.iinfo(dtype)
    return isinstance(value, int) and info.min <= value <= info.max


def _from_dict(text: bytes) -> _Row | None:
    """An event line the narrow decoder refused (a newer kind, odd field types): keep what is
    well-typed, ``-1`` for the rest; None when it is not an event at all."""
    try:
        raw = _decode_any(text)
    except _BAD:
        return None
    if not isinstance(raw, dict):
        return None
    kind, seq, step = raw.get("kind"), raw.get("seq"), raw.get("step")
    if not isinstance(kind, str) or type(seq) is not int or type(step) is not int:
        return None

    def num(key: str) -> int:
        v = raw.get(key)
        return v if type(v) is int else -1

    if KIND_CODE.get(kind) in (UPLOAD, WRITE, EVICT, FITS):
        # Their indexed fields are required by the format: the line is damaged (the reader
        # drops it too).
        return None
    return _Row(kind=kind, seq=seq, step=step, layer=num("layer"), stream=num("stream"),
                slot=num("slot"))


_decode_event = msgspec.json.Decoder(AnyEvent).decode


def decode_event(text: bytes) -> TraceItem | None:
    """One event line as the reader would give it (an ``Unknown`` for a kind this version does
    not know); None when the line is not an event."""
    try:
        event: TraceItem = _decode_event(text)
        return event
    except _BAD:
        pass
    row = _from_dict(text)
    if row is None or row.kind in KIND_CODE:
        return None
    raw = _decode_any(text)
    fields = {k: v for k, v in raw.items() if k not in ("kind", "seq", "t_ns", "step")}
    t_ns = raw.get("t_ns")
    return Unknown(row.kind, row.seq, t_ns if type(t_ns) is int else 0, row.step, fields)


def header_end(source: LineSource) -> int:
    """Offset just after the header line (the file's first line)."""
    nl = source.find(b"\n", 0)
    return source.size if nl < 0 else nl + 1
