"""2 Timeline: every event (or log line), filtered and searched, drawn only where visible."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Input, Static

from kvdiag.analysis.log_index import LOG_KINDS
from kvdiag.analysis.rowfilter import FilterError, RowFilter, apply_filter, parse_filter
from kvdiag.analysis.textsearch import find_row
from kvdiag.analysis.trace_index import KINDS
from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence
from kvdiag.tui.document import Document, LogDoc, TraceDoc
from kvdiag.tui.marks import place
from kvdiag.tui.messages import RowHighlighted, RowSelected
from kvdiag.tui.navigation import Target, evidence_target
from kvdiag.tui.rows import LOG_COLUMNS, TRACE_COLUMNS, LogRows, TraceRows, read_judged
from kvdiag.tui.rowsource import EmptySource
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.row_detail import RowDetail
from kvdiag.tui.widgets.virtual_table import VirtualTable

FILTER_HINT = "filter (f): kind:read,upload layer:0-3 stream:1 slot:10 step:5-9"


MATCH_KEYS = Binding.Group("Match")
"""One footer entry for n and N, so that the footer fits 80 columns."""


class TimelineScreen(KvScreen):
    MODE = "timeline"
    AUTO_FOCUS = "#timeline"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "focus_filter", "Filter"),
        Binding("slash", "focus_search", "Search", key_display="/"),
        Binding("n", "match(1)", "Next match", group=MATCH_KEYS),
        Binding("N", "match(-1)", "Prev match", key_display="N", group=MATCH_KEYS),
        Binding("c", "clear", "Clear"),
        Binding("escape", "leave_input", "Table", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.flt = RowFilter()
        self.selection: np.ndarray | None = None
        self.rows: TraceRows | LogRows | None = None
        self.needle = ""

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="timeline-bar"):
            yield Input(placeholder=FILTER_HINT, id="filter")
            yield Input(placeholder="search (/)", id="search")
        yield Static(id="timeline-info")
        yield VirtualTable(TRACE_COLUMNS, id="timeline")
        yield RowDetail(id="timeline-detail")

    @property
    def table(self) -> VirtualTable:
        return self.query_one("#timeline", VirtualTable)

    def _kinds(self) -> tuple[str, ...]:
        return LOG_KINDS if isinstance(self.doc, LogDoc) else KINDS

    # -- drawing ------------------------------------------------------------------------

    def show_doc(self, doc: Document, old: Document | None) -> None:
        table = self.table
        if not isinstance(doc, TraceDoc | LogDoc):
            self.rows = None
            table.set_source(EmptySource())
            self._info()
            self.refit()
            return
        if old is None or type(old) is not type(doc):
            self.flt = RowFilter()
            self.query_one("#filter", Input).value = ""
        table.columns = LOG_COLUMNS if isinstance(doc, LogDoc) else TRACE_COLUMNS
        keep = self.current_row()
        if doc.live is not None and (old is None or self._at_end()):
            keep = doc.index.n - 1  # a followed file: the table tails it (up: stays put)
        self._rebuild(doc, keep if old is not None or doc.live is not None else 0)

    def _at_end(self) -> bool:
        """The cursor is on the last row shown (or there are none yet)."""
        return self.rows is None or self.table.cursor >= len(self.rows) - 1

    def _rebuild(self, doc: TraceDoc | LogDoc, keep_row: int | None) -> None:
        if isinstance(doc, TraceDoc):
            self.selection = apply_filter(self.flt, doc.index.columns, KINDS,
                                          doc.index.slot_span_of)
            rows: TraceRows | LogRows = TraceRows(doc, self.selection, self.needle or None)
        else:
            self.selection = apply_filter(self.flt, doc.index.columns, LOG_KINDS)
            rows = LogRows(doc, self.selection, self.needle or None)
        self.rows = rows
        cursor = rows.nearest_position(keep_row) if keep_row is not None and len(rows) else 0
        self.table.set_source(rows, cursor=cursor)
        self._info()
        self.refit()

    def refit(self) -> None:
        self.query_one("#timeline-detail", RowDetail).follow(self.table)

    def _info(self, extra: str = "") -> None:
        doc = self.doc
        if isinstance(doc, TraceDoc | LogDoc):
            total = doc.index.n
            shown = len(self.rows) if self.rows is not None else 0
            what = "lines" if isinstance(doc, LogDoc) else "events"
            text = f"{shown:,} of {total:,} {what}"
            if isinstance(doc, TraceDoc) and not doc.judged:
                judged = doc.digest.rows if doc.digest is not None else 0
                text += f" · reads past event {judged:,} are still judging…"
            if not self.flt.empty:
                text += f" · filter {self.flt.describe()}"
            if self.needle:
                text += f" · search {self.needle!r}"
        else:
            text = (unavailable(doc) if doc is not None else None) or ""
        self.query_one("#timeline-info", Static).update(text + (f" · {extra}" if extra else ""),
                                                        layout=False)

    def current_row(self) -> int | None:
        """The source row under the cursor (index row / log line - 1)."""
        if self.rows is None or not len(self.rows):
            return None
        return self.rows.source_row(self.table.cursor)

    # -- filter and search --------------------------------------------------------------

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.set_filter(event.value)

    def set_filter(self, text: str) -> bool:
        doc = self.doc
        if not isinstance(doc, TraceDoc | LogDoc):
            return False
        try:
            flt = parse_filter(text, self._kinds())
        except FilterError as exc:
            self._info(f"[red]{exc}[/]")
            return False
        if flt == self.flt:
            return True
        self.flt = flt
        self._rebuild(doc, self.current_row())
        return True

    @on(Input.Changed, "#search")
    def search_changed(self, event: Input.Changed) -> None:
        self.needle = event.value
        self._search(forward=True, from_next=False)

    @on(Input.Submitted, "#search")
    def search_submitted(self, event: Input.Submitted) -> None:
        # enter ends the typing: the table takes the keys again, so n / N step through the
        # matches instead of going into the search box
        self._search(forward=True, from_next=True)
        self.table.focus()

    @on(Input.Submitted, "#filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    def _search(self, *, forward: bool, from_next: bool) -> None:
        doc = self.doc
        if not isinstance(doc, TraceDoc | LogDoc) or self.rows is None:
            return
        if self.doc is not None and isinstance(self.rows, TraceRows | LogRows):
            self.rows.needle = self.needle or None
            self.rows._row.cache_clear()
            self.table.invalidate()
        if not self.needle:
            self._info()
            return
        here = self.current_row() or 0
        start = here + 1 if (from_next and forward) else here
        offsets = doc.index.columns["offset"]
        start = min(start, max(len(offsets) - 1, 0))
        row = find_row(doc.source, offsets, self.needle.encode(), start, forward=forward,
                       selection=self.selection)
        if row is None:
            self._info("[yellow]no match[/]")
            return
        pos = self.rows.position_of(row)
        if pos is not None:
            self.table.go_to(pos)
        self._info()

    def action_match(self, direction: int) -> None:
        if self.needle:
            self._search(forward=direction > 0, from_next=True)

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_leave_input(self) -> None:
        self.table.focus()

    def action_clear(self) -> None:
        self.query_one("#search", Input).value = ""
        self.query_one("#filter", Input).value = ""
        self.needle = ""
        self.set_filter("")
        self.table.focus()

    # -- navigation ---------------------------------------------------------------------

    @on(RowHighlighted, "#timeline")
    def highlighted(self, message: RowHighlighted) -> None:
        self.refit()
        doc = self.doc
        row = self.current_row()
        if isinstance(doc, TraceDoc) and row is not None:
            self.kv.step = int(doc.index.columns["step"][row])

    @on(RowSelected, "#timeline")
    def selected(self, message: RowSelected) -> None:
        doc = self.doc
        row = self.current_row()
        if not isinstance(doc, TraceDoc) or row is None:
            return
        c = doc.index.columns
        kind = KINDS[int(c["kind"][row])]
        page = int(c["a"][row]) if kind in ("upload", "evict") else None
        if kind == "read" and doc.digest is not None and row < doc.digest.rows:
            # open the read at its first page the judgement did not find exact, if any
            judged = read_judged(doc.digest, row)
            if judged is not None and len(judged.pieces):
                page = int(judged.pieces["begin"].min())
        stream: int | None = None
        if kind == "mark" and isinstance(self.rows, TraceRows) and doc.geometry is not None:
            # open the Pages on the first page the mark put outside the window
            event = self.rows.event(row)
            if isinstance(event, ev.Mark) and event.outside:
                stream, page = place(doc.geometry, *event.outside[0])

        def opt(name: str) -> int | None:
            v = int(c[name][row])
            return v if v >= 0 else None

        evidence = Evidence(seq=int(c["seq"][row]), step=int(c["step"][row]),
                            layer=opt("layer"),
                            stream=stream if stream is not None else opt("stream"), page=page)
        target = evidence_target(self.doc_index, kind, row, evidence)
        if target.screen == "timeline":
            self.notify(f"a {kind} event has no other view", timeout=2)
            return
        self.kv.jump(target)

    def go_to(self, target: Target) -> None:
        doc = self.doc
        if target.row is None or self.rows is None or not isinstance(doc, TraceDoc | LogDoc):
            return
        pos = self.rows.position_of(target.row)
        if pos is None:
            self.query_one("#filter", Input).value = ""
            self.flt = RowFilter()
            self._rebuild(doc, target.row)
            self.notify("filter cleared to show the target", timeout=3)
            pos = self.rows.position_of(target.row)
        if pos is not None:
            self.table.go_to(pos)
        self.table.focus()

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0), row=self.current_row())

