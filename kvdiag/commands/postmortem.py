"""Analyse llama-server logs after a crash: aborts, backtraces, known signatures.

Exit status, the rule of ``check``: 1 when a result reaches --fail-on (default error; every
crash counts as an error-level result, whichever rule names it), else 0; 2 input errors (a log
or binary that cannot be read; partial input is still analysed and the break reported).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvdiag.commands._formats import add_format_args, chosen_format
from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, UsageError

if TYPE_CHECKING:
    from kvdiag.model.findings import Finding, Severity
    from kvdiag.model.logrecords import LogScan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="log files (.gz accepted); '-' reads standard input")
    parser.add_argument("--binary", action="append", default=[], metavar="PATH",
                        help="ELF binary or shared library the crash ran (repeatable); "
                             "frames in it are symbolized from its DWARF")
    parser.add_argument("--no-auto-binaries", action="store_true",
                        help="do not symbolize with the files found at the module paths the "
                             "log printed (only --binary)")
    parser.add_argument("--debug-dir", metavar="DIR",
                        help="directory with separate debug files (.build-id/xx/yyyy.debug)")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not read or write the symbolizer's on-disk index cache")
    parser.add_argument("--fail-on", default="error",
                        help="exit 1 when a result has this severity or higher (info, warning, "
                             "error, critical; default error); a crash counts as an error")
    add_format_args(parser)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from kvdiag.analysis.signatures import evaluate
    from kvdiag.errors import InputError
    from kvdiag.files.logs import open_log
    from kvdiag.model.findings import Severity
    from kvdiag.postmortem.parse import LogParser
    from kvdiag.report.postmortem import postmortem_renderable, postmortem_to_json
    from kvdiag.trace.segments import starts_a_trace

    try:
        threshold = Severity.parse(args.fail_on)
    except ValueError as exc:
        raise UsageError(f"--fail-on: {exc}") from None
    fmt = chosen_format(args)
    parser = LogParser()
    for path in args.logs:
        with open_log(path) as log:
            peek = getattr(log.stream, "peek", None)
            head = peek(4096)[:4096] if callable(peek) else b""
            if starts_a_trace(head):
                # a trace's lines hold JSON the log grammar half-reads (its abort message
                # became a crash with no backtrace): refused, as import refuses it
                raise InputError(f"{log.name}: this is a kvtrace trace, not a server log: "
                                 "kvdiag check reads it (and trace export --format llama-log "
                                 "writes the log its run would print)")
            parser.feed(log.name, log.stream, leading_nuls=log.leading_nuls)
    scan = parser.result()
    if args.debug_dir and not args.binary and args.no_auto_binaries:
        raise UsageError("--debug-dir needs at least one --binary")
    if args.binary or (scan.crashes and not args.no_auto_binaries):
        from kvdiag.postmortem.resymbolize import resymbolize

        scan = resymbolize(scan, args.binary, args.debug_dir, use_cache=not args.no_cache,
                           auto=not args.no_auto_binaries)
    findings = evaluate(scan)
    code = EXIT_FINDINGS if failing(scan, findings, threshold) else EXIT_OK
    if any(p.message.startswith("input breaks") for p in scan.problems):
        code = EXIT_USAGE
    if fmt == "json":
        json.dump(postmortem_to_json(scan, findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "text":
        from kvdiag.report.console import is_terminal, print_renderables

        print_renderables([postmortem_renderable(scan, findings, full_paths=not is_terminal())])
    else:
        from kvdiag.report.postmortem_formats import write_postmortem

        write_postmortem(fmt, args.logs, scan, findings, code, threshold)
    for p in scan.problems:
        if p.message.startswith("input breaks"):
            # on stderr in every output mode: a --json consumer may not read "problems"
            print(f"kvdiag: {p.source}: {p.message}", file=sys.stderr)
    return code


def failing(scan: LogScan, findings: Sequence[Finding], threshold: Severity) -> bool:
    """Whether a result reaches ``threshold``: a finding of that severity or higher, or a
    crash when the threshold is ``error`` or lower (a crash no rule names is still one)."""
    from kvdiag.model.findings import Severity

    return (any(f.severity >= threshold for f in findings)
            or (bool(scan.crashes) and threshold <= Severity.ERROR))
