"""Where rich output goes: a terminal gets the console's own width; anything else (a file,
a pipe, a CI log) gets each renderable at its natural width, so no identifier, path or
assert text is cut with ``…`` or wrapped mid-word (issue 11 #13).

rich sizes a console that is not a terminal at 80 columns and then folds or ellipsises table
cells to fit; measuring the renderable first and printing it on a console exactly that wide
keeps every cell whole while tables keep their layout.
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
MIN_WIDTH = 80


def is_terminal(*, stderr: bool = False) -> bool:
    return Console(stderr=stderr).is_terminal


def print_renderables(parts: Iterable[RenderableType], *, file: IO[str] | None = None) -> None:
    """Print each part: at the terminal's width on a terminal, else at its natural width."""
    out = file if file is not None else sys.stdout
    terminal = Console(file=out)
    if terminal.is_terminal:
        for part in parts:
            terminal.print(part)
        return
    measure = Console(file=out, width=MAX_WIDTH, color_system=None)
    for part in _flatten(parts):
        width = Measurement.get(measure, measure.options, part).maximum
        Console(file=out, width=max(MIN_WIDTH, min(width, MAX_WIDTH)), color_system=None,
                highlight=False).print(part, crop=False)


def _flatten(parts: Iterable[RenderableType]) -> Iterator[RenderableType]:
    """Groups opened up, so that each table is as wide as itself, not as the widest part."""
    for part in parts:
        if isinstance(part, Group):
            yield from _flatten(part.renderables)
        else:
            if isinstance(part, Table):
                _unwrapped(part)
            yield part


def _unwrapped(table: Table) -> None:
    """Every column at its natural width and never wrapped: ratios and expansion only share
    out a terminal's width, and off a terminal there is none to share."""
    table.expand = False
    for column in table.columns:
        column.ratio = None
        column.no_wrap = True
        column.overflow = "ignore"
