"""Find the next (or previous) line containing a byte string, among selected rows.

The search runs over the file's bytes with ``bytes.find``/``rfind`` (C speed), maps each hit to
its row by binary search over the line offsets, and skips rows outside the selection (a
filtered view), so it never decodes lines it does not show.
"""

from __future__ import annotations

import numpy as np

from kvdiag.analysis.linesource import LineSource


def _selected(selection: np.ndarray | None, row: int) -> bool:
    if selection is None:
        return True
    i = int(np.searchsorted(selection, row))
    return i < len(selection) and int(selection[i]) == row


def find_row(source: LineSource, offsets: np.ndarray, needle: bytes, start: int, *,
             forward: bool = True, selection: np.ndarray | None = None,
             wrap: bool = True) -> int | None:
    """The first row at or after ``start`` (``forward``) or the last row before ``start``
    whose line contains ``needle``; wraps around once when ``wrap``. None: no such row."""
    n = len(offsets)
    if n == 0 or not needle or b"\n" in needle:
        return None
    lo = int(offsets[0])
    end = source.size

    def row_of(pos: int) -> int:
        return int(np.searchsorted(offsets, pos, side="right")) - 1

    def line_end(row: int) -> int:
        return int(offsets[row + 1]) if row + 1 < n else end

    start = max(0, min(start, n - 1))
    if forward:
        spans = [(int(offsets[start]), end)]
        if wrap:
            spans.append((lo, line_end(start)))
        for a, b in spans:
            pos = a
            while pos < b:
                hit = source.find(needle, pos, b)
                if hit < 0:
                    break
                row = row_of(hit)
                if _selected(selection, row):
                    return row
                pos = line_end(row)
    else:
        spans = [(lo, int(offsets[start]))]
        if wrap:
            spans.append((int(offsets[start]), end))
        for a, b in spans:
            hi = b
            while hi > a:
                hit = source.rfind(needle, a, hi)
                if hit < 0:
                    break
                row = row_of(hit)
                if _selected(selection, row):
                    return row
                hi = int(offsets[row])
    return None
