"""Findings in the formats CI systems read: SARIF 2.1.0, JUnit XML and Markdown.

SARIF follows the OASIS SARIF 2.1.0 standard (sarifLog → runs[] → tool.driver.rules[] and
results[]; result.level is ``error``/``warning``/``note``; §3.27.10 of the standard), and
tests validate the output against the standard's JSON schema. JUnit XML follows the shape
pytest's junitxml plugin writes (``testsuites/testsuite/testcase/failure`` with the
``tests``/``failures``/``errors``/``skipped`` counts on the suite), which is what Jenkins,
GitLab and GitHub test reporters parse. ``--format`` of ``check`` and ``postmortem`` picks one.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree as ET

from kvdiag import __version__
from kvdiag.model.findings import Evidence, Finding, Severity
from kvdiag.report.findings_plain import evidence_text
from kvdiag.report.text import cap

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://github.com/kvdiag/kvdiag"

_LEVEL = {Severity.INFO: "note", Severity.WARNING: "warning", Severity.ERROR: "error",
          Severity.CRITICAL: "error"}


def _ordered(findings: Sequence[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: -int(f.severity))


# -- SARIF ---------------------------------------------------------------------------------


def _sarif_location(artifact: str, ev: Evidence) -> dict[str, Any]:
    """A log line is a physical location (file and line); a trace event is named by its
    ``seq`` as a logical location, since a damaged trace's line numbers differ from seq."""
    uri = ev.source if ev.source is not None else artifact
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if ev.line is not None and ev.line >= 1:
        physical["region"] = {"startLine": ev.line}
    location: dict[str, Any] = {"physicalLocation": physical}
    if ev.seq is not None:
        where = " ".join(f"{name} {getattr(ev, name)}" for name in ("step", "layer", "stream",
                                                                    "page")
                         if getattr(ev, name) is not None)
        location["logicalLocations"] = [{"name": f"event #{ev.seq}", "kind": "trace-event",
                                         "fullyQualifiedName": f"#{ev.seq} {where}".strip()}]
    if ev.text:
        location["message"] = {"text": cap(ev.text)}
    return location


InputProblem = tuple[str, int | None, str]
"""(file, line or None, message) of a damage in the input that was read past: a trace's
corrupt or cut line, a log's replaced bytes or gzip break."""


def findings_sarif(findings: Sequence[Finding], artifact: str, *, command: str,
                   exit_code: int, problems: Sequence[InputProblem] = ()) -> dict[str, Any]:
    """One SARIF log with one run: a rule per rule id, a result per finding; each problem of
    the input a ``toolExecutionNotification`` of the invocation (SARIF §3.20.21: what went
    wrong while the tool ran, not a result), so a damaged input is not a clean report."""
    rules: dict[str, int] = {}
    rule_objs: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for f in _ordered(findings):
        if f.rule not in rules:
            rules[f.rule] = len(rule_objs)
            rule: dict[str, Any] = {"id": f.rule, "name": f.rule,
                                    "shortDescription": {"text": f.rule},
                                    "defaultConfiguration": {"level": _LEVEL[f.severity]}}
            if f.fix:
                rule["help"] = {"text": cap(f.fix)}
            rule_objs.append(rule)
        result: dict[str, Any] = {
            "ruleId": f.rule, "ruleIndex": rules[f.rule], "level": _LEVEL[f.severity],
            "message": {"text": cap(f.title)},
            "locations": [_sarif_location(artifact, e) for e in f.evidence[:10]]
                         or [{"physicalLocation": {"artifactLocation": {"uri": artifact}}}],
            "properties": {"severity": f.severity.label, "evidenceCount": len(f.evidence)},
        }
        if f.fix:
            result["properties"]["fix"] = cap(f.fix)
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "kvdiag", "version": __version__,
                                "informationUri": INFORMATION_URI, "rules": rule_objs}},
            "artifacts": [{"location": {"uri": artifact}}],
            "invocations": [{"commandLine": command, "executionSuccessful": True,
                             "exitCode": exit_code,
                             **({"toolExecutionNotifications": [
                                 _sarif_notification(p) for p in problems]}
                                if problems else {})}],
            "results": results,
        }],
    }


