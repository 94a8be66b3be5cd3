"""SQL over traces, server logs and Parquet folders (DuckDB, an optional extra).

One query runs over the inputs' tables (events, pages, fits, conditions, findings, evidence,
timings, crashes, frames, python_frames, files, problems; docs/sql.md); a trace's verdicts
are the judgement's, as kvdiag check reports them. Several inputs load into the same tables,
told apart by the ``file`` column; a folder that --parquet wrote is read as its tables. With
--parquet DIR, every table is written as DIR/<table>.parquet instead.
Exit 0; 2 on bad input, a query DuckDB refuses, or DuckDB not installed.
"""

from __future__ import annotations

import argparse
from typing import Any

FORMATS = ("text", "csv", "json")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="+", metavar="SQL|FILE",
                        help="the query, then the inputs (traces, llama-server logs, folders "
                             "written by --parquet); with --parquet only the inputs")
    parser.add_argument("--parquet", metavar="DIR",
                        help="write every table of the inputs as DIR/<table>.parquet")
    parser.add_argument("--tables", metavar="T,T",
                        help="with --parquet: only these tables (events: every events table; "
                             "files and problems are always written)")
    parser.add_argument("--force", action="store_true",
                        help="with --parquet: replace tables already in DIR")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="query result as an aligned table (default), CSV, or JSON Lines")


def run(args: argparse.Namespace) -> int:
    import sys

    from kvdiag.errors import EXIT_OK, UsageError
    from kvdiag.sql import run as sqlrun

    def progress(path: str) -> None:
        if sys.stderr.isatty():
            print(f"reading {path} …", file=sys.stderr)

    if args.tables and not args.parquet:
        raise UsageError("--tables goes with --parquet (a query loads the tables it names)")
    if args.parquet:
        tables = [t.strip() for t in args.tables.split(",") if t.strip()] if args.tables \
            else None
        written = sqlrun.parquet(args.parquet, args.args, force=args.force, progress=progress,
                                 tables=tables)
        print(f"wrote {len(written)} tables to {args.parquet}")
        return EXIT_OK
    if len(args.args) < 2:
        raise UsageError('kvdiag sql needs a query and at least one input: kvdiag sql '
                         '"SELECT …" F...')
    result = sqlrun.query(args.args[0], args.args[1:], progress=progress)
    _print(result.columns, result.rows, args.format)
    return EXIT_OK


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _print(columns: tuple[str, ...], rows: list[tuple[Any, ...]], fmt: str) -> None:
    import sys

    if fmt == "csv":
        import csv

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        w.writerows(["" if v is None else v for v in r] for r in rows)
        return
    if fmt == "json":
        import msgspec

        enc = msgspec.json.Encoder(enc_hook=str)
        for r in rows:
            sys.stdout.write(enc.encode(dict(zip(columns, r, strict=True))).decode() + "\n")
        return
    from rich.table import Table

    from kvdiag.report.console import print_renderables

    t = Table(show_edge=False, box=None, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*(_cell(v) for v in r))
    print_renderables([t, f"{len(rows)} row(s)"])
