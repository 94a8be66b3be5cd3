"""``kvdiag tui``: the Textual app that replays traces and post-mortem logs.

The app is thin: it owns the list of document snapshots, the step shared by the Pages,
Telemetry and Timeline screens, and the jump history. Files load in a thread worker that
publishes snapshots by message (:mod:`kvdiag.tui.document`); each screen draws from the
snapshot of the current document and refreshes when a newer one arrives.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import partial
from typing import ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.reactive import var
from textual.screen import Screen
from textual.worker import get_current_worker

from kvdiag.errors import KvdiagError
from kvdiag.tui.document import Document, ErrorDoc, LogDoc, PendingDoc, TraceDoc
from kvdiag.tui.loading import NO_SYMBOLS, Symbols, load
from kvdiag.tui.messages import DocumentUpdated
from kvdiag.tui.navigation import SCREENS, TITLES, Target
from kvdiag.tui.perfview import Predictor
from kvdiag.tui.screens.backtrace import BacktraceScreen
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.screens.findings import FindingsScreen
from kvdiag.tui.screens.fits import FitsScreen
from kvdiag.tui.screens.help import HelpScreen
from kvdiag.tui.screens.overview import OverviewScreen
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.perf import PerfScreen
from kvdiag.tui.screens.telemetry import TelemetryScreen
from kvdiag.tui.screens.timeline import TimelineScreen

SCREEN_KEYS = Binding.Group("Screens", compact=True)
MAX_HISTORY = 100
EXIT_INTERNAL = 70
"""The exit code of an internal error (kvdiag.cli.main uses the same for any other command)."""
FIRST_PAINT_WAIT_S = 0.5


class KvdiagApp(App[int]):
    TITLE = "kvdiag"
    CSS_PATH = "app.tcss"
    MODES: ClassVar[dict[str, type[KvScreen]]] = {  # type: ignore[assignment]
        "overview": OverviewScreen, "timeline": TimelineScreen, "fits": FitsScreen,
        "pages": PagesScreen, "backtrace": BacktraceScreen, "telemetry": TelemetryScreen,
        "findings": FindingsScreen, "perf": PerfScreen,
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        # one footer entry for the eight screen keys ("12345678 Screens"): eight entries
        # overflow an 80-column footer
        *(Binding(str(i), f"show('{name}')", TITLES[name], key_display=str(i), group=SCREEN_KEYS)
          for i, name in enumerate(SCREENS, 1)),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("o", "next_file(1)", "Other file", show=False),
        Binding("O", "next_file(-1)", "Previous file", show=False),
        Binding("backspace", "go_back", "Back", show=False),
        Binding("s", "pause", "Pause/resume"),
        Binding("q", "quit", "Quit"),
    ]

    step: var[int] = var(0, init=False)
    """The step the Pages and Telemetry screens show (shared, so they stay in sync)."""

    def __init__(self, paths: list[str], *, start_screen: str = "overview",
                 symbols: Symbols = NO_SYMBOLS, debug: bool = False,
                 predictor: Predictor | None = None, follow: bool = False) -> None:
        super().__init__()
        self.predictor = predictor
        """The model beside the measurement on the Perf screen (``kvdiag tui`` passes
        ``kvdiag perf --predict``'s computation; None: not offered)."""
        self.follow = follow
        """The one file is followed as it is written (kvdiag tui --follow)."""
        self.paused = False
        """Following, but the screens keep what they show (key s); newer snapshots wait."""
        self.follow_step = True
        """Following: the shared step moves to the newest step as it arrives, until the user
        puts it elsewhere (Pages, Telemetry); the last step, or ``end``, takes it up again."""
        self._held: dict[int, Document] = {}
        self.show_tracebacks = debug
        self.crash: Exception | None = None
        """The first unhandled exception: the app exits on it (see :func:`run_tui`)."""
        self.paths = list(paths)
        self.symbols = symbols
        self.docs: list[Document] = [PendingDoc(p) for p in self.paths]
        self.current = 0
        self.history: list[Target] = []
        self.start_screen = start_screen
        self.loaded = 0
        self._painted = threading.Event()

    # -- documents ----------------------------------------------------------------------

    @property
    def doc(self) -> Document:
        return self.docs[self.current]

    def on_mount(self) -> None:
        self.switch_mode(self.start_screen)
        if self.follow:
            self.set_interval(1.0, self._sync_screen)  # the marker's "quiet for ..." moves on
        for i, path in enumerate(self.paths):
            self._load(i, path)

    @work(thread=True, group="load")
    def _load(self, i: int, path: str) -> None:
        worker = get_current_worker()

        def publish(doc: Document) -> None:
            if not worker.is_cancelled:
                self.post_message(DocumentUpdated(i, doc))

        try:
            if self.follow:
                from kvdiag.tui.live import follow

                follow(path, publish, lambda: worker.is_cancelled,
                       lambda: self._painted.wait(FIRST_PAINT_WAIT_S))
                return
            load(path, publish, lambda: worker.is_cancelled,
                 lambda: self._painted.wait(FIRST_PAINT_WAIT_S), self.symbols)
        except Exception as exc:  # a bug in a loader must not take the viewer down
            publish(ErrorDoc(path, f"{path}: internal error while loading: "
                                   f"{type(exc).__name__}: {exc}"))

    def on_document_updated(self, message: DocumentUpdated) -> None:
        old = self.docs[message.index]
        doc = message.doc
        if self.paused and isinstance(doc, TraceDoc | LogDoc) and doc.live is not None:
            self._held[message.index] = doc  # shown on resume
            return
        self.docs[message.index] = doc
        if (self.follow_step and isinstance(doc, TraceDoc) and doc.live is not None
                and message.index == self.current):
            self.step = max(doc.index.last_step, 0)
        if isinstance(doc, ErrorDoc) and not isinstance(old, ErrorDoc):
            self.notify(doc.message, title="cannot show this file", severity="error",
                        timeout=8)
        if isinstance(doc, LogDoc) and not isinstance(old, LogDoc):
            for note in doc.notes:
                self.notify(note, title=doc.name, severity="warning", timeout=8)
        if doc.stage == "ready" and old.stage != "ready":
            self.loaded += 1
        if message.index == self.current:
            self._sync_screen()
        if not self._painted.is_set():
            self.call_after_refresh(self._painted.set)

    # -- following ----------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "pause":
            return self.follow  # no key in the footer unless following
        return True

    def action_pause(self) -> None:
        """Stop showing newer snapshots of the followed file, or show the newest again."""
        if not self.follow:
            return
        self.paused = not self.paused
        if not self.paused:
            held, self._held = self._held, {}
            for index, doc in held.items():
                self.on_document_updated(DocumentUpdated(index, doc))
        self._sync_screen()

    def user_step(self, step: int, last: int) -> None:
        """The user put the shared step at ``step`` (the newest is ``last``): following the
        newest step stops there, and goes on again when it is the newest."""
        self.step = step
        if self.follow:
            self.follow_step = step >= last

    def _sync_screen(self) -> None:
        if isinstance(self.screen, KvScreen):
            self.screen.sync()

    # -- navigation ---------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for i, name in enumerate(SCREENS, 1):
            yield SystemCommand(f"Screen: {TITLES[name]}", f"show the {TITLES[name]} screen "
                                f"(key {i})", partial(self.action_show, name))
        for i, doc in enumerate(self.docs):
            yield SystemCommand(f"File: {doc.name}", f"show {doc.path} ({doc.kind})",
                                partial(self.select_doc, i))
        yield SystemCommand("Pages: compare with the other trace",
                            "the selected stream of this trace and of the other open one side by "
                            "side, aligned by step (key c on Pages)",
                            lambda: self.run_worker(self._compare(), exclusive=True, group="jump"))
        yield SystemCommand("Back", "return to where the last jump came from (backspace)",
                            self.action_go_back)
        yield SystemCommand("Help", "keys of this screen (?)", self.action_help)

    def action_show(self, name: str) -> None:
        self.switch_mode(name)

    def action_help(self) -> None:
        mode = self.current_mode
        self.push_screen(HelpScreen(mode))

    def action_next_file(self, delta: int = 1) -> None:
        if len(self.docs) > 1:
            self.select_doc((self.current + delta) % len(self.docs))

    def select_doc(self, index: int) -> None:
        self.current = index
        self.step = 0
        self._sync_screen()
        self.notify(f"file {index + 1} of {len(self.docs)}: {self.docs[index].name}", timeout=3)

    def location(self) -> Target | None:
        screen = self.screen
        return screen.location() if isinstance(screen, KvScreen) else None

    def jump(self, target: Target, *, remember: bool = True) -> None:
        """Show ``target``; ``backspace`` comes back here."""
        here = self.location()
        if remember and here is not None:
            self.history.append(here)
            del self.history[:-MAX_HISTORY]
        self.run_worker(self._jump(target), exclusive=True, group="jump")

    async def _jump(self, target: Target) -> None:
        if target.doc != self.current:
            self.current = target.doc
        if target.step is not None:
            self.step = target.step
        await self.switch_mode(target.screen)
        screen = self.screen
        if isinstance(screen, KvScreen):
            screen.sync()
            screen.go_to(target)

    async def _compare(self) -> None:
        await self.switch_mode("pages")
        screen = self.screen
        if isinstance(screen, PagesScreen):
            screen.sync()
            screen.action_compare()

    def action_go_back(self) -> None:
        if not self.history:
            self.notify("nothing to go back to", timeout=2)
            return
        self.jump(self.history.pop(), remember=False)


    # -- unhandled exceptions --------------------------------------------------------------

    def _handle_exception(self, error: Exception) -> None:
        # Textual exits on it and prints a full-screen traceback with locals; kvdiag's rule is
        # one line and a non-zero exit (run_tui), the traceback only with --debug.
        if self.crash is None:
            self.crash = error
        super()._handle_exception(error)
        renderables = getattr(self, "_exit_renderables", None)  # Textual's private list
        if not self.show_tracebacks and isinstance(renderables, list):
            renderables.clear()


def crash_error(error: Exception) -> KvdiagError:
    """The one-line error the CLI reports for an exception that stopped the viewer."""
    first = next(iter(str(error).splitlines()), "")
    if len(first) > 300:
        first = first[:300] + "…"
    return KvdiagError(f"the viewer stopped on an internal error: {type(error).__name__}"
                       f"{': ' + first if first else ''} (rerun with --debug for the traceback)",
                       EXIT_INTERNAL)


def run_tui(paths: list[str], symbols: Symbols = NO_SYMBOLS, *, debug: bool = False,
            predictor: Predictor | None = None, follow: bool = False) -> int:
    """Run the viewer on ``paths`` (traces and/or logs; with ``follow`` one file, followed as
    it is written) until the user quits.

    An exception that stopped it is a :class:`KvdiagError` (one line, exit 70); with ``debug``
    Textual prints its traceback instead and the exit code is still 70.
    """
    app = KvdiagApp(paths, symbols=symbols, debug=debug, predictor=predictor, follow=follow)
    result = app.run()
    if app.crash is not None:
        if debug:
            return EXIT_INTERNAL
        raise crash_error(app.crash)
    return result if isinstance(result, int) else 0