def _sarif_notification(problem: InputProblem) -> dict[str, Any]:
    source, line, message = problem
    physical: dict[str, Any] = {"artifactLocation": {"uri": source}}
    if line is not None and line >= 1:
        physical["region"] = {"startLine": line}
    return {"level": "warning", "message": {"text": cap(message)},
            "locations": [{"physicalLocation": physical}]}


def problem_text(problem: InputProblem) -> str:
    """``file:line: message`` (``file: message`` without a line)."""
    source, line, message = problem
    return f"{source}{'' if line is None else f':{line}'}: {cap(message)}"


# -- JUnit XML -----------------------------------------------------------------------------


def findings_junit(findings: Sequence[Finding], artifact: str, *, suite: str,
                   threshold: Severity, problems: Sequence[InputProblem] = ()) -> str:
    """One testsuite; one testcase per finding (a ``failure`` when at or above the threshold,
    a pass with the finding in ``system-out`` below it); a run without findings is one
    passing testcase, so the report is never empty. The input's problems go to the suite's
    ``system-err``, one line each (they do not change the exit code, so they fail nothing)."""
    cases: list[ET.Element] = []
    failures = 0
    for f in _ordered(findings):
        case = ET.Element("testcase", {"classname": f"kvdiag.{suite}.{f.rule}",
                                       "name": cap(f.title, 200), "file": artifact, "time": "0"})
        body = "\n".join([cap(f.title), *(cap(evidence_text(e)) for e in f.evidence[:20]),
                          *([f"fix: {cap(f.fix)}"] if f.fix else [])])
        if f.severity >= threshold:
            failures += 1
            failure = ET.SubElement(case, "failure", {
                "message": f"{f.severity.label}: {cap(f.title, 500)}", "type": f.rule})
            failure.text = body
        else:
            ET.SubElement(case, "system-out").text = f"{f.severity.label}: {body}"
        cases.append(case)
    if not cases:
        cases.append(ET.Element("testcase", {"classname": f"kvdiag.{suite}", "name": artifact,
                                             "file": artifact, "time": "0"}))
    root = ET.Element("testsuites", {"name": f"kvdiag {suite}"})
    ts = ET.SubElement(root, "testsuite", {
        "name": f"kvdiag {suite} {artifact}", "errors": "0", "failures": str(failures),
        "skipped": "0", "tests": str(len(cases)), "time": "0",
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname()})
    ts.extend(cases)
    if problems:
        ET.SubElement(ts, "system-err").text = "\n".join(
            "input problem: " + problem_text(p) for p in problems)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


# -- Markdown ------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return cap(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def findings_markdown(title: str, facts: Sequence[tuple[str, str]],
                      findings: Sequence[Finding], verdict: str) -> str:
    """A heading, the run's facts, a findings table and the verdict line (GitHub-flavoured
    tables: pipes escaped, newlines as ``<br>``; nothing is cut except per-field caps)."""
    lines = [f"# {_md_cell(title)}", ""]
    lines += [f"- **{_md_cell(k)}**: {_md_cell(v)}" for k, v in facts]
    lines.append("")
    if findings:
        lines += ["| severity | rule | finding | evidence | fix |", "|---|---|---|---|---|"]
        for f in _ordered(findings):
            evidence = "<br>".join(_md_cell(evidence_text(e)) for e in f.evidence[:5])
            if len(f.evidence) > 5:
                evidence += f"<br>… and {len(f.evidence) - 5} more"
            lines.append(f"| {f.severity.label} | `{f.rule}` | {_md_cell(f.title)} | "
                         f"{evidence} | {_md_cell(f.fix)} |")
        lines.append("")
    lines.append(f"**{_md_cell(verdict)}**")
    return "\n".join(lines) + "\n"
