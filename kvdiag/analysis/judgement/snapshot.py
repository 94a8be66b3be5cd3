"""A trace segment's starting state: the ``snapshot`` event (format 1.2, kernels/kvtrace.h's
rotation and flight recorder; docs/trace-format.md, ``snapshot``).

A segment of a rotated trace, or a flight recorder's window, begins in the middle of a run:
slots already hold copies, host pages already have versions. Judged from its own events alone,
every page read from a slot filled before it would be foreign and every version wrong. The
writer therefore starts each segment with what the judgement would have derived from the
events before it — what every pool and ring slot holds (with the upload's seq and step), every
written page's host version, the views whose ring copies still wait for their read — and the
Judge takes that state as its own:

- fed first (a segment read alone), or after a gap (segments missing between two that are
  read as one set), the snapshot **replaces** the state (:class:`~.batch.State`): host
  versions, pool and ring slots, ring batches. What the event does not carry is said, not guessed: the ring copies a read
  consumed are known only from the snapshot on, so rule 3 of :mod:`.slots` (a ring that cycles
  within a read) judges a page whose copy it cannot find after the snapshot "not judged"
  (``before-snapshot``), never foreign; the last write of each page (where a flow starts) is
  not carried, so no flow is drawn from a write before the segment;
- fed right after the events it summarises (a set read as one, no gap), it describes a state
  the Judge already has: it is **compared** (host versions and slot contents) and nothing
  changes. A difference means the writer
  and the judgement disagree; the state is then replaced as above and counted
  (``residency.cross_check.snapshot_replaced``) — unless nothing was fed before, where
  replacing is the point.
"""

from __future__ import annotations

import numpy as np

from kvdiag.analysis.judgement.batch import State, grow_views
from kvdiag.analysis.judgement.classes import BEFORE_SNAPSHOT, MAX_PAGE, MAX_SLOT
from kvdiag.analysis.judgement.slots import PageTable, SlotTable
from kvdiag.model import events as ev

Held = dict[int, tuple[int, int, int, int, int, int]]


def _versions(state: State) -> dict[tuple[int, int], dict[int, int]]:
    out: dict[tuple[int, int], dict[int, int]] = {}
    pages = state.pages
    for (layer, stream), vid in state.views.ids.items():
        if vid >= pages.cap.size:
            continue
        o, c = int(pages.offset[vid]), int(pages.cap[vid])
        seg = pages.version[o:o + c]
        nz = np.flatnonzero(seg)
        if nz.size:
            out[(layer, stream)] = dict(zip(nz.tolist(), seg[nz].tolist(), strict=True))
    return out


def _snapshot_versions(e: ev.Snapshot) -> dict[tuple[int, int], dict[int, int]]:
    out: dict[tuple[int, int], dict[int, int]] = {}
    for run in e.versions:
        got = {run.page + i: v for i, v in enumerate(run.versions)
               if v and 0 <= run.page + i < MAX_PAGE}
        if got:
            out.setdefault((run.layer, run.stream), {}).update(got)
    return out


def _held(state: State, table: SlotTable) -> Held:
    out: Held = {}
    views = state.views
    for q in np.flatnonzero(table.view >= 0).tolist():
        vid = int(table.view[q])
        out[q] = (int(views.layer[vid]), int(views.stream[vid]), int(table.page[q]),
                  int(table.version[q]), int(table.step[q]), int(table.seq[q]))
    return out


def _snapshot_held(runs: tuple[ev.SlotCopies, ...]) -> Held:
    return {r.slot + i: (r.layer, r.stream, r.page + i, v, r.step, r.seq)
            for r in runs for i, v in enumerate(r.versions)
            if 0 <= r.slot + i < MAX_SLOT and 0 <= r.page + i < MAX_PAGE}


def matches(state: State, e: ev.Snapshot) -> bool:
    """Does the judgement's state equal what the snapshot says (host versions, what every
    slot holds)? (Which views wait for their ring read is not compared: the judgement keeps
    that only for rule 3, and an invalidate settles it without clearing it.)"""
    return (_versions(state) == _snapshot_versions(e)
            and _held(state, state.pool) == _snapshot_held(e.pool)
            and _held(state, state.ring) == _snapshot_held(e.ring))


def seed(state: State, e: ev.Snapshot, row: int) -> None:
    """Replace the state by the snapshot's (module docstring); ``row`` is the snapshot's."""
    versions = _snapshot_versions(e)
    held = {t: _snapshot_held(runs) for t, runs in (("pool", e.pool), ("ring", e.ring))}
    pairs = list(versions) + [(c[0], c[1]) for h in held.values() for c in h.values()]
    pairs += [(layer, stream) for layer, stream in e.ring_pending]
    if pairs:
        state.views.of(np.array([p[0] for p in pairs], np.int64),
                       np.array([p[1] for p in pairs], np.int64))
    state.pages = PageTable()
    if versions:
        vids = np.array([state.views.ids[v] for v in versions], np.int64)
        ends = np.array([max(p) + 1 for p in versions.values()], np.int64)
        state.pages.ensure(vids, ends)
        for view, pv in versions.items():
            vid = state.views.ids[view]
            flat = state.pages.flat(np.full(len(pv), vid, np.int64),
                                    np.array(list(pv), np.int64))
            state.pages.version[flat] = np.array(list(pv.values()), np.int64)
    for name, table in (("pool", state.pool), ("ring", state.ring)):
        table.clear()
        h = held[name]
        if not h:
            continue
        table.grow(max(h) + 1)
        q = np.array(list(h), np.int64)
        cols = np.array(list(h.values()), np.int64)
        table.view[q] = [state.views.ids[(int(a), int(b))] for a, b in cols[:, :2]]
        table.page[q], table.version[q] = cols[:, 2], cols[:, 3]
        table.step[q], table.seq[q] = cols[:, 4], cols[:, 5]
        table.row[q] = -1
    state.ring_log.clear()
    grow_views(state)
    # every view's ring batch began before the snapshot: what it copied then is not known
    state.batch_start[:] = row - 1
    state.read_since[:] = True
    for layer, stream in e.ring_pending:
        state.read_since[state.views.ids[(layer, stream)]] = False
    state.history_row = row
    state.history_why = BEFORE_SNAPSHOT
