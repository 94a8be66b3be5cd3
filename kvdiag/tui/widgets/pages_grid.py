"""The layer × page grid of one stream at one step (Line API: wide grids scroll)."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvdiag.analysis.replay import PagesSnapshot
from kvdiag.tui.messages import CellSelected
from kvdiag.tui.pagestext import CELL_WIDTH, cell_mark, cell_text

LABEL_WIDTH = 4
Line = tuple[str, int, int, int, tuple[tuple[str, tuple[str, ...]], ...]]
"""What one line of the grid shows: kind (``head``, ``layer``, ``blank``), width, the columns
scrolled into the first cell, the layer, and per cell its text and style names."""
HEADER = ("header",)
UNSTREAMED = (("not streamed: K/V in device memory", ("empty",)),)


class PagesGrid(ScrollView, can_focus=False):
    """Row 0: page numbers; row 1 + layer: that layer's pages of ``stream``."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "pages-grid--header", "pages-grid--label", "pages-grid--exact", "pages-grid--stale",
        "pages-grid--foreign", "pages-grid--ring", "pages-grid--host", "pages-grid--empty",
        "pages-grid--now", "pages-grid--cursor", "pages-grid--outside",
        "pages-grid--marked-outside",
    }

    cursor: reactive[tuple[int, int] | None] = reactive(None, always_update=True, repaint=False)
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
        self._drawn: dict[int, Line] = {}
        """Per line on screen, what was last drawn there."""

    def show(self, snapshot: PagesSnapshot, streamed: int | None = None,
             outside: frozenset[int] = frozenset()) -> None:
        self.snapshot = snapshot
        self.streamed = streamed
        self.outside = outside
        geo = snapshot.geometry
        size = Size(LABEL_WIDTH + geo.pages * CELL_WIDTH, geo.layers + 1)
        if size != self.virtual_size:
            self.virtual_size = size
        self._refresh_changed()

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
        if new != old:
            self._refresh_changed()

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
        self._drawn.clear()
        super().notify_style_update()

    def _line(self, y: int, width: int) -> Line:
        """What line ``y`` shows at content ``width``, as a value: equal values draw equal
        lines."""
        snap = self.snapshot
        if snap is None:
            return ("blank", width, 0, 0, ())
        scroll_x, scroll_y = self.scroll_offset
        geo = snap.geometry
        # Only the columns on screen are built (a long context has hundreds of pages).
        first = max(0, scroll_x // CELL_WIDTH)
        stop = min(geo.pages, (scroll_x + width) // CELL_WIDTH + 2)
        shift = scroll_x - first * CELL_WIDTH
        if y == 0:
            return ("head", width, shift, 0,
                    tuple((str(p).center(CELL_WIDTH), HEADER) for p in range(first, stop)))
        layer = scroll_y + y - 1
        if layer >= geo.layers or self.stream not in geo.streams:
            return ("blank", width, 0, 0, ())
        if self.streamed is not None and layer >= self.streamed:
            # a layer the plan does not stream has no pages: say so instead of empty cells
            return ("layer", width, 0, layer, UNSTREAMED)
        cursor = self.cursor
        step = snap.step
        edge = snap.window(layer)
        cells: list[tuple[str, tuple[str, ...]]] = []
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
            cells.append((cell_text(cell, outside, cell.page == edge), tuple(marks)))
        return ("layer", width, shift, layer, tuple(cells))

    def _draw(self, line: Line) -> Strip:
        """The strip of a line described by :meth:`_line`."""
        kind, width, shift, layer, cells = line
        base = self._style()
        if kind == "blank":
            return Strip.blank(width, base)
        label = (Segment("page".ljust(LABEL_WIDTH), self._style(*HEADER)) if kind == "head"
                 else Segment(f"L{layer}".ljust(LABEL_WIDTH), self._style("label")))
        return self._crop(label, [Segment(text, self._style(*marks)) for text, marks in cells],
                          shift, width, base)

    def render_line(self, y: int) -> Strip:
        line = self._drawn[y] = self._line(y, self.scrollable_content_region.width)
        return self._draw(line)

    def _refresh_changed(self) -> None:
        """Ask for a repaint of the lines on screen whose content differs from what was drawn
        there (scrubbing one step changes a few lines of a decode trace's grid, and a repaint
        of a line costs Textual more than working out what it shows)."""
        width, height = self.scrollable_content_region.size
        start = -1
        for y in range(height + 1):
            changed = y < height and self._drawn.get(y) != self._line(y, width)
            if changed and start < 0:
                start = y
            elif not changed and start >= 0:
                self.refresh(Region(0, start, width, y - start))
                start = -1

    @staticmethod
    def _crop(label: Segment, cells: list[Segment], shift: int, width: int, base: Style
              ) -> Strip:
        """Keep the row label in place; the cells after it start ``shift`` cells into the
        first visible column. The label and each cell are one character a cell wide (ASCII,
        ``·`` and ``│``), so the line is cut by slicing their text."""
        room = max(0, width - len(label.text))
        out = [label] if room else [Segment(label.text[:width], label.style)]
        for seg in cells:
            if room <= 0:
                break
            text = seg.text[shift:shift + room] if shift else seg.text[:room]
            shift = max(0, shift - len(seg.text))
            if text:
                out.append(Segment(text, seg.style))
                room -= len(text)
        if room > 0:
            out.append(Segment(" " * room, base))
        return Strip(out, width)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        snap = self.snapshot
        if offset is None or snap is None or offset.y == 0 or offset.x < LABEL_WIDTH:
            return
        layer = int(self.scroll_y) + offset.y - 1
        page = (offset.x - LABEL_WIDTH + int(self.scroll_x)) // CELL_WIDTH
        if 0 <= layer < snap.geometry.layers and 0 <= page < snap.geometry.pages:
            self.post_message(CellSelected(self, self.stream, layer, page))
