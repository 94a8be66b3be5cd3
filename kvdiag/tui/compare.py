"""Two open traces of one schedule side by side on the Pages screen (no textual import).

Issue 10 §4: "two open traces of the same schedule can be compared side by side on the Pages
screen". Steps are aligned by number (:func:`aligned_step`): two captures of one scenario run
the same request schedule step for step, whatever the layout or dispatch policy. This is the
one place that decides the alignment, so a smarter one (the trace diff's, aligned by step,
layer and stream) can replace it without touching the screen.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.analysis.replay import PagesSnapshot
from kvdiag.tui.pagestext import cell_mark

MAX_COMPARED_CELLS = 50_000
"""Cells compared per step (a long context × many layers would make a step key slow)."""


@dataclass(frozen=True)
class Alignment:
    step: int
    """The other trace's step shown next to ``step`` of this one."""
    exact: bool
    """False when the other trace has no such step (it ended earlier): its last is shown."""


def aligned_step(step: int, other_last_step: int) -> Alignment:
    """The other trace's step for ``step`` of this one: the same number while it has one."""
    if 0 <= step <= other_last_step:
        return Alignment(step, True)
    return Alignment(max(0, min(step, other_last_step)), False)


def differing_cells(a: PagesSnapshot, b: PagesSnapshot, stream: int) -> int | None:
    """Cells of ``stream`` whose latest read is of a different class (exact, stale, foreign,
    ring, host, not read) in ``a`` and ``b``; None when the grids differ in shape or are too
    large to compare on every step."""
    ga, gb = a.geometry, b.geometry
    if (ga.layers, ga.pages) != (gb.layers, gb.pages) or stream not in ga.streams or \
            stream not in gb.streams or ga.layers * ga.pages > MAX_COMPARED_CELLS:
        return None
    n = 0
    for layer in range(ga.layers):
        for ca, cb in zip(a.row(stream, layer), b.row(stream, layer), strict=True):
            if cell_mark(ca, a.step) != cell_mark(cb, b.step):
                n += 1
    return n
