"""The resident window at a step, rebuilt from a trace's events (the Pages view's model).

A trace records what the runtime's bookkeeping did, not its state, so the state at step S is
rebuilt from the events up to the end of S (docs/trace-format.md):

- ``upload`` with ``target: resident`` copies pages ``[p0, p1)`` of (layer, stream) into pool
  slots ``slot, slot+1, ...``: each slot then holds (layer, stream, page, version), the version
  being the host page's version at that moment; the bookkeeping key
  ``(layer, key_stream, page)`` (``key_stream`` absent in the shared layout) now maps to it;
- ``evict`` empties a slot;
- ``write`` makes the host pages it touches one version newer and names the bookkeeping keys
  it marked dirty (``dirty``, the keys of the ubatch in progress);
- ``read``: where each page came from and whether it got the right data is the judgement's
  (:mod:`kvdiag.analysis.judgement`: exact, stale by how many writes, foreign with whose bytes
  the slot held, or not judged and why), never the model's ``ranges`` annotation; host
  versions are the judgement's too (the writes that touched the page), never ``versions``;
- ``learn`` maps K view pointers to layer numbers (cleared when ``relearn``);
- ``invalidate`` empties every slot and forgets every bookkeeping key (brief §1.5); in an
  adaptive trace it is also when the resident cache takes its new shape: the partition and
  decode layout of the ``adapt`` event before it (resident pages per layer, ring slots,
  decode-layout active pages) give each layer's window, the way
  ``kvdiag.kvstream.adaptive.AdaptiveRuntime`` reshapes the cache (:class:`Window`).

:class:`PagesReplay` applies events one at a time: the reference semantics, used on small
traces and by tests. :mod:`kvdiag.analysis.pages_query` computes the same snapshots from an
index with random access, for traces too big to replay on every key press; both build the
result with :func:`assemble`, so they agree by construction wherever their inputs agree.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvdiag.analysis.judgement import CLASSES, SOURCES, Judge
from kvdiag.model import events as ev
from kvdiag.model.decode_layout import decode_layout
from kvdiag.model.pages import PAGE_TOKENS, Holder, Key


class LastRead(NamedTuple):
    """The latest read of one page as the judgement saw it: the step, source, whose bytes the
    slot held (``holder`` stream, ``holder_layer``, ``holder_page``; -1: an empty slot or not
    judged), the class (exact, stale, foreign, not judged, or ``judging`` while the read is
    past the judged prefix) and the writes a stale copy missed."""

    step: int
    source: str
    holder: int
    cls: str
    lag: int
    holder_layer: int = -1
    holder_page: int = -1
    why: int = 0
    """Why it is not judged (:data:`kvdiag.analysis.judgement.WHY`)."""


JUDGING = "judging"
"""The class of a page whose read the judgement has not reached yet."""

Run = tuple[int, int, LastRead]
"""Pages ``[begin, end)`` of one read with one verdict."""


def judged_runs(step: int, layer: int, stream: int, served: Iterable[ev.Served],
                pieces: Iterable[Sequence[int]]) -> tuple[Run, ...]:
    """The pages of a read in page order with the judgement's verdicts: ``pieces`` are its
    non-exact runs (:data:`kvdiag.analysis.judgement.slots.Piece` fields: begin, end, source,
    slot, class, lag, holder layer, stream, page, version, step, seq, why); a served page
    outside them is exact
    (the judgement's ledger, docs/trace-format.md "Derivation")."""
    bad = sorted(pieces, key=lambda p: p[0])
    out: list[Run] = []
    k = 0
    for s in sorted(served, key=lambda s: s.begin):
        cursor = s.begin
        exact = LastRead(step, s.source, stream, "exact", 0, layer, -1)
        while k < len(bad) and bad[k][0] < s.end:
            p = bad[k]
            if p[0] > cursor:
                out.append((cursor, p[0], exact))
            out.append((p[0], p[1], LastRead(step, SOURCES[p[2]], p[7], CLASSES[p[4]], p[5],
                                             p[6], p[8], p[12])))
            cursor = max(cursor, p[1])
            k += 1
        if cursor < s.end:
            out.append((cursor, s.end, exact))
    return tuple(out)


def judging_runs(step: int, served: Iterable[ev.Served]) -> tuple[Run, ...]:
    """The pages of a read the judgement has not reached yet."""
    return tuple((s.begin, s.end, LastRead(step, s.source, -1, JUDGING, 0))
                 for s in served)


class PageCell(NamedTuple):
    """One (layer, stream, page) at a step. (Named tuples: a grid has thousands of cells, and a
    tuple is built several times faster than a frozen dataclass.)"""

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
    """The latest read of this (layer, stream), where it covered this page."""
    dirty: bool
    """Its bookkeeping key was marked dirty by this step's writes."""

    @property
    def flagged(self) -> bool:
        """Its latest read was stale or foreign."""
        return self.read is not None and self.read.cls in FLAGGED


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
    pool_layers: int = 0
    """Layers sharing the pool (the streamed layers; 0: every layer)."""

    def window(self, resident: int | None = None) -> int:
        """Resident pages per view of a layer holding ``resident`` pages (default: the plan's):
        the per-stream layout splits a layer's pages evenly."""
        total = self.resident_per_layer if resident is None else resident
        if self.layout == "per-stream" and self.streams:
            return total // len(self.streams)
        return total

    def key(self, layer: int, stream: int, page: int) -> Key:
        return (layer, None, page) if self.layout == "shared" else (layer, stream, page)


@dataclass(frozen=True)
class Window:
    """The resident pages of each pool layer (all streams together) after an adaptive
    reshape, and a line saying why."""

    per_layer: tuple[int, ...]
    note: str


def reshaped_window(geometry: PagesGeometry, adapt: ev.Adapt | None,
                    repartition: ev.Repartition | None) -> Window | None:
    """The window an ``invalidate`` leaves: the shape of the latest ``adapt`` before it
    (None without one: a clear that reshapes nothing we know of). ``repartition`` is the
    latest one before the clear; it is named when it set this resident count.

    The runtime model applies ``decode_layout(resident, layout, layers, ring)`` when the
    adapt line has a layout, the uniform ``resident`` per layer otherwise
    (kvdiag/kvstream/adaptive.py, ``after_evaluation``)."""
    if adapt is None:
        return None
    layers = geometry.pool_layers or geometry.layers
    resident = max(adapt.resident, 0)
    moved = ""
    if repartition is not None and repartition.resident[1] == resident:
        a, b = repartition.resident
        moved = f" (step {repartition.step}: repartition {a}→{b})"
    active = adapt.layout
    if active is None or active <= resident:
        return Window((resident,) * layers, f"window: {resident} pages/layer{moved}")
    layout = decode_layout(resident, active, layers, max(adapt.ring, 1))
    caps = tuple(layout.capacity(layer) for layer in range(layers))
    split = layout.split_layers()
    streamed = sorted({active - caps[layer] for layer in split})
    pages = "–".join(str(n) for n in (streamed[0], streamed[-1])) if len(streamed) > 1 \
        else str(streamed[0])
    others = "" if len(split) == layers else f", the others keep all {active} resident"
    return Window(caps, f"decode layout: layers {','.join(map(str, split))} stream {pages} "
                        f"pages{others}{moved}")


ReadOf = Callable[[int, int], "tuple[Run, ...] | None"]
"""(layer, stream) → the pages and verdicts of its latest step's read events (None: not read yet)."""
FLAGGED = frozenset({"stale", "foreign"})


@dataclass(frozen=True, eq=False)
class PagesSnapshot:
    """The state at the end of ``step``. Cells are computed when first asked for and then
    kept: a grid of a long context has tens of thousands of cells and a screen shows a few
    hundred. The value never changes once made (the lookups it was built from are fixed)."""

    step: int
    geometry: PagesGeometry
    read_of: ReadOf
    slot_of: Callable[[Key], int | None]
    holder_of: Callable[[int], Holder | None]
    version_of: Callable[[int, int, int], int]
    dirty: frozenset[Key]
    learned: tuple[tuple[int, int], ...] = ()
    """(layer, K pointer) pairs the resident cache has learned (shared layout)."""
    relearn_step: int | None = None
    shape: Window | None = None
    """The adaptive reshape in force (None: the header plan's uniform window)."""
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def window(self, layer: int) -> int:
        """Resident pages per view of ``layer`` at this step: pages below it are resident."""
        if self.shape is None:
            return self.geometry.window()
        caps = self.shape.per_layer
        return self.geometry.window(caps[layer] if 0 <= layer < len(caps) else 0)

    def window_note(self) -> str:
        """Why the window is what it is, where an adaptive reshape set it."""
        return "" if self.shape is None else self.shape.note

    def reads(self, stream: int, layer: int) -> tuple[LastRead | None, ...]:
        """Per page, the latest read of (layer, stream) if it covered that page."""
        key = ("r", stream, layer)
        got = self._memo.get(key)
        if got is None:
            pages: list[LastRead | None] = [None] * self.geometry.pages
            for begin, end, info in self.read_of(layer, stream) or ():
                for page in range(max(begin, 0), min(end, self.geometry.pages)):
                    # a run's holder page is its first page's: the slots after it hold the
                    # pages after it
                    pages[page] = info if info.holder_page < 0 or page == begin else \
                        info._replace(holder_page=info.holder_page + page - begin)
            got = self._memo[key] = tuple(pages)
        return got  # type: ignore[return-value]

    def _slot(self, key: Key) -> int | None:
        k = ("s", *key)
        if k in self._memo:
            return self._memo[k]  # type: ignore[return-value]
        slot = self._memo[k] = self.slot_of(key)
        return slot

    def _holder(self, slot: int) -> Holder | None:
        k = ("h", slot)
        if k in self._memo:
            return self._memo[k]  # type: ignore[return-value]
        holder = self._memo[k] = self.holder_of(slot)
        return holder

    def cell(self, stream: int, layer: int, page: int) -> PageCell:
        got = self._memo.get(("c", stream, layer, page))
        if got is None:
            if not 0 <= page < self.geometry.pages:
                raise IndexError(f"no cell stream {stream} layer {layer} page {page}")
            return self.row(stream, layer, page, page + 1)[0]
        return got  # type: ignore[return-value]

    def row(self, stream: int, layer: int, first: int = 0, stop: int | None = None
            ) -> tuple[PageCell, ...]:
        """The cells of pages ``[first, stop)`` of (layer, stream)."""
        geo = self.geometry
        if stream not in geo.streams or not 0 <= layer < geo.layers:
            raise IndexError(f"no cells of stream {stream} layer {layer}")
        end = geo.pages if stop is None else min(stop, geo.pages)
        memo = self._memo
        reads: tuple[LastRead | None, ...] = ()
        window = 0
        out: list[PageCell] = []
        for page in range(max(first, 0), end):
            k = ("c", stream, layer, page)
            got = memo.get(k)
            if got is None:
                if not reads:  # once per row: the row's reads and window
                    reads, window = self.reads(stream, layer), self.window(layer)
                key = geo.key(layer, stream, page)
                slot = self._slot(key)
                got = memo[k] = PageCell(
                    page, page < window, self.version_of(layer, stream, page), slot,
                    self._holder(slot) if slot is not None else None, reads[page],
                    key in self.dirty)
            out.append(got)  # type: ignore[arg-type]
        return tuple(out)

    def cells(self) -> tuple[tuple[tuple[PageCell, ...], ...], ...]:
        """Every cell: ``cells()[i][layer][page]`` for stream ``geometry.streams[i]``."""
        return tuple(tuple(self.row(s, layer) for layer in range(self.geometry.layers))
                     for s in self.geometry.streams)

    def flagged(self) -> list[tuple[int, int, int, LastRead]]:
        """(stream, layer, page, read) of every page whose latest read was stale or foreign
        (from the reads alone: no cell is built)."""
        out: list[tuple[int, int, int, LastRead]] = []
        for stream in self.geometry.streams:
            for layer in range(self.geometry.layers):
                for page, read in enumerate(self.reads(stream, layer)):
                    if read is not None and read.cls in FLAGGED:
                        out.append((stream, layer, page, read))
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
    pool: dict[str, Any] = plan["pool"] if isinstance(plan.get("pool"), dict) else {}
    return PagesGeometry(
        layers=max(n_layers, 1),
        streams=stream_ids,
        pages=max(num(plan, "pages_per_stream", 0), pages, 1),
        resident_per_layer=num(plan, "resident_pages_per_layer", 0),
        layout=layout if layout in ("shared", "per-stream") else "shared",
        ring_slots=num(plan, "ring_slots", 0),
        pool_pages=num(plan, "pool_pages", 0),
        pool_layers=min(num(pool, "layer_count", 0) or num(plan, "streamed_layers", 0),
                        max(n_layers, 1)),
    )


def assemble(geometry: PagesGeometry, step: int, *, read_of: ReadOf,
             slot_of: Callable[[Key], int | None], holder_of: Callable[[int], Holder | None],
             version_of: Callable[[int, int, int], int], dirty: frozenset[Key],
             learned: tuple[tuple[int, int], ...] = (),
             relearn_step: int | None = None, shape: Window | None = None) -> PagesSnapshot:
    """The snapshot at the end of ``step`` from lookups of the state then."""
    return PagesSnapshot(step, geometry, read_of, slot_of, holder_of, version_of, dirty,
                         learned, relearn_step, shape)


def write_pages(cells: tuple[int, int]) -> range:
    """Pages a write of cells ``[c0, c1)`` touches."""
    c0, c1 = cells
    if c1 <= c0 or c0 < 0:
        return range(0)
    return range(c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1)


@dataclass
class PagesReplay:
    """Apply events in file order; :meth:`snapshot` gives the state after the last one. Reads
    are the judgement's (a :class:`~kvdiag.analysis.judgement.Judge` is fed every event), host
    versions the Judge's too; the model's annotations are not used."""

    geometry: PagesGeometry
    header: ev.Header | None = None
    judge: Judge = field(init=False)
    holders: dict[int, Holder] = field(default_factory=dict)
    key_slot: dict[Key, int] = field(default_factory=dict)
    reads: dict[tuple[int, int], tuple[Run, ...]] = field(default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    dirty_step: int | None = None
    learned: dict[int, int] = field(default_factory=dict)
    relearn_step: int | None = None
    shape: Window | None = None
    last_adapt: ev.Adapt | None = None
    last_repartition: ev.Repartition | None = None

    def __post_init__(self) -> None:
        self.judge = Judge(self.header)

    def version(self, layer: int, stream: int, page: int) -> int:
        """The host page's version now, as the Judge counts it."""
        st = self.judge.state
        return st.pages.get(st.views.one(layer, stream), page)[0]

    def apply(self, event: object) -> None:
        if isinstance(event, ev.Event | ev.Unknown):
            self.judge.feed(event)  # type: ignore[arg-type]
        match event:
            case ev.Write():
                if self.dirty_step != event.step:
                    self.dirty.clear()
                    self.dirty_step = event.step
                self.dirty.update(event.dirty)
            case ev.Upload(target="resident"):
                shared = event.key_stream is None
                version = self.version
                for i, page in enumerate(range(event.pages[0], event.pages[1])):
                    slot = event.slot + i
                    self.holders[slot] = Holder(event.layer, event.stream, page,
                                                version(event.layer, event.stream, page))
                    self.key_slot[(event.layer, None if shared else event.key_stream, page)] = slot
            case ev.Evict():
                self.holders.pop(event.slot, None)
            case ev.Read():
                verdict = self.judge.last
                assert verdict is not None
                runs = judged_runs(event.step, event.layer, event.stream, event.served,
                                   verdict.pieces)
                # one step's read of a view may be several events (PagesQuery._read_of):
                # the step's earlier runs stay, the later event's pages drawn over them
                key = (event.layer, event.stream)
                before = self.reads.get(key, ())
                same_step = bool(before) and before[0][2].step == event.step
                self.reads[key] = (*before, *runs) if same_step else runs
            case ev.Adapt():
                self.last_adapt = event
            case ev.Repartition():
                self.last_repartition = event
            case ev.Invalidate():
                self.holders.clear()
                self.key_slot.clear()
                self.shape = reshaped_window(self.geometry, self.last_adapt,
                                             self.last_repartition) or self.shape
            case ev.Learn():
                if event.relearn:
                    self.learned.clear()
                    self.relearn_step = event.step
                if event.layer >= 0:
                    self.learned[event.layer] = event.k_ptr
            case _:
                pass

    def snapshot(self, step: int) -> PagesSnapshot:
        """The state now, as a value: later events do not change it (the maps are copied)."""
        dirty = frozenset(self.dirty) if self.dirty_step == step else frozenset()
        reads, key_slot, holders = dict(self.reads), dict(self.key_slot), dict(self.holders)
        pages = copy.deepcopy(self.judge.state.pages)
        views = dict(self.judge.state.views.ids)

        def version_of(layer: int, stream: int, page: int) -> int:
            return pages.get(views.get((layer, stream)), page)[0]

        return assemble(
            self.geometry, step,
            read_of=lambda layer, stream: reads.get((layer, stream)),
            slot_of=key_slot.get,
            holder_of=holders.get,
            version_of=version_of,
            dirty=dirty, learned=tuple(sorted(self.learned.items())),
            relearn_step=self.relearn_step, shape=self.shape,
        )


def replay_steps(geometry: PagesGeometry, events: Iterable[object],
                 header: ev.Header | None = None) -> dict[int, PagesSnapshot]:
    """Snapshot at the end of every step that has events (small traces and tests)."""
    replay = PagesReplay(geometry, header)
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
