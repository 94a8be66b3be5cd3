"""Page provenance derived from a trace's raw facts alone (format 1.1, "Derivation").

A read's ``ranges`` are the model's annotation; a native trace has none. What every writer
records is: ``write`` (the host store changed), ``upload`` (a copy into a pool or ring slot),
``invalidate`` (every slot emptied) and, per read, ``served`` (which source and slot each
page came from). From those alone (docs/trace-format.md, "Derivation"):

- the host version of (layer, stream, page) is the number of writes whose cells touched it;
- an upload of pages ``[p0, p1)`` to ``slot`` makes slot ``slot+i`` hold
  (layer, stream, p0+i, version at upload time);
- ``invalidate`` empties every slot;
- a page served from the pool is *exact* if its slot holds (layer, stream, page, current
  version), *stale* if it holds the same page at an older version, *foreign* otherwise (another
  stream's or page's bytes, or a slot never loaded); a ring page is judged by the last ring copy
  of that page made in the same step (none: foreign); a host page is exact (zero-copy from the
  authoritative store).

:class:`Provenance` applies events one at a time in file order. Its memory is bounded by the
number of distinct host pages and slots, never by the length of the trace. For a model trace
the derived ranges equal the annotated ones run for run (tests/test_provenance.py).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS

MAX_PAGE = 1 << 20
"""Pages per view beyond which an event is not believed (a 268M-token context): a damaged or
hostile trace must not make the derivation allocate or loop without bound."""
MAX_SLOT = 1 << 22

PageId = tuple[int, int, int]
"""(layer, stream, page) of the host store."""


class Copy(NamedTuple):
    """What a slot holds: host page (layer, stream, page) at ``version``, copied by the upload
    event ``seq`` at ``step``. (A named tuple: uploads make one per page.)"""

    layer: int
    stream: int
    page: int
    version: int
    step: int
    seq: int


class PageVerdict(NamedTuple):
    """One page of one read: where it came from and whether those were the right bytes."""

    page: int
    source: ev.Source
    slot: int
    copy: Copy | None
    """The copy that was read (None for a host page, or a slot/ring page never loaded)."""
    cls: ev.ReadClass
    lag: int
    """Writes the copy missed (stale only)."""
    version: int
    """The host page's version at the read."""


