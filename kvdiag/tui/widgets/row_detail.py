"""The line under a table that shows the selected row's cells the table cut, whole.

A table keeps one line per row at any width; what does not fit its column (a log line, a path,
a C++ name) is cut with ``…``. This pane repeats those cells in full, wrapped, so nothing is
only ever seen cut (issue 16 #6). It scrolls when a cell is longer than the pane is tall.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kvdiag.tui.widgets.virtual_table import VirtualTable


class RowDetail(VerticalScroll, can_focus=False):
    """``follow(table)`` after the table's cursor moves or its width changes."""

    def compose(self) -> ComposeResult:
        yield Static(classes="row-detail--text")

    def follow(self, table: VirtualTable) -> None:
        self.show(table.cut_cells())

    def show(self, cells: list[tuple[str, Text]]) -> None:
        lines: list[Text] = []
        for label, text in cells:
            line = Text(f"{label}: " if label else "", style="bold")
            line.append_text(text)
            lines.append(line)
        self.set_class(not lines, "-empty")
        if self.is_mounted and self.children:
            self.query_one(".row-detail--text", Static).update(Group(*lines))
