"""The ``--format`` option shared by ``check`` and ``postmortem`` (``--json`` is its alias)."""

from __future__ import annotations

import argparse

FORMATS = ("text", "json", "markdown", "sarif", "junit")


def add_format_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (default: tables at the terminal's width, or 120 "
                             "columns off a terminal, wider only for a word that needs it; "
                             "nothing is cut), json, markdown, sarif (SARIF 2.1.0) or junit "
                             "(JUnit XML)")
    parser.add_argument("--json", action="store_true", help="same as --format json")


def chosen_format(args: argparse.Namespace) -> str:
    from kvdiag.errors import UsageError

    if args.json and args.format not in (None, "json"):
        raise UsageError(f"--json and --format {args.format} disagree; give one")
    return "json" if args.json else (args.format or "text")
