"""Analyse a trace: findings with rule ids, evidence and fixes; CI exit codes."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trace file (.kvtrace)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--fail-on", default="error",
                        help="exit 1 when a finding has this severity or higher "
                             "(info, warning, error, critical; default error)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="a run that did not complete (no End event, or End status "
                             "error: killed, interrupted) is a warning instead of an error")


def run(args: argparse.Namespace) -> int:
    from kvdiag.check import check_file

    return check_file(args.file, json_out=args.json, fail_on=args.fail_on,
                      allow_incomplete=args.allow_incomplete)
