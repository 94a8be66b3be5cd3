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
  read as one set), the snapshot **replaces** the state: host versions, pool and ring slots,
  ring batches. What the event does not carry is said, not guessed: the ring copies a read
  consumed are known only from the snapshot on, so rule 3 of :mod:`.slots` (a ring that cycles
  within a read) judges a page whose copy it cannot find after the snapshot "not judged"
  (``before-snapshot``), never foreign; the last write of each page (where a flow starts) is
  not carried, so no flow is drawn from a write before the segment;
- fed right after the events it summarises (a set read as one, no gap), it describes a state
  the Judge already has: it is **compared** and nothing changes. A difference means the writer
  and the judgement disagree; the state is then replaced as above and counted
  (``residency.cross_check.snapshot_replaced``) — unless nothing was fed before, where
  replacing is the point.
"""

from __future__ import annotations

from kvdiag.analysis.judgement.slots import HostPages, Ring, Slots
from kvdiag.model import events as ev


def _versions(host: HostPages) -> dict[tuple[int, int], dict[int, int]]:
    return {view: {p: v for p, v in enumerate(vers) if v}
            for view, vers in host.ver.items() if any(vers)}


def _snapshot_versions(e: ev.Snapshot) -> dict[tuple[int, int], dict[int, int]]:
    out: dict[tuple[int, int], dict[int, int]] = {}
    for run in e.versions:
        got = {run.page + i: v for i, v in enumerate(run.versions) if v}
        if got:
            out.setdefault((run.layer, run.stream), {}).update(got)
    return out


def _held(slots: Slots) -> dict[int, tuple[int, int, int, int, int, int]]:
    out = {}
    for slot in range(len(slots.ident)):
        c = slots.held(slot)
        if c is not None:
            out[slot] = (c.layer, c.stream, c.page, c.version, c.step, c.seq)
    return out


def _snapshot_held(runs: tuple[ev.SlotCopies, ...]
                   ) -> dict[int, tuple[int, int, int, int, int, int]]:
    return {r.slot + i: (r.layer, r.stream, r.page + i, v, r.step, r.seq)
            for r in runs for i, v in enumerate(r.versions)}


def _pending(ring: Ring) -> set[tuple[int, int]]:
    return {view for view, (_, read_since) in ring.batch.items() if not read_since}


def matches(host: HostPages, pool: Slots, ring: Ring, e: ev.Snapshot) -> bool:
    """Does the Judge's state equal what the snapshot says (versions, slots, waiting views)?"""
    return (_versions(host) == _snapshot_versions(e)
            and _held(pool) == _snapshot_held(e.pool)
            and _held(ring) == _snapshot_held(e.ring)
            and _pending(ring) == {tuple(v) for v in e.ring_pending})


def seed(host: HostPages, pool: Slots, ring: Ring, e: ev.Snapshot) -> None:
    """Replace the state by the snapshot's (module docstring)."""
    host.ver.clear()
    host.wseq.clear()
    host.wevent.clear()
    for view, pages in _snapshot_versions(e).items():
        v = host.views(view, max(pages) + 1)[0]
        for page, version in pages.items():
            v[page] = version
    pool.clear()
    ring.clear()
    for slots, runs in ((pool, e.pool), (ring, e.ring)):
        for r in runs:
            if r.versions:
                slots.copy(r.layer, r.stream, r.page, r.slot, list(r.versions), (r.step, r.seq))
    for layer, stream in e.ring_pending:
        ring.batch[(layer, stream)] = [0, 0]  # the batch began before the snapshot
    ring.history_from = e.seq
