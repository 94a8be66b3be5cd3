"""What every pool and ring slot holds, and every host page's version (docs/trace-format.md,
"Derivation").

- The **host version** of (layer, stream, page) is the number of ``write`` events whose
  ``cells`` touch the page; the last such write is remembered (flows start there).
- An ``upload`` of pages ``[p0, p1)`` to ``slot`` with ``target`` T makes slot ``slot + i`` of
  namespace T hold (layer, stream, ``p0 + i``) at the page's version at that moment, copied by
  that upload. Pool (``resident``) and ring slots are two namespaces: the real runtime's ring
  is a separate area at the start of the pool, numbered 0..ring-1 on its own
  (kv-stream-domain.md §1.5, §1.6; the model's ``Runner._ring``).
- ``evict`` empties the pool slot it names (the format: "a resident slot lost the content it
  held"); ``invalidate`` empties every slot of both namespaces (§1.5: afterwards no slot holds
  valid content).

A **pool** page is judged by the copy its slot holds when the read is recorded.

A **ring** page is judged by the copy the read consumed. A read may need more ring pages than
there are ring slots; the runtime then copies into a slot again once the kernel has consumed
it (the ``consumed`` event gates reuse, §1.6), so the trace shows all of a read's copies
before the read. The rule, for page p of view V (layer, stream) served from ring slot s:

1. if the newest copy in s is of (V, p), the read consumed it;
2. else, if the newest copy in s is another view's, the slot holds that view's bytes: foreign;
3. else the newest copy is one of V's other pages. Walking back over s's copies: copies of V's
   other pages made for this read (V's *batch*: its ring copies since its previous read) are
   the ring cycling within the read and are passed over; the first copy of (V, p) in the
   batch is what the read consumed; a copy of another view met first means that view
   overwrote the slot before the read: foreign, holding those bytes; reaching the batch's
   start without either: foreign, holding the newest copy.

So a slot overwritten by another layer before the read gives that layer's bytes, and a ring
that cycles within one read still judges each page by the copy it consumed. A read split into
several events (kvtrace.h's ``KVTRACE_READ_RUNS``) is one batch: the batch starts at V's first
ring copy after a read of V.

Memory is bounded by the number of distinct host pages and slots (and a window of recent ring
copies for rule 3), never by the length of the trace.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import NamedTuple

from kvdiag.analysis.judgement.classes import (
    BEFORE_SNAPSHOT,
    EXACT,
    FOREIGN,
    NO_WRITE,
    NOT_JUDGED,
    RING_HISTORY,
    STALE,
)

View = tuple[int, int]
"""(layer, stream) of the host store."""
Ident = tuple[int, int, int]
"""What a slot holds, as (layer, stream, page - slot): consecutive pages copied into
consecutive slots share one ident object, so a run of slots is checked with ``list.count``
(whose identity shortcut skips comparing the tuples)."""
When = tuple[int, int]
"""(step, seq) of the upload that made a copy."""

RING_LOG = 8192
"""Ring uploads kept for rule 3 (a read's own batch is a few dozen)."""


class Copy(NamedTuple):
    """What a slot held: host page (layer, stream, page) at ``version``, copied by the upload
    event ``seq`` at ``step``."""

    layer: int
    stream: int
    page: int
    version: int
    step: int
    seq: int


Piece = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]
"""One run of pages of one served run with one verdict: (begin, end, source, slot of begin,
class, lag, holder layer, holder stream, holder page of begin, holder version of begin,
holder step, holder upload seq, why-not-judged). Holder fields are -1 when the slot held
nothing or the page is not judged."""


class HostPages:
    """Host versions and the last write of every page, page-indexed per view."""

    def __init__(self) -> None:
        self.ver: dict[View, list[int]] = {}
        self.wseq: dict[View, list[int]] = {}
        """Seq of the last write that touched each page (0: none)."""
        self.wevent: dict[View, list[object]] = {}
        """The last write event of each page with the mark of its ubatch, where the Judge keeps
        them (``keep_writes``: diff's cause chains)."""

    def views(self, view: View, end: int) -> tuple[list[int], list[int]]:
        v = self.ver.get(view)
        if v is None:
            v = self.ver[view] = []
            self.wseq[view] = []
        w = self.wseq[view]
        if len(v) < end:
            v.extend([0] * (end - len(v)))
            w.extend([0] * (end - len(w)))
        return v, w

    def version(self, layer: int, stream: int, page: int) -> int:
        v = self.ver.get((layer, stream))
        return v[page] if v is not None and 0 <= page < len(v) else 0

    def last_write(self, layer: int, stream: int, page: int) -> int:
        w = self.wseq.get((layer, stream))
        return w[page] if w is not None and 0 <= page < len(w) else 0


