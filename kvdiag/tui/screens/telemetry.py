"""6 Telemetry: kv_stream_adapt's partition (resident pages/layer, ring slots; miss and copy
busy %) as plotext plots over the steps, its values at the step in a table, and NVML samples as
sparklines, all with the cursor at the step."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static
from textual_plotext import PlotextPlot

from kvdiag.tui.digest import TelemetrySeries
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.navigation import Target
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.sparkline import sparkline
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.partition_plot import FEEDBACK_SERIES, PARTITION_SERIES, draw

# (field, label, scale to the unit shown, unit, fixed scale or None for the samples' range)
Plot = tuple[str, str, float, str, tuple[float, float] | None]
PLOTS: tuple[Plot, ...] = (
    ("mem_used", "VRAM used", 1 / (1 << 30), "GiB", None),
    ("pcie_rx_kbps", "PCIe rx", 1 / 1000, "MB/s", None),
    ("pcie_tx_kbps", "PCIe tx", 1 / 1000, "MB/s", None),
    ("gpu_util", "GPU util", 1.0, "%", (0.0, 100.0)),
    ("mem_util", "mem util", 1.0, "%", (0.0, 100.0)),
    ("sm_clock_mhz", "SM clock", 1.0, "MHz", None),
    ("mem_clock_mhz", "mem clock", 1.0, "MHz", None),
    ("temperature_c", "temp", 1.0, "°C", None),
    ("power_mw", "power", 1 / 1000, "W", None),
)
PARTITION_PLOTS: tuple[Plot, ...] = (
    ("resident", "resident/layer", 1.0, "pages", None),
    ("ring", "ring slots", 1.0, "slots", None),
    ("miss_pct", "miss", 1.0, "%", None),
    ("busy_pct", "copy busy", 1.0, "%", (0.0, 100.0)),
    ("active", "active", 1.0, "tokens", None),
    ("peak", "ring peak", 1.0, "slots", None),
)
"""kv_stream_adapt's partition: an ``adapt`` event per trace line, a ``repartition`` per
change (brief §1.10, §5.3; ``kvdiag import`` turns a log's lines into them)."""
_COUNTS = frozenset({"pages", "slots", "tokens"})
NO_TELEMETRY = ("no telemetry in this trace: samples come from NVML during a GPU capture "
                "(the NumPy executor, or a machine without NVML, records none)")


def _fmt(v: float, unit: str = "") -> str:
    if np.isnan(v):
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 or unit in _COUNTS else f"{v:.2f}"


def series_table(series: TelemetrySeries, plots: tuple[Plot, ...], step: int, width: int,
                 cursor_style: Style | str = "reverse", title: str = "over the capture",
                 label_width: int = 12) -> Table:
    """One row per plotted field with samples: sparkline over the trace, value at the step."""
    present = set(series.present())
    sample = series.sample_at_step(step)
    spark_w = max(10, width - label_width - 26 - 6)
    table = Table(box=None, expand=False, pad_edge=False, show_header=True,
                  header_style="bold")
    table.add_column("metric", width=label_width, no_wrap=True)
    table.add_column(f"{title} ({series.n} samples)", width=spark_w, no_wrap=True)
    table.add_column("at step", width=12, justify="right", no_wrap=True)
    table.add_column("min – max", width=14, justify="right", no_wrap=True)
    for name, label, scale, unit, fixed in plots:
        if name not in present:
            continue
        vals = series.values[name] * scale
        lo, hi = fixed if fixed is not None else (None, None)
        line = sparkline(vals, spark_w, sample, cursor_style=cursor_style, lo=lo, hi=hi)
        now = vals[sample] if sample is not None else np.nan
        finite = vals[~np.isnan(vals)]
        table.add_row(label, line, f"{_fmt(float(now), unit)} {unit}",
                      f"{_fmt(float(finite.min()), unit)} – {_fmt(float(finite.max()), unit)}")
    return table


def telemetry_table(series: TelemetrySeries, step: int, width: int,
                    cursor_style: Style | str = "reverse") -> Table:
    """One row per field NVML provided: sparkline over the capture, value at the step."""
    table = series_table(series, PLOTS, step, width, cursor_style)
    if "mem_total" in series.present():
        total = series.values["mem_total"]
        table.add_row("VRAM total", "", f"{_fmt(float(np.nanmax(total)) / (1 << 30))} GiB", "")
    return table


def partition_table(series: TelemetrySeries, step: int, width: int,
                    cursor_style: Style | str = "reverse") -> Table:
    """kv_stream_adapt's partition over the trace: resident pages/layer, ring slots, miss %
    and copy busy % where the lines recorded them."""
    return series_table(series, PARTITION_PLOTS, step, width, cursor_style,
                        title="kv_stream_adapt", label_width=14)


def _where(series: TelemetrySeries, sample: int | None) -> str:
    if sample is None:
        return ""
    return (f"sample {sample + 1} of {series.n} (step {int(series.step[sample])}, "
            f"t {series.t_ns[sample] / 1e9:.3f} s)")


class TelemetryScreen(KvScreen):
    MODE = "telemetry"
    AUTO_FOCUS = "#telemetry-scroll"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Step back", key_display="←"),
        Binding("right", "step(1)", "Step", key_display="→"),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"telemetry--cursor"}

    def compose_body(self) -> ComposeResult:
        yield Static(id="telemetry-info")
        with VerticalScroll(id="telemetry-scroll"):
            yield PlotextPlot(id="partition-plot", classes="adapt-plot")
            yield PlotextPlot(id="feedback-plot", classes="adapt-plot")
            yield Static(id="telemetry")

    def show_doc(self, doc: Document, old: Document | None) -> None:
        self.redraw()

    def on_resize(self, event: events.Resize) -> None:
        self.redraw()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.redraw()

    def series(self) -> TelemetrySeries | None:
        doc = self.doc
        if isinstance(doc, TraceDoc) and doc.digest is not None:
            return doc.digest.telemetry
        return None

    def partition(self) -> TelemetrySeries | None:
        doc = self.doc
        if isinstance(doc, TraceDoc) and doc.digest is not None:
            return doc.digest.partition
        return None

    def redraw(self) -> None:
        if not self.is_mounted:
            return
        info = self.query_one("#telemetry-info", Static)
        body = self.query_one("#telemetry", Static)
        plots = (self.query_one("#partition-plot", PlotextPlot),
                 self.query_one("#feedback-plot", PlotextPlot))
        for plot in plots:
            plot.display = False
        doc = self.doc
        series = self.series()
        if not isinstance(doc, TraceDoc):
            info.update((unavailable(doc) if doc is not None else None) or
                        "telemetry comes from traces captured on a GPU; this file is not a trace")
            body.update("")
            return
        if series is None:
            info.update("judging… telemetry appears as the judgement reaches it")
            body.update("")
            return
        partition = self.partition()
        nvml = series.n > 0 and bool(series.present())
        adapt = partition is not None and partition.n > 0 and bool(partition.present())
        if not nvml and not adapt:
            info.update(Text(NO_TELEMETRY, style="yellow"))
            body.update("")
            return
        step = self.kv.step
        cursor = self.get_component_rich_style("telemetry--cursor", default=Style(reverse=True))
        width = self.size.width - 2
        if not adapt:
            where = _where(series, series.sample_at_step(step))
            info.update(f"cursor at step {step} of {doc.index.last_step} → {where} · ←/→ move "
                        "the cursor (shared with Pages)")
            body.update(telemetry_table(series, step, width, cursor))
            return
        assert partition is not None
        plots[0].display = draw(plots[0], partition, PARTITION_SERIES, step,
                                "KV partition: resident pages/layer, ring slots") > 0
        plots[1].display = draw(plots[1], partition, FEEDBACK_SERIES, step,
                                "deadline miss %, copy busy %", percent=True) > 0
        where = _where(partition, partition.sample_at_step(step))
        info.update(f"cursor at step {step} of {doc.index.last_step} → partition {where} · "
                    "←/→ move the cursor (shared with Pages)")
        parts: list[RenderableType] = [
            Text("KV partition (kv_stream_adapt) at the step", style="bold"),
            partition_table(partition, step, width, cursor), Text("")]
        if nvml:
            parts += [Text("NVML", style="bold"), telemetry_table(series, step, width, cursor)]
        else:
            parts.append(Text(NO_TELEMETRY, style="dim"))
        body.update(Group(*parts))

    def action_step(self, delta: int) -> None:
        doc = self.doc
        if isinstance(doc, TraceDoc):
            last = doc.index.last_step
            self.kv.user_step(max(0, min(self.kv.step + delta, last)), last)
            self.redraw()

    def action_edge(self, end: int) -> None:
        doc = self.doc
        if isinstance(doc, TraceDoc):
            last = doc.index.last_step
            self.kv.user_step(last if end else 0, last)
            self.redraw()

    def go_to(self, target: Target) -> None:
        self.redraw()

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0), step=self.kv.step)
