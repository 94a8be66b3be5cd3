"""``kvdiag postmortem --format markdown|sarif|junit``: the findings of a log scan in the
formats of :mod:`kvdiag.report.formats` (JSON and text live in report.postmortem)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from kvdiag.model.findings import Finding, Severity
from kvdiag.model.logrecords import LogScan
from kvdiag.report.formats import findings_junit, findings_markdown, findings_sarif


def write_postmortem(fmt: str, logs: Sequence[str], scan: LogScan,
                     findings: Sequence[Finding], exit_code: int,
                     threshold: Severity = Severity.ERROR) -> None:
    artifact = ", ".join("<stdin>" if p == "-" else p for p in logs)
    problems = [(p.source, p.line, p.message) for p in scan.problems]
    if fmt == "sarif":
        doc = findings_sarif(findings, artifact, command=f"kvdiag postmortem {' '.join(logs)}",
                             exit_code=exit_code, problems=problems)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "junit":
        # failures are the results at or above --fail-on, as the exit code counts them
        sys.stdout.write(findings_junit(findings, artifact, suite="postmortem",
                                        threshold=threshold, problems=problems))
        sys.stdout.write("\n")
    elif fmt == "markdown":
        facts = [("logs", artifact), ("lines", f"{scan.lines:,}"),
                 ("crashes", str(len(scan.crashes))), ("boots", str(len(scan.boots)))]
        facts += [(f"problem ({p.source}:{p.line})" if p.line is not None
                   else f"problem ({p.source})", p.message) for p in scan.problems]
        verdict = (f"{len(scan.crashes)} crash(es) found" if scan.crashes
                   else "OK — no crash found")
        sys.stdout.write(findings_markdown(f"kvdiag postmortem {artifact}", facts, findings,
                                           verdict))
    else:
        raise ValueError(f"unknown format {fmt!r}")