class Slots:
    """One namespace of slots (pool or ring): slot-indexed lists of the newest copy."""

    def __init__(self, canon: dict[Ident, Ident]) -> None:
        self.canon = canon
        self.ident: list[Ident | None] = []
        self.ver: list[int] = []
        self.when: list[When] = []

    def grow(self, end: int) -> None:
        n = end - len(self.ident)
        if n > 0:
            self.ident.extend([None] * n)
            self.ver.extend([-1] * n)
            self.when.extend([(-1, -1)] * n)

    def copy(self, layer: int, stream: int, p0: int, s0: int, versions: list[int],
             when: When) -> None:
        n = len(versions)
        if s0 + n > len(self.ident):
            self.grow(s0 + n)
        ident = (layer, stream, p0 - s0)
        ident = self.canon.setdefault(ident, ident)
        if n == 1:
            self.ident[s0] = ident
            self.ver[s0] = versions[0]
            self.when[s0] = when
        else:
            self.ident[s0:s0 + n] = [ident] * n
            self.ver[s0:s0 + n] = versions
            self.when[s0:s0 + n] = [when] * n

    def empty(self, slot: int) -> None:
        if 0 <= slot < len(self.ident):
            self.ident[slot] = None
            self.ver[slot] = -1
            self.when[slot] = (-1, -1)

    def clear(self) -> None:
        n = len(self.ident)
        self.ident = [None] * n
        self.ver = [-1] * n
        self.when = [(-1, -1)] * n

    def held(self, slot: int) -> Copy | None:
        """The newest copy in ``slot``."""
        ident = self.ident[slot] if 0 <= slot < len(self.ident) else None
        if ident is None:
            return None
        step, seq = self.when[slot]
        return Copy(ident[0], ident[1], slot + ident[2], self.ver[slot], step, seq)

    def pieces(self, layer: int, stream: int, begin: int, slot: int, current: list[int],
               source: int, writes: bool, out: list[Piece]) -> None:
        """Verdicts of pages ``begin..begin+len(current)`` served from slots ``slot..``, by
        the newest copy of each slot, a group of equal slot contents at a time (uploads fill
        consecutive slots with one ident, so a run is a handful of groups)."""
        n = len(current)
        if slot + n > len(self.ident):
            self.grow(slot + n)
        idents = self.ident[slot:slot + n]
        own = self.canon.get((layer, stream, begin - slot))
        i = 0
        for ident, group in _groups(idents):
            j = i + group
            q = slot + i
            if ident is None:
                out.append((begin + i, begin + j, source, q, FOREIGN, 0, -1, -1, -1, -1, -1,
                            -1, 0))
            elif ident is not own:
                step, seq = self.when[q]
                out.append((begin + i, begin + j, source, q, FOREIGN, 0, ident[0], ident[1],
                            q + ident[2], self.ver[q], step, seq, 0))
            elif not writes:
                step, seq = self.when[q]
                out.append((begin + i, begin + j, source, q, NOT_JUDGED, 0, layer, stream,
                            begin + i, self.ver[q], step, seq, NO_WRITE))
            else:
                _same_page(self, layer, stream, begin, slot, i, j, current, source, out)
            i = j


def _groups(items: list[Ident | None]) -> list[tuple[Ident | None, int]]:
    """(value, length) of each run of equal consecutive items (iterated in C: the idents are
    canonical objects, compared by identity first)."""
    return [(k, len(list(g))) for k, g in itertools.groupby(items)]


def _same_page(slots: Slots, layer: int, stream: int, begin: int, slot: int, i: int, j: int,
               current: list[int], source: int, out: list[Piece]) -> None:
    """Pages i..j of a run whose slots hold copies of the right pages: exact where the copy's
    version is current, stale (by how many writes) where not."""
    vers = slots.ver[slot + i:slot + j]
    cur = current[i:j]
    if vers == cur:
        step, seq = slots.when[slot + i]
        out.append((begin + i, begin + j, source, slot + i, EXACT, 0, layer, stream, begin + i,
                    vers[0], step, seq, 0))
        return
    k = i
    while k < j:
        lag = cur[k - i] - vers[k - i]
        m = k + 1
        while m < j and cur[m - i] - vers[m - i] == lag:
            m += 1
        step, seq = slots.when[slot + k]
        cls = EXACT if lag == 0 else STALE
        out.append((begin + k, begin + m, source, slot + k, cls, lag if cls == STALE else 0,
                    layer, stream, begin + k, vers[k - i], step, seq, 0))
        k = m


