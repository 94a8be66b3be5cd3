"""Render findings as a rich table (their plain text and JSON: :mod:`.findings_plain`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvdiag.model.findings import Finding, Severity
from kvdiag.report.findings_plain import evidence_text
from kvdiag.report.text import cap

SEVERITY_STYLE = {
    Severity.INFO: "cyan",
    Severity.WARNING: "yellow",
    Severity.ERROR: "red",
    Severity.CRITICAL: "bold white on red",
}


def findings_table(findings: Sequence[Finding], max_evidence: int = 3) -> RenderableType:
    if not findings:
        return Text("no findings", style="green")
    table = Table(title="Findings", expand=True, show_lines=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("finding", ratio=3)
    table.add_column("evidence", ratio=2)
    for f in sorted(findings, key=lambda f: -int(f.severity)):
        shown = [evidence_text(e) for e in f.evidence[:max_evidence]]
        total = f.details.get("evidence_total", len(f.evidence))
        if total > len(shown):
            command = f.details.get("evidence_command")
            shown.append(f"first {len(shown)} of {total}"
                         + (f" ({len(f.evidence)} in --json)" if len(f.evidence) > len(shown) else "")
                         + (f"; all: {cap(command)}" if isinstance(command, str) else ""))
        body: list[RenderableType] = [Text(cap(f.title))]
        if f.fix:
            body.append(Text(f"fix: {cap(f.fix)}", style="dim"))
        table.add_row(
            Text(f.severity.label, style=SEVERITY_STYLE[f.severity]),
            f.rule,
            Group(*body),
            "\n".join(shown),
        )
    return table
