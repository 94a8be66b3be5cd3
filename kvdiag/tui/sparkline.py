"""Block-character sparklines with a cursor column (rich Text; no textual import)."""

from __future__ import annotations

import warnings

import numpy as np
from rich.style import Style
from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"


def resample(values: np.ndarray, width: int) -> np.ndarray:
    """``width`` buckets of consecutive samples, each the bucket's maximum (NaN if empty)."""
    n = len(values)
    if n == 0 or width <= 0:
        return np.full(max(width, 0), np.nan)
    edges = np.linspace(0, n, min(width, n) + 1).astype(np.int64)
    out = np.full(len(edges) - 1, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN bucket stays NaN
        for i in range(len(edges) - 1):
            lo, hi = edges[i], max(edges[i + 1], edges[i] + 1)
            out[i] = np.nanmax(values[lo:hi])
    return out


def column_of(sample: int, n: int, width: int) -> int:
    """The bucket that sample ``sample`` of ``n`` falls in, at ``width`` buckets."""
    buckets = min(width, n)
    if buckets <= 0:
        return 0
    return min(buckets - 1, sample * buckets // max(n, 1))


def sparkline(values: np.ndarray, width: int, cursor: int | None = None, *,
              style: Style | str = "", cursor_style: Style | str = "reverse",
              lo: float | None = None, hi: float | None = None) -> Text:
    """Samples as one line of block characters scaled between ``lo`` and ``hi`` (their range by
    default); the bucket holding sample ``cursor`` is drawn in ``cursor_style``."""
    buckets = resample(np.asarray(values, dtype=np.float64), width)
    finite = buckets[~np.isnan(buckets)]
    text = Text(style=style)
    if finite.size == 0:
        return Text("no samples", style="dim")
    low = float(finite.min()) if lo is None else lo
    high = float(finite.max()) if hi is None else hi
    span = high - low
    cursor_col = column_of(cursor, len(values), width) if cursor is not None else -1
    for i, v in enumerate(buckets):
        if np.isnan(v):
            ch = " "
        elif span <= 0:
            ch = BLOCKS[len(BLOCKS) // 2]
        else:
            level = int((float(v) - low) / span * (len(BLOCKS) - 1) + 0.5)
            ch = BLOCKS[max(0, min(len(BLOCKS) - 1, level))]
        text.append(ch, style=cursor_style if i == cursor_col else "")
    return text