class Provenance:
    """The derivation's state: host versions, slot contents, ring copies.

    Kept as page- and slot-indexed lists rather than per-page objects so that the common case,
    a run of pages that are all exact, is decided by comparing list slices (a C loop) instead
    of a Python loop over the pages: ``kvdiag check`` reads millions of events and a read can
    cover hundreds of pages (benchmarks/bench_check.py).
    """

    def __init__(self) -> None:
        self._ver: dict[tuple[int, int], list[int]] = {}
        """Host version of every page of each (layer, stream) view, page-indexed."""
        self._ident: list[tuple[int, int, int] | None] = []
        """Per slot: (layer, stream, page - slot) of the copy it holds; None = empty."""
        self._canon: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        """One tuple object per distinct ident, so that a slice of ``_ident`` is checked with
        ``list.count``, whose identity shortcut skips comparing the tuples' contents."""
        self._slot_ver: list[int] = []
        self._good = bytearray()
        """Per slot: 1 while its copy is the current version of the page it holds (cleared by
        a write to that page), so a run's freshness is one ``bytearray.find``."""
        self._held: dict[PageId, list[int]] = {}
        """The slots holding a copy (of any version) of each host page."""
        self._slot_when: list[tuple[int, int]] = []
        self._ring: dict[tuple[int, int], tuple[int, list[tuple[int, int, int, list[int]]]]] = {}
        """Per (layer, stream) view: the step of its latest ring copies and those copies,
        (p0, p1, upload seq, host versions of the pages then). Only the step's own copies
        count (a ring slot is reused by the next batch), so older steps' are dropped."""
        self.copies: dict[tuple[str, str], list[int]] = {}
        """Per (target, reason): uploads, pages, bytes (residency statistics)."""
        self.invalidations = 0
        self.out_of_range = 0
        """Events (or read runs) ignored because their pages or slots are out of range."""

    # -- facts ---------------------------------------------------------------------------

    def _versions(self, layer: int, stream: int, end: int) -> list[int]:
        v = self._ver.get((layer, stream))
        if v is None:
            v = self._ver[(layer, stream)] = []
        if len(v) < end:
            v.extend([0] * (end - len(v)))
        return v

    def version(self, layer: int, stream: int, page: int) -> int:
        v = self._ver.get((layer, stream))
        return v[page] if v is not None and page < len(v) else 0

    def write(self, e: ev.Write) -> None:
        c0, c1 = e.cells
        if c1 <= c0:
            return
        p0, p1 = c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1
        if p0 < 0 or p1 > MAX_PAGE:
            self.out_of_range += 1
            return
        v = self._ver.get((e.layer, e.stream))
        if v is None or len(v) < p1:
            v = self._versions(e.layer, e.stream, p1)
        held, good = self._held, self._good
        for page in range(p0, p1):
            v[page] += 1
            slots = held.get((e.layer, e.stream, page))
            if slots:
                for q in slots:
                    good[q] = 0

    def _grow_slots(self, end: int) -> None:
        n = end - len(self._ident)
        if n > 0:
            self._ident.extend([None] * n)
            self._good.extend(bytes(n))
            self._slot_ver.extend([-1] * n)
            self._slot_when.extend([(-1, -1)] * n)

    def upload(self, e: ev.Upload) -> None:
        p0, p1 = e.pages
        n = p1 - p0
        acc = self.copies.get((e.target, e.reason))
        if acc is None:
            acc = self.copies[(e.target, e.reason)] = [0, 0, 0]
        acc[0] += 1
        acc[1] += n
        acc[2] += e.bytes
        if n <= 0:
            return
        if p0 < 0 or p1 > MAX_PAGE or (e.target != "ring" and not 0 <= e.slot <= MAX_SLOT - n):
            self.out_of_range += 1
            return
        v = self._ver.get((e.layer, e.stream))
        if v is None or len(v) < p1:
            v = self._versions(e.layer, e.stream, p1)
        if e.target == "ring":
            key = (e.layer, e.stream)
            rec = self._ring.get(key)
            if rec is None or rec[0] != e.step:
                rec = self._ring[key] = (e.step, [])
            elif rec[1]:
                # a later copy of the same pages replaces the earlier one: the list stays
                # bounded by the view's pages however many copies one step makes
                rec[1][:] = [c for c in rec[1] if c[0] < p0 or c[1] > p1]
            rec[1].append((p0, p1, e.seq, v[p0:p1]))
        else:
            s0 = e.slot
            if s0 + n > len(self._ident):
                self._grow_slots(s0 + n)
            ident = (e.layer, e.stream, p0 - s0)
            ident = self._canon.setdefault(ident, ident)
            held, old_idents = self._held, self._ident
            if n == 1:  # one page: a dirty page refreshed, or a slot taken over
                old = old_idents[s0]
                if old is not ident:
                    if old is not None:
                        slots = held.get((old[0], old[1], s0 + old[2]))
                        if slots and s0 in slots:
                            slots.remove(s0)
                    held.setdefault((e.layer, e.stream, p0), []).append(s0)
                    old_idents[s0] = ident
                self._good[s0] = 1
                self._slot_ver[s0] = v[p0]
                self._slot_when[s0] = (e.step, e.seq)
                return
            for q in range(s0, s0 + n):
                old = old_idents[q]
                if old is not None and old is not ident:
                    slots = held.get((old[0], old[1], q + old[2]))
                    if slots and q in slots:
                        slots.remove(q)
                if old is not ident:
                    held.setdefault((e.layer, e.stream, q - s0 + p0), []).append(q)
            self._ident[s0:s0 + n] = [ident] * n
            self._good[s0:s0 + n] = b"\x01" * n
            self._slot_ver[s0:s0 + n] = v[p0:p1]
            self._slot_when[s0:s0 + n] = [(e.step, e.seq)] * n

    def invalidate(self, e: ev.Invalidate) -> None:
        n = len(self._ident)
        self._ident = [None] * n
        self._good = bytearray(n)
        self._held.clear()
        self._slot_ver = [-1] * n
        self._slot_when = [(-1, -1)] * n
        self._ring.clear()
        self.invalidations += 1

    # -- judgement -----------------------------------------------------------------------

    def _all_exact(self, e: ev.Read, s: ev.Served) -> bool:
        """Every page of one served run exact, decided on slices (C loops, not Python)."""
        b, end = s.begin, s.end
        n = end - b
        if s.source == "host" or n <= 0:
            return True
        if s.source == "pool":
            q = s.slot
            ident = self._canon.get((e.layer, e.stream, b - q))
            return (ident is not None and q >= 0 and self._ident[q:q + n].count(ident) == n
                    and self._good.find(0, q, q + n) < 0)
        v = self._ver.get((e.layer, e.stream))
        if v is None or len(v) < end:
            v = self._versions(e.layer, e.stream, end)
        rec = self._ring.get((e.layer, e.stream))
        if rec is None or rec[0] != e.step:
            return False
        copies = rec[1]
        if len(copies) == 1:  # one batch copied exactly this run: the common case
            p0, p1, _, snap = copies[0]
            if p0 == b and p1 == end:
                return snap == v[b:end]
        # the step's copies must tile [b, end) once each, with the versions still current
        at = b
        for p0, p1, _, snap in sorted(c for c in rec[1] if c[0] < end and c[1] > b):
            if p0 != at:
                return False
            top = min(p1, end)
            if snap[:top - p0] != v[p0:top]:
                return False
            at = top
        return at == end

    def exact_pages(self, e: ev.Read) -> int | None:
        """The number of pages the read's ``served`` runs cover if every one is exact, else
        None (then :meth:`ranges` says which are not). The common case, decided without
        building ranges; the pool test of :meth:`_all_exact` is inlined (a read is a fifth of
        a trace's events)."""
        total = 0
        canon, idents, good = self._canon, self._ident, self._good
        for s in e.served:
            b = s.begin
            n = s.end - b
            if n <= 0:
                continue
            if b < 0 or s.end > MAX_PAGE:
                return None  # ranges() leaves it out
            if s.source == "pool":
                q = s.slot
                ident = canon.get((e.layer, e.stream, b - q))
                if (ident is None or q < 0 or idents[q:q + n].count(ident) != n
                        or good.find(0, q, q + n) >= 0):
                    return None
            elif s.source == "ring":
                rec = self._ring.get((e.layer, e.stream))
                if rec is None or rec[0] != e.step:
                    return None
                copies = rec[1]
                if len(copies) == 1 and copies[0][0] == b and copies[0][1] == b + n:
                    v = self._ver.get((e.layer, e.stream))
                    if v is None or copies[0][3] != v[b:b + n]:
                        return None
                elif not self._all_exact(e, s):
                    return None
            elif s.source != "host":
                return None
            total += n
        return total

    def ranges(self, e: ev.Read) -> tuple[ev.ReadRange, ...]:
        """The read's provenance from its ``served`` runs, in the annotation's shape:
        consecutive pages with equal (source, holder stream, class, lag) share a range."""
        out: list[ev.ReadRange] = []
        stream = e.stream
        for s in e.served:
            if not self._in_range(s):
                continue
            if self._all_exact(e, s):
                if s.end <= s.begin:
                    continue
                if out and out[-1].end == s.begin and out[-1].source == s.source \
                        and out[-1].cls == "exact" and out[-1].holder == stream:
                    out[-1] = ev.ReadRange(out[-1].begin, s.end, s.source, stream, "exact")
                else:
                    out.append(ev.ReadRange(s.begin, s.end, s.source, stream, "exact"))
                continue
            if s.source == "pool" and s.slot >= 0:
                self._pool_ranges(e, s, out)
                continue
            for v in self._judge(e, s):
                holder = stream if v.source == "host" else v.copy.stream if v.copy else -1
                last = out[-1] if out else None
                if (last is not None and last.end == v.page and last.source == v.source
                        and last.holder == holder and last.cls == v.cls
                        and last.version_lag == v.lag):
                    out[-1] = ev.ReadRange(last.begin, v.page + 1, v.source, holder, v.cls, v.lag)
                else:
                    out.append(ev.ReadRange(v.page, v.page + 1, v.source, holder, v.cls, v.lag))
        return tuple(out)

    def _pool_ranges(self, e: ev.Read, s: ev.Served, out: list[ev.ReadRange]) -> None:
        """:meth:`ranges` for one pool run, judged a run of equal slot contents at a time
        (uploads fill consecutive slots with one ident, so a run is usually a handful of
        groups): the same verdicts as :meth:`_judge`, without an object per page."""
        layer, stream, b, q = e.layer, e.stream, s.begin, s.slot
        n = s.end - b
        if q + n > len(self._ident):
            self._grow_slots(q + n)
        idents = self._ident[q:q + n]
        cur = self._versions(layer, stream, s.end)[b:b + n]
        vers = self._slot_ver[q:q + n]
        i = 0
        for ident, group in itertools.groupby(idents):
            j = i + sum(1 for _ in group)
            pieces: list[tuple[int, int, ev.ReadClass, int]]
            if ident is None or ident[0] != layer or ident[1] != stream or q + ident[2] != b:
                pieces = [(j - i, -1 if ident is None else ident[1], "foreign", 0)]
            else:  # the right pages: exact where the copy's version is current
                pieces = []
                for lag, g in itertools.groupby(c - w for c, w in zip(cur[i:j], vers[i:j],
                                                                       strict=True)):
                    pieces.append((sum(1 for _ in g), stream, "exact" if lag == 0 else "stale",
                                   lag))
            page = b + i
            for count, holder, cls, lag in pieces:
                last = out[-1] if out else None
                if (last is not None and last.end == page and last.source == "pool"
                        and last.holder == holder and last.cls == cls
                        and last.version_lag == lag):
                    out[-1] = ev.ReadRange(last.begin, page + count, "pool", holder, cls, lag)
                else:
                    out.append(ev.ReadRange(page, page + count, "pool", holder, cls, lag))
                page += count
            i = j

    def pages(self, e: ev.Read) -> list[PageVerdict]:
        """Every page of the read's ``served`` runs, judged one by one (runs outside
        ``[0, MAX_PAGE)`` are left out and counted in ``out_of_range``)."""
        return [v for s in e.served if self._in_range(s) for v in self._judge(e, s)]

    def _in_range(self, s: ev.Served) -> bool:
        if s.begin < 0 or s.end > MAX_PAGE:
            self.out_of_range += 1
            return False
        return True

    def _judge(self, e: ev.Read, s: ev.Served) -> list[PageVerdict]:
        layer, stream, step, source = e.layer, e.stream, e.step, s.source
        v = self._versions(layer, stream, s.end)
        out: list[PageVerdict] = []
        rec = self._ring.get((layer, stream))
        ring = rec[1] if rec is not None and rec[0] == step else []
        for i, page in enumerate(range(s.begin, s.end)):
            current = v[page]
            if source == "host":
                out.append(PageVerdict(page, source, -1, None, "exact", 0, current))
                continue
            slot = s.slot + i
            copy: Copy | None = None
            if source == "pool":
                ident = self._ident[slot] if 0 <= slot < len(self._ident) else None
                if ident is not None:
                    l_, s_, delta = ident
                    wstep, wseq = self._slot_when[slot]
                    copy = Copy(l_, s_, slot + delta, self._slot_ver[slot], wstep, wseq)
            else:
                for p0, p1, seq, snap in reversed(ring):  # the last copy of the page wins
                    if p0 <= page < p1:
                        copy = Copy(layer, stream, page, snap[page - p0], step, seq)
                        break
            if copy is None or (copy.layer, copy.stream, copy.page) != (layer, stream, page):
                out.append(PageVerdict(page, source, slot, copy, "foreign", 0, current))
            elif copy.version == current:
                out.append(PageVerdict(page, source, slot, copy, "exact", 0, current))
            else:
                out.append(PageVerdict(page, source, slot, copy, "stale",
                                       current - copy.version, current))
        return out

    def holder(self, slot: int) -> Copy | None:
        """What a pool slot holds now."""
        ident = self._ident[slot] if 0 <= slot < len(self._ident) else None
        if ident is None:
            return None
        wstep, wseq = self._slot_when[slot]
        return Copy(ident[0], ident[1], slot + ident[2], self._slot_ver[slot], wstep, wseq)

    def feed(self, e: ev.AnyEvent | ev.Unknown) -> None:
        """Apply one event of any kind (reads change no state)."""
        if isinstance(e, ev.Write):
            self.write(e)
        elif isinstance(e, ev.Upload):
            self.upload(e)
        elif isinstance(e, ev.Invalidate):
            self.invalidate(e)
