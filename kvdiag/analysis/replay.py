"""The resident window at a step, rebuilt from a trace's events (the Pages view's model).

A trace records what the runtime's bookkeeping did, not its state, so the state at step S is
rebuilt from the events up to the end of S (docs/trace-format.md):

- ``upload`` with ``target: resident`` copies pages ``[p0, p1)`` of (layer, stream) into pool
  slots ``slot, slot+1, ...``: each slot then holds (layer, stream, page, version), the version
  being the host page's version at that moment; the bookkeeping key
  ``(layer, key_stream, page)`` (``key_stream`` absent in the shared layout) now maps to it;
- ``evict`` empties a slot;
- ``write`` sets the host versions of the pages it lists (``versions``) and names the
  bookkeeping keys it marked dirty (``dirty``, the keys of the ubatch in progress);
- ``read`` tells, per run of pages of one (layer, stream), where they were served from (pool,
  ring, host), whose bytes they were (``holder``) and whether that was the right data
  (``exact``), an older version (``stale``) or another stream's (``foreign``);
- ``learn`` maps K view pointers to layer numbers (cleared when ``relearn``).

:class:`PagesReplay` applies events one at a time: the reference semantics, used on small
traces and by tests. :mod:`kvdiag.analysis.pages_query` computes the same snapshots from an
index with random access, for traces too big to replay on every key press; both build the
result with :func:`assemble`, so they agree by construction wherever their inputs agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvdiag.model import events as ev

PAGE_TOKENS = 256
"""Tokens per page (kvdiag.kvstream.pages); a write's cells map to pages by this."""

Key = tuple[int, int | None, int]
"""Bookkeeping key (layer, stream or None in the shared layout, page)."""


@dataclass(frozen=True)
class Holder:
    """What a pool slot's bytes are: host page (layer, stream, page) at ``version``."""

    layer: int
    stream: int
    page: int
    version: int


@dataclass(frozen=True)
class LastRead:
    """The latest read of one page: the step, source, holder stream, class and version lag."""

    step: int
    source: str
    holder: int
    cls: str
    lag: int


@dataclass(frozen=True)
class PageCell:
    """One (layer, stream, page) at a step."""

    page: int
    resident: bool
    """Inside the layer's resident window (else it streams through the ring)."""
    version: int
    """The host page's version (writes so far)."""
    slot: int | None
    """The pool slot the page's bookkeeping key maps to, once uploaded."""
    holder: Holder | None
    """What that slot holds now."""
    read: LastRead | None
    dirty: bool
    """Its bookkeeping key was marked dirty by this step's writes."""

    @property
    def flagged(self) -> bool:
        return self.read is not None and self.read.cls != "exact"


@dataclass(frozen=True)
class PagesGeometry:
    """Shape of the grid: from the trace header's ``plan`` and ``scenario.config``."""

    layers: int
    streams: tuple[int, ...]
    pages: int
    """Pages per stream (columns of the grid)."""
    resident_per_layer: int
    """Resident pool pages per layer, all streams together."""
    layout: str
    ring_slots: int = 0
    pool_pages: int = 0

    def window(self) -> int:
        """Resident pages per view: the per-stream layout splits a layer's pages evenly."""
        if self.layout == "per-stream" and self.streams:
            return self.resident_per_layer // len(self.streams)
        return self.resident_per_layer

    def key(self, layer: int, stream: int, page: int) -> Key:
        return (layer, None, page) if self.layout == "shared" else (layer, stream, page)


@dataclass(frozen=True)
class PagesSnapshot:
    step: int
    geometry: PagesGeometry
    cells: tuple[tuple[tuple[PageCell, ...], ...], ...]
    """``cells[i][layer][page]`` for stream ``geometry.streams[i]``."""
    learned: tuple[tuple[int, int], ...] = ()
    """(layer, K pointer) pairs the resident cache has learned (shared layout)."""
    relearn_step: int | None = None

    def cell(self, stream: int, layer: int, page: int) -> PageCell:
        return self.cells[self.geometry.streams.index(stream)][layer][page]

    def flagged(self) -> list[tuple[int, int, PageCell]]:
        """(stream, layer, cell) of every page whose latest read was stale or foreign."""
        out: list[tuple[int, int, PageCell]] = []
        for i, stream in enumerate(self.geometry.streams):
            for layer, row in enumerate(self.cells[i]):
                out.extend((stream, layer, c) for c in row if c.flagged)
        return out


def geometry_from_header(header: ev.Header, *, layers: int = 0, streams: Iterable[int] = (),
                         pages: int = 0) -> PagesGeometry:
    """Grid shape from the header, falling back to what the events showed (``layers``,
    ``streams``, ``pages`` seen) where the header is silent."""
    plan: dict[str, Any] = header.plan or {}
    cfg: dict[str, Any] = (header.scenario or {}).get("config", {}) or {}

    def num(d: dict[str, Any], key: str, default: int) -> int:
        v = d.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default

    n_layers = max(num(cfg, "layers", 0), layers)
    n_stream = num(plan, "n_stream", 0) or (1 if cfg.get("kv_unified") else num(cfg, "np", 0))
    seen = sorted(set(streams))
    stream_ids = tuple(range(max(n_stream, (seen[-1] + 1) if seen else 0))) or (0,)
    layout = cfg.get("layout")
    return PagesGeometry(
        layers=max(n_layers, 1),
        streams=stream_ids,
        pages=max(num(plan, "pages_per_stream", 0), pages, 1),
        resident_per_layer=num(plan, "resident_pages_per_layer", 0),
        layout=layout if layout in ("shared", "per-stream") else "shared",
        ring_slots=num(plan, "ring_slots", 0),
        pool_pages=num(plan, "pool_pages", 0),
    )


