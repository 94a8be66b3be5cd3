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
from typing import NamedTuple

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
GroupedRows = dict[tuple[int, ...], tuple[np.ndarray, ...]]


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
    return int(rows.searchsorted(limit)) - 1


_END = np.iinfo(np.int64).max


def _span(rows: np.ndarray, limit: int) -> tuple[int, int, int]:
    """``(n, lo, hi)``: ``n`` entries of ``rows`` are below ``limit``, and the same ``n`` are
    below every limit in ``(lo, hi]``."""
    n = int(rows.searchsorted(limit))
    return n, int(rows[n - 1]) if n else -1, int(rows[n]) if n < len(rows) else _END


class _Parts(NamedTuple):
    """The rows of each kind a snapshot looks up, grouped by key (rows ascending)."""

    reads: GroupedRows
    writes: GroupedRows
    slot_uploads: GroupedRows
    key_uploads: GroupedRows
    evicts: GroupedRows
    learns: np.ndarray
    relearns: np.ndarray
    invalidates: np.ndarray
    adapts: np.ndarray
    repartitions: np.ndarray

    def joined(self, later: _Parts, room: Room) -> _Parts:
        """These groups followed by ``later``'s (rows of a later part of the trace).

        A key's arrays grow inside buffers kept in ``room`` (twice the size they need), so
        that appending a few rows to a key of millions copies only the new rows: the arrays of
        these groups are views of the buffers' first rows, which appending leaves as they are.
        So only the latest parts may be joined to (each one's spare room is the next one's).
        """

        def rows(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
            return np.concatenate((mine, theirs)) if len(theirs) else mine

        def groups(part: int, mine: GroupedRows, theirs: GroupedRows) -> GroupedRows:
            if not theirs:
                return mine
            merged = dict(mine)
            for key, arrays in theirs.items():
                have = merged.get(key)
                merged[key] = arrays if have is None else _extend(room, (part, key), have,
                                                                   arrays)
            return merged

        return _Parts(groups(0, self.reads, later.reads), groups(1, self.writes, later.writes),
                      groups(2, self.slot_uploads, later.slot_uploads),
                      groups(3, self.key_uploads, later.key_uploads),
                      groups(4, self.evicts, later.evicts), rows(self.learns, later.learns),
                      rows(self.relearns, later.relearns),
                      rows(self.invalidates, later.invalidates),
                      rows(self.adapts, later.adapts),
                      rows(self.repartitions, later.repartitions))


Room = dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, ...]]
"""Buffers the groups of a growing query live in, by (part, key)."""