class RingCopy(NamedTuple):
    seq: int
    step: int
    layer: int
    stream: int
    p0: int
    p1: int
    slot: int
    versions: tuple[int, ...]


class Ring(Slots):
    """The ring namespace: newest copies as in :class:`Slots`, plus what rule 3 of the module
    docstring needs — each view's batch start and a window of recent ring uploads."""

    def __init__(self, canon: dict[Ident, Ident]) -> None:
        super().__init__(canon)
        self.log: deque[RingCopy] = deque(maxlen=RING_LOG)
        self.batch: dict[View, list[int]] = {}
        """Per view: [seq of the batch's first copy, 1 if a read of the view came since]."""
        self.history_from = 0
        """Seq of the snapshot the ring's state was taken from (:mod:`.snapshot`): copies
        before it are not in :attr:`log`. 0: the log goes back to the trace's start (or the
        last invalidate, which emptied every slot)."""

    def copy_ring(self, seq: int, step: int, layer: int, stream: int, p0: int, s0: int,
                  versions: list[int]) -> None:
        view = (layer, stream)
        b = self.batch.get(view)
        if b is None:
            self.batch[view] = [seq, 0]
        elif b[1]:
            b[0], b[1] = seq, 0
        self.copy(layer, stream, p0, s0, versions, (step, seq))
        self.log.append(RingCopy(seq, step, layer, stream, p0, p0 + len(versions), s0,
                                 tuple(versions)))

    def read_done(self, layer: int, stream: int) -> None:
        b = self.batch.get((layer, stream))
        if b is not None:
            b[1] = 1

    def clear(self) -> None:
        super().clear()
        self.log.clear()
        self.batch.clear()
        self.history_from = 0

    def pieces(self, layer: int, stream: int, begin: int, slot: int, current: list[int],
               source: int, writes: bool, out: list[Piece]) -> None:
        """Rules 1 and 2 by groups of equal newest copies (as the pool); rule 3 page by page
        for slots whose newest copy is another page of the same view."""
        first = len(out)
        super().pieces(layer, stream, begin, slot, current, source, writes, out)
        view_ok = False
        for k in range(first, len(out)):
            p = out[k]
            if p[4] == FOREIGN and p[6] == layer and p[7] == stream:
                view_ok = True
                break
        if not view_ok:
            return
        pieces = out[first:]
        del out[first:]
        for p in pieces:
            if p[4] != FOREIGN or p[6] != layer or p[7] != stream:
                out.append(p)
                continue
            for page in range(p[0], p[1]):
                s = p[3] + page - p[0]
                out.append(self._consumed(layer, stream, page, s, current[page - begin],
                                          source, writes))

    def _consumed(self, layer: int, stream: int, page: int, slot: int, current: int,
                  source: int, writes: bool) -> Piece:
        """Rule 3 for one page whose slot's newest copy is another page of its view."""
        start = self.batch.get((layer, stream), [0, 0])[0]
        newest = self.held(slot)
        assert newest is not None
        seen_start = False
        for c in reversed(self.log):
            if c.seq < start:
                seen_start = True
                break
            if not c.slot <= slot < c.slot + (c.p1 - c.p0):
                continue
            p = c.p0 + slot - c.slot
            if (c.layer, c.stream) != (layer, stream):
                return (page, page + 1, source, slot, FOREIGN, 0, c.layer, c.stream, p,
                        c.versions[p - c.p0], c.step, c.seq, 0)
            if p == page:
                version = c.versions[p - c.p0]
                if not writes:
                    return (page, page + 1, source, slot, NOT_JUDGED, 0, layer, stream, page,
                            version, c.step, c.seq, NO_WRITE)
                cls = EXACT if version == current else STALE
                return (page, page + 1, source, slot, cls, current - version, layer, stream,
                        page, version, c.step, c.seq, 0)
        if not seen_start and len(self.log) == self.log.maxlen:
            return (page, page + 1, source, slot, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                    RING_HISTORY)
        if not seen_start and start < self.history_from:
            # the batch began before the segment's snapshot: its earlier copies are unknown
            return (page, page + 1, source, slot, NOT_JUDGED, 0, -1, -1, -1, -1, -1, -1,
                    BEFORE_SNAPSHOT)
        return (page, page + 1, source, slot, FOREIGN, 0, newest.layer, newest.stream,
                newest.page, newest.version, newest.step, newest.seq, 0)
