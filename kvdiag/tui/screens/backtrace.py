"""5 Backtrace: crashes grouped by fingerprint; frames with in-app ones marked; source."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from kvdiag.model.frames import Frame
from kvdiag.report.postmortem import frame_name
from kvdiag.tui.crashes import CrashView, from_abort, from_crash, group, resolve_source, snippet
from kvdiag.tui.document import Document, LogDoc, TraceDoc
from kvdiag.tui.messages import RowHighlighted
from kvdiag.tui.navigation import Target
from kvdiag.tui.rowsource import Cells, Column
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.row_detail import RowDetail
from kvdiag.tui.widgets.virtual_table import VirtualTable

MODULE_WIDTH = 44
"""At most this many cells for ``module / address`` (a versioned library name, an address)."""
MIN_SOURCE = 16


def frame_columns(frames: Sequence[Frame], width: int) -> tuple[Column, ...]:
    """Columns for ``frames`` in a table ``width`` cells wide: each as wide as its longest
    cell where that fits. Otherwise module/address gets up to half the width (at most
    ``MODULE_WIDTH``), the function what it needs, and the source (which keeps its end: the
    file and line) the rest but at least a third of it; the function column fills what is
    left. What a column cuts, the detail line under the table shows whole."""
    rows = [FrameRows.cells(fr) for fr in frames]
    longest = [max((len(r[k]) for r in rows), default=0) for k in range(4)]
    index_w = max(2, longest[0])
    module_w = max(len("module / address") // 2,
                   min(longest[3], MODULE_WIDTH, max(16, width // 2 - 4)))
    rest = width - index_w - module_w - 4  # one space after each column
    source_w = longest[2] if longest[1] + longest[2] <= rest else min(
        longest[2], max(MIN_SOURCE, rest // 3, rest - longest[1]))
    return (Column("#", index_w, "right"), Column("function", 0),
            Column("source", max(len("source"), source_w), keep="end"),
            Column("module / address", module_w))


class FrameRows:
    def __init__(self, view: CrashView) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view.frames)

    @staticmethod
    def cells(fr: Frame) -> list[str]:
        """``#``, function, ``file:line`` and module/address of a frame, whole."""
        src = (f"{fr.file}:{fr.line}" if fr.line is not None else fr.file) if fr.file else ""
        # the library's name says which one; its build path only eats the column
        where = fr.module.replace("\\", "/").rsplit("/", 1)[-1] if fr.module else ""
        if fr.offset is not None:
            where += f"+0x{fr.offset:x}"
        elif fr.address is not None:
            where = f"{where} 0x{fr.address:x}".strip()
        return [str(fr.index), frame_name(fr), src, where]

    def row(self, i: int) -> tuple[Cells, str]:
        fr = self.view.frames[i]
        cells = self.cells(fr)
        start = self.view.python_from
        if start is not None and i >= start:
            # a Python frame has no module or address: say which stack it belongs to
            cells[3] = "Python"
        return cells, "inapp" if fr.in_app else "system"


class SourcePane(Static):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"source-pane--hit", "source-pane--number",
                                             "source-pane--missing"}

    def show(self, file: str | None, line: int | None, bases: list[Path]) -> None:
        if not file or not line:
            self.update(Text("no source location for this frame", style=self._st("missing")))
            return
        path = resolve_source(file, bases)
        if path is None:
            self.update(Text(f"{file}:{line} — not found on this machine (the snippet shows "
                             "when the file exists at that path, or a tail of it exists under "
                             "the current directory, e.g. run from a llama.cpp checkout)",
                             style=self._st("missing")))
            return
        lines = snippet(path, line)
        parts: list[RenderableType] = [Text(f"{path}:{line}", style="bold")]
        for n, text in lines:
            row = Text(f"{n:>6} ", style=self._st("number"))
            row.append(text.expandtabs(4), style=self._st("hit") if n == line else "")
            parts.append(row)
        self.update(Group(*parts))

    def _st(self, name: str) -> Style:
        return self.get_component_rich_style(f"source-pane--{name}", default=Style())