def _extend(room: Room, where: tuple[int, tuple[int, ...]], have: tuple[np.ndarray, ...],
            more: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``have`` with ``more`` appended (per array), in the buffers ``room`` keeps."""
    n, m = len(have[0]), len(more[0])
    bufs = room.get(where)
    if bufs is None or len(bufs[0]) < n + m or not np.may_share_memory(bufs[0], have[0]):
        bufs = tuple(np.empty(max(2 * (n + m), 64), a.dtype) for a in have)
        for buf, a in zip(bufs, have, strict=True):
            buf[:n] = a
        room[where] = bufs
    for buf, a in zip(bufs, more, strict=True):
        buf[n:n + m] = a
    return tuple(buf[:n + m] for buf in bufs)


def _parts(index: TraceIndex, lo: int) -> _Parts:
    """Group the index rows from ``lo`` on. Row numbers are int32 and columns are gathered
    in their own (narrow) types: on a trace of millions of events every temporary here is a
    few MiB, and the sum of them was the viewer's peak memory (bench_tui)."""
    c = index.columns
    kind = c["kind"][lo:]

    def rows_of(mask: np.ndarray) -> np.ndarray:
        rows = _rows_of(mask)
        if lo:
            rows += lo
        return rows

    r = rows_of(kind == READ)
    reads = _group([c["layer"][r], c["stream"][r]], r)
    del r

    w = rows_of(kind == WRITE)
    wa, wb = c["a"][w], c["b"][w]
    # the writes the judgement counts (Judge._write): a believable page range
    valid = (wa >= 0) & (wb > wa) & ((wb - 1) // PAGE_TOKENS + 1 <= MAX_PAGE)
    w, wa, wb = w[valid], wa[valid], wb[valid]
    p0 = wa // PAGE_TOKENS
    wrow, wpage, _ = _expand(w, p0, (wb - 1) // PAGE_TOKENS + 1 - p0)
    del w, wa, wb, p0, valid
    writes = _group([c["layer"][wrow], c["stream"][wrow], wpage], wrow)
    del wrow, wpage

    u = rows_of((kind == UPLOAD) & ((c["flags"][lo:] & F_RING) == 0))
    ua = c["a"][u]
    urow, upage, within = _expand(u, ua, c["b"][u] - ua)
    del u, ua
    uslot = within
    uslot += c["slot"][urow]
    ulayer, ustream, ukey = c["layer"][urow], c["stream"][urow], c["key"][urow]
    slot_uploads = _group([uslot], urow, ulayer, ustream, upage)
    key_uploads = _group([ulayer, ukey, upage], urow, uslot)
    del urow, upage, uslot, ulayer, ustream, ukey

    e = rows_of(kind == EVICT)
    evicts = _group([c["slot"][e]], e)

    learns = rows_of(kind == LEARN)
    return _Parts(reads, writes, slot_uploads, key_uploads, evicts, learns,
                  learns[(c["flags"][learns] & F_RELEARN) != 0],
                  rows_of(kind == KIND_CODE["invalidate"]), rows_of(kind == KIND_CODE["adapt"]),
                  rows_of(kind == KIND_CODE["repartition"]))


class PagesQuery:
    """Snapshots of an indexed trace (complete or not: only indexed rows are used)."""

    def __init__(self, index: TraceIndex, source: LineSource, geometry: PagesGeometry, *,
                 parts: _Parts | None = None) -> None:
        self.index = index
        self.source = source
        self.geometry = geometry
        p = _parts(index, 0) if parts is None else parts
        self.parts = p
        self._reads, self._writes = p.reads, p.writes
        self._slot_uploads, self._key_uploads, self._evicts = p.slot_uploads, p.key_uploads, p.evicts
        self._learns, self._relearns = p.learns, p.relearns
        self._invalidates, self._adapts, self._repartitions = p.invalidates, p.adapts, p.repartitions
        self.event: Callable[[int], object] = functools.lru_cache(maxsize=16384)(self._decode)
        self._room: Room = {}
        # Per key, the last answer and the cutoffs it holds for, ``(lo, hi]``: a scrubbed step
        # moves the cutoff by a step's rows, past which most slots and pages have no event, so
        # their answers are reused instead of searched again.
        self._known_versions: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        self._known_slots: dict[tuple[int, int, int], tuple[int, int, int, int | None]] = {}
        self._known_holders: dict[int, tuple[int, int, int, Holder | None]] = {}

    def grown(self, index: TraceIndex, source: LineSource, geometry: PagesGeometry
              ) -> PagesQuery:
        """The query of ``index``, a longer prefix of the same trace (a followed file): only
        the rows added since are grouped, and appended to this query's groups (which stay as
        they are: a screen may still be drawing from this one). The grid's shape may have
        grown too (``geometry``); the groups do not depend on it. Call it on the latest query
        only (see :meth:`_Parts.joined`)."""
        if index.n < self.index.n:
            raise ValueError("grown() needs a longer prefix of the same trace")
        grown = PagesQuery(index, source, geometry,
                           parts=self.parts.joined(_parts(index, self.index.n), self._room))
        grown._room = self._room
        return grown

    def _decode(self, row: int) -> object:
        return decode_event(self.source.line(int(self.index.columns["offset"][row])))

    # -- lookups at a cutoff (rows [0, limit)) ---------------------------------------------

    def _read_of(self, limit: int, layer: int, stream: int, ledger: LedgerSnapshot | None,
                 judged: int) -> tuple[Run, ...] | None:
        """The latest read of (layer, stream) below row ``limit``, with the judgement's verdicts
        from ``ledger`` (its reads up to row ``judged``; later ones are still being judged).

        The latest read is every read event of that step: a writer may split one view's read
        into several events (kvtrace.h writes one per ``KVTRACE_READ_RUNS`` runs; a fork may
        write the pool and the ring part apart, or one per page), so the runs of the step's
        earlier events come first and a later event's pages override theirs
        (:meth:`PagesReplay.apply` likewise)."""
        group = self._reads.get((layer, stream))
        if group is None:
            return None
        i = _last(group[0], limit)
        found: list[tuple[Run, ...]] = []
        step: int | None = None
        while i >= 0:
            row = int(group[0][i])
            i -= 1
            if step is not None and int(self.index.columns["step"][row]) != step:
                break
            event = self.event(row)
            if not isinstance(event, ev.Read):
                continue  # a line the judgement did not take as a read (damaged)
            if ledger is None or row >= judged:
                runs = judging_runs(event.step, event.served)
            else:
                j = ledger.read_at(row)
                if j is None:
                    continue
                pieces = [p[1:] for p in ledger.pieces_of(j).tolist()]
                runs = judged_runs(event.step, layer, stream, event.served, pieces)
            found.append(runs)
            step = event.step
        if not found:
            return None
        return tuple(run for runs in reversed(found) for run in runs)

    def _version_at(self, layer: int, stream: int, page: int, limit: int) -> int:
        """The host page's version before row ``limit``: the writes that touched it (the
        judgement's rule, :class:`kvdiag.analysis.judgement.slots.HostPages`)."""
        key = (layer, stream, page)
        known = self._known_versions.get(key)
        if known is not None and known[0] < limit <= known[1]:
            return known[2]
        group = self._writes.get(key)
        if group is None:
            return 0
        n, lo, hi = _span(group[0], limit)
        self._known_versions[key] = (lo, hi, n)
        return n

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
        k = (layer, -1 if stream is None else stream, page)
        known = self._known_slots.get(k)
        if known is not None and known[0] < limit <= known[1] and known[2] == cleared:
            return known[3]
        group = self._key_uploads.get(k)
        if group is None:
            return None
        n, lo, hi = _span(group[0], limit)
        i = n - 1
        slot = int(group[1][i]) if i >= 0 and int(group[0][i]) > cleared else None
        self._known_slots[k] = (lo, hi, cleared, slot)
        return slot

    def _holder_of(self, limit: int, cleared: int, slot: int) -> Holder | None:
        known = self._known_holders.get(slot)
        if known is not None and known[0] < limit <= known[1] and known[2] == cleared:
            return known[3]
        group = self._slot_uploads.get((slot,))
        if group is None:
            return None
        rows, layers, streams, pages = group
        n, lo, hi = _span(rows, limit)
        i = n - 1
        holder: Holder | None = None
        if i >= 0 and int(rows[i]) >= cleared:
            evicts = self._evicts.get((slot,))
            evicted = False
            if evicts is not None:
                m, elo, ehi = _span(evicts[0], limit)
                lo, hi = max(lo, elo), min(hi, ehi)
                evicted = m > 0 and int(evicts[0][m - 1]) > int(rows[i])
            if not evicted:
                layer, stream, page = int(layers[i]), int(streams[i]), int(pages[i])
                holder = Holder(layer, stream, page,
                                self._version_at(layer, stream, page, int(rows[i])))
        self._known_holders[slot] = (lo, hi, cleared, holder)
        return holder

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
