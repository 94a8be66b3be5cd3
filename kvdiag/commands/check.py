"""Analyse a trace: findings with rule ids, evidence and fixes; CI exit codes.

Exit status: 0 no finding at or above --fail-on, 1 some, 2 the trace cannot be read.
With --follow, judge a trace or a llama-server log while it is written and print each finding
when it first appears; --exit-on SEVERITY stops at the first finding at or above it (exit 1).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvdiag.commands._formats import add_format_args, chosen_format

if TYPE_CHECKING:
    from kvdiag.judged.trace import CheckResult


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trace file (.kvtrace); '-' reads standard input")
    add_format_args(parser)
    parser.add_argument("--fail-on", default="error",
                        help="exit 1 when a finding has this severity or higher "
                             "(info, warning, error, critical; default error)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="a run that did not complete (no End event, or End status "
                             "error: killed, interrupted) is a warning instead of an error")
    parser.add_argument("--follow", action="store_true",
                        help="read FILE (a trace or a llama-server log) as it grows and print "
                             "each finding when it first appears; follows a file replaced or "
                             "truncated, waits for one not created yet; ends at the trace's "
                             "End event or Ctrl-C")
    parser.add_argument("--exit-on", metavar="SEVERITY",
                        help="with --follow: stop at the first finding of this severity or "
                             "higher, with its evidence, exit 1 (a watchdog)")


def run(args: argparse.Namespace) -> int:
    from kvdiag.errors import UsageError
    from kvdiag.model.findings import Severity

    if args.exit_on is not None and not args.follow:
        raise UsageError("--exit-on needs --follow (without it, --fail-on sets the exit code)")
    if args.follow:
        from kvdiag.follow.check import follow_check

        fmt = chosen_format(args)
        if fmt not in (None, "text", "json"):
            raise UsageError(f"--follow prints text or JSON Lines, not {fmt}")
        if args.file == "-":
            raise UsageError("--follow follows a file by its name, not standard input")
        try:
            fail_on = Severity.parse(args.fail_on)
            exit_on = Severity.parse(args.exit_on) if args.exit_on is not None else None
        except ValueError as exc:
            raise UsageError(f"--fail-on/--exit-on: {exc}") from None
        return follow_check(args.file, json_out=fmt == "json", fail_on=fail_on,
                            exit_on=exit_on, allow_incomplete=args.allow_incomplete)

    return check_file(args.file, fail_on=args.fail_on, fmt=chosen_format(args),
                      allow_incomplete=args.allow_incomplete)


def _allow_incomplete(result: CheckResult) -> CheckResult:
    """``--allow-incomplete``: a run that did not complete is a warning, not an error."""
    import msgspec

    from kvdiag.judged.trace import CheckResult
    from kvdiag.model.findings import Severity

    findings = [msgspec.structs.replace(f, severity=Severity.WARNING)
                if f.rule == "trace-incomplete" else f for f in result.findings]
    return CheckResult(result.header, findings, result.summary, result.problems,
                       result.judgement)


def check_file(path: str, json_out: bool = False, fail_on: str = "error",
               allow_incomplete: bool = False, fmt: str | None = None) -> int:
    """Judge the trace at ``path``, print the result in ``fmt``, return the exit code: 1 when
    a finding is at or above ``fail_on``, else 0."""
    from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, UsageError
    from kvdiag.judged.trace import analyse_file
    from kvdiag.model.findings import Severity

    try:
        threshold = Severity.parse(fail_on)
    except ValueError as exc:
        raise UsageError(f"--fail-on: {exc}") from None
    result = analyse_file(path)
    if allow_incomplete:
        result = _allow_incomplete(result)
    failing = [f for f in result.findings if f.severity >= threshold]
    code = EXIT_FINDINGS if failing else EXIT_OK
    name = "<stdin>" if path == "-" else str(path)
    fmt = fmt or ("json" if json_out else "text")
    if fmt == "text":
        from kvdiag.report.check import check_report
        from kvdiag.report.console import print_renderables

        print_renderables(check_report(name, result.header, result.findings, result.summary))
    else:
        from kvdiag.report.check_formats import write_check

        write_check(fmt, name, result.header, result.findings, result.summary, threshold, code)
    return code
