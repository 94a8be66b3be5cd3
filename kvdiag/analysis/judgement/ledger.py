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

_I32 = (np.iinfo(np.int32).min, np.iinfo(np.int32).max)
_LIMITS = {np.dtype(t).char: (np.iinfo(t).min, np.iinfo(t).max)
           for t in (np.int8, np.int16, np.int32, np.int64)}


class Table:
    """Append-only rows sealed into structured-array blocks."""

    def __init__(self, columns: list[tuple[str, str]]) -> None:
        self.dtype = np.dtype(columns)
        self.blocks: list[np.ndarray] = []
        self.rows: list[tuple[int, ...]] = []
        self.n = 0

    def append(self, row: tuple[int, ...]) -> None:
        self.rows.append(row)
        self.n += 1
        if len(self.rows) >= BLOCK:
            self.blocks.append(self._seal(self.rows))
            self.rows = []

    def extend(self, columns: list[np.ndarray]) -> None:
        """Many rows at once, one array per column (in :attr:`dtype`'s order)."""
        if not columns or not columns[0].size:
            return
        if self.rows:
            self.blocks.append(self._seal(self.rows))
            self.rows = []
        block = np.empty(columns[0].size, self.dtype)
        for name, col in zip(self.dtype.names or (), columns, strict=True):
            block[name] = np.clip(col, *_LIMITS[block[name].dtype.char])
        block.flags.writeable = False
        self.blocks.append(block)
        self.n += block.size

    def _seal(self, rows: list[tuple[int, ...]]) -> np.ndarray:
        try:
            arr = np.array(rows, dtype=self.dtype)
        except OverflowError:  # a hostile value beyond its column: clipped, never a crash
            arr = np.array([tuple(max(_I32[0], min(_I32[1], v)) for v in r) for r in rows],
                           dtype=self.dtype)
        arr.flags.writeable = False
        return arr

    def snapshot(self) -> TableSnapshot:
        tail = (self._seal(self.rows),) if self.rows else ()
        return TableSnapshot(self.dtype, (*self.blocks, *tail), self.n)


class TableSnapshot:
    """An immutable prefix of a :class:`Table`."""

    def __init__(self, dtype: np.dtype[Any], blocks: Sequence[np.ndarray], n: int) -> None:
        self.dtype = dtype
        self.blocks = tuple(blocks)
        self.n = n
        self._flat: np.ndarray | None = None

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

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(self.reads.snapshot(), self.pieces.snapshot(),
                              self.flows.snapshot(), self.fits.snapshot(),
                              self.outputs.snapshot())


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
        col = self.pieces.column("read")
        lo, hi = np.searchsorted(col, read, side="left"), np.searchsorted(col, read, "right")
        return self.pieces.array[lo:hi]

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
