"""Block-character sparklines with a cursor column (rich Text; no textual import)."""

from __future__ import annotations

import warnings

import numpy as np
from rich.style import Style
from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"


def _buckets(n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample range ``[lo, hi)`` of each of ``width`` columns; with fewer samples than columns
    a sample spans several columns (``hi = lo + 1``)."""
    lo = (np.arange(width) * n) // width
    hi = np.maximum(((np.arange(1, width + 1) * n) // width), lo + 1)
    return lo, hi


def resample(values: np.ndarray, width: int) -> np.ndarray:
    """``width`` columns over the samples, each the mean of its samples (NaN if all NaN).

    The mean, not the maximum: with many samples per column a maximum climbs to the global
    peak wherever the signal oscillates, and the line goes flat; the table beside the plot
    gives the extremes."""
    n = len(values)
    if n == 0 or width <= 0:
        return np.full(max(width, 0), np.nan)
    lo, hi = _buckets(n, width)
    out = np.full(width, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column stays NaN
        for i in range(width):
            out[i] = np.nanmean(values[lo[i] : hi[i]])
    return out


def cursor_columns(sample: int, n: int, width: int) -> range:
    """The columns that show sample ``sample`` of ``n``."""
    if n <= 0 or width <= 0:
        return range(0)
    lo, hi = _buckets(n, width)
    cols = np.flatnonzero((lo <= sample) & (sample < hi))
    return range(int(cols[0]), int(cols[-1]) + 1) if cols.size else range(0)


def sparkline(values: np.ndarray, width: int, cursor: int | None = None, *,
              style: Style | str = "", cursor_style: Style | str = "reverse",
              lo: float | None = None, hi: float | None = None) -> Text:
    """Samples as one line of block characters scaled between ``lo`` and ``hi`` (their range by
    default); the columns showing sample ``cursor`` are drawn in ``cursor_style``."""
    values = np.asarray(values, dtype=np.float64)
    buckets = resample(values, width)
    finite = buckets[~np.isnan(buckets)]
    text = Text(style=style)
    if finite.size == 0:
        return Text("no samples", style="dim")
    low = float(finite.min()) if lo is None else lo
    high = float(finite.max()) if hi is None else hi
    span = high - low
    marked = cursor_columns(cursor, len(values), width) if cursor is not None else range(0)
    for i, v in enumerate(buckets):
        if np.isnan(v):
            ch = " "
        elif span <= 0:
            ch = BLOCKS[len(BLOCKS) // 2]
        else:
            level = int((float(v) - low) / span * (len(BLOCKS) - 1) + 0.5)
            ch = BLOCKS[max(0, min(len(BLOCKS) - 1, level))]
        text.append(ch, style=cursor_style if i in marked else "")
    return text
