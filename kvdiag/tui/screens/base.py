"""The base of every viewer screen: a status line, the body, the footer; and the contract with
the app (``sync`` pulls the current document snapshot, ``go_to`` shows a jump target,
``location`` says where the user is so that a jump can come back)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static

from kvdiag.tui.document import Document
from kvdiag.tui.navigation import TITLES, Target
from kvdiag.tui.summaries import live_marker, status_text

LIVE_STATES = ("live", "paused", "ended")

if TYPE_CHECKING:
    from kvdiag.tui.app import KvdiagApp


class KvScreen(Screen[None]):
    MODE = ""

    def __init__(self) -> None:
        super().__init__()
        self.doc: Document | None = None
        self.doc_index = -1

    @property
    def kv(self) -> KvdiagApp:
        return cast("KvdiagApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static(id="status", classes="status")
        yield from self.compose_body()
        yield Footer(compact=True)

    def compose_body(self) -> ComposeResult:
        yield from ()

    def _status(self) -> None:
        """The status line, fitted to the screen's width (its padding takes two columns); a
        followed file's marker first (LIVE, PAUSED, ENDED), the line coloured by it."""
        app = self.kv
        title = f"{TITLES[self.MODE]}  ·  "
        found = self.query("#status")
        if not found:
            return  # not composed yet (the follower's clock ticks from the start)
        status = found.first(Static)
        if app.follow:
            marker, state = live_marker(app.doc, app.paused, time.monotonic())
            title = f"{marker}  ·  {title}"
            for s in LIVE_STATES:
                status.set_class(s == state, f"-{s}")
        width = self.size.width - 2 - len(title) if self.size.width else None
        status.update(title + status_text(app.doc, app.current, len(app.docs), width),
                      layout=False)

    def on_resize(self, event: events.Resize) -> None:
        if self.is_mounted:
            self._status()
            self.call_after_refresh(self.refit)

    def refit(self) -> None:
        """After a resize, once laid out: redo what depends on widths (detail lines)."""

    def on_mount(self) -> None:
        self.sync()

    def on_screen_resume(self) -> None:
        self.sync()

    def sync(self) -> None:
        """Draw from the app's current document if it changed since the last draw."""
        if not self.is_mounted:
            return
        app = self.kv
        doc, index = app.doc, app.current
        self._status()
        if doc is self.doc and index == self.doc_index:
            return
        old = self.doc if index == self.doc_index else None
        self.doc, self.doc_index = doc, index
        self.show_doc(doc, old)

    def show_doc(self, doc: Document, old: Document | None) -> None:
        """Redraw for ``doc``; ``old`` is the previous snapshot of the same file, if any."""

    def go_to(self, target: Target) -> None:
        """Select what ``target`` names (the document is already current)."""

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0))
