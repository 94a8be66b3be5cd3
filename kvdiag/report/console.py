"""Where rich output goes: a terminal gets the console's own width; anything else (a file,
a pipe, a CI log) gets each renderable at its natural width, so no identifier, path or
assert text is cut with ``…`` or wrapped mid-word (issue 11 #13).

rich sizes a console that is not a terminal at 80 columns and then folds or ellipsises table
cells to fit; measuring the renderable first and printing it on a console exactly that wide
keeps every cell whole while tables keep their layout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO

from rich.console import Console, RenderableType
from rich.measure import Measurement

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
    for part in parts:
        width = Measurement.get(measure, measure.options, part).maximum
        Console(file=out, width=max(MIN_WIDTH, min(width, MAX_WIDTH)), color_system=None,
                highlight=False).print(part, crop=False)
