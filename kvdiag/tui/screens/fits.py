"""3 Fits: every fits() decision in a table; the selected one explained below."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.style import Style
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from kvdiag.analysis.judgement.fits import OUTCOME_CODE
from kvdiag.analysis.trace_index import F_FITS_FALSE, ROUTES
from kvdiag.tui.document import Document, LogDoc, TraceDoc
from kvdiag.tui.fitsdetail import FitsStyles, fits_detail, fitsline_detail
from kvdiag.tui.messages import RowHighlighted
from kvdiag.tui.navigation import Target
from kvdiag.tui.rows import FITS_COLUMNS, LOG_FITS_COLUMNS, FitsRows, LogFitsRows, log_fits_records
from kvdiag.tui.rowsource import EmptySource
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.virtual_table import VirtualTable


class FitsDetail(Static):
    """The explanation pane; its colours come from the stylesheet."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fits-detail--failed", "fits-detail--ok", "fits-detail--dim", "fits-detail--heading",
    }

    def styles_for_detail(self) -> FitsStyles:
        def get(name: str) -> Style:
            return self.get_component_rich_style(f"fits-detail--{name}", default=Style())

        return FitsStyles(failed=get("failed"), ok=get("ok"), dim=get("dim"),
                          heading=get("heading"))


class FitsScreen(KvScreen):
    MODE = "fits"
    AUTO_FOCUS = "#fits-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "timeline", "In Timeline"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.rows: FitsRows | LogFitsRows | None = None

    def compose_body(self) -> ComposeResult:
        yield Static(id="fits-info")
        yield VirtualTable(FITS_COLUMNS, id="fits-table")
        with VerticalScroll(id="fits-detail-scroll"):
            yield FitsDetail(id="fits-detail")

    @property
    def table(self) -> VirtualTable:
        return self.query_one("#fits-table", VirtualTable)

    def show_doc(self, doc: Document, old: Document | None) -> None:
        info = self.query_one("#fits-info", Static)
        table = self.table
        keep = table.cursor if old is not None else 0
        if isinstance(doc, TraceDoc) and doc.fits_rows is not None:
            self.rows = FitsRows(doc, doc.fits_rows)
            table.columns = FITS_COLUMNS
            table.set_source(self.rows, cursor=keep)
            info.update(self._trace_info(doc, doc.fits_rows))
        elif isinstance(doc, LogDoc):
            records = log_fits_records(doc)
            self.rows = LogFitsRows(records)
            table.columns = LOG_FITS_COLUMNS
            table.set_source(self.rows, cursor=keep)
            info.update(f"{len(records)} instrumented fits=false line(s) in the log" if records
                        else "this log has no instrumented fits=false lines (the runtime prints "
                             "them only when built with the fits diagnostics)")
        else:
            self.rows = None
            table.set_source(EmptySource())
            info.update("indexing… the fits() decisions appear when the index is complete"
                        if isinstance(doc, TraceDoc) else unavailable(doc) or "")
        self._detail()

    @staticmethod
    def _trace_info(doc: TraceDoc, rows: np.ndarray) -> str:
        c = doc.index.columns
        routes: list[int] = (np.bincount(c["a"][rows].clip(0), minlength=len(ROUTES)).tolist()
                             if rows.size else [])
        false = int(np.count_nonzero(c["flags"][rows] & F_FITS_FALSE)) if rows.size else 0
        parts = ", ".join(f"{r} {int(n)}" for r, n in zip(ROUTES, routes, strict=False) if n)
        text = (f"{rows.size:,} fits() decision(s), {false:,} false · routes: {parts or '-'}")
        digest = doc.digest
        missing = None if digest is None else next(
            (k for k in digest.judgement.completeness.missing if k.kind == "fits"), None)
        if missing is not None:
            # no fits events is not "no bad decision": the judgement's completeness says so
            text += f" · fits not recorded: {missing.hides}" + (
                "" if digest is None or digest.done else " (judging…)")
        elif digest is not None:
            # the judgement's outcomes: which decisions are bad is its rule, not the route's
            outcome = digest.ledger.fits.array["outcome"]
            bad = {name: int(np.count_nonzero(outcome == OUTCOME_CODE[name]))
                   for name in ("mismatch", "fallback")}
            text += f" · mismatch {bad['mismatch']:,}, fallback {bad['fallback']:,}" + (
                "" if digest.done else " (judging…)")
        return text + " · the pane below explains the selected row"

    @on(RowHighlighted, "#fits-table")
    def highlighted(self, message: RowHighlighted) -> None:
        self._detail()
        if isinstance(self.rows, FitsRows) and isinstance(self.doc, TraceDoc):
            row = self.rows.source_row(self.table.cursor)
            self.kv.step = int(self.doc.index.columns["step"][row])

    def _detail(self) -> None:
        pane = self.query_one("#fits-detail", FitsDetail)
        rows = self.rows
        if rows is None or not len(rows):
            pane.update("")
            return
        i = self.table.cursor
        if isinstance(rows, FitsRows):
            event = rows.event(i)
            plan = self.doc.header.plan if isinstance(self.doc, TraceDoc) else {}
            pane.update(fits_detail(event, rows.verdict(event), pane.styles_for_detail(),
                                    plan.get("stage_bytes") if isinstance(plan, dict) else None)
                        if event is not None else "(this line is not a valid fits event)")
        else:
            pane.update(fitsline_detail(rows.records[i], pane.styles_for_detail()))

    def go_to(self, target: Target) -> None:
        if target.row is None:
            return
        if isinstance(self.rows, LogFitsRows):
            # a log's fits line: the row is the line number - 1
            pos = next((i for i, r in enumerate(self.rows.records)
                        if r.where.line - 1 == target.row), None)
        elif isinstance(self.rows, FitsRows):
            pos = self.rows.position_of(target.row)
        else:
            return
        if pos is not None:
            self.table.go_to(pos)
            self.table.focus()

    def _source_row(self) -> int | None:
        """The Timeline row of the selected decision (trace row, or log line - 1)."""
        rows = self.rows
        if rows is None or not len(rows):
            return None
        if isinstance(rows, FitsRows):
            return rows.source_row(self.table.cursor)
        return rows.records[self.table.cursor].where.line - 1

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0), row=self._source_row())

    def action_timeline(self) -> None:
        row = self._source_row()
        if row is not None:
            self.kv.jump(Target("timeline", self.doc_index, row=row))
