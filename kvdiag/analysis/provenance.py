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

from typing import NamedTuple

from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS

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
    source: str
    slot: int
    copy: Copy | None
    """The copy that was read (None for a host page, or a slot/ring page never loaded)."""
    cls: str
    lag: int
    """Writes the copy missed (stale only)."""
    version: int
    """The host page's version at the read."""


class Provenance:
    """The derivation's state: host versions, slot contents, ring copies."""

    def __init__(self) -> None:
        self.versions: dict[PageId, int] = {}
        self.last_write: dict[PageId, tuple[int, int]] = {}
        """(step, seq) of the latest write that touched each page: for cause chains."""
        self.slots: dict[int, Copy] = {}
        self.ring: dict[PageId, Copy] = {}
        self.invalidations = 0

    # -- facts ---------------------------------------------------------------------------

    def write(self, e: ev.Write) -> None:
        c0, c1 = e.cells
        if c1 <= c0:
            return
        versions, last = self.versions, self.last_write
        layer, stream, when = e.layer, e.stream, (e.step, e.seq)
        for page in range(c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1):
            key = (layer, stream, page)
            versions[key] = versions.get(key, 0) + 1
            last[key] = when

    def upload(self, e: ev.Upload) -> None:
        layer, stream, step, seq = e.layer, e.stream, e.step, e.seq
        get = self.versions.get
        p0, p1 = e.pages
        if e.target == "ring":
            ring = self.ring
            for page in range(p0, p1):
                key = (layer, stream, page)
                ring[key] = Copy(layer, stream, page, get(key, 0), step, seq)
        else:
            slots, slot = self.slots, e.slot - p0
            for page in range(p0, p1):
                slots[slot + page] = Copy(layer, stream, page, get((layer, stream, page), 0),
                                          step, seq)

    def invalidate(self, e: ev.Invalidate) -> None:
        self.slots.clear()
        self.ring.clear()
        self.invalidations += 1

    # -- judgement -----------------------------------------------------------------------

    def ranges(self, e: ev.Read) -> tuple[ev.ReadRange, ...]:
        """The read's provenance from its ``served`` runs, in the annotation's shape:
        consecutive pages with equal (source, holder stream, class, lag) share a range."""
        out: list[ev.ReadRange] = []
        run: list[object] | None = None  # [begin, end, source, holder, cls, lag]
        for v in self.pages(e):
            holder = e.stream if v.source == "host" else (v.copy.stream if v.copy else -1)
            if (run is not None and run[1] == v.page and run[2] == v.source
                    and run[3] == holder and run[4] == v.cls and run[5] == v.lag):
                run[1] = v.page + 1
                continue
            if run is not None:
                out.append(ev.ReadRange(*run))  # type: ignore[arg-type]
            run = [v.page, v.page + 1, v.source, holder, v.cls, v.lag]
        if run is not None:
            out.append(ev.ReadRange(*run))  # type: ignore[arg-type]
        return tuple(out)

    def pages(self, e: ev.Read) -> list[PageVerdict]:
        """Every page of the read's ``served`` runs, judged."""
        layer, stream, step = e.layer, e.stream, e.step
        get = self.versions.get
        out: list[PageVerdict] = []
        for s in e.served:
            source = s.source
            for i, page in enumerate(range(s.begin, s.end)):
                current = get((layer, stream, page), 0)
                if source == "host":
                    out.append(PageVerdict(page, source, -1, None, "exact", 0, current))
                    continue
                if source == "pool":
                    copy = self.slots.get(s.slot + i)
                else:
                    copy = self.ring.get((layer, stream, page))
                    if copy is not None and copy.step != step:
                        copy = None  # a ring copy lives for the read it was made for
                slot = s.slot + i
                if copy is None or (copy.layer, copy.stream, copy.page) != (layer, stream, page):
                    out.append(PageVerdict(page, source, slot, copy, "foreign", 0, current))
                elif copy.version == current:
                    out.append(PageVerdict(page, source, slot, copy, "exact", 0, current))
                else:
                    out.append(PageVerdict(page, source, slot, copy, "stale",
                                           current - copy.version, current))
        return out

    def feed(self, e: ev.AnyEvent | ev.Unknown) -> None:
        """Apply one event of any kind (reads change no state)."""
        if isinstance(e, ev.Write):
            self.write(e)
        elif isinstance(e, ev.Upload):
            self.upload(e)
        elif isinstance(e, ev.Invalidate):
            self.invalidate(e)
