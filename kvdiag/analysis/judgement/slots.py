"""What every pool and ring slot holds, and every host page's version (docs/trace-format.md,
"Derivation") — the rule, and the arrays that carry it from one chunk of events to the next.

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
   other pages made for this read (V's *batch*: its ring copies since its previous read)
   after the FA node of V's layer was dispatched (its ``fits`` event) are the ring cycling
   within the read and are passed over; the first copy of (V, p) in the batch is what the
   read consumed; a copy of another view met first means that view overwrote the slot before
   the read: foreign, holding those bytes; a copy of V's other page made before the dispatch
   replaced p before any kernel could consume it (a prefetch that overran the ring; the
   ``consumed`` gate is the kernel's): foreign, holding it — and with no dispatch of V's
   layer recorded, not judged (``fits``; ``lost-events`` when the walk, were it the cycling,
   would reach a gap in seq unanswered: the dispatch may be among the lost events); reaching
   the batch's start without either: foreign, holding the newest copy.

So a slot overwritten by another layer before the read gives that layer's bytes, and a ring
that cycles within one read still judges each page by the copy it consumed. A read split into
several events (kvtrace.h's ``KVTRACE_READ_RUNS``) is one batch: the batch starts at V's first
ring copy after a read of V. After events lost from the trace (a gap in ``seq``) every view's
batch is open and began before the gap until a read of it is recorded: a walk that reaches the
gap judges nothing (:meth:`.batch.State.lose_history`).

The state is numpy arrays (:class:`PageTable`, :class:`SlotTable`, :class:`RingLog`) so that
a chunk of events is judged with array operations (:mod:`~kvdiag.analysis.judgement.batch`);
memory is bounded by the number of distinct host pages and slots (and a window of recent ring
copies for rule 3), never by the length of the trace.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from kvdiag.analysis.judgement.classes import MAX_PAGE

View = tuple[int, int]
"""(layer, stream) of the host store."""

DENSE_LAYERS, DENSE_STREAMS = 1025, 64
"""View ids of layers -1..1023 and streams 0..63 are looked up in a table."""

RING_LOG = 1 << 16
"""Ring copies (pages) kept for rule 3 (a read's own batch is a few dozen)."""

EMPTY = -1
"""A slot's view id when it holds nothing (never filled, evicted, invalidated)."""
LOST = -2
"""A slot's view id when what it holds is unknown: events were lost from the trace after its
last known copy (a gap in ``seq``: :mod:`.gaps`), and a lost upload, evict or invalidate may
have changed it. Its pages are not judged until an upload fills it again."""



def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by sorting (numpy 2's hashing unique measured 4x slower on the
    tens of thousands of page keys a chunk has; and np.unique imports numpy.ma, 10-25 ms of
    a short check's start)."""
    out = np.sort(values)
    keep = np.empty(out.size, bool)
    keep[:1] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    result: np.ndarray = out[keep]
    return result

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


class Views:
    """(layer, stream) ↔ a small view id, vectorised both ways."""

    def __init__(self) -> None:
        self.ids: dict[View, int] = {}
        self.layer = np.empty(0, np.int64)
        self.stream = np.empty(0, np.int64)
        self._keys = np.empty(0, np.int64)
        self._order = np.empty(0, np.int64)
        self._dense = np.full((DENSE_LAYERS, DENSE_STREAMS), -1, np.int64)

    @staticmethod
    def key(layer: np.ndarray, stream: np.ndarray) -> np.ndarray:
        out: np.ndarray = (layer + (1 << 31)) * (1 << 32) + (stream + (1 << 31))
        return out

    def of(self, layer: np.ndarray, stream: np.ndarray) -> np.ndarray:
        """View ids of (layer, stream) pairs, assigning new ones as needed (a table lookup for
        the usual small layer and stream numbers)."""
        if layer.size == 0:
            return np.empty(0, np.int64)
        # a hostile layer or stream beyond 32 bits: one view for all of them (keys fit int64)
        dense = self._dense
        lo, hi = int(layer.min()), int(layer.max())
        so, sh = int(stream.min()), int(stream.max())
        if lo < -(1 << 31) or hi >= 1 << 31:
            layer = np.clip(layer, -(1 << 31), (1 << 31) - 1)
        if so < -(1 << 31) or sh >= 1 << 31:
            stream = np.clip(stream, -(1 << 31), (1 << 31) - 1)
        if lo >= -1 and hi < DENSE_LAYERS - 1 and so >= 0 and sh < DENSE_STREAMS:
            got: np.ndarray = dense[layer + 1, stream]
            if (got >= 0).all():
                return got
        keys = self.key(layer, stream)
        new = np.setdiff1d(sorted_unique(keys), self._keys, assume_unique=True)
        if new.size:
            lay = np.asarray(layer)
            st = np.asarray(stream)
            for k in new.tolist():
                i = int(np.flatnonzero(keys == k)[0])
                self.ids[(int(lay[i]), int(st[i]))] = len(self.ids)
            pairs = list(self.ids)
            self.layer = np.array([p[0] for p in pairs], np.int64)
            self.stream = np.array([p[1] for p in pairs], np.int64)
            all_keys = self.key(self.layer, self.stream)
            self._order = np.argsort(all_keys)
            self._keys = all_keys[self._order]
            for (ly, sm), vid in self.ids.items():
                if -1 <= ly < DENSE_LAYERS - 1 and 0 <= sm < DENSE_STREAMS:
                    dense[ly + 1, sm] = vid
        out: np.ndarray = self._order[np.searchsorted(self._keys, keys)]
        return out

    def one(self, layer: int, stream: int) -> int | None:
        return self.ids.get((layer, stream))


class PageTable:
    """Per view, the host version and last write (seq and row) of every page: one flat array
    per column, each view a segment of it (``offset[view] + page``), grown by doubling."""

    def __init__(self) -> None:
        self.offset = np.zeros(0, np.int64)
        self.cap = np.zeros(0, np.int64)
        self.version = np.zeros(0, np.int64)
        self.wseq = np.zeros(0, np.int64)
        """Seq of the last write that touched each page (0: none)."""
        self.wrow = np.full(0, -1, np.int64)
        """Row of that write (for the kept write events: -1 none)."""

    def ensure(self, views: np.ndarray, ends: np.ndarray) -> None:
        """Room for pages ``< ends`` of ``views`` (every end ≤ MAX_PAGE)."""
        n_views = int(views.max()) + 1 if views.size else 0
        if n_views > self.cap.size:
            grow = n_views - self.cap.size
            self.offset = np.concatenate([self.offset, np.zeros(grow, np.int64)])
            self.cap = np.concatenate([self.cap, np.zeros(grow, np.int64)])
        if not views.size:
            return
        need = np.zeros(self.cap.size, np.int64)
        np.maximum.at(need, views, ends)
        short = np.flatnonzero(need > self.cap)
        for v in short.tolist():
            new_cap = min(max(int(need[v]), 2 * int(self.cap[v]), 16), MAX_PAGE)
            start = self.version.size
            old, size = int(self.offset[v]), int(self.cap[v])
            self.version = np.concatenate([self.version, np.zeros(new_cap, np.int64)])
            self.wseq = np.concatenate([self.wseq, np.zeros(new_cap, np.int64)])
            self.wrow = np.concatenate([self.wrow, np.full(new_cap, -1, np.int64)])
            if size:
                self.version[start:start + size] = self.version[old:old + size]
                self.wseq[start:start + size] = self.wseq[old:old + size]
                self.wrow[start:start + size] = self.wrow[old:old + size]
            self.offset[v] = start
            self.cap[v] = new_cap
        if self.version.size > 4 * max(int(self.cap.sum()), 1024):
            self._compact()

    def _compact(self) -> None:
        """Drop the segments left behind by growth."""
        total = int(self.cap.sum())
        version = np.zeros(total, np.int64)
        wseq = np.zeros(total, np.int64)
        wrow = np.full(total, -1, np.int64)
        at = 0
        for v in range(self.cap.size):
            o, c = int(self.offset[v]), int(self.cap[v])
            version[at:at + c] = self.version[o:o + c]
            wseq[at:at + c] = self.wseq[o:o + c]
            wrow[at:at + c] = self.wrow[o:o + c]
            self.offset[v] = at
            at += c
        self.version, self.wseq, self.wrow = version, wseq, wrow

    def flat(self, views: np.ndarray, pages: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.offset[views] + pages
        return out

    def get(self, view: int | None, page: int) -> tuple[int, int]:
        """(version, last write seq) of one page (0, 0 when never written)."""
        if view is None or view >= self.cap.size or not 0 <= page < int(self.cap[view]):
            return 0, 0
        i = int(self.offset[view]) + page
        return int(self.version[i]), int(self.wseq[i])


class SlotTable:
    """One namespace of slots (pool or ring): slot-indexed arrays of the newest copy."""

    COLUMNS = ("view", "page", "version", "seq", "step", "row")

    def __init__(self) -> None:
        self.view = np.full(0, EMPTY, np.int64)
        """View id of the copy held (:data:`EMPTY`, :data:`LOST`)."""
        self.fill = EMPTY
        """What a slot beyond the arrays holds: :data:`LOST` after a gap (:meth:`lose`)."""
        self.page = np.zeros(0, np.int64)
        self.version = np.zeros(0, np.int64)
        self.seq = np.zeros(0, np.int64)
        self.step = np.zeros(0, np.int64)
        self.row = np.full(0, -1, np.int64)

    def grow(self, end: int) -> None:
        n = end - self.view.size
        if n > 0:
            n = max(n, self.view.size)  # doubling
            self.view = np.concatenate([self.view, np.full(n, self.fill, np.int64)])
            for name in ("page", "version", "seq", "step"):
                setattr(self, name, np.concatenate([getattr(self, name),
                                                     np.zeros(n, np.int64)]))
            self.row = np.concatenate([self.row, np.full(n, -1, np.int64)])

    def clear(self) -> None:
        """An invalidate: every slot empty, those beyond the arrays too."""
        self.view[:] = EMPTY
        self.row[:] = -1
        self.fill = EMPTY

    def lose(self) -> None:
        """Events were lost: what every slot holds is unknown (:data:`LOST`)."""
        self.view[:] = LOST
        self.row[:] = -1
        self.fill = LOST


class RingLog:
    """Recent ring copies, page by page, for rule 3: kept as a few numpy blocks (row, slot,
    view, page, version, seq, step) up to :data:`RING_LOG` pages."""

    def __init__(self) -> None:
        self.blocks: deque[np.ndarray] = deque()
        self.size = 0
        self.dropped = False
        """Older copies were dropped: a walk that reaches them cannot be finished."""

    def add(self, block: np.ndarray) -> None:
        if block.shape[0] == 0:
            return
        self.blocks.append(block)
        self.size += block.shape[0]
        while self.size - self.blocks[0].shape[0] >= RING_LOG:
            self.size -= self.blocks.popleft().shape[0]
            self.dropped = True

    def clear(self) -> None:
        self.blocks.clear()
        self.size = 0
        self.dropped = False

    def entries(self) -> np.ndarray:
        if not self.blocks:
            return np.empty((0, 7), np.int64)
        if len(self.blocks) > 1:
            merged = np.concatenate(list(self.blocks))
            self.blocks = deque([merged])
        block: np.ndarray = self.blocks[0]
        return block
