"""7 Findings: every finding with its evidence; enter jumps to where the evidence is."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from kvdiag.analysis.trace_index import KINDS
from kvdiag.model.findings import Evidence, Finding
from kvdiag.model.logrecords import Crash
from kvdiag.report.findings_plain import evidence_text
from kvdiag.tui.document import Document, LogDoc, TraceDoc
from kvdiag.tui.messages import RowHighlighted, RowSelected
from kvdiag.tui.navigation import Target, evidence_target
from kvdiag.tui.rows import log_fits_records
from kvdiag.tui.rowsource import Cells, Column
from kvdiag.tui.screens.base import KvScreen
from kvdiag.tui.summaries import unavailable
from kvdiag.tui.widgets.row_detail import RowDetail
from kvdiag.tui.widgets.virtual_table import VirtualTable

FINDING_COLUMNS = (Column("severity", 9), Column("rule", 32), Column("finding", 0),
                   Column("evidence", 12, "right"))


def finding_columns(rows: FindingRows) -> tuple[Column, ...]:
    """The columns as wide as the longest rule and count, so that on a narrow screen the
    finding's title, not blank padding, gets the room (the pane below shows it whole)."""
    cells = [rows.row(i)[0] for i in range(len(rows))]
    rule = max([len("rule"), *(len(str(c[1])) for c in cells)])
    count = max([len("evidence"), *(len(str(c[3])) for c in cells)])
    return (Column("severity", 9), Column("rule", rule), Column("finding", 0),
            Column("evidence", count, "right"))


def evidence_count(f: Finding) -> tuple[int, int]:
    """(evidence items the finding carries, occurrences the rule counted). A rule keeps its
    first items only and records the total in ``details["count"]`` (kvdiag.analysis.judgement.findings
    MAX_EVIDENCE), so a count shown without the total would understate it."""
    shown = len(f.evidence)
    total = f.details.get("count")
    if isinstance(total, int) and not isinstance(total, bool) and total > shown:
        return shown, total
    return shown, shown
EVIDENCE_COLUMNS = (Column("#", 3, "right"), Column("opens", 10), Column("evidence", 0))


def _order(findings: tuple[Finding, ...]) -> list[Finding]:
    return sorted(findings, key=lambda f: -int(f.severity))


def crash_at_line(crashes: tuple[Crash, ...], source: str | None, line: int) -> int | None:
    """Index of the crash that a log line belongs to (its first line or a part's line)."""
    for i, c in enumerate(crashes):
        wheres = [c.where, *(p.where for p in (c.abort, c.error, c.signal, c.backtrace)
                             if p is not None), *(st.where for st in c.python)]
        if any(w.line == line and (source is None or w.source == source) for w in wheres):
            return i
    return None


class FindingRows:
    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings

    def __len__(self) -> int:
        return len(self.findings)

    def row(self, i: int) -> tuple[Cells, str]:
        f = self.findings[i]
        shown, total = evidence_count(f)
        count = str(shown) if shown == total else f"{shown} of {total}"
        return [f.severity.label, f.rule, f.title, count], f.severity.label


class EvidenceRows:
    def __init__(self, evidence: tuple[Evidence, ...], targets: list[Target | None]) -> None:
        self.evidence = evidence
        self.targets = targets

    def __len__(self) -> int:
        return len(self.evidence)

    def row(self, i: int) -> tuple[Cells, str]:
        t = self.targets[i]
        return [str(i + 1), t.screen if t is not None else "-", evidence_text(self.evidence[i])], ""


