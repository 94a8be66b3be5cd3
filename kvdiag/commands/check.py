"""Analyse a trace: findings with rule ids, evidence and fixes; CI exit codes.

Exit status: 0 no finding at or above --fail-on, 1 some, 2 the trace cannot be read.
"""

from __future__ import annotations

import argparse

from kvdiag.commands._formats import add_format_args, chosen_format


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trace file (.kvtrace); '-' reads standard input")
    add_format_args(parser)
    parser.add_argument("--fail-on", default="error",
                        help="exit 1 when a finding has this severity or higher "
                             "(info, warning, error, critical; default error)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="a run that did not complete (no End event, or End status "
                             "error: killed, interrupted) is a warning instead of an error")


def run(args: argparse.Namespace) -> int:
    from kvdiag.check import check_file

    return check_file(args.file, fail_on=args.fail_on, fmt=chosen_format(args),
                      allow_incomplete=args.allow_incomplete)
