"""Every message the viewer's widgets, screens and loader exchange."""

from __future__ import annotations

from textual.message import Message
from textual.widget import Widget

from kvdiag.tui.document import Document


class DocumentUpdated(Message):
    """The loader published a newer snapshot of document ``index``.

    Snapshots are cumulative, so a queued one may be replaced by a newer one of the same file.
    """

    def __init__(self, index: int, doc: Document) -> None:
        super().__init__()
        self.index = index
        self.doc = doc

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DocumentUpdated) and message.index == self.index


class RowHighlighted(Message):
    """The cursor of a virtual table moved to ``row`` (a position in its current rows)."""

    def __init__(self, table: Widget, row: int) -> None:
        super().__init__()
        self.table = table
        self.row = row

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RowHighlighted) and message.table is self.table

    @property
    def control(self) -> Widget:
        return self.table



class RowSelected(Message):
    """Enter (or a double click) on ``row`` of a virtual table."""

    def __init__(self, table: Widget, row: int) -> None:
        super().__init__()
        self.table = table
        self.row = row

    @property
    def control(self) -> Widget:
        return self.table



class CellSelected(Message):
    """The pages grid cursor moved to (layer, page) of ``stream``."""

    def __init__(self, grid: Widget, stream: int, layer: int, page: int) -> None:
        super().__init__()
        self.grid = grid
        self.stream = stream
        self.layer = layer
        self.page = page

    @property
    def control(self) -> Widget:
        return self.grid



class SeekStep(Message):
    """The user clicked the step scrubber at ``step``."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
