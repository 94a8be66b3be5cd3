"""The judgement as compact tables, for viewers that jump around a judged trace (the TUI's
Pages, Timeline and scrubber marks; ``kvdiag trace pages`` reads the Judge directly).

Rows are appended as events are judged and sealed into numpy structured arrays of
:data:`BLOCK` rows; a :class:`LedgerSnapshot` is an immutable prefix (sealed blocks are shared
between snapshots, the open block is copied), so a background thread can keep judging while a
viewer reads the last snapshot. Memory is a few dozen bytes per read and per non-exact run:
the common all-exact read costs one row, never an object per page.

Tables (columns in :data:`READS`, :data:`PIECES`, :data:`FLOWS`, :data:`FITS`,
:data:`OUTPUTS`):

- ``reads``: one row per read event: its row (the Judge's event counter), seq, step, layer,
  stream and how many of its pages are exact, stale, foreign, not judged;
- ``pieces``: one row per run of pages of one read with one non-exact verdict (stale, foreign,
  not judged): ``read`` is its read's index in ``reads``; the holder columns say whose copy the
  slot held (-1: nothing, or not judged), ``why`` why a page is not judged
  (:data:`~kvdiag.analysis.judgement.classes.WHY`); pages of a read outside every piece are
  exact;
- ``flows``: write → read: the last write of a page (``write_seq``) before a read that got that
  page stale or foreign (``read_seq``, ``read`` index, ``cls``): one row per (write, read);
- ``fits``: one row per fits event: outcome code (:data:`~kvdiag.analysis.judgement.fits.OUTCOMES`),
  failed-condition count;
- ``outputs``: one row per output event: 1 diverged, 0 within tolerance, -1 no reference.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from kvdiag.analysis.judgement.fits import OUTCOME_CODE
from kvdiag.analysis.judgement.slots import Piece

BLOCK = 8192

READS: list[tuple[str, str]] = [
    ("row", "i8"), ("seq", "i8"), ("step", "i4"), ("layer", "i4"), ("stream", "i4"),
    ("exact", "i4"), ("stale", "i4"), ("foreign", "i4"), ("not_judged", "i4"),
]
PIECES: list[tuple[str, str]] = [
    ("read", "i8"), ("begin", "i4"), ("end", "i4"), ("source", "i1"), ("slot", "i4"),
    ("cls", "i1"), ("lag", "i4"), ("holder_layer", "i4"), ("holder_stream", "i4"),
    ("holder_page", "i4"), ("holder_version", "i4"), ("holder_step", "i4"),
    ("holder_seq", "i8"), ("why", "i1"),
]
FLOWS: list[tuple[str, str]] = [("write_seq", "i8"), ("read_seq", "i8"), ("read", "i8"),
                                ("cls", "i1")]
FITS: list[tuple[str, str]] = [("row", "i8"), ("seq", "i8"), ("step", "i4"), ("layer", "i4"),
                               ("outcome", "i1"), ("failed", "i2")]
OUTPUTS: list[tuple[str, str]] = [("row", "i8"), ("seq", "i8"), ("step", "i4"),
                                  ("stream", "i4"), ("diverged", "i1")]

_I64 = (-(1 << 63), (1 << 63) - 1)
_LIMITS = {np.dtype(t).char: (np.iinfo(t).min, np.iinfo(t).max)
           for t in (np.int8, np.int16, np.int32, np.int64)}


class Table:
    """Append-only rows sealed into structured-array blocks.

    The open rows are one flat ``array('q')`` of int64s: appending a row is one C call, and
    sealing or copying them is a buffer view and a cast per column (converting a list of
    tuples to a structured array cost about a microsecond per row, a tenth of a viewer's
    judging pass when every snapshot copies the open rows)."""

    def __init__(self, columns: list[tuple[str, str]]) -> None:
        self.dtype = np.dtype(columns)
        self.width = len(columns)
        self.blocks: list[np.ndarray] = []
        self.open = array("q")
        self.n = 0

    def append(self, row: tuple[int, ...]) -> None:
        start = len(self.open)
        try:
            self.open.extend(row)
        except OverflowError:  # a hostile value beyond 64 bits: clipped, never a crash
            del self.open[start:]
            self.open.extend(max(_I64[0], min(_I64[1], v)) for v in row)
        self.n += 1
        if len(self.open) >= BLOCK * self.width:
            self.blocks.append(self._seal())
            self.open = array("q")

    def extend(self, columns: list[np.ndarray]) -> None:
        """Many rows at once, one array per column (in :attr:`dtype`'s order)."""
        if not columns or not columns[0].size:
            return
        if self.open:
            self.blocks.append(self._seal())
            self.open = array("q")
        block = np.empty(columns[0].size, self.dtype)
        for name, col in zip(self.dtype.names or (), columns, strict=True):
            lo, hi = _LIMITS[block[name].dtype.char]
            # a value beyond its column (a hostile trace) is clipped, never wrapped; the
            # bounds are looked at first, np.clip's own cost being most of a column's
            if col.dtype.itemsize > block[name].dtype.itemsize and col.size and (
                    col.min() < lo or col.max() > hi):
                col = np.clip(col, lo, hi)
            block[name] = col
        block.flags.writeable = False
        self.blocks.append(block)
        self.n += block.size

    def _seal(self) -> np.ndarray:
        flat = np.frombuffer(self.open, dtype=np.int64).reshape(-1, self.width)
        arr = np.empty(len(flat), self.dtype)
        for i, name in enumerate(self.dtype.names or ()):
            kind = self.dtype[name]
            info = np.iinfo(kind)
            # a value beyond its column (a hostile trace) is clipped, never wrapped
            arr[name] = flat[:, i].clip(info.min, info.max) if kind.itemsize < 8 \
                else flat[:, i]
        arr.flags.writeable = False
        return arr

    def snapshot(self) -> TableSnapshot:
        tail = (self._seal(),) if self.open else ()
        return TableSnapshot(self.dtype, (*self.blocks, *tail), self.n, len(self.blocks))

    def take(self) -> tuple[list[np.ndarray], np.ndarray | None, int]:
        """The blocks sealed since the last take (forgotten here), a copy of the open rows
        and the row count: for a viewer that keeps the table in another process, so that it
        is held once. A table taken from no longer makes whole snapshots."""
        sealed, self.blocks = self.blocks, []
        return sealed, (self._seal() if self.open else None), self.n


class TableSnapshot:
    """An immutable prefix of a :class:`Table`: ``blocks`` in row order, the first ``sealed``
    of them final (a later snapshot shares them), the rest a copy of the rows still open.

    Lookups by an ascending column (``reads.row``, ``pieces.read``) search block by block, so
    a viewer asking about a few rows never flattens millions of them; :attr:`array` does."""

    def __init__(self, dtype: np.dtype[Any], blocks: Sequence[np.ndarray], n: int,
                 sealed: int | None = None) -> None:
        self.dtype = dtype
        self.blocks = tuple(b for b in blocks if len(b))
        self.n = n
        self.sealed = len(self.blocks) if sealed is None else min(sealed, len(self.blocks))
        self._flat: np.ndarray | None = None
        self._starts: list[int] | None = None
        self._firsts: dict[str, list[int]] = {}

    def _block_starts(self) -> list[int]:
        """Index of each block's first row, and the total."""
        if self._starts is None:
            self._starts = [0, *itertools.accumulate(len(b) for b in self.blocks)]
        return self._starts

    def _first_values(self, name: str) -> list[int]:
        got = self._firsts.get(name)
        if got is None:
            got = self._firsts[name] = [int(b[name][0]) for b in self.blocks]
        return got

    def bounds(self, name: str, value: int) -> tuple[int, int]:
        """``[lo, hi)``: the rows whose ``name`` equals ``value``, for an integer column that
        ascends through the table (a viewer asks this per cell row it draws: plain bisection
        over the blocks' first values, one search in a block)."""
        if not self.blocks:
            return 0, 0
        firsts = self._first_values(name)
        starts = self._block_starts()
        first = max(0, bisect.bisect_left(firsts, value) - 1)
        last = max(0, bisect.bisect_right(firsts, value) - 1)
        # in ascending integers the rows equal to v end where those >= v + 1 begin. A column
        # of a structured block is strided, and numpy's searchsorted copies it whole first (a
        # block is tens of thousands of rows); bisection reads the ~16 values it compares.
        col = self.blocks[first][name]
        lo = starts[first] + bisect.bisect_left(col, value)
        hi = starts[first] + bisect.bisect_left(col, value + 1, lo - starts[first])
        if last != first:
            hi = starts[last] + bisect.bisect_left(self.blocks[last][name], value + 1)
        return lo, max(lo, hi)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` as one array (joining the blocks they span)."""
        lo, hi = max(lo, 0), min(hi, self.n)
        if hi <= lo:
            return np.empty(0, self.dtype)
        starts = self._block_starts()
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_right(starts, hi - 1) - 1
        parts = [self.blocks[b][max(lo - starts[b], 0):hi - starts[b]]
                 for b in range(first, last + 1)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __len__(self) -> int:
        return self.n

    @property
    def array(self) -> np.ndarray:
        """All rows as one structured array (made once per snapshot)."""
        if self._flat is None:
            flat = (np.concatenate(self.blocks) if len(self.blocks) > 1 else
                    self.blocks[0] if self.blocks else np.empty(0, self.dtype))
            flat.flags.writeable = False
            self._flat = flat
        return self._flat

    def column(self, name: str) -> np.ndarray:
        return self.array[name]


class Ledger:
    """The tables the Judge appends to when asked to keep a ledger."""

    def __init__(self) -> None:
        self.reads = Table(READS)
        self.pieces = Table(PIECES)
        self.flows = Table(FLOWS)
        self.fits = Table(FITS)
        self.outputs = Table(OUTPUTS)

    def tables(self) -> tuple[Table, ...]:
        """In :class:`LedgerSnapshot`'s order."""
        return self.reads, self.pieces, self.flows, self.fits, self.outputs

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(*(t.snapshot() for t in self.tables()))


class LedgerSnapshot:
    """Immutable tables of a judged prefix, with the lookups viewers need."""

    def __init__(self, reads: TableSnapshot, pieces: TableSnapshot, flows: TableSnapshot,
                 fits: TableSnapshot, outputs: TableSnapshot) -> None:
        self.reads = reads
        self.pieces = pieces
        self.flows = flows
        self.fits = fits
        self.outputs = outputs

    def pieces_of(self, read: int) -> np.ndarray:
        """The non-exact runs of read ``read`` (an index into ``reads``), in page order."""
        return self.pieces.rows(*self.pieces.bounds("read", read))

    def read_at(self, row: int) -> int | None:
        """The index into ``reads`` of the read event at ``row`` (None: no read judged
        there)."""
        lo, hi = self.reads.bounds("row", row)
        return lo if hi > lo else None

    def piece_tuples(self, read: int) -> list[Piece]:
        """:meth:`pieces_of` as :data:`~kvdiag.analysis.judgement.slots.Piece` tuples."""
        return [cast(Piece, tuple(r[1:])) for r in self.pieces_of(read).tolist()]

    def steps_with(self, what: str) -> np.ndarray:
        """Sorted unique steps with ``stale`` or ``foreign`` or ``not judged`` pages, a
        ``mismatch`` or ``fallback`` fits outcome, or a ``diverged`` output."""
        if what in ("stale", "foreign", "not_judged"):
            r = self.reads.array
            return np.unique(r["step"][r[what] > 0])
        if what in ("mismatch", "fallback"):
            f = self.fits.array
            return np.unique(f["step"][f["outcome"] == OUTCOME_CODE[what]])
        if what == "diverged":
            o = self.outputs.array
            return np.unique(o["step"][o["diverged"] == 1])
        raise ValueError(f"no step mark {what!r}")
