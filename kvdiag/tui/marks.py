"""Dirty marks outside the resident window, for the Pages screen (no textual import).

A format 1.1 ``mark`` event (docs/trace-format.md, "mark") lists in ``outside`` the
``[stream, page]`` pairs its rows fell in that lie outside every layer's resident window: the
mark refreshes no resident copy there. In the shared layout the stream is null and the page is
the *global* page, global row / 256 (kv-stream-domain.md §4.3: mark_dirty_rows divides global
rows, which include stream × kv_size), so global page g is page g mod pages_per_stream of
stream g div pages_per_stream: the page whose rows were written, whose resident copy (keyed by
the in-view page alone) the mark never reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.replay import PagesGeometry
from kvdiag.analysis.trace_index import KIND_CODE, TraceIndex, decode_event
from kvdiag.model import events as ev

MARK = KIND_CODE["mark"]
MAX_MARKS_PER_STEP = 64
"""A step has one mark per ubatch: more than this is a damaged or hostile file; the rest are
counted, not decoded."""
MAX_OUTSIDE = 4096
"""Outside pairs kept per step (a grid has a few hundred pages per stream)."""


@dataclass(frozen=True)
class OutsideMark:
    """One ``outside`` pair of a mark, placed on the grid."""

    seq: int
    stream: int | None
    """As recorded: None in the shared layout."""
    page: int
    """As recorded: the global page in the shared layout."""
    grid_stream: int | None
    grid_page: int | None
    """The grid cell it falls in (None when the page lies beyond the grid)."""

    def words(self) -> str:
        if self.stream is None:
            where = f"global page {self.page}"
            if self.grid_stream is not None:
                where += f" (stream {self.grid_stream} page {self.grid_page})"
        else:
            where = f"stream {self.stream} page {self.page}"
        return where


@dataclass(frozen=True)
class StepMarks:
    outside: tuple[OutsideMark, ...] = ()
    marks: int = 0
    """mark events at the step (all of them, decoded or not)."""
    undecoded: int = 0

    def cells(self, stream: int) -> frozenset[int]:
        """Pages of ``stream``'s grid that a mark at this step put outside the window."""
        return frozenset(m.grid_page for m in self.outside
                         if m.grid_stream == stream and m.grid_page is not None)

    def at(self, stream: int, page: int) -> OutsideMark | None:
        return next((m for m in self.outside
                     if m.grid_stream == stream and m.grid_page == page), None)


def place(geo: PagesGeometry, stream: int | None, page: int) -> tuple[int | None, int | None]:
    """The grid cell of an ``outside`` pair (see the module docstring)."""
    if stream is None:
        if page < 0 or geo.pages <= 0:
            return None, None
        s, p = divmod(page, geo.pages)
        return (s, p) if s in geo.streams else (None, None)
    return (stream, page) if stream in geo.streams and 0 <= page < geo.pages else (None, None)


def step_marks(index: TraceIndex, source: LineSource, geo: PagesGeometry, step: int
               ) -> StepMarks:
    """The outside-the-window marks of ``step``."""
    lo, hi = index.step_rows(step)
    kinds = index.columns["kind"][lo:hi]
    rows = lo + np.flatnonzero(kinds == MARK)
    outside: list[OutsideMark] = []
    for r in rows[:MAX_MARKS_PER_STEP]:
        event = decode_event(source.line(int(index.columns["offset"][r])))
        if not isinstance(event, ev.Mark):
            continue
        for stream, page in event.outside[:max(0, MAX_OUTSIDE - len(outside))]:
            gs, gp = place(geo, stream, page)
            outside.append(OutsideMark(event.seq, stream, page, gs, gp))
    return StepMarks(tuple(outside), len(rows), max(0, len(rows) - MAX_MARKS_PER_STEP))
