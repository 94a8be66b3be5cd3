"""What a virtual table draws: columns, and a source of rows by position (no textual import)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rich.text import Text

Cells = Sequence[str | Text]


@dataclass(frozen=True)
class Column:
    label: str
    width: int
    """Cells; 0 takes the width left over."""
    justify: Literal["left", "right"] = "left"
    keep: Literal["start", "end"] = "start"
    """Which end of a cell too long for the column stays: a path keeps its end (the file)."""


class RowSource(Protocol):
    def __len__(self) -> int: ...

    def row(self, i: int) -> tuple[Cells, str]:
        """Cells of row ``i`` and its mark (``""`` for none)."""
        ...


class EmptySource:
    def __len__(self) -> int:
        return 0

    def row(self, i: int) -> tuple[Cells, str]:
        raise IndexError(i)
