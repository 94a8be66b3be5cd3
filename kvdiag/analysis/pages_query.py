"""Pages snapshots by random access: the state at any step without replaying the trace.

Every part of the state at the end of step S is "the latest event of some kind, for some key,
at or before S" (see :mod:`kvdiag.analysis.replay`): the latest read of a (layer, stream), the
latest upload into a slot (unless an eviction came after it), the latest upload of a bookkeeping
key, the number of writes that gave a host page its version. What a slot held and a page's
version come from the judgement's random-access form of its slot rule
(:mod:`kvdiag.analysis.judgement.history`); what each page of a read was — exact, stale,
foreign, whose bytes — comes from the judgement's ledger (:mod:`kvdiag.analysis.judgement.ledger`)
and never from the model's annotation: without a ledger (the judgement still running) read
pages are "not judged". The cost of a snapshot depends on the grid size, not on the step or the
trace length. An ``invalidate`` empties the slots and forgets the keys, so an upload counts
only after the latest one, and the window is the shape of the ``adapt`` before it
(:func:`~kvdiag.analysis.replay.reshaped_window`). The result equals
:class:`~kvdiag.analysis.replay.PagesReplay`'s (tested).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from kvdiag.analysis.judgement import LedgerSnapshot
from kvdiag.analysis.judgement.classes import MAX_PAGE, NOT_JUDGED, SOURCE_CODE
from kvdiag.analysis.judgement.crosscheck import as_ranges
from kvdiag.analysis.judgement.history import History, expand, group, last_below
from kvdiag.analysis.judgement.slots import Piece
from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.replay import PagesGeometry, PagesSnapshot, Window, assemble, reshaped_window
from kvdiag.analysis.trace_index import (
    EVICT,
    F_RELEARN,
    F_RING,
    KIND_CODE,
    LEARN,
    READ,
    UPLOAD,
    WRITE,
    TraceIndex,
    decode_event,
)
from kvdiag.model import events as ev
from kvdiag.model.pages import Holder, Key


class PagesQuery:
    """Snapshots of an indexed trace (complete or not: only indexed rows are used)."""

    def __init__(self, index: TraceIndex, source: LineSource, geometry: PagesGeometry,
                 ledger: LedgerSnapshot | None = None) -> None:
        self.index = index
        self.source = source
        self.geometry = geometry
        self.ledger = ledger
        c = index.columns
        kind = c["kind"]

        def col(name: str, rows: np.ndarray) -> np.ndarray:
            # Gather first, widen after: widening whole columns of millions of rows first
            # would cost hundreds of MiB at the peak.
            out: np.ndarray = c[name][rows].astype(np.int64)
            return out

        r = np.flatnonzero(kind == READ)
        self._reads = group([col("layer", r), col("stream", r)], r)
        self._judged = self._ledger_reads(ledger)

        u = np.flatnonzero((kind == UPLOAD) & ((c["flags"] & F_RING) == 0))
        self.history = History(c["layer"], c["stream"], c["slot"], c["a"], c["b"],
                               np.flatnonzero(kind == WRITE), u,
                               np.flatnonzero(kind == EVICT),
                               np.flatnonzero(kind == KIND_CODE["invalidate"]))
        ua, ub = col("a", u), col("b", u)
        ok = (ub > ua) & (ua >= 0) & (ub <= MAX_PAGE)  # the judgement's bounds
        urow, upage, within = expand(u[ok], ua[ok], (ub - ua)[ok])
        uslot = col("slot", urow) + within
        self._key_uploads = group([col("layer", urow), col("key", urow), upage], urow, uslot)

        self._learns = np.flatnonzero(kind == LEARN)
        self._relearns = self._learns[(c["flags"][self._learns] & F_RELEARN) != 0]
        self._adapts = np.flatnonzero(kind == KIND_CODE["adapt"])
        self._repartitions = np.flatnonzero(kind == KIND_CODE["repartition"])
        self.event: Callable[[int], object] = functools.lru_cache(maxsize=16384)(self._decode)

    def _decode(self, row: int) -> object:
        return decode_event(self.source.line(int(self.index.columns["offset"][row])))

    # -- lookups at a cutoff (rows [0, limit)) ---------------------------------------------

    @staticmethod
    def _ledger_reads(ledger: LedgerSnapshot | None) -> dict[int, int]:
        """seq → index of the read in the ledger's tables."""
        if ledger is None:
            return {}
        return {int(seq): i for i, seq in enumerate(ledger.reads.column("seq").tolist())}

    def _read_of(self, limit: int, layer: int, stream: int
                 ) -> tuple[int, tuple[ev.ReadRange, ...]] | None:
        group_ = self._reads.get((layer, stream))
        if group_ is None:
            return None
        i = last_below(group_[0], limit)
        if i < 0:
            return None
        event = self.event(int(group_[0][i]))
        if not isinstance(event, ev.Read):
            return None
        at = self._judged.get(event.seq)
        if at is None or self.ledger is None:  # not judged (yet)
            pieces: list[Piece] = [
                (s.begin, s.end, SOURCE_CODE[s.source], s.slot, NOT_JUDGED, 0, -1, -1, -1, -1,
                 -1, -1, 0) for s in event.served if s.end > s.begin]
        else:
            pieces = self.ledger.piece_tuples(at)
        return event.step, as_ranges(event, pieces)

    def _version_at(self, layer: int, stream: int, page: int, limit: int) -> int:
        return self.history.version(layer, stream, page, limit)

    def _cleared(self, limit: int) -> int:
        """Row of the latest ``invalidate`` below ``limit`` (-1 when none)."""
        return self.history.cleared(limit)

    def _shape(self, cleared: int) -> Window | None:
        """The window the clear at row ``cleared`` left (see ``reshaped_window``)."""
        if cleared < 0:
            return None
        a = last_below(self._adapts, cleared)
        r = last_below(self._repartitions, cleared)
        adapt = self.event(int(self._adapts[a])) if a >= 0 else None
        rep = self.event(int(self._repartitions[r])) if r >= 0 else None
        return reshaped_window(self.geometry, adapt if isinstance(adapt, ev.Adapt) else None,
                               rep if isinstance(rep, ev.Repartition) else None)

    def _slot_of(self, limit: int, cleared: int, key: Key) -> int | None:
        layer, stream, page = key
        group = self._key_uploads.get((layer, -1 if stream is None else stream, page))
        if group is None:
            return None
        i = last_below(group[0], limit)
        return int(group[1][i]) if i >= 0 and int(group[0][i]) > cleared else None

    def _holder_of(self, limit: int, cleared: int, slot: int) -> Holder | None:
        held = self.history.held(slot, limit)
        return None if held is None else Holder(held.layer, held.stream, held.page,
                                                held.version)

    def _dirty(self, step: int, limit: int) -> frozenset[Key]:
        lo, hi = self.index.step_rows(step)
        hi = min(hi, limit)
        if hi <= lo:
            return frozenset()
        kinds = self.index.columns["kind"][lo:hi]
        out: set[Key] = set()
        for row in (np.flatnonzero(kinds == WRITE) + lo).tolist():
            event = self.event(row)
            if isinstance(event, ev.Write) and event.step == step:
                out.update(event.dirty)
        return frozenset(out)

    def _learned(self, limit: int) -> tuple[tuple[tuple[int, int], ...], int | None]:
        i = last_below(self._relearns, limit)
        start = int(self._relearns[i]) if i >= 0 else 0
        relearn_step: int | None = None
        learned: dict[int, int] = {}
        rows = self._learns[(self._learns >= start) & (self._learns < limit)]
        for row in rows.tolist():
            event = self.event(row)
            if not isinstance(event, ev.Learn):
                continue
            if event.relearn:
                learned.clear()
                relearn_step = event.step
            if event.layer >= 0:
                learned[event.layer] = event.k_ptr
        return tuple(sorted(learned.items())), relearn_step

    def snapshot(self, step: int) -> PagesSnapshot:
        limit = self.index.cutoff(step)
        learned, relearn_step = self._learned(limit)
        cleared = self._cleared(limit)
        return assemble(
            self.geometry, step,
            read_of=lambda layer, stream: self._read_of(limit, layer, stream),
            slot_of=lambda key: self._slot_of(limit, cleared, key),
            holder_of=lambda slot: self._holder_of(limit, cleared, slot),
            version_of=lambda layer, stream, page: self._version_at(layer, stream, page, limit),
            dirty=self._dirty(step, limit), learned=learned, relearn_step=relearn_step,
            shape=self._shape(cleared),
        )
