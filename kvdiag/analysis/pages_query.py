"""Pages snapshots by random access: the state at any step without replaying the trace.

Every part of the state at the end of step S is "the latest event of some kind, for some key,
at or before S" (see :mod:`kvdiag.analysis.replay`): the latest read of a (layer, stream) —
with the judgement's verdicts on it from its ledger (:class:`~kvdiag.analysis.judgement.
LedgerSnapshot`, by the read's row) — the latest upload into a slot (unless an eviction came
after it), the latest upload of a bookkeeping key, and the number of writes that touched a
host page before S (its version, the judgement's rule). So the index rows of those kinds are
grouped once by key (sorted row numbers per key, built with numpy), and a snapshot is a binary
search per key plus decoding the handful of lines found. The cost of a snapshot depends on the
grid size, not on the step or the trace length, which keeps a scrub step fast on a trace of
millions of events. An ``invalidate`` empties the slots and forgets the keys, so an upload
counts only after the latest one, and the window is the shape of the ``adapt`` before it
(:func:`~kvdiag.analysis.replay.reshaped_window`). The result equals :class:`~kvdiag.analysis.replay.PagesReplay`'s (tested).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from kvdiag.analysis.judgement import LedgerSnapshot
from kvdiag.analysis.judgement.classes import MAX_PAGE
from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.replay import (
    PagesGeometry,
    PagesSnapshot,
    Run,
    Window,
    assemble,
    judged_runs,
    judging_runs,
    reshaped_window,
)
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
from kvdiag.model.pages import PAGE_TOKENS, Holder, Key

Groups = dict[tuple[int, ...], np.ndarray]


def _group(keys: list[np.ndarray], rows: np.ndarray, *values: np.ndarray
           ) -> dict[tuple[int, ...], tuple[np.ndarray, ...]]:
    """Group ``rows`` (ascending) by the key columns; per key, its rows and ``values``.

    The key columns (small integers, -1 allowed) are packed into one integer so that a single
    stable argsort groups them, rows staying ascending within a key. The packing is done in
    place, in 32 bits where the keys fit: on a trace of millions of events every temporary here
    is a few MiB, and the sum of them was the viewer's peak memory (bench_tui).
    """
    if rows.size == 0:
        return {}
    bases: list[int] = []
    mins: list[int] = []
    for k in keys:
        lo = int(k.min())
        bases.append(int(k.max()) - lo + 1)
        mins.append(lo)
    wide = int(np.prod(np.array(bases, dtype=np.float64))) >= 1 << 31
    packed = np.zeros(rows.size, np.int64 if wide else np.int32)
    for k, base, lo in zip(keys, bases, mins, strict=True):
        np.multiply(packed, base, out=packed)
        np.add(packed, k, out=packed, casting="unsafe")  # k fits: its range is in ``base``
        np.subtract(packed, lo, out=packed)
    order = np.argsort(packed, kind="stable")
    packed.sort(kind="stable")  # the keys in order, without a third copy
    cut = np.flatnonzero(packed[1:] != packed[:-1]) + 1
    starts = [0, *cut.tolist()]
    ends = [*cut.tolist(), len(order)]
    codes = packed[starts].tolist()
    del packed, cut
    sorted_rows = rows[order]
    sorted_values = [v[order] for v in values]
    del order
    out: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}
    for code, s, e in zip(codes, starts, ends, strict=True):
        key: list[int] = []
        for base, lo in zip(reversed(bases), reversed(mins), strict=True):
            code, digit = divmod(code, base)
            key.append(digit + lo)
        out[tuple(reversed(key))] = (sorted_rows[s:e], *(v[s:e] for v in sorted_values))
    return out


def _rows_of(mask: np.ndarray) -> np.ndarray:
    """Row numbers where ``mask`` holds, as int32 (an index has fewer than 2**31 rows)."""
    return np.flatnonzero(mask).astype(np.int32)


def _expand(rows: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, ...]:
    """One entry per (row, i) for i in range(count): (row repeated, first + i, i)."""
    count = np.maximum(count, 0)
    total = int(count.sum(dtype=np.int64))
    kind = np.int32 if total < 1 << 31 else np.int64
    rep = np.repeat(rows, count)
    within = np.arange(total, dtype=kind)
    np.subtract(within, np.repeat(np.cumsum(count, dtype=kind) - count, count), out=within,
                casting="unsafe")
    at = np.repeat(first.astype(kind), count)
    np.add(at, within, out=at)
    return rep, at, within


def _last(rows: np.ndarray, limit: int) -> int:
    """Position of the last entry of ``rows`` below ``limit`` (-1 when none)."""
    return int(np.searchsorted(rows, limit)) - 1


class PagesQuery:
    """Snapshots of an indexed trace (complete or not: only indexed rows are used)."""

    def __init__(self, index: TraceIndex, source: LineSource, geometry: PagesGeometry) -> None:
        self.index = index
        self.source = source
        self.geometry = geometry
        c = index.columns
        kind = c["kind"]

        r = _rows_of(kind == READ)
        self._reads = _group([c["layer"][r], c["stream"][r]], r)
        del r

        w = _rows_of(kind == WRITE)
        wa, wb = c["a"][w], c["b"][w]
        # the writes the judgement counts (Judge._write): a believable page range
        valid = (wa >= 0) & (wb > wa) & ((wb - 1) // PAGE_TOKENS + 1 <= MAX_PAGE)
        w, wa, wb = w[valid], wa[valid], wb[valid]
        p0 = wa // PAGE_TOKENS
        wrow, wpage, _ = _expand(w, p0, (wb - 1) // PAGE_TOKENS + 1 - p0)
        del w, wa, wb, p0, valid
        self._writes = _group([c["layer"][wrow], c["stream"][wrow], wpage], wrow)
        del wrow, wpage

        u = _rows_of((kind == UPLOAD) & ((c["flags"] & F_RING) == 0))
        ua = c["a"][u]
        urow, upage, within = _expand(u, ua, c["b"][u] - ua)
        del u, ua
        uslot = within
        uslot += c["slot"][urow]
        ulayer, ustream, ukey = c["layer"][urow], c["stream"][urow], c["key"][urow]
        self._slot_uploads = _group([uslot], urow, ulayer, ustream, upage)
        self._key_uploads = _group([ulayer, ukey, upage], urow, uslot)
        del urow, upage, uslot, ulayer, ustream, ukey

        e = _rows_of(kind == EVICT)
        self._evicts = _group([c["slot"][e]], e)

        self._learns = np.flatnonzero(kind == LEARN)
        self._relearns = self._learns[(c["flags"][self._learns] & F_RELEARN) != 0]
        self._invalidates = np.flatnonzero(kind == KIND_CODE["invalidate"])
        self._adapts = np.flatnonzero(kind == KIND_CODE["adapt"])
        self._repartitions = np.flatnonzero(kind == KIND_CODE["repartition"])
        self.event: Callable[[int], object] = functools.lru_cache(maxsize=16384)(self._decode)

    def _decode(self, row: int) -> object:
        return decode_event(self.source.line(int(self.index.columns["offset"][row])))

    # -- lookups at a cutoff (rows [0, limit)) ---------------------------------------------

    def _read_of(self, limit: int, layer: int, stream: int, ledger: LedgerSnapshot | None,
                 judged: int) -> tuple[Run, ...] | None:
        """The latest read of (layer, stream) below row ``limit``, with the judgement's verdicts
        from ``ledger`` (its reads up to row ``judged``; later ones are still being judged)."""
        group = self._reads.get((layer, stream))
        if group is None:
            return None
        i = _last(group[0], limit)
        while i >= 0:
            row = int(group[0][i])
            event = self.event(row)
            if isinstance(event, ev.Read):
                if ledger is None or row >= judged:
                    return judging_runs(event.step, event.served)
                j = ledger.read_at(row)
                if j is not None:
                    pieces = [p[1:] for p in ledger.pieces_of(j).tolist()]
                    return judged_runs(event.step, layer, stream, event.served, pieces)
            i -= 1  # a line the judgement did not take as a read (damaged): the one before
        return None

    def _version_at(self, layer: int, stream: int, page: int, limit: int) -> int:
        """The host page's version before row ``limit``: the writes that touched it (the
        judgement's rule, :class:`kvdiag.analysis.judgement.slots.HostPages`)."""
        group = self._writes.get((layer, stream, page))
        return 0 if group is None else int(np.searchsorted(group[0], limit))

    def _cleared(self, limit: int) -> int:
        """Row of the latest ``invalidate`` below ``limit`` (-1 when none)."""
        i = _last(self._invalidates, limit)
        return int(self._invalidates[i]) if i >= 0 else -1

    def _shape(self, cleared: int) -> Window | None:
        """The window the clear at row ``cleared`` left (see ``reshaped_window``)."""
        if cleared < 0:
            return None
        a = _last(self._adapts, cleared)
        r = _last(self._repartitions, cleared)
        adapt = self.event(int(self._adapts[a])) if a >= 0 else None
        rep = self.event(int(self._repartitions[r])) if r >= 0 else None
        return reshaped_window(self.geometry, adapt if isinstance(adapt, ev.Adapt) else None,
                               rep if isinstance(rep, ev.Repartition) else None)

    def _slot_of(self, limit: int, cleared: int, key: Key) -> int | None:
        layer, stream, page = key
        group = self._key_uploads.get((layer, -1 if stream is None else stream, page))
        if group is None:
            return None
        i = _last(group[0], limit)
        return int(group[1][i]) if i >= 0 and int(group[0][i]) > cleared else None

    def _holder_of(self, limit: int, cleared: int, slot: int) -> Holder | None:
        group = self._slot_uploads.get((slot,))
        if group is None:
            return None
        rows, layers, streams, pages = group
        i = _last(rows, limit)
        if i < 0 or int(rows[i]) < cleared:
            return None
        evicts = self._evicts.get((slot,))
        if evicts is not None:
            j = _last(evicts[0], limit)
            if j >= 0 and int(evicts[0][j]) > int(rows[i]):
                return None
        layer, stream, page = int(layers[i]), int(streams[i]), int(pages[i])
        return Holder(layer, stream, page, self._version_at(layer, stream, page, int(rows[i])))

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
        i = _last(self._relearns, limit)
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

    def snapshot(self, step: int, ledger: LedgerSnapshot | None = None,
                 judged: int | None = None) -> PagesSnapshot:
        """The state at the end of ``step``; reads as the judgement's ``ledger`` judged them
        (its first ``judged`` rows, default all; without a ledger every read is still being
        judged)."""
        limit = self.index.cutoff(step)
        upto = self.index.n if judged is None else judged
        learned, relearn_step = self._learned(limit)
        cleared = self._cleared(limit)
        return assemble(
            self.geometry, step,
            read_of=lambda layer, stream: self._read_of(limit, layer, stream, ledger, upto),
            slot_of=lambda key: self._slot_of(limit, cleared, key),
            holder_of=lambda slot: self._holder_of(limit, cleared, slot),
            version_of=lambda layer, stream, page: self._version_at(layer, stream, page, limit),
            dirty=self._dirty(step, limit), learned=learned, relearn_step=relearn_step,
            shape=self._shape(cleared),
        )
