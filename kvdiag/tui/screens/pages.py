"""4 Pages: the resident window at the selected step, one grid per stream, and a scrubber."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import numpy as np
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.timer import Timer
from textual.widgets import Static

from kvdiag.analysis.replay import PagesSnapshot
from kvdiag.tui.clip import clip
from kvdiag.tui.compare import aligned_step, differing_cells
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.marks import StepMarks, step_marks
from kvdiag.tui.messages import CellSelected, SeekStep
from kvdiag.tui.navigation import Target
from kvdiag.tui.pagestext import LEGEND, cell_words, window_words
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.pages_grid import PagesGrid
from kvdiag.tui.widgets.scrubber import Scrubber
from kvdiag.tui.widgets.steady import update_steady

PLAY_INTERVAL_S = 0.3
Panel = tuple[int, int]
"""(open file, stream) that one grid shows."""

STEP_KEYS = Binding.Group("Step")
"""One footer entry for ← and →, so that the footer fits 80 columns."""


def _replayed(doc: Document) -> bool:
    return isinstance(doc, TraceDoc) and doc.pages is not None


class PagesScreen(KvScreen):
    MODE = "pages"
    AUTO_FOCUS = None
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Step back", key_display="←", group=STEP_KEYS),
        Binding("right", "step(1)", "Step", key_display="→", group=STEP_KEYS),
        Binding("shift+left", "step(-10)", "-10", show=False),
        Binding("shift+right", "step(10)", "+10", show=False),
        Binding("space", "play", "Play"),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
        Binding("n", "flagged(1)", "Bad read"),
        Binding("N", "flagged(-1)", "Prev bad read", key_display="N", show=False),
        Binding("up", "cell(-1, 0)", "Layer up", show=False),
        Binding("down", "cell(1, 0)", "Layer down", show=False),
        Binding("left_square_bracket", "cell(0, -1)", "Page left", show=False),
        Binding("right_square_bracket", "cell(0, 1)", "Page right", show=False),
        Binding("tab", "stream(1)", "Next stream", show=False),
        Binding("shift+tab", "stream(-1)", "Prev stream", show=False),
        Binding("c", "compare", "Compare", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: PagesSnapshot | None = None
        self.shown_step = -1
        self.cursor = (0, 0, 0)  # (stream position, layer, page)
        self.timer: Timer | None = None
        self.step_marks = StepMarks()
        self._arranging = asyncio.Lock()
        self._wanted: tuple[tuple[Panel, ...], bool] = ((), False)
        self.compare: int | None = None
        self._last_doc = -1
        """The other open trace shown next to this one (key c), aligned by step."""

    def compose_body(self) -> ComposeResult:
        yield Static(id="pages-info")
        yield Scrubber(id="pages-scrubber")
        yield Horizontal(id="pages-grids")
        yield Static(id="pages-cell")
        yield Static(LEGEND, id="pages-legend")

    # -- drawing ------------------------------------------------------------------------

    def show_doc(self, doc: Document, old: Document | None) -> None:
        if not isinstance(doc, TraceDoc) or doc.pages is None or doc.geometry is None:
            # a log, or a trace still indexing, has no steps to scrub: the bar and the legend
            # of the file shown before must not stay
            self.set_class(True, "-no-grid")
            self.query_one("#pages-scrubber", Scrubber).show(0, 0, {})
            self.snapshot = None
            self.shown_step = -1
            self.query_one("#pages-info", Static).update(
                "indexing… the page grid appears when the index is complete"
                if isinstance(doc, TraceDoc) else unavailable(doc) or
                "no page bookkeeping in this file (Pages replays traces; a log has none)")
            self.query_one("#pages-cell", Static).update("")
            self._arrange(())
            return
        self.set_class(False, "-no-grid")
        streams = tuple(doc.geometry.streams)
        if old is None:
            self.cursor = (min(self.cursor[0], len(streams) - 1), 0, 0)
            if self.compare == self.doc_index:  # switched to the compared file: swap sides
                self.compare = self._last_doc if self._last_doc >= 0 else None
            if self.compare is not None and self.compare_doc() is None:
                self.compare = None
        self._last_doc = self.doc_index
        panels = self.panels()
        if old is None or self._shown_panels() != list(panels):
            self._arrange(panels, rebuild=True)
        self.shown_step = -1
        self.call_after_refresh(self.render_step)

    def panels(self) -> tuple[Panel, ...]:
        """(file, stream) of each grid: every stream of the current file, or in comparison the
        selected stream of this file and of the other."""
        doc = self.doc
        if not isinstance(doc, TraceDoc) or doc.geometry is None:
            return ()
        streams = doc.geometry.streams
        if self.compare is None:
            return tuple((self.doc_index, s) for s in streams)
        s = streams[min(self.cursor[0], len(streams) - 1)]
        return ((self.doc_index, s), (self.compare, s))

    def _shown_panels(self) -> list[Panel]:
        return [(g.doc_index, g.stream) for g in self.query(PagesGrid)]

    def compare_doc(self) -> TraceDoc | None:
        """The other trace of the comparison, while it is open and replayable."""
        if self.compare is None or self.compare == self.doc_index:
            return None
        other = self.kv.docs[self.compare] if self.compare < len(self.kv.docs) else None
        return other if isinstance(other, TraceDoc) and other.pages is not None else None

    def _arrange(self, panels: tuple[Panel, ...], *, rebuild: bool = False) -> None:
        """Have one grid per panel in ``panels`` (new grids when ``rebuild``).

        Removing and mounting widgets completes later, so a second switch of file could mount a
        grid while the old one with its id is still there (Textual's DuplicateIds): each
        arrangement runs after the previous one has finished, and does what the latest asked.
        """
        self._wanted = (panels, rebuild or self._wanted[1])
        self.run_worker(self._arrange_now(), group="pages-grids")

    async def _arrange_now(self) -> None:
        async with self._arranging:
            panels, rebuild = self._wanted
            self._wanted = (panels, False)
            grids = self.query_one("#pages-grids", Horizontal)
            if rebuild or self._shown_panels() != list(panels):
                await grids.remove_children()
                comparing = len({d for d, _ in panels}) > 1
                await grids.mount_all(
                    PagesGrid(s, doc_index=d, id=f"pages-cmp-{i}" if comparing else
                              f"pages-grid-{s}",
                              title=f"{self.kv.docs[d].name} · stream {s}" if comparing else "")
                    for i, (d, s) in enumerate(panels))
            if panels:
                self.shown_step = -1
                self.render_step()

    @property
    def last_step(self) -> int:
        doc = self.doc
        return doc.index.last_step if isinstance(doc, TraceDoc) else 0

    def marks(self) -> dict[str, np.ndarray]:
        doc = self.doc
        if isinstance(doc, TraceDoc) and doc.digest is not None:
            return doc.digest.marks
        return {}

    def streamed_layers(self) -> int | None:
        """Layers 0..n-1 are streamed (plan ``streamed_layers``); None when the plan does not
        say or streams every layer."""
        doc = self.doc
        if not isinstance(doc, TraceDoc) or doc.geometry is None:
            return None
        n = (doc.header.plan or {}).get("streamed_layers")
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < doc.geometry.layers:
            return n
        return None

    def render_step(self) -> None:
        """Compute the snapshot at the app's step and show it."""
        doc = self.doc
        if not isinstance(doc, TraceDoc) or doc.pages is None:
            return
        step = max(0, min(self.kv.step, self.last_step))
        if step != self.kv.step:
            self.kv.step = step
        if step != self.shown_step or self.snapshot is None:
            self.snapshot = doc.pages_at(step)
            self.shown_step = step
        snap = self.snapshot
        streamed = self.streamed_layers()
        marks = self.step_marks = step_marks(doc.index, doc.source, snap.geometry, step)
        other = self.compare_doc()
        other_snap = None
        compared = ""
        if other is not None and other.pages is not None:
            aligned = aligned_step(step, other.index.last_step)
            other_snap = other.pages_at(aligned.step)
            other_marks = step_marks(other.index, other.source, other_snap.geometry,
                                     aligned.step)
            stream = self.panels()[0][1]
            differ = differing_cells(snap, other_snap, stream)
            compared = (f"\ncompared with {other.name} at step {aligned.step}" +
                        ("" if aligned.exact else f" (its last; it has no step {step})") +
                        (f" · stream {stream}: {differ} cell(s) read differently"
                         if differ is not None else " · grids of different shape"))
            names = [str((d.header.scenario or {}).get("name", "?")) for d in (doc, other)]
            if names[0] != names[1]:
                compared += (f" · different scenarios ({clip(names[0], 40)} vs "
                             f"{clip(names[1], 40)}): the steps need not correspond")
        for grid in self.query(PagesGrid):
            if grid.doc_index == self.doc_index:
                grid.show(snap, streamed, marks.cells(grid.stream))
            elif other_snap is not None:
                grid.show(other_snap, None, other_marks.cells(grid.stream))
        self.query_one("#pages-scrubber", Scrubber).show(self.last_step + 1, step, self.marks())
        playing = " ▶ playing" if self.timer is not None else ""
        if self.kv.follow and isinstance(doc, TraceDoc) and doc.live is not None:
            playing += (" · following the newest step" if self.kv.follow_step else
                        " · [yellow]not following (end: the newest step)[/]")
        flagged = snap.flagged()
        now = [f for f in flagged if f[3].step == step]
        bad = (f" · [red]{len(now)} stale/foreign page read(s) at this step[/]" if now else
               (f" · {len(flagged)} page(s) last read stale/foreign" if flagged else ""))
        if not doc.judged and (doc.digest is None or
                               doc.index.cutoff(step) > doc.digest.rows):
            bad += " · [yellow]judging… (reads of this step not judged yet)[/]"
        outside = (f" · {len(marks.outside)} page(s) marked outside the window (^)"
                   if marks.outside else "")
        update_steady(self.query_one("#pages-info", Static),
                      f"step {step} of {self.last_step}{playing}{bad}{outside}\n"
                      f"{window_words(snap)}{compared}")
        self._show_cursor()

    def _show_cursor(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        si, layer, page = self.cursor
        streams = snap.geometry.streams
        for grid in self.query(PagesGrid):
            grid.cursor = (layer, page) if grid.stream == streams[si] else None
        words = cell_words(snap, streams[si], layer, page, self.streamed_layers())
        mark = self.step_marks.at(streams[si], page)
        if mark is not None:
            words += f" Marked at this step (mark #{mark.seq}) as {mark.words()}: outside the window: "
            try:
                resident = snap.cell(streams[si], layer, page).resident
            except IndexError:
                resident = True
            # beyond the window the page is read through the ring from the host copy, so the
            # missed mark leaves nothing stale; inside it, the resident copy keeps old bytes
            words += ("this page's resident copy is never refreshed." if resident else
                      "it has no resident copy (read through the ring), so nothing is left stale.")
        update_steady(self.query_one("#pages-cell", Static), words)

    # -- keys ---------------------------------------------------------------------------

    def set_step(self, step: int) -> None:
        self.kv.user_step(max(0, min(step, self.last_step)), self.last_step)
        self.render_step()

    def action_step(self, delta: int) -> None:
        self.set_step(self.kv.step + delta)

    def action_edge(self, end: int) -> None:
        self.set_step(self.last_step if end else 0)

    def action_play(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
            self.render_step()
            return
        if self.kv.step >= self.last_step:
            self.kv.step = 0
        self.timer = self.set_interval(PLAY_INTERVAL_S, self._tick)
        self.render_step()

    def _tick(self) -> None:
        if self.kv.step >= self.last_step:
            if self.timer is not None:
                self.timer.stop()
            self.timer = None
            self.render_step()
            return
        self.set_step(self.kv.step + 1)

    def on_screen_suspend(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None

    def action_flagged(self, direction: int) -> None:
        """To the next (previous) step with a read the judgement found stale or foreign."""
        doc = self.doc
        if not isinstance(doc, TraceDoc) or doc.digest is None:
            self.notify("judging… try again in a moment", timeout=2)
            return
        marks = doc.digest.marks
        steps = np.union1d(marks["foreign"], marks["stale"])
        here = self.kv.step
        after = steps[steps > here] if direction > 0 else steps[steps < here]
        if after.size == 0:
            self.notify("no further step with a stale or foreign read" + (
                "" if doc.judged else " judged so far (judging…)"), timeout=2)
            return
        self.set_step(int(after[0] if direction > 0 else after[-1]))
        self._cursor_to_flagged()

    def _cursor_to_flagged(self) -> None:
        """Put the cell cursor on the first page read stale/foreign at this step."""
        snap = self.snapshot
        if snap is None:
            return
        for stream, layer, page, read in snap.flagged():
            if read.step == snap.step:
                self.cursor = (snap.geometry.streams.index(stream), layer, page)
                self._show_cursor()
                return

    def action_cell(self, dlayer: int, dpage: int) -> None:
        snap = self.snapshot
        if snap is None:
            return
        si, layer, page = self.cursor
        self.cursor = (si, max(0, min(layer + dlayer, snap.geometry.layers - 1)),
                       max(0, min(page + dpage, snap.geometry.pages - 1)))
        self._show_cursor()

    def action_stream(self, delta: int) -> None:
        snap = self.snapshot
        if snap is None:
            return
        si, layer, page = self.cursor
        self.cursor = ((si + delta) % len(snap.geometry.streams), layer, page)
        if self.compare is not None:
            self._arrange(self.panels())  # the pair of grids follows the stream
        self._show_cursor()

    def action_compare(self) -> None:
        """Show the other open trace next to this one (the next trace after this file), or
        stop comparing."""
        if self.compare is not None:
            self.compare = None
            self.notify("comparison off", timeout=2)
        else:
            docs = self.kv.docs
            n = len(docs)
            others = [(self.doc_index + k) % n for k in range(1, n)]
            pick = next((i for i in others if _replayed(docs[i])), None)
            if pick is None or self.doc is None or not _replayed(self.doc):
                self.notify("comparing needs this file and another open trace, both replayed",
                            timeout=3)
                return
            self.compare = pick
            self.notify(f"comparing with {docs[pick].name}, aligned by step number", timeout=3)
        self._arrange(self.panels())

    @on(CellSelected)
    def cell_clicked(self, message: CellSelected) -> None:
        snap = self.snapshot
        if snap is not None and message.stream in snap.geometry.streams:
            self.cursor = (snap.geometry.streams.index(message.stream), message.layer,
                           message.page)
            self._show_cursor()

    @on(SeekStep)
    def seek(self, message: SeekStep) -> None:
        self.set_step(message.step)

    # -- navigation ---------------------------------------------------------------------

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self.snapshot is not None and self.kv.step != self.shown_step:
            self.render_step()

    def go_to(self, target: Target) -> None:
        if target.step is not None:
            self.kv.step = target.step
        doc = self.doc
        if isinstance(doc, TraceDoc) and doc.geometry is not None:
            streams = doc.geometry.streams
            si = streams.index(target.stream) if target.stream in streams else self.cursor[0]
            self.cursor = (si, target.layer if target.layer is not None else 0,
                           target.page if target.page is not None else 0)
        self.shown_step = -1
        self.call_after_refresh(self.render_step)

    def location(self) -> Target:
        snap = self.snapshot
        if snap is None:
            return Target(self.MODE, max(self.doc_index, 0), step=self.kv.step)
        si, layer, page = self.cursor
        return Target(self.MODE, max(self.doc_index, 0), step=self.kv.step, layer=layer,
                      stream=snap.geometry.streams[si], page=page)
