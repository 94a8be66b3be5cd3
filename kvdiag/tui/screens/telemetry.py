"""6 Telemetry: NVML samples over the capture as sparklines, with the cursor at the step."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from kvdiag.tui.digest import TelemetrySeries
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.navigation import Target
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.sparkline import sparkline
from kvdiag.tui.summaries import unavailable

# (field, label, scale to the unit shown, unit, fixed scale or None for the samples' range)
PLOTS: tuple[tuple[str, str, float, str, tuple[float, float] | None], ...] = (
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
NO_TELEMETRY = ("no telemetry in this trace: samples come from NVML during a GPU capture "
                "(the NumPy executor, or a machine without NVML, records none)")


def _fmt(v: float) -> str:
    if np.isnan(v):
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}"


def telemetry_table(series: TelemetrySeries, step: int, width: int,
                    cursor_style: Style | str = "reverse") -> Table:
    """One row per field NVML provided: sparkline over the capture, value at the step."""
    present = set(series.present())
    sample = series.sample_at_step(step)
    spark_w = max(10, width - 12 - 26 - 6)
    table = Table(box=None, expand=False, pad_edge=False, show_header=True,
                  header_style="bold")
    table.add_column("metric", width=12, no_wrap=True)
    table.add_column(f"over the capture ({series.n} samples)", width=spark_w, no_wrap=True)
    table.add_column("at step", width=12, justify="right", no_wrap=True)
    table.add_column("min – max", width=14, justify="right", no_wrap=True)
    for name, label, scale, unit, fixed in PLOTS:
        if name not in present:
            continue
        vals = series.values[name] * scale
        lo, hi = fixed if fixed is not None else (None, None)
        line = sparkline(vals, spark_w, sample, cursor_style=cursor_style, lo=lo, hi=hi)
        now = vals[sample] if sample is not None else np.nan
        finite = vals[~np.isnan(vals)]
        table.add_row(label, line, f"{_fmt(float(now))} {unit}",
                      f"{_fmt(float(finite.min()))} – {_fmt(float(finite.max()))}")
    if "mem_total" in present:
        total = series.values["mem_total"]
        table.add_row("VRAM total", "", f"{_fmt(float(np.nanmax(total)) / (1 << 30))} GiB", "")
    return table


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

    def redraw(self) -> None:
        if not self.is_mounted:
            return
        info = self.query_one("#telemetry-info", Static)
        body = self.query_one("#telemetry", Static)
        doc = self.doc
        series = self.series()
        if not isinstance(doc, TraceDoc):
            info.update((unavailable(doc) if doc is not None else None) or
                        "telemetry comes from traces captured on a GPU; this file is not a trace")
            body.update("")
            return
        if series is None:
            info.update("analysing… telemetry appears when the analysis finishes")
            body.update("")
            return
        if series.n == 0 or not series.present():
            info.update(Text(NO_TELEMETRY, style="yellow"))
            body.update("")
            return
        step = self.kv.step
        sample = series.sample_at_step(step)
        where = (f"sample {sample + 1} of {series.n} (step {int(series.step[sample])}, "
                 f"t {series.t_ns[sample] / 1e9:.3f} s)" if sample is not None else "")
        info.update(f"cursor at step {step} of {doc.index.last_step} → {where} · ←/→ move the "
                    "cursor (shared with Pages)")
        cursor = self.get_component_rich_style("telemetry--cursor", default=Style(reverse=True))
        body.update(telemetry_table(series, step, self.size.width - 2, cursor))

    def action_step(self, delta: int) -> None:
        doc = self.doc
        if isinstance(doc, TraceDoc):
            self.kv.step = max(0, min(self.kv.step + delta, doc.index.last_step))
            self.redraw()

    def action_edge(self, end: int) -> None:
        doc = self.doc
        if isinstance(doc, TraceDoc):
            self.kv.step = doc.index.last_step if end else 0
            self.redraw()

    def go_to(self, target: Target) -> None:
        self.redraw()

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0), step=self.kv.step)
