"""The layer × page grid of one stream at one step (Line API: wide grids scroll)."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvdiag.analysis.replay import PagesSnapshot
from kvdiag.tui.messages import CellSelected
from kvdiag.tui.pagestext import CELL_WIDTH, cell_label, cell_mark

LABEL_WIDTH = 4


class PagesGrid(ScrollView, can_focus=False):
    """Row 0: page numbers; row 1 + layer: that layer's pages of ``stream``."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "pages-grid--header", "pages-grid--label", "pages-grid--exact", "pages-grid--stale",
        "pages-grid--foreign", "pages-grid--ring", "pages-grid--host", "pages-grid--empty",
        "pages-grid--now", "pages-grid--cursor", "pages-grid--outside",
    }

    cursor: reactive[tuple[int, int] | None] = reactive(None, always_update=True)
    """(layer, page) of the selected cell, when this panel has the cursor."""

    def __init__(self, stream: int, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="pages-grid")
        self.stream = stream
        self.snapshot: PagesSnapshot | None = None
        self.border_title = f"stream {stream}"

    def show(self, snapshot: PagesSnapshot) -> None:
        self.snapshot = snapshot
        geo = snapshot.geometry
        self.virtual_size = Size(LABEL_WIDTH + geo.pages * CELL_WIDTH, geo.layers + 1)
        self.refresh()

    def watch_cursor(self, old: tuple[int, int] | None, new: tuple[int, int] | None) -> None:
        if new is not None:
            layer, page = new
            x = LABEL_WIDTH + page * CELL_WIDTH
            width = self.scrollable_content_region.width
            if x < self.scroll_x + LABEL_WIDTH or x + CELL_WIDTH > self.scroll_x + width:
                self.scroll_to(x=max(0, x - width // 2), animate=False, immediate=True)
            below = layer + 1 >= self.scroll_y + self.scrollable_content_region.height
            if below or layer < self.scroll_y:
                self.scroll_to(y=layer, animate=False, immediate=True)
        self.refresh()

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"pages-grid--{name}", default=Style())

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        snap = self.snapshot
        scroll_x, scroll_y = self.scroll_offset
        if snap is None:
            return Strip.blank(width, base)
        geo = snap.geometry
        if y == 0:
            head = self._style("header")
            segments = [Segment("page".ljust(LABEL_WIDTH), base + head)]
            segments += [Segment(str(p).center(CELL_WIDTH), base + head)
                         for p in range(geo.pages)]
            return self._crop(segments, scroll_x, width, base, frozen=1)
        layer = scroll_y + y - 1
        if layer >= geo.layers or self.stream not in geo.streams:
            return Strip.blank(width, base)
        row = snap.cells[geo.streams.index(self.stream)][layer]
        segments = [Segment(f"L{layer}".ljust(LABEL_WIDTH), base + self._style("label"))]
        cursor = self.cursor
        for cell in row:
            style = base + self._style(cell_mark(cell, snap.step))
            if not cell.resident:
                style += self._style("outside")
            if cell.read is not None and cell.read.step == snap.step:
                style += self._style("now")
            if cursor == (layer, cell.page):
                style += self._style("cursor")
            label = cell_label(cell)[: CELL_WIDTH - 1]
            segments.append(Segment(label.ljust(CELL_WIDTH - 1), style))
            segments.append(Segment(" ", base))
        return self._crop(segments, scroll_x, width, base, frozen=1)

    @staticmethod
    def _crop(segments: list[Segment], scroll_x: int, width: int, base: Style, frozen: int
              ) -> Strip:
        """Keep the first ``frozen`` segments (the row label) in place; scroll the rest."""
        label = Strip(segments[:frozen])
        rest = Strip(segments[frozen:])
        body = rest.crop_extend(scroll_x, scroll_x + max(0, width - label.cell_length), base)
        return Strip.join([label, body]).crop_extend(0, width, base)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        snap = self.snapshot
        if offset is None or snap is None or offset.y == 0 or offset.x < LABEL_WIDTH:
            return
        layer = int(self.scroll_y) + offset.y - 1
        page = (offset.x - LABEL_WIDTH + int(self.scroll_x)) // CELL_WIDTH
        if 0 <= layer < snap.geometry.layers and 0 <= page < snap.geometry.pages:
            self.post_message(CellSelected(self, self.stream, layer, page))
