"""The resident cache's bookkeeping (brief §1.5, §4.3) in both layouts, with provenance.

``shared`` is upstream: slots, ``loaded`` and ``dirty`` are keyed by (layer, page-in-view);
layer numbers are learned from K view pointers (relearned on prefill graphs), and
mark_dirty_rows divides *global* rows (stream × kv_size + cell) by 256 with no stream term.

``per-stream`` is the fix: keys (layer, stream, page); each layer's resident window is split
evenly between the streams (the pool's page budget is unchanged), the layer and stream come
from the tensor base and the view's byte offset, the dirty page comes from the
stream-local cell, and a dirty mark lasts until its page is uploaded rather than until the
next ubatch (see :meth:`ResidentCache.mark_dirty_rows`).

Provenance is kvdiag's addition: every host page (layer, stream, page) has a version bumped by
each write, and every slot remembers which (layer, stream, page, version) it holds, so each
read can be classified exact / stale / foreign.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvdiag.kvstream.config import Layout
from kvdiag.model.pages import PAGE_TOKENS, Holder, Key


class LayerIdentityError(RuntimeError):
    """``next_layer < layer_count`` failed: a K pointer never seen in a prefill graph."""


@dataclass
class HostVersions:
    """Version of every host page; 0 = never written."""

    versions: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def bump(self, layer: int, stream: int, page: int) -> int:
        key = (layer, stream, page)
        v = self.versions.get(key, 0) + 1
        self.versions[key] = v
        return v

    def get(self, layer: int, stream: int, page: int) -> int:
        return self.versions.get((layer, stream, page), 0)


@dataclass(frozen=True)
class ResidentPage:
    """Where page ``page`` of a view is served from and what must happen first."""

    slot: int
    key: Key
    upload: str | None
    """None, or the upload reason: miss / dirty / wide-query / last-chunk."""


class ResidentCache:
    def __init__(
        self,
        layout: Layout,
        layer_count: int,
        pages_per_layer: int,
        ring_slots: int,
        n_stream: int,
        kv_size: int,
    ) -> None:
        self.layout = layout
        self.layer_count = layer_count
        self.layer_pages = [pages_per_layer] * layer_count
        self.layer_offsets = [i * pages_per_layer for i in range(layer_count)]
        self.ring_slots = ring_slots
        self.n_stream = n_stream
        self.kv_size = kv_size
        self.loaded: set[Key] = set()
        self.dirty: set[Key] = set()
        self.precise: list[bool] = [False] * layer_count
        self.holders: dict[int, Holder] = {}
        self.layer_by_k: dict[int, int] = {}
        self.next_layer = 0
        self.versions = HostVersions()

    # -- windows and slots -------------------------------------------------------------

    def window(self, layer: int) -> int:
        """Resident pages of one view of ``layer``: pages 0..window-1 are resident."""
        if self.layout == "shared":
            return self.layer_pages[layer]
        return self.layer_pages[layer] // self.n_stream

    def key(self, layer: int, stream: int, page: int) -> Key:
        return (layer, None, page) if self.layout == "shared" else (layer, stream, page)

    def slot(self, key: Key) -> int:
        layer, stream, page = key
        if not 0 <= page < self.window(layer):
            raise IndexError(f"page {page} outside the resident window of layer {layer}")
        base = self.ring_slots + self.layer_offsets[layer]
        if stream is None:
            return base + page
        return base + stream * self.window(layer) + page

    # -- layer identity ------------------------------------------------------------------

    def forget_layers(self) -> None:
        """A prefill graph's first attention clears the pointer maps (brief §1.5)."""
        self.layer_by_k.clear()
        self.next_layer = 0

    def learn(self, k_ptr: int) -> tuple[int, bool]:
        """Layer number for a K view pointer; (layer, newly_learned)."""
        layer = self.layer_by_k.get(k_ptr)
        if layer is not None:
            return layer, False
        if self.next_layer >= self.layer_count:
            raise LayerIdentityError(
                f"K pointer {k_ptr:#x} is unknown and all {self.layer_count} layers are taken"
            )
        layer = self.next_layer
        self.layer_by_k[k_ptr] = layer
        self.next_layer += 1
        return layer, True

    # -- dirty marking -----------------------------------------------------------------

    def mark_dirty_rows(self, rows: Iterable[int]) -> set[Key]:
        """Called once per ubatch with the global row indices (set_input_k_idxs).

        Turns precise tracking on for every layer, then marks, for every layer, the page each
        row falls in (if inside the layer's window); returns the keys this ubatch marked.

        ``shared`` first clears every dirty flag, as upstream does (brief §4.3): that is sound
        only while every ubatch's streamed attention consumes its own marks, which holds under
        the upstream dispatcher (a member FA node streams or aborts). With several streams the
        fits dispatcher sends every two-stream ubatch to ordinary flash attention, which
        uploads nothing, so clearing would forget that ubatch's writes: a page of a stream
        resident from before (a slot's earlier request) would be served stale once that
        stream decodes alone. ``per-stream`` therefore keeps a mark until the page is uploaded
        (:meth:`uploaded`) or the cache is invalidated.
        """
        if self.layout == "shared":
            self.dirty.clear()
        self.precise = [True] * self.layer_count
        pages = self.row_pages(rows)
        marked: set[Key] = set()
        for layer in range(self.layer_count):
            window = self.window(layer)
            for stream, page in pages:
                if page < window:
                    marked.add((layer, stream, page))
        self.dirty |= marked
        return marked

    def row_pages(self, rows: Iterable[int]) -> set[tuple[int | None, int]]:
        """The (stream, page) each global row falls in, as mark_dirty_rows divides it:
        ``shared`` divides the global row by 256 with no stream term (brief §4.3),
        ``per-stream`` takes the stream and the stream-local cell's page."""
        if self.layout == "shared":
            return {(None, row // PAGE_TOKENS) for row in rows}
        return {(row // self.kv_size, row % self.kv_size // PAGE_TOKENS) for row in rows}

    def outside(self, pages: Iterable[tuple[int | None, int]]) -> list[tuple[int | None, int]]:
        """Of ``pages``, those outside every layer's resident window: a mark refreshes no
        resident copy of them (trace 1.1 ``mark.outside``)."""
        widest = max((self.window(layer) for layer in range(self.layer_count)), default=0)
        return sorted((p for p in pages if p[1] >= widest),
                      key=lambda p: (-1 if p[0] is None else p[0], p[1]))

    # -- the upload rule -----------------------------------------------------------------

    def plan_page(
        self, layer: int, stream: int, page: int, q_width: int, last_chunk: bool
    ) -> ResidentPage:
        """First use is a miss; later, upload iff dirty under precise tracking, else iff the
        query is wider than one token or the page is the last chunk (brief §1.5)."""
        key = self.key(layer, stream, page)
        reason: str | None
        if key not in self.loaded:
            reason = "miss"
        elif self.precise[layer]:
            reason = "dirty" if key in self.dirty else None
        elif q_width > 1:
            reason = "wide-query"
        elif last_chunk:
            reason = "last-chunk"
        else:
            reason = None
        return ResidentPage(slot=self.slot(key), key=key, upload=reason)

    def uploaded(self, key: Key, slot: int, holder: Holder) -> Holder | None:
        """Record an upload; returns the previous holder if the slot held other bytes."""
        self.loaded.add(key)
        self.dirty.discard(key)
        previous = self.holders.get(slot)
        self.holders[slot] = holder
        if previous is not None and (previous.layer, previous.stream, previous.page) != (
            holder.layer, holder.stream, holder.page
        ):
            return previous
        return None

    def invalidate(self) -> list[tuple[int, Holder]]:
        """Wholesale invalidation (reconfigure, buffer clear): returns what was dropped."""
        dropped = sorted(self.holders.items())
        self.loaded.clear()
        self.dirty.clear()
        self.holders.clear()
        self.forget_layers()
        return dropped


def classify(holder: Holder | None, layer: int, stream: int, page: int, current: int) -> str:
    """exact / stale (same page, older version) / foreign (another stream's or page's bytes)."""
    if holder is None:
        return "foreign"
    if (holder.layer, holder.stream, holder.page) != (layer, stream, page):
        return "foreign"
    return "exact" if holder.version == current else "stale"
