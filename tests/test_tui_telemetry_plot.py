"""Telemetry on an adaptive capture (issue 12): plotext plots of the partition (resident
pages/layer, ring slots) and of misses and copy busy over the steps, with the step cursor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual_plotext import PlotextPlot

from kvdiag.tui.app import KvdiagApp
from tests.conftest import Capture
from tests.test_tui_pilot import drive, show, text

ADAPTIVE = ("--adaptive", "--steps", "6", "--prompt-tokens", "1200")


def partition_lines(path: Path) -> list[dict[str, Any]]:
    """The adapt and repartition lines, in file order."""
    with path.open() as f:
        return [e for e in map(json.loads, f) if e.get("kind") in ("adapt", "repartition")]


def after(e: dict[str, Any], name: str) -> float:
    """An adapt line's value, or the value after a repartition."""
    v = e[name]
    return float(v[1] if isinstance(v, list) else v)


def series(plot: PlotextPlot) -> dict[str, tuple[list[float], list[float]]]:
    m = plot.plt.monitor
    return {label: (list(x), list(y)) for label, x, y in zip(m.label, m.x, m.y, strict=True)}


def cursor(plot: PlotextPlot) -> list[float]:
    """x of the vertical lines on the plot's lower axis (the step cursor)."""
    return list(plot.plt.monitor.vcoord[0])


def test_the_partition_is_plotted_with_the_cursor(captured: Capture) -> None:
    """GIVEN a 4 MiB adaptive capture (resident 1 → 0, ring 4 → 8 at step 4) THEN the plots hold
    the resident, ring and copy busy of every adapt line (and the partition after the
    repartition) by step, the miss ratio per line, and the cursor line moves with the step."""
    path, code = captured("pool-pressure", "shared", "membership", *ADAPTIVE, "--stage-mib", "4")
    assert code == 0
    lines = partition_lines(path)
    steps = [float(e["step"]) for e in lines]
    assert [e["kind"] for e in lines].count("repartition") == 1 and len(lines) >= 7

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "6", "home")
        partition = app.screen.query_one("#partition-plot", PlotextPlot)
        feedback = app.screen.query_one("#feedback-plot", PlotextPlot)
        assert partition.display and feedback.display
        got = series(partition)
        assert got["resident pages/layer"] == (steps, [after(e, "resident") for e in lines])
        assert got["ring slots"] == (steps, [after(e, "ring") for e in lines])
        assert got["resident pages/layer"][1][:6] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
        assert got["ring slots"][1][3:6] == [4.0, 8.0, 8.0]
        fb = series(feedback)
        assert fb["copy busy %"] == (steps, [float(e["busy_pct"]) for e in lines])
        miss_steps, misses = fb["miss %"]
        assert miss_steps == steps and misses == [100.0] * len(lines)  # every deadline missed
        assert cursor(partition) == cursor(feedback) == [0]
        await show(pilot, "right", "right")
        assert cursor(partition) == cursor(feedback) == [2]
        words = " ".join(text(app).split())
        assert "KV partition: resident pages/layer, ring slots" in words
        assert "deadline miss %, copy busy %" in words

    drive([path], script, size=(120, 50))


def test_no_plots_without_adapt_lines(captured: Capture) -> None:
    path, _ = captured("pool-pressure", "shared", "membership", "--steps", "2")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "6")
        plots = list(app.screen.query(PlotextPlot))
        assert len(plots) == 2 and not any(p.display for p in plots)
        assert "no telemetry in this trace" in text(app)

    drive([path], script)
