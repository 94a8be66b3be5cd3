"""Where rich output goes: a terminal gets the console's own width; anything else (a file, a
pipe, a CI log) gets a readable width, ``READABLE_WIDTH`` columns, and never loses a character
(issue 11 #13, issue 16 #7).

rich sizes a console that is not a terminal at 80 columns and then ellipsises table cells to
fit, which cut identifiers; printing every renderable at its natural width instead kept them
but made tables hundreds of columns wide. Now each part is printed at ``READABLE_WIDTH``
columns, or at its minimum width when that is wider (rich measures a text's minimum as its
longest word, a table's as the sum of its columns' minimums), with every table cell set to
fold rather than ellipsise: long prose wraps between words, and no word, path or identifier is
cut or split.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table

# Bounds the measuring console only; displayed input is capped per field (kvdiag.report.text)
MAX_WIDTH = 1 << 20
#: Columns of output that is not a terminal, unless one word needs more.
READABLE_WIDTH = 120


def is_terminal(*, stderr: bool = False) -> bool:
    return Console(stderr=stderr).is_terminal


def print_renderables(parts: Iterable[RenderableType], *, file: IO[str] | None = None) -> None:
    """Print each part: at the terminal's width on a terminal, else at ``READABLE_WIDTH``
    columns, wider only where one word needs it, nothing cut."""
    out = file if file is not None else sys.stdout
    terminal = Console(file=out)
    if terminal.is_terminal:
        for part in parts:
            terminal.print(part)
        return
    measure = Console(file=out, width=MAX_WIDTH, color_system=None)
    for part in _flatten(parts):
        if isinstance(part, Table):
            width = _fit(part, measure, READABLE_WIDTH)
        else:
            need = Measurement.get(measure, measure.options, part)
            width = min(need.maximum, max(READABLE_WIDTH, need.minimum))
        Console(file=out, width=max(1, min(width, MAX_WIDTH)), color_system=None,
                highlight=False).print(part, crop=False)


def _flatten(parts: Iterable[RenderableType]) -> Iterator[RenderableType]:
    """Groups opened up, so that each part is as wide as itself, not as the widest part."""
    for part in parts:
        if isinstance(part, Group):
            yield from _flatten(part.renderables)
        else:
            yield part


def _fit(table: Table, console: Console, width: int) -> int:
    """Give ``table`` fixed column widths that fit ``width`` columns where its longest words
    allow, and return the width it then needs. Each column gets at least its longest word (its
    longest cell in a ``no_wrap`` column, whose header alone may then wrap) and shares what is
    left in proportion to how much more it could use; rich's own shrinking (ratios, then an
    even cut) would split words."""
    table.expand = False
    ranges: list[tuple[int, int]] = []
    for column in table.columns:
        column.ratio = None
        if column.overflow in ("ellipsis", "crop"):
            column.overflow = "fold"
        head = Measurement.get(console, console.options, column.header)
        cells = [Measurement.get(console, console.options, cell) for cell in column.cells]
        hi = max([head.maximum, *(m.maximum for m in cells)])
        if column.no_wrap:
            # its cells stay whole on one line; its header may wrap between words
            lo = max([head.minimum, *(m.maximum for m in cells)])
            column.no_wrap = False
        else:
            lo = max([head.minimum, *(m.minimum for m in cells)])
        ranges.append((lo, hi))
    overhead = Measurement.get(console, console.options, table).maximum - sum(
        hi for _lo, hi in ranges)
    room = width - overhead
    if room >= sum(hi for _lo, hi in ranges):
        return width
    slack = max(0, room - sum(lo for lo, _hi in ranges))
    spread = sum(hi - lo for lo, hi in ranges) or 1
    widths = [lo + (hi - lo) * slack // spread for lo, hi in ranges]
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w
    return max(width, sum(widths) + overhead)
