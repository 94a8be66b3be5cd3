"""kv_stream_adapt's partition over the steps as two plotext plots (issue 12): resident pages per
layer and ring slots, then deadline miss % and copy-engine busy %, each with the step cursor as
a vertical line. The values are the ``adapt`` events' (brief §5.3), one point per line."""

from __future__ import annotations

import numpy as np
from textual_plotext import PlotextPlot

from kvdiag.tui.digest import TelemetrySeries

PARTITION_SERIES: tuple[tuple[str, str], ...] = (
    ("resident", "resident pages/layer"), ("ring", "ring slots"))
FEEDBACK_SERIES: tuple[tuple[str, str], ...] = (
    ("miss_pct", "miss %"), ("busy_pct", "copy busy %"))


def points(series: TelemetrySeries, name: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the samples that have ``name`` (plotext cannot draw NaN)."""
    values = series.values.get(name)
    if values is None:
        return [], []
    keep = ~np.isnan(values)
    return series.step[keep].astype(float).tolist(), values[keep].tolist()


def draw(plot: PlotextPlot, series: TelemetrySeries, fields: tuple[tuple[str, str], ...],
         step: int, title: str, percent: bool = False) -> int:
    """Redraw ``plot`` with the ``fields`` that have samples and the cursor at ``step``;
    returns how many series were drawn."""
    plt = plot.plt
    plt.clear_data()
    plt.clear_figure()
    plt.title(title)
    plt.xlabel("step")
    drawn = 0
    for name, label in fields:
        x, y = points(series, name)
        if x:
            # a single sample draws no line: a marker shows it
            plt.plot(x, y, label=label, marker="braille" if len(x) > 1 else "dot")
            drawn += 1
    if percent:
        plt.ylim(0, 100)
    plt.vline(step, "red")
    plot.refresh()
    return drawn
