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
from kvdiag.tui.pagestext import CELL_WIDTH, cell_mark, cell_text

LABEL_WIDTH = 4


class PagesGrid(ScrollView, can_focus=False):
    """Row 0: page numbers; row 1 + layer: that layer's pages of ``stream``."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "pages-grid--header", "pages-grid--label", "pages-grid--exact", "pages-grid--stale",
        "pages-grid--foreign", "pages-grid--ring", "pages-grid--host", "pages-grid--empty",
        "pages-grid--now", "pages-grid--cursor", "pages-grid--outside",
        "pages-grid--marked-outside",
    }

    cursor: reactive[tuple[int, int] | None] = reactive(None, always_update=True)
    """(layer, page) of the selected cell, when this panel has the cursor."""

    def __init__(self, stream: int, *, id: str | None = None, doc_index: int = -1,
                 title: str = "") -> None:
        super().__init__(id=id, classes="pages-grid")
        self.stream = stream
        self.doc_index = doc_index
        """The open file whose state this grid shows (-1: the current one)."""
        self.snapshot: PagesSnapshot | None = None
        self.streamed: int | None = None
        """Layers from this one on are not streamed (plan ``streamed_layers``), when known."""
        self.outside: frozenset[int] = frozenset()
        """Pages of this stream that a mark at this step put outside the window (all layers)."""
        self.border_title = title or f"stream {stream}"
        self._styles: dict[tuple[str, ...], Style] = {}

    def show(self, snapshot: PagesSnapshot, streamed: int | None = None,
             outside: frozenset[int] = frozenset()) -> None:
        self.snapshot = snapshot
        self.streamed = streamed
        self.outside = outside
        geo = snapshot.geometry
        size = Size(LABEL_WIDTH + geo.pages * CELL_WIDTH, geo.layers + 1)
        if size != self.virtual_size:
            self.virtual_size = size
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

    def _style(self, *names: str) -> Style:
        """The combined style of a cell with these marks (combinations are few; cache them)."""
        style = self._styles.get(names)
        if style is None:
            style = self.rich_style
            for name in names:
                # partial: only what the rule sets, so "foreign" + "now" keeps the red
                style += self.get_component_rich_style(f"pages-grid--{name}", partial=True,
                                                       default=Style())
            self._styles[names] = style
        return style

    def notify_style_update(self) -> None:
        self._styles.clear()
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        snap = self.snapshot
        scroll_x, scroll_y = self.scroll_offset
        if snap is None:
            return Strip.blank(width, base)
        geo = snap.geometry
        # Only the columns on screen are built (a long context has hundreds of pages).
        first = max(0, scroll_x // CELL_WIDTH)
        stop = min(geo.pages, (scroll_x + width) // CELL_WIDTH + 2)
        shift = scroll_x - first * CELL_WIDTH
        if y == 0:
            head = self._style("header")
            segments = [Segment("page".ljust(LABEL_WIDTH), head)]
            segments += [Segment(str(p).center(CELL_WIDTH), head) for p in range(first, stop)]
            return self._crop(segments, shift, width, base)
        layer = scroll_y + y - 1
        if layer >= geo.layers or self.stream not in geo.streams:
            return Strip.blank(width, base)
        segments = [Segment(f"L{layer}".ljust(LABEL_WIDTH), self._style("label"))]
        if self.streamed is not None and layer >= self.streamed:
            # a layer the plan does not stream has no pages: say so instead of empty cells
            segments.append(Segment("not streamed: K/V in device memory",
                                    self._style("empty")))
            return self._crop(segments, 0, width, base)
        cursor = self.cursor
        step = snap.step
        edge = snap.window(layer)
        for cell in snap.row(self.stream, layer, first, stop):
            marks = [cell_mark(cell, step)]
            outside = cell.page in self.outside
            if outside:
                marks.append("marked-outside")
            if not cell.resident:
                marks.append("outside")
            if cell.read is not None and cell.read.step == step:
                marks.append("now")
            if cursor == (layer, cell.page):
                marks.append("cursor")
            segments.append(Segment(cell_text(cell, outside, cell.page == edge),
                                    self._style(*marks)))
        return self._crop(segments, shift, width, base)

    @staticmethod
    def _crop(segments: list[Segment], shift: int, width: int, base: Style) -> Strip:
        """Keep the row label (first segment) in place; the cells after it start ``shift``
        cells into the first visible column."""
        label = Strip(segments[:1])
        rest = Strip(segments[1:])
        body = rest.crop_extend(shift, shift + max(0, width - label.cell_length), base)
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
