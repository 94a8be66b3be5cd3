"""``kvdiag check`` in each ``--format``: JSON, Markdown, SARIF 2.1.0, JUnit XML and the rich
report (:mod:`.check`). Each format imports only what it writes with: ``--format json``, what CI
runs most, imports neither rich nor the XML and SARIF writers."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvdiag.analysis.judgement.gaps import lost_text
from kvdiag.model.events import Header
from kvdiag.model.findings import Finding, Severity
from kvdiag.report.findings_plain import findings_to_json
from kvdiag.report.text import cap

if TYPE_CHECKING:
    from kvdiag.report.formats import InputProblem


def steps_text(summary: dict[str, Any]) -> str:
    """``"4 step(s)"``, with the span when it does not start at 0 and a note when no step
    event marks them (the judgement's one steps rule)."""
    n = summary["steps"]
    span = summary.get("step_span") or {}
    text = f"{n} step(s)"
    if n and span.get("first") not in (None, 0):
        text += f" ({span['first']}-{span['last']})"
    if n and not span.get("step_events"):
        text += ", numbered by the writer (no step events)"
    return text


def verdict_line(findings: Sequence[Finding]) -> str:
    worst = max((f.severity for f in findings), default=None)
    if worst is None:
        return "OK — no findings"
    top = [f for f in findings if f.severity == worst]
    return f"{worst.label.upper()}: {cap(top[0].title)}"


def _problems(path: str, summary: dict[str, Any]) -> list[InputProblem]:
    """The trace's problems (corrupt or cut lines, gaps) as the CI formats carry them."""
    return [(path, p.get("line"), str(p.get("message", ""))) for p in summary.get("problems", [])]


def write_check(fmt: str, path: str, header: Header, findings: Sequence[Finding],
                summary: dict[str, Any], threshold: Severity, exit_code: int) -> None:
    """Print the check result of ``path`` in ``fmt`` (one of report.formats.FORMATS but the
    text report, :func:`kvdiag.report.check.check_report`)."""
    failing = sum(1 for f in findings if f.severity >= threshold)
    if fmt == "json":
        doc = {
            "file": path,
            "scenario": header.scenario.get("name"),
            "backend": header.backend,
            "findings": findings_to_json(findings),
            "summary": summary,
            "fail_on": threshold.label,
            "failing": failing,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "sarif":
        from kvdiag.report.formats import findings_sarif

        doc = findings_sarif(findings, path, command=f"kvdiag check {path}",
                             exit_code=exit_code, problems=_problems(path, summary))
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "junit":
        from kvdiag.report.formats import findings_junit

        sys.stdout.write(findings_junit(findings, path, suite="check", threshold=threshold,
                                        problems=_problems(path, summary)))
        sys.stdout.write("\n")
    elif fmt == "markdown":
        from kvdiag.report.formats import findings_markdown

        sc = header.scenario
        facts = [("trace", path), ("scenario", str(sc.get("name", "?"))),
                 ("executor", f"{header.backend} on {header.device.name}"),
                 ("events", f"{summary['events']} over {steps_text(summary)} "
                            f"[{summary['status']}]"),
                 ("fail on", f"{threshold.label} ({failing} finding(s) at or above)")]
        facts += [(f"trace problem (line {p['line']})", str(p["message"]))
                  for p in summary.get("problems", [])]
        lost = lost_text(summary.get("lost_events"))
        if lost:
            facts.append(("events lost", lost))
        sys.stdout.write(findings_markdown(f"kvdiag check {path}", facts, findings,
                                           verdict_line(findings)))
    else:
        raise ValueError(f"{fmt}: not a format written here (the text report: .check)")
