"""1 Overview: configuration, findings by severity, counts, and what went wrong."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import ProgressBar, Static

from kvdiag.tui.document import Document
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import overview


class OverviewScreen(KvScreen):
    MODE = "overview"
    AUTO_FOCUS = "#overview-scroll"

    def compose_body(self) -> ComposeResult:
        yield ProgressBar(total=1.0, show_eta=False, id="load-progress")
        with VerticalScroll(id="overview-scroll"):
            yield Static(id="overview")

    def show_doc(self, doc: Document, old: Document | None) -> None:
        bar = self.query_one("#load-progress", ProgressBar)
        loading = doc.stage in ("opening", "indexing", "judging")
        bar.display = loading
        if loading:
            bar.update(progress=doc.progress)
        self.query_one("#overview", Static).update(overview(doc))
