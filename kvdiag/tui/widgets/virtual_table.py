"""A table that draws only the rows on screen (Textual's Line API), for millions of rows.

The rows come from a :class:`RowSource`: a length and a function from row position to cells.
Nothing per row exists until it scrolls into view; a small cache keeps recently drawn rows.
Colours come from the stylesheet through component classes: one per row *mark* (``abort``,
``foreign``, ...) plus the header and the cursor.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvdiag.tui.messages import RowHighlighted, RowSelected
from kvdiag.tui.rowsource import Cells, Column, EmptySource, RowSource

MARKS: tuple[str, ...] = (
    "abort", "warn", "foreign", "stale", "fits-false", "diverged", "corrupt", "crash",
    "backtrace", "boot", "slot", "stream", "fits", "problem", "match", "inapp", "system",
    "critical", "error", "warning", "info", "outside",
)
_CACHE = 512
MAX_CELL = 4096


class VirtualTable(ScrollView, can_focus=True):
    """Header line, then rows ``[scroll_y, scroll_y + height - 1)`` of the source."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "virtual-table--header", "virtual-table--cursor",
        *(f"virtual-table--{m}" for m in MARKS),
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    cursor: reactive[int] = reactive(0, always_update=True)

    def __init__(self, columns: Sequence[Column], *, min_fill: int = 30,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.columns = tuple(columns)
        self.min_fill = min_fill
        self.source: RowSource = EmptySource()
        self._cache: OrderedDict[int, Strip] = OrderedDict()
        self._cache_width = -1

    # -- data ---------------------------------------------------------------------------

    def set_source(self, source: RowSource, cursor: int | None = None) -> None:
        """Show ``source``; keep the cursor where it was unless ``cursor`` is given."""
        self.source = source
        self._cache.clear()
        n = len(source)
        self._resize_virtual()
        target = self.cursor if cursor is None else cursor
        self.cursor = max(0, min(target, n - 1)) if n else 0
        self._scroll_to_cursor(center=cursor is not None)
        self.refresh()

    def invalidate(self) -> None:
        """Drop cached rows (their content or marks changed)."""
        self._cache.clear()
        self.refresh()

    @property
    def row_count(self) -> int:
        return len(self.source)

    def _fill_width(self) -> int:
        fixed = sum(c.width + 1 for c in self.columns if c.width)
        return max(self.min_fill, self.scrollable_content_region.width - fixed)

    def _total_width(self) -> int:
        return sum((c.width or self._fill_width()) + 1 for c in self.columns)

    def _resize_virtual(self) -> None:
        self.virtual_size = Size(self._total_width(), len(self.source) + 1)

    def on_resize(self, event: events.Resize) -> None:
        self._cache.clear()
        self._resize_virtual()

    # -- drawing ------------------------------------------------------------------------

    def _cells_text(self, cells: Cells, style: Style | None = None) -> Text:
        line = Text(no_wrap=True, overflow="crop")
        fill = self._fill_width()
        for col, cell in zip(self.columns, cells, strict=False):
            width = col.width or fill
            # a cell is at most a screen wide: cut long text before laying it out
            if isinstance(cell, Text):
                t = cell[:MAX_CELL] if len(cell) > MAX_CELL else cell.copy()
            else:
                t = Text(str(cell)[:MAX_CELL])
            t.no_wrap = True
            if col.keep == "end" and t.cell_len > width > 1:
                t = Text("…") + t[len(t) - (width - 1):]
            t.truncate(width, overflow="ellipsis")
            t.align(col.justify, width)
            line.append_text(t)
            line.append(" ")
        if style is not None:
            line.stylize(style)
        return line

    def _strip(self, text: Text, base: Style) -> Strip:
        segments = list(text.render(self.app.console, end=""))
        return Strip(Segment.apply_style(segments, base), text.cell_len)

    def _row_strip(self, i: int) -> Strip:
        width = self.scrollable_content_region.width
        if width != self._cache_width:
            self._cache.clear()
            self._cache_width = width
        strip = self._cache.get(i)
        if strip is None:
            try:
                cells, mark = self.source.row(i)
            except Exception as exc:  # a row that cannot be drawn must not take the app down
                cells, mark = (("?",) * (len(self.columns) - 1) + (f"<{exc}>",)), "corrupt"
            base = self.rich_style
            if mark:
                base = base + self.get_component_rich_style(f"virtual-table--{mark}",
                                                            default=Style())
            strip = self._strip(self._cells_text(cells), base)
            self._cache[i] = strip
            if len(self._cache) > _CACHE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(i)
        return strip

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("virtual-table--header")
            strip = self._strip(self._cells_text([c.label for c in self.columns]), base + header)
            return strip.crop_extend(scroll_x, scroll_x + width, base + header)
        i = scroll_y + y - 1
        if i >= len(self.source):
            return Strip.blank(width, base)
        strip = self._row_strip(i)
        if i == self.cursor and self.row_count:
            cursor_style = self.get_component_rich_style("virtual-table--cursor")
            strip = Strip(Segment.apply_style(list(strip), post_style=cursor_style),
                          strip.cell_length)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def cut_cells(self, i: int | None = None) -> list[tuple[str, Text]]:
        """The cells of row ``i`` (default: the cursor's) that the table does not show whole,
        whole: longer than their column, or in a column scrolled out of view. A detail line
        under the table shows them (``RowDetail``)."""
        i = self.cursor if i is None else i
        if not 0 <= i < self.row_count:
            return []
        try:
            cells, _mark = self.source.row(i)
        except Exception:  # drawn as a corrupt row already; nothing more to show
            return []
        fill = self._fill_width()
        left = int(self.scroll_x)
        right = left + self.scrollable_content_region.width
        out: list[tuple[str, Text]] = []
        x = 0
        for col, cell in zip(self.columns, cells, strict=False):
            width = col.width or fill
            text = cell if isinstance(cell, Text) else Text(str(cell))
            shown = min(width, text.cell_len)
            if text.cell_len > width or (shown and (x < left or x + shown > right)):
                out.append((col.label, text))
            x += width + 1
        return out

    # -- cursor -------------------------------------------------------------------------

    @property
    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def _scroll_to_cursor(self, center: bool = False) -> None:
        top = int(self.scroll_y)
        page = self._page
        c = self.cursor
        if center and not top <= c < top + page:
            self.scroll_to(y=max(0, c - page // 2), animate=False, immediate=True)
        elif c < top:
            self.scroll_to(y=c, animate=False, immediate=True)
        elif c >= top + page:
            self.scroll_to(y=c - page + 1, animate=False, immediate=True)

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh()
        if self.row_count:
            self.post_message(RowHighlighted(self, new))

    def go_to(self, row: int, center: bool = True) -> None:
        n = self.row_count
        if n:
            self.cursor = max(0, min(row, n - 1))
            self._scroll_to_cursor(center=center)

    def action_move(self, delta: int) -> None:
        self.go_to(self.cursor + delta, center=False)

    def action_page(self, direction: int) -> None:
        self.go_to(self.cursor + direction * self._page, center=False)

    def action_edge(self, end: int) -> None:
        self.go_to(self.row_count - 1 if end else 0, center=False)

    def action_select(self) -> None:
        if self.row_count:
            self.post_message(RowSelected(self, self.cursor))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        row = int(self.scroll_y) + offset.y - 1
        if 0 <= row < self.row_count:
            self.focus()
            self.go_to(row, center=False)
            if event.chain >= 2:
                self.post_message(RowSelected(self, row))
