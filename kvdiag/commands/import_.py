"""Turn a llama-server log into a trace: fits=false lines, kv_stream_adapt lines, aborts.

The lines instrumented forks already print become events (docs/log-import.md): fits
decisions (evaluated=false: the log does not say which condition failed), partition changes
and adapt samples, fallback and feedback warnings, aborts with their backtraces; the header's
plan comes from the boot lines. Exit status: 0 imported, 1 the log holds nothing importable
(no file written), 2 bad input (missing, binary, unreadable, or the log breaks off: the trace
then holds every event before the break) or an output that exists without --force.
"""

from __future__ import annotations

import argparse

from kvdiag.errors import EXIT_OK, EXIT_USAGE


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="a llama-server log (.gz accepted); '-' "
                        "reads standard input")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="trace to write (default: the log's name with .kvtrace)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    import sys

    from kvdiag.check import analyse_file
    from kvdiag.logimport import import_log

    result = import_log(args.log, args.output, force=args.force)
    # what the trace says is the judgement's, as check, trace info and the TUI will say it
    judgement = analyse_file(result.output).judgement
    counts = ", ".join(f"{k} {n}" for k, n in sorted(judgement.counts.items()) if k != "end")
    end = result.end
    print(f"{result.output}: {sum(judgement.counts.values()) - judgement.counts.get('end', 0)} "
          f"events from {result.lines} lines ({counts}), {judgement.steps.text()}, end "
          f"{end.status}")
    missing = [k.kind for k in judgement.completeness.missing]
    if missing:
        print(f"  a log does not record {', '.join(missing)} events: kvdiag check says what "
              "that leaves unjudged")
    if result.counts.inferred_routes:
        print(f"  {result.counts.inferred_routes} fits route(s) inferred as fallback "
              "(no abort or fallback warning followed); see the warn events "
              "import-route-inferred")
    if result.breaks.error is not None or result.breaks.no_newline:
        print(f"kvdiag: warning: {end.reason}", file=sys.stderr)
    return EXIT_USAGE if result.breaks.error is not None else EXIT_OK
