"""Render findings as a rich table or as JSON-ready dicts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvdiag.model.findings import Evidence, Finding, Severity
from kvdiag.report.text import cap

SEVERITY_STYLE = {
    Severity.INFO: "cyan",
    Severity.WARNING: "yellow",
    Severity.ERROR: "red",
    Severity.CRITICAL: "bold white on red",
}


def evidence_text(ev: Evidence) -> str:
    """A short human form: ``#123 step 4 layer 2 stream 1 page 0`` or ``log:12``."""
    parts: list[str] = []
    if ev.seq is not None:
        parts.append(f"#{ev.seq}")
    if ev.source is not None:
        parts.append(f"{ev.source}:{ev.line}" if ev.line is not None else ev.source)
    elif ev.line is not None:
        parts.append(f"line {ev.line}")
    for name in ("step", "layer", "stream", "page"):
        value = getattr(ev, name)
        if value is not None:
            parts.append(f"{name} {value}")
    text = " ".join(parts)
    if ev.text:
        shown = cap(ev.text)
        text = f"{text}: {shown}" if text else shown
    return text


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


def finding_to_json(f: Finding) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(f)
    out["severity"] = f.severity.label
    return out


def findings_to_json(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [finding_to_json(f) for f in findings]