ReadOf = Callable[[int, int], "tuple[int, tuple[ev.ReadRange, ...]] | None"]


def assemble(geometry: PagesGeometry, step: int, *, read_of: ReadOf,
             slot_of: Callable[[Key], int | None], holder_of: Callable[[int], Holder | None],
             version_of: Callable[[int, int, int], int], dirty: frozenset[Key],
             learned: tuple[tuple[int, int], ...] = (),
             relearn_step: int | None = None) -> PagesSnapshot:
    """Build the snapshot from lookups of the state at the end of ``step``."""
    window = geometry.window()
    cells: list[tuple[tuple[PageCell, ...], ...]] = []
    for stream in geometry.streams:
        layers: list[tuple[PageCell, ...]] = []
        for layer in range(geometry.layers):
            reads: list[LastRead | None] = [None] * geometry.pages
            last = read_of(layer, stream)
            if last is not None:
                read_step, ranges = last
                for r in ranges:
                    for page in range(max(r.begin, 0), min(r.end, geometry.pages)):
                        reads[page] = LastRead(read_step, r.source, r.holder, r.cls,
                                               r.version_lag)
            row: list[PageCell] = []
            for page in range(geometry.pages):
                key = geometry.key(layer, stream, page)
                slot = slot_of(key)
                row.append(PageCell(
                    page=page, resident=page < window,
                    version=version_of(layer, stream, page), slot=slot,
                    holder=holder_of(slot) if slot is not None else None,
                    read=reads[page], dirty=key in dirty,
                ))
            layers.append(tuple(row))
        cells.append(tuple(layers))
    return PagesSnapshot(step, geometry, tuple(cells), learned, relearn_step)


def write_pages(cells: tuple[int, int]) -> range:
    """Pages a write of cells ``[c0, c1)`` touches."""
    c0, c1 = cells
    if c1 <= c0 or c0 < 0:
        return range(0)
    return range(c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1)


@dataclass
class PagesReplay:
    """Apply events in file order; :meth:`snapshot` gives the state after the last one."""

    geometry: PagesGeometry
    versions: dict[tuple[int, int, int], int] = field(default_factory=dict)
    holders: dict[int, Holder] = field(default_factory=dict)
    key_slot: dict[Key, int] = field(default_factory=dict)
    reads: dict[tuple[int, int], tuple[int, tuple[ev.ReadRange, ...]]] = field(
        default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    dirty_step: int | None = None
    learned: dict[int, int] = field(default_factory=dict)
    relearn_step: int | None = None

    def apply(self, event: object) -> None:
        match event:
            case ev.Write():
                for page, version in event.versions:
                    self.versions[(event.layer, event.stream, page)] = version
                if self.dirty_step != event.step:
                    self.dirty.clear()
                    self.dirty_step = event.step
                self.dirty.update(event.dirty)
            case ev.Upload(target="resident"):
                shared = event.key_stream is None
                for i, page in enumerate(range(event.pages[0], event.pages[1])):
                    slot = event.slot + i
                    self.holders[slot] = Holder(
                        event.layer, event.stream, page,
                        self.versions.get((event.layer, event.stream, page), 0))
                    self.key_slot[(event.layer, None if shared else event.key_stream, page)] = slot
            case ev.Evict():
                self.holders.pop(event.slot, None)
            case ev.Read():
                self.reads[(event.layer, event.stream)] = (event.step, event.ranges)
            case ev.Learn():
                if event.relearn:
                    self.learned.clear()
                    self.relearn_step = event.step
                if event.layer >= 0:
                    self.learned[event.layer] = event.k_ptr
            case _:
                pass

    def snapshot(self, step: int) -> PagesSnapshot:
        dirty = frozenset(self.dirty) if self.dirty_step == step else frozenset()
        return assemble(
            self.geometry, step,
            read_of=lambda layer, stream: self.reads.get((layer, stream)),
            slot_of=self.key_slot.get,
            holder_of=self.holders.get,
            version_of=lambda layer, stream, page: self.versions.get((layer, stream, page), 0),
            dirty=dirty, learned=tuple(sorted(self.learned.items())),
            relearn_step=self.relearn_step,
        )


def replay_steps(geometry: PagesGeometry, events: Iterable[object]) -> dict[int, PagesSnapshot]:
    """Snapshot at the end of every step that has events (small traces and tests)."""
    replay = PagesReplay(geometry)
    out: dict[int, PagesSnapshot] = {}
    current: int | None = None
    for event in events:
        step = getattr(event, "step", None)
        if not isinstance(step, int):
            continue
        if current is not None and step > current:
            out[current] = replay.snapshot(current)
        if current is None or step > current:
            current = step
        replay.apply(event)
    if current is not None:
        out[current] = replay.snapshot(current)
    return out
