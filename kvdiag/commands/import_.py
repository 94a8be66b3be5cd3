"""Turn a llama-server log into a trace: fits=false lines, kv_stream_adapt lines, aborts.

The lines instrumented forks already print become events (docs/log-import.md): fits
decisions (evaluated=false: the log does not say which condition failed), partition changes
and adapt samples, fallback and feedback warnings, aborts with their backtraces; the header's
plan comes from the boot lines. Stray bytes (NULs, invalid UTF-8) are replaced and counted.
Exit status: 0 imported, 1 the log holds nothing importable (no file written), 2 bad input
(missing, mostly not text, unreadable, or the log breaks off: the trace then holds every event
before the break) or an output that exists without --force or is not a regular file.
"""

from __future__ import annotations

import argparse

from kvdiag.errors import EXIT_OK, EXIT_USAGE


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="a llama-server log (.gz accepted); '-' "
                        "reads standard input")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="trace to write (default: the log's name with .kvtrace); '-' "
                             "writes it to standard output")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from kvdiag.judged.trace import analyse_file
    from kvdiag.logimport import import_log

    result = import_log(args.log, args.output, force=args.force)
    end = result.end
    # with -o - standard output carries the trace itself (and cannot be read back to judge it)
    report = sys.stderr if args.output == "-" else sys.stdout
    if args.output == "-" or not os.path.isfile(result.output):
        # standard output or the null device: nothing written can be read back to judge it
        again = "kvdiag check - judges what was written" if args.output == "-" else \
            "nothing kept to judge"
        print(f"{result.output}: {result.counts.imported} events from {result.lines} lines, "
              f"end {end.status} ({again})", file=report)
    else:
        # what the trace says is the judgement's, as check, trace info and the TUI will say it
        judgement = analyse_file(result.output).judgement
        counts = ", ".join(f"{k} {n}" for k, n in sorted(judgement.counts.items())
                           if k != "end")
        events = sum(judgement.counts.values()) - judgement.counts.get("end", 0)
        print(f"{result.output}: {events} events from {result.lines} lines ({counts}), "
              f"{judgement.steps.text()}, end {end.status}", file=report)
        missing = [k.kind for k in judgement.completeness.missing]
        if missing:
            print(f"  a log does not record {', '.join(missing)} events: kvdiag check says what "
                  "that leaves unjudged", file=report)
    if result.counts.inferred_routes:
        print(f"  {result.counts.inferred_routes} fits route(s) inferred as fallback "
              "(no abort or fallback warning followed); see the warn events "
              "import-route-inferred", file=report)
    if result.counts.out_of_range:
        print(f"  {result.counts.out_of_range} line(s) not imported: a number wider than 64 "
              "bits (a damaged line?); see the warn events import-out-of-range", file=report)
    for r in result.replaced:
        print(f"  {r.source}: {r.bytes:,} bytes replaced in {r.lines:,} line(s) "
              f"({r.nul_bytes:,} NUL dropped, {r.invalid_bytes:,} not UTF-8 replaced by "
              f"U+FFFD; first at line {r.first_line})", file=report)
    if result.breaks.error is not None or result.breaks.no_newline:
        print(f"kvdiag: warning: {end.reason}", file=sys.stderr)
    return EXIT_USAGE if result.breaks.error is not None else EXIT_OK