class BacktraceScreen(KvScreen):
    MODE = "backtrace"
    AUTO_FOCUS = "#frames"
    # narrow: the crash list goes above the frames; short: smaller head and source panes
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]  # noqa: RUF012 (textual's type)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "group(1)", "Next crash"),
        Binding("C", "group(-1)", "Prev crash", key_display="C", show=False),
        Binding("t", "occurrence(1)", "Next thread"),
        Binding("l", "timeline", "In Timeline", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[list[CrashView]] = []
        self.group_i = 0
        self.occ_i = 0

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="bt-main"):
            yield OptionList(id="crash-groups")
            with Vertical(id="bt-right"):
                with VerticalScroll(id="crash-head-scroll"):
                    yield Static(id="crash-head")
                yield VirtualTable(frame_columns((), 80), id="frames", min_fill=16)
                yield RowDetail(id="frame-detail")
                with VerticalScroll(id="source-scroll"):
                    yield SourcePane(id="source")

    @property
    def frames_table(self) -> VirtualTable:
        return self.query_one("#frames", VirtualTable)

    def show_doc(self, doc: Document, old: Document | None) -> None:
        if isinstance(doc, LogDoc):
            views = [from_crash(i, c) for i, c in enumerate(doc.scan.crashes)]
        elif isinstance(doc, TraceDoc) and doc.digest is not None:
            views = [from_abort(i, a) for i, a in enumerate(doc.digest.aborts)]
        else:
            views = []
        self.groups = group(views)
        self._group_labels()
        # a single crash needs no list: its room goes to the frames
        self.set_class(len(self.groups) <= 1, "-single")
        if not self.groups:
            self._empty(doc)
            return
        self.group_i = min(self.group_i, len(self.groups) - 1) if old is not None else 0
        self.occ_i = 0
        self.query_one("#crash-groups", OptionList).highlighted = self.group_i
        self._show()

    def _group_labels(self) -> None:
        """One option per crash group: kind, count and fingerprint, then the title, each on
        one line cut at the list's edge (the crash head repeats the title whole)."""
        options = self.query_one("#crash-groups", OptionList)
        width = max(8, (options.scrollable_content_region.width or 30) - 2)
        highlighted = options.highlighted
        options.clear_options()
        for g in self.groups:
            head = g[0]
            label = Text(f"{head.kind}", style="bold red")
            label.append(f" ×{len(g)}" if len(g) > 1 else "")
            label.append(f"  {head.fingerprint}", style="dim")
            label.truncate(width, overflow="ellipsis")
            title = Text(head.title.splitlines()[0] if head.title else "")
            title.truncate(width, overflow="ellipsis")
            options.add_option(Option(Text("\n").join([label, title])))
        if highlighted is not None and highlighted < len(self.groups):
            options.highlighted = highlighted

    def _empty(self, doc: Document) -> None:
        if isinstance(doc, TraceDoc) and not doc.judged:
            text = "judging… aborts appear as the judgement reaches them"
        elif isinstance(doc, TraceDoc):
            text = "no abort in this trace: the capture did not crash"
        elif isinstance(doc, LogDoc):
            text = "no crash in this log"
        else:
            text = unavailable(doc) or ""
        self.query_one("#crash-head", Static).update(text)
        self.frames_table.set_source(FrameRows(CrashView(0, "", "", (), (), "", "", None)))
        self.query_one("#frame-detail", RowDetail).show([])
        self.query_one("#source", SourcePane).update("")

    @property
    def view(self) -> CrashView | None:
        if not self.groups:
            return None
        g = self.groups[self.group_i]
        return g[min(self.occ_i, len(g) - 1)]

    def _show(self) -> None:
        view = self.view
        if view is None:
            return
        g = self.groups[self.group_i]
        head = Text()
        head.append(f"crash group {self.group_i + 1} of {len(self.groups)}: {view.kind}",
                    style="bold red")
        head.append(f"  fingerprint {view.fingerprint}", style="dim")
        lines: list[RenderableType] = [head]
        for d in view.details:
            lines.append(Text(f"  {d}", style="red"))
        occ = f"occurrence {min(self.occ_i, len(g) - 1) + 1} of {len(g)}"
        if view.thread:
            occ += f", thread {view.thread}"
        lines.append(Text(f"  at {view.where} · {occ}" + (" (t: next)" if len(g) > 1 else ""),
                          style="dim"))
        n_app = sum(1 for f in view.frames if f.in_app)
        said = (f"  {len(view.frames)} frame(s), {n_app} in-app (highlighted)"
                if view.frames else "  no backtrace was printed")
        if view.python_from is not None:
            n_py = len(view.frames) - view.python_from
            thread = f" of thread {view.python_thread}" if view.python_thread else ""
            said += (f"; the last {n_py} are the Python stack{thread}, the thread the signal "
                     "hit" if view.python_from else f"; all the Python stack{thread}, the "
                     "thread the signal hit (no native backtrace was printed)")
        lines.append(Text(said, style="dim"))
        self.query_one("#crash-head", Static).update(Group(*lines))
        rows = FrameRows(view)
        first_app = next((i for i, f in enumerate(view.frames) if f.in_app and f.function), 0)
        self.frames_table.set_source(rows, cursor=first_app)
        self._source()
        self.call_after_refresh(self.refit)

    def _fit_columns(self) -> None:
        view = self.view
        table = self.frames_table
        # the vertical scrollbar may come and go with the rows: leave its two cells free
        width = (table.size.width or self.size.width) - 2
        table.columns = frame_columns(view.frames if view is not None else (), width)
        table.invalidate()

    def refit(self) -> None:
        """Column widths and list labels for the laid-out widths, then the detail line."""
        if self.view is not None:
            self._fit_columns()
            self.frames_table.set_source(self.frames_table.source)
        if self.groups:
            self._group_labels()
        self.query_one("#frame-detail", RowDetail).follow(self.frames_table)

    def _bases(self) -> list[Path]:
        doc = self.doc
        bases = [Path.cwd()]
        if doc is not None:
            bases.append(Path(doc.path).resolve().parent)
        return bases

    def _source(self) -> None:
        view = self.view
        pane = self.query_one("#source", SourcePane)
        if view is None:
            return
        frames = view.frames
        i = self.frames_table.cursor
        if frames and 0 <= i < len(frames) and frames[i].file:
            pane.show(frames[i].file, frames[i].line, self._bases())
        else:
            pane.show(view.file, view.file_line, self._bases())

    @on(RowHighlighted, "#frames")
    def frame_highlighted(self, message: RowHighlighted) -> None:
        self.query_one("#frame-detail", RowDetail).follow(self.frames_table)
        self._source()

    @on(OptionList.OptionHighlighted, "#crash-groups")
    def group_highlighted(self, message: OptionList.OptionHighlighted) -> None:
        if message.option_index != self.group_i:
            self.group_i = message.option_index
            self.occ_i = 0
            self._show()

    def action_group(self, delta: int) -> None:
        if self.groups:
            self.group_i = (self.group_i + delta) % len(self.groups)
            self.occ_i = 0
            self.query_one("#crash-groups", OptionList).highlighted = self.group_i
            self._show()

    def action_occurrence(self, delta: int) -> None:
        if self.groups:
            self.occ_i = (self.occ_i + delta) % len(self.groups[self.group_i])
            self._show()

    def action_timeline(self) -> None:
        view = self.view
        if view is not None and view.line is not None:
            self.kv.jump(Target("timeline", self.doc_index, row=view.line - 1))

    def go_to(self, target: Target) -> None:
        crash = target.crash
        doc = self.doc
        if crash is None and isinstance(doc, TraceDoc) and doc.digest and target.row is not None:
            seq = int(doc.index.columns["seq"][target.row])
            crash = next((i for i, a in enumerate(doc.digest.aborts) if a.seq == seq), None)
        if crash is None:
            return
        for gi, g in enumerate(self.groups):
            for oi, v in enumerate(g):
                if v.index == crash:
                    self.group_i, self.occ_i = gi, oi
                    self.query_one("#crash-groups", OptionList).highlighted = gi
                    self._show()
                    self.frames_table.focus()
                    return

    def location(self) -> Target:
        view = self.view
        return Target(self.MODE, max(self.doc_index, 0),
                      crash=view.index if view is not None else None)
