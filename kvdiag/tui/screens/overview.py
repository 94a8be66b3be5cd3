"""1 Overview: configuration, findings by severity, counts, and what went wrong."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import ProgressBar, Static

from kvdiag.tui.document import Document
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import overview

LOADING_REDRAW_S = 1.0
"""While a file loads, its overview is rebuilt at most this often; the progress bar moves with
every snapshot (five a second). Rebuilding it is the viewer's main cost while a big trace loads:
py-spy on bench_tui's 5M-event trace found Textual laying out and rendering the overview's
tables for most of the UI thread's time, at every snapshot."""


class OverviewScreen(KvScreen):
    MODE = "overview"
    AUTO_FOCUS = "#overview-scroll"
    _drawn_at = -LOADING_REDRAW_S

    def compose_body(self) -> ComposeResult:
        yield ProgressBar(total=1.0, show_eta=False, id="load-progress")
        with VerticalScroll(id="overview-scroll"):
            yield Static(id="overview")

    def show_doc(self, doc: Document, old: Document | None) -> None:
        bar = self.query_one("#load-progress", ProgressBar)
        loading = doc.stage in ("opening", "indexing", "judging")
        if bar.display != loading:
            bar.display = loading
        if loading:
            bar.update(progress=doc.progress)
        now = time.monotonic()
        if (loading and old is not None and old.stage == doc.stage
                and now - self._drawn_at < LOADING_REDRAW_S):
            return
        self._drawn_at = now
        self.query_one("#overview", Static).update(overview(doc))
