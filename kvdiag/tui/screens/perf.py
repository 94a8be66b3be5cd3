"""8 Perf: decode tok/s against context depth for every open run that has request timings (a
log's print_timing lines, a trace's timing events), the baseline among them, with the partition
and deadline misses the current run recorded on the same depth axis and a cursor per request
(``kvdiag perf``'s analysis, docs/perf.md)."""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static
from textual_plotext import PlotextPlot

from kvdiag.analysis.perf_compare import Comparison
from kvdiag.errors import KvdiagError
from kvdiag.model.perf import PerfRun
from kvdiag.tui.document import Document
from kvdiag.tui.navigation import Target
from kvdiag.tui.perfview import ModelCurve, RunView, comparison_of, describe
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable

NO_TIMING = ("no request timing in this file: the Perf screen reads a llama-server log's "
             "print_timing lines or a trace's timing events (kvdiag import writes them)")


class PerfScreen(KvScreen):
    MODE = "perf"
    AUTO_FOCUS = "#perf-scroll"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "request(-1)", "Previous request", key_display="←"),
        Binding("right", "request(1)", "Next request", key_display="→"),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
        Binding("b", "baseline", "Baseline"),
        Binding("p", "model", "Model"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.cursor: dict[int, int] = {}
        self.baseline: int | None = None
        self._views: dict[int, tuple[PerfRun, RunView]] = {}
        self._comparisons: dict[tuple[int, int],
                                tuple[PerfRun, PerfRun, Comparison | None]] = {}
        self.show_model = False
        self._models: dict[tuple[str, str | None], ModelCurve | str] = {}
        """By (run's path, baseline's path): the model's curve, or why there is none."""

    def compose_body(self) -> ComposeResult:
        yield Static(id="perf-info")
        with VerticalScroll(id="perf-scroll"):
            yield PlotextPlot(id="perf-rate", classes="perf-plot")
            yield PlotextPlot(id="perf-partition", classes="perf-plot")
            yield PlotextPlot(id="perf-misses", classes="perf-plot perf-small")
            yield Static(id="perf-detail")

    def show_doc(self, doc: Document, old: Document | None) -> None:
        self.redraw()

    def on_resize(self, event: events.Resize) -> None:
        self.redraw()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.redraw()

    # -- data ------------------------------------------------------------------------------

    def view(self, index: int) -> RunView | None:
        doc = self.kv.docs[index]
        run = getattr(doc, "perf", None)
        if run is None:
            return None
        cached = self._views.get(index)
        if cached is None or cached[0] is not run:
            cached = self._views[index] = (run, RunView(run))
        return cached[1]

    def others(self) -> list[int]:
        """Other open files with request timings: the baseline candidates."""
        return [i for i in range(len(self.kv.docs))
                if i != self.kv.current and self.view(i) is not None]

    def base_index(self) -> int | None:
        others = self.others()
        if self.baseline in others:
            return self.baseline
        return others[0] if others else None

    # -- drawing ---------------------------------------------------------------------------

    def redraw(self) -> None:
        if not self.is_mounted:
            return
        info = self.query_one("#perf-info", Static)
        detail = self.query_one("#perf-detail", Static)
        plots = [self.query_one(f"#perf-{n}", PlotextPlot)
                 for n in ("rate", "partition", "misses")]
        for plot in plots:
            plot.display = False
        doc = self.doc
        current = self.kv.current
        view = self.view(current) if doc is not None else None
        if view is None:
            why = unavailable(doc) if doc is not None else None
            info.update(why or NO_TIMING)
            detail.update("")
            return
        base_i = self.base_index()
        base = self.view(base_i) if base_i is not None else None
        n = len(view.table)
        at = max(0, min(self.cursor.get(current, 0), n - 1)) if n else 0
        self.cursor[current] = at
        x = view.table[at].depth_mid if n else None
        model = self._model(self.kv.docs[current].path, self.kv.docs[base_i].path if base is not None and
                            base_i is not None else None) if self.show_model else None
        self._rate(plots[0], view, base, x, model if isinstance(model, ModelCurve) else None)
        self._partition(plots[1], plots[2], view, x)
        # one depth axis for the three plots
        # every x drawn is inside it: plotext fails to draw the legend of a labelled series
        # whose points all fall outside the axes (a bin's middle left of a single request)
        span: list[float] = [d for v in (view, base) if v is not None
                             for r in v.table for d in (r.depth_start, r.depth_end)
                             if d is not None]
        span += [d for v in (view, base) if v is not None for d in v.bins()[0]]
        span += [d for xs, _ in view.partition().values() for d in xs]
        if isinstance(model, ModelCurve):
            span += list(model.depths)
        if span:
            for plot in plots:
                plot.plt.xlim(min(span), max(span))
        base_name = base.run.name if base is not None else None
        info.update(f"{view.run.name}: {n} request(s) · "
                    + (f"baseline {base_name} (b: another)" if base_name else
                       "no baseline open") + " · ←/→ request cursor · p: the model beside it")
        comp = None
        if base is not None and base_i is not None:
            cached = self._comparisons.get((current, base_i))
            if cached is None or cached[0] is not view.run or cached[1] is not base.run:
                cached = (view.run, base.run, comparison_of(view.run, base.run))
                self._comparisons[(current, base_i)] = cached
            comp = cached[2]
        lines = describe(view, at, comp, base_name)
        if isinstance(model, ModelCurve):
            lines += [f"{model.label} (p hides it):", *(f"  {t}" for t in model.lines)]
        elif model is not None:
            lines.append(model)
        detail.update("\n".join(lines))

    def _model(self, path: str, base: str | None) -> ModelCurve | str:
        """The model's curve for this run against this baseline: computed once, in a thread
        (it plays every request through the runtime model)."""
        key = (path, base)
        got = self._models.get(key)
        if got is None:
            got = self._models[key] = "model: playing the run's requests through the runtime " \
                "model…"
            self.run_worker(partial(self._compute_model, key), thread=True)
        return got

    def _compute_model(self, key: tuple[str, str | None]) -> None:
        predictor = self.kv.predictor
        assert predictor is not None
        result: ModelCurve | str
        try:
            result = predictor(*key)
        except (KvdiagError, OSError, ValueError) as exc:
            result = f"model: {exc}"
        self._models[key] = result
        self.app.call_from_thread(self.redraw)

    def _rate(self, plot: PlotextPlot, view: RunView, base: RunView | None,
              x: float | None, model: ModelCurve | None) -> None:
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("decode tok/s against context depth (dots: requests, lines: depth bins)")
        plt.xlabel("depth (tokens)")
        for v, label in ((view, view.run.name),
                         *(((base, f"{base.run.name} (baseline)"),) if base else ())):
            bx, by = v.bins()
            if bx:
                plt.plot(bx, by, label=label, marker="braille" if len(bx) > 1 else "dot")
            rx, ry = v.requests()
            if rx:
                plt.scatter(rx, ry, marker="dot")
        if model is not None and model.depths:
            plt.plot(model.depths, model.tps, label=model.label,
                     marker="braille" if len(model.depths) > 1 else "dot")
        if x is not None:
            plt.vline(x, "red")
        plot.display = True
        plot.refresh()

    def _partition(self, plot: PlotextPlot, misses: PlotextPlot, view: RunView,
                   x: float | None) -> None:
        series = view.partition()
        for p in (plot, misses):
            p.plt.clear_data()
            p.plt.clear_figure()
            p.plt.xlabel("depth (tokens)")
        plot.plt.title("partition recorded: resident pages/layer, ring slots; active pages of "
                       "the requests" if "resident pages/layer" in series else
                       "active pages of the requests (no kv_stream_adapt line recorded)")
        for name in ("resident pages/layer", "ring slots", "active pages"):
            if name in series:
                xs, ys = series[name]
                plot.plt.plot(xs, ys, label=name, marker="braille" if len(xs) > 1 else "dot")
        for d in view.repartitions()[:200]:
            plot.plt.vline(d, "orange")
        if x is not None:
            plot.plt.vline(x, "red")
        plot.display = bool(series)
        plot.refresh()
        if "miss %" in series:
            xs, ys = series["miss %"]
            misses.plt.title("deadline miss % (kv_stream_adapt)")
            misses.plt.plot(xs, ys, label="miss %", marker="braille" if len(xs) > 1 else "dot")
            misses.plt.ylim(0, 100)
            if x is not None:
                misses.plt.vline(x, "red")
            misses.display = True
        misses.refresh()

    # -- keys ------------------------------------------------------------------------------

    def action_request(self, delta: int) -> None:
        view = self.view(self.kv.current)
        if view is not None and view.table:
            at = self.cursor.get(self.kv.current, 0) + delta
            self.cursor[self.kv.current] = max(0, min(at, len(view.table) - 1))
            self.redraw()

    def action_edge(self, end: int) -> None:
        view = self.view(self.kv.current)
        if view is not None and view.table:
            self.cursor[self.kv.current] = len(view.table) - 1 if end else 0
            self.redraw()

    def action_baseline(self) -> None:
        others = self.others()
        if not others:
            self.notify("no other open file has request timings", timeout=3)
            return
        now = self.base_index()
        self.baseline = others[(others.index(now) + 1) % len(others)] if now in others else others[0]
        self.redraw()

    def action_model(self) -> None:
        if self.kv.predictor is None:
            self.notify("the model is offered by kvdiag tui (kvdiag perf --predict computes it)",
                        timeout=3)
            return
        self.show_model = not self.show_model
        self.redraw()

    def go_to(self, target: Target) -> None:
        self.redraw()

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0))