class FindingsScreen(KvScreen):
    MODE = "findings"
    AUTO_FOCUS = "#findings-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "jump", "Jump to evidence"),
        Binding("tab", "swap", "Findings/evidence", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.findings: list[Finding] = []
        self.evidence_rows: EvidenceRows | None = None

    def compose_body(self) -> ComposeResult:
        yield VirtualTable(FINDING_COLUMNS, id="findings-table")
        with VerticalScroll(id="finding-detail-scroll"):
            yield Static(id="finding-detail")
        yield VirtualTable(EVIDENCE_COLUMNS, id="evidence-table")
        yield RowDetail(id="evidence-detail")

    def show_doc(self, doc: Document, old: Document | None) -> None:
        table = self.query_one("#findings-table", VirtualTable)
        if isinstance(doc, TraceDoc | LogDoc):
            self.findings = _order(tuple(doc.findings))
        else:
            self.findings = []
        rows = FindingRows(self.findings)
        table.columns = finding_columns(rows)
        table.set_source(rows, cursor=table.cursor if old else 0)
        if not self.findings:
            text = ("judging… findings appear as the judgement reaches them"
                    if isinstance(doc, TraceDoc) and not doc.judged
                    else unavailable(doc) or "no findings")
            self.query_one("#finding-detail", Static).update(text)
            self.query_one("#evidence-table", VirtualTable).set_source(EvidenceRows((), []))
            self.refit()
            return
        if old is None:
            table.focus()
        self._detail()

    @property
    def finding(self) -> Finding | None:
        i = self.query_one("#findings-table", VirtualTable).cursor
        return self.findings[i] if 0 <= i < len(self.findings) else None

    def _detail(self) -> None:
        f = self.finding
        if f is None:
            return
        parts: list[RenderableType] = [Text(f"{f.severity.label}: {f.title}", style="bold")]
        parts.append(Text(f"rule {f.rule}", style="dim"))
        if f.fix:
            parts.append(Text(f"fix: {f.fix}"))
        for k, v in f.details.items():
            if k not in ("backtrace",) and v not in (None, "", [], {}):
                shown = ", ".join(map(str, v)) if isinstance(v, list | tuple) else v
                parts.append(Text(f"{k}: {shown}", style="dim"))
        shown, total = evidence_count(f)
        if total > shown:
            parts.append(Text(f"evidence below: the first {shown} of {total}", style="bold"))
        self.query_one("#finding-detail", Static).update(Group(*parts))
        targets = [self.target_for(e) for e in f.evidence]
        self.evidence_rows = EvidenceRows(f.evidence, targets)
        self.query_one("#evidence-table", VirtualTable).set_source(self.evidence_rows, cursor=0)

    def target_for(self, e: Evidence) -> Target | None:
        doc = self.doc
        if isinstance(doc, TraceDoc) and e.seq is not None:
            row = doc.index.row_of_seq(e.seq)
            if row is None:
                return None
            kind = KINDS[int(doc.index.columns["kind"][row])]
            return evidence_target(self.doc_index, kind, row, e)
        if isinstance(doc, LogDoc) and e.line is not None:
            crash = crash_at_line(doc.scan.crashes, e.source, e.line)
            fits = any(r.where.line == e.line for r in log_fits_records(doc))
            return evidence_target(self.doc_index, "fits" if fits else None, e.line - 1, e,
                                   crash=crash)
        return None

    @on(RowHighlighted, "#findings-table")
    def finding_highlighted(self, message: RowHighlighted) -> None:
        self._detail()

    @on(RowSelected, "#findings-table")
    def finding_selected(self, message: RowSelected) -> None:
        self._jump(0)

    @on(RowHighlighted, "#evidence-table")
    def evidence_highlighted(self, message: RowHighlighted) -> None:
        self.refit()

    def refit(self) -> None:
        self.query_one("#evidence-detail", RowDetail).follow(
            self.query_one("#evidence-table", VirtualTable))

    @on(RowSelected, "#evidence-table")
    def evidence_selected(self, message: RowSelected) -> None:
        self._jump(message.row)

    def action_jump(self) -> None:
        focused = self.focused
        if focused is not None and focused.id == "evidence-table":
            self._jump(self.query_one("#evidence-table", VirtualTable).cursor)
        else:
            self._jump(0)

    def _jump(self, i: int) -> None:
        rows = self.evidence_rows
        if rows is None or not 0 <= i < len(rows):
            self.notify("this finding cites no evidence", timeout=2)
            return
        target = rows.targets[i]
        if target is None:
            self.notify("the evidence is not in this file", timeout=2)
            return
        self.kv.jump(target)

    def action_swap(self) -> None:
        focused = self.focused
        target = "#findings-table" if focused is not None and focused.id == "evidence-table" \
            else "#evidence-table"
        self.query_one(target, VirtualTable).focus()

    def go_to(self, target: Target) -> None:
        if target.finding is not None:
            self.query_one("#findings-table", VirtualTable).go_to(target.finding)

    def location(self) -> Target:
        return Target(self.MODE, max(self.doc_index, 0),
                      finding=self.query_one("#findings-table", VirtualTable).cursor)
