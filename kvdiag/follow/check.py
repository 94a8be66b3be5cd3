"""``kvdiag check --follow F [--exit-on SEVERITY]``: each finding printed when it first appears,
flushed at once (a pipe or a CI log sees it when it happens).

Text: one line per finding (time, severity, rule, title), its evidence so far indented below,
then its fix. ``--json``: one JSON object per line — ``{"type": "finding", …}`` (the
finding as ``kvdiag check --json`` prints it, with the time and file) and at the end
``{"type": "end", …}``. Notices (waiting for the file, replaced, truncated) go to stderr.

Exit status: with ``--exit-on``, 1 at the first finding at or above it (following stops
there); at a trace's End event or on Ctrl-C, 1 when a finding reached ``--fail-on``, else 0;
2 when the file cannot be followed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import msgspec

from kvdiag.errors import EXIT_FINDINGS, EXIT_OK
from kvdiag.follow.watch import Followed, Follower, Stop
from kvdiag.model.findings import Finding, Severity
from kvdiag.report.findings_plain import evidence_text, finding_to_json


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class _Printer:
    def __init__(self, path: str, json_out: bool, exit_on: Severity | None,
                 allow_incomplete: bool) -> None:
        self.path = path
        self.json = json_out
        self.exit_on = exit_on
        self.allow_incomplete = allow_incomplete
        self.stopped_by: Finding | None = None

    def severity(self, f: Finding) -> Severity:
        if self.allow_incomplete and f.rule == "trace-incomplete":
            return Severity.WARNING
        return f.severity

    def finding(self, f: Finding) -> None:
        sev = self.severity(f)
        if self.json:
            doc = {"type": "finding", "time": _clock(), "file": self.path,
                   **finding_to_json(msgspec.structs.replace(f, severity=sev))}
            sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        else:
            lines = [f"[{_clock()}] {sev.label.upper()} {f.rule}: {f.title}"]
            lines += [f"    {evidence_text(e)}" for e in f.evidence]
            if f.fix:
                lines.append(f"    fix: {f.fix}")
            sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        if self.exit_on is not None and sev >= self.exit_on:
            self.stopped_by = f
            raise Stop

    def notice(self, text: str) -> None:
        print(f"kvdiag check --follow: {text}", file=sys.stderr, flush=True)

    def end(self, state: Followed, how: str, code: int, threshold: Severity) -> None:
        failing = sum(1 for f in [*state.findings, *state.final]
                      if self.severity(f) >= threshold)
        if self.json:
            doc = {"type": "end", "file": self.path, "how": how, "events": state.events,
                   "findings": len(state.findings) + len(state.final), "failing": failing,
                   "problems": state.problems, "exit": code}
            sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        else:
            for p in state.problems[:10]:
                sys.stdout.write(f"problem: {p}\n")
            sys.stdout.write(f"{how}: {state.events} event(s) judged, "
                             f"{len(state.findings) + len(state.final)} finding(s), "
                             f"{failing} at or above {threshold.label}\n")
        sys.stdout.flush()


def follow_check(path: str, *, json_out: bool, fail_on: Severity, exit_on: Severity | None,
                 allow_incomplete: bool) -> int:
    printer = _Printer(path, json_out, exit_on, allow_incomplete)
    follower = Follower(path, printer.finding, printer.notice)
    printer.notice(f"following {path} (Ctrl-C stops)")
    interrupted = False
    try:
        state = follower.run()
    except KeyboardInterrupt:
        state, interrupted = follower.state, True
    if printer.stopped_by is not None:
        f = printer.stopped_by
        printer.end(state, f"stopped at {f.rule} ({printer.severity(f).label}, at or above "
                           f"--exit-on {exit_on.label if exit_on else ''})", EXIT_FINDINGS,
                    fail_on)
        return EXIT_FINDINGS
    for f in state.final:
        printer.exit_on = None  # the trace has ended: report the rest, stop nothing
        printer.finding(f)
    findings: Sequence[Finding] = [*state.findings, *state.final]
    limit = min(fail_on, exit_on) if exit_on is not None else fail_on
    code = EXIT_FINDINGS if any(printer.severity(f) >= limit for f in findings) else EXIT_OK
    how = ("end of trace" if state.ended else
           "interrupted" if interrupted else "stopped")
    printer.end(state, how, code, fail_on)
    return code
