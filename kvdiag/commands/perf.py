"""Why is it slow: each request's decode rate against context depth, against a baseline run.

Reads llama-server logs (the print_timing block and the slot lines around it) or traces with
``timing`` events (``kvdiag import`` writes them) and reports, per request, the slot, depth at
start and end, prompt and decode tok/s, ms per token and whether the context capped it; per
depth bin the decode rate and the kv-stream partition the run recorded there. With
``--baseline`` it aligns the runs on depth: the mean cost over the requests both completed
uncapped, turn-1 parity, the worst bin, and for every bin more than 10 % below the baseline the
partition state and the causes the recorded evidence names (or "not explained by what the log
records"). ``--predict`` adds the runtime model's curve for the run's own requests (docs/perf.md).
Exit 0; 1 when a run holds no completed request; 2 on bad input.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdiag.model.perf import PerfRun


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a llama-server log (.gz accepted, '-' for stdin) or a trace with "
                             "timing events")
    parser.add_argument("--baseline", metavar="BASE",
                        help="the run to compare with (a log or trace of the same session)")
    parser.add_argument("--bin-tokens", type=int, metavar="N",
                        help="depth bin width in tokens, a multiple of 256 (default 4096)")
    parser.add_argument("--max-rows", type=int, default=50, metavar="N",
                        help="requests listed per run in text (0: all; default 50)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--plot", metavar="OUT.svg|OUT.png",
                        help="save decode tok/s against depth for each run, with the partition "
                             "on the same axis")


def load_run(path: str) -> PerfRun:
    """A log or a trace as a :class:`~kvdiag.model.perf.PerfRun` (``InputError`` if neither)."""
    import os

    from kvdiag.analysis.perf_trace import run_from_events
    from kvdiag.errors import STDIN_NAME, InputError
    from kvdiag.postmortem.perfscan import scan_paths
    from kvdiag.trace.reader import TraceReader

    if path != STDIN_NAME:
        try:
            with open(path, "rb") as fh:
                head = fh.read(256).lstrip(b"\xef\xbb\xbf")
        except OSError:
            head = b""  # scan_paths words the error
        if head.startswith(b'{"format":"kvtrace"') or (head.startswith(b"{")
                                                       and b'"kvtrace"' in head):
            with TraceReader.open(path) as reader:
                run = run_from_events(os.path.basename(path), path, reader)
                problems = [p.message for p in reader.problems][:5]
            if problems:
                import msgspec

                from kvdiag.model.logrecords import Problem

                return msgspec.structs.replace(run, problems=tuple(
                    Problem(source=path, message=m) for m in problems))
            return run
    (run,) = scan_paths([path])
    if run.lines == 0 and not run.requests:
        raise InputError(f"{path}: empty")
    return run


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from rich.console import Console

    from kvdiag.analysis.perf import DEFAULT_BIN_TOKENS, depth_bins, rows
    from kvdiag.analysis.perf_compare import compare
    from kvdiag.analysis.perf_evidence import state_at
    from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, UsageError
    from kvdiag.report.perf import (
        bins_table,
        comparison_json,
        comparison_lines,
        comparison_table,
        requests_table,
        run_json,
        run_summary,
    )

    width = DEFAULT_BIN_TOKENS if args.bin_tokens is None else args.bin_tokens
    if width <= 0 or width % 256:
        raise UsageError(f"--bin-tokens {width}: want a positive multiple of 256 (a page)")
    runs = [load_run(p) for p in args.runs]
    base = load_run(args.baseline) if args.baseline else None
    tables = [rows(r) for r in runs]
    bins = [depth_bins(t, width) for t in tables]
    states = [[state_at(r, t, b) for b in bs] for r, t, bs in zip(runs, tables, bins,
                                                                  strict=True)]
    comparisons = [compare(r, base, width) for r in runs] if base is not None else []
    empty = [r.name for r in [*runs, *([base] if base else [])] if not r.requests]
    if args.plot:
        from kvdiag.report.perf_plot import save_plot

        save_plot([*runs, *([base] if base else [])], Path(args.plot), width,
                  baseline=base.name if base else None)
    if args.json:
        out: dict[str, object] = {
            "runs": [run_json(r, t, b, s) for r, t, b, s in zip(runs, tables, bins, states,
                                                               strict=True)],
            "baseline": None if base is None else run_json(
                base, rows(base), depth_bins(rows(base), width),
                [state_at(base, rows(base), b) for b in depth_bins(rows(base), width)]),
            "comparisons": [comparison_json(c) for c in comparisons],
        }
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_FINDINGS if empty else EXIT_OK
    console = Console(width=None if sys.stdout.isatty() else 160)
    for r, t, b, s in zip(runs, tables, bins, states, strict=True):
        console.print(f"run {run_summary(r)}", highlight=False)
        for p in r.problems:
            console.print(f"  note: {p.message}" + (f" (line {p.line})" if p.line else ""),
                          highlight=False)
        if not r.requests:
            console.print("  no completed request: no print_timing block was read", style="yellow")
            continue
        console.print(requests_table(r, t, args.max_rows))
        console.print(bins_table(r, b, s))
    if base is not None:
        console.print(f"baseline {run_summary(base)}", highlight=False)
        for r, comp in zip(runs, comparisons, strict=True):
            if not comp.bins:
                continue
            console.print(comparison_table(comp, r.name, base.name))
            for line in comparison_lines(comp):
                console.print(line, highlight=False, markup=False)
    if args.plot:
        console.print(f"plot saved to {args.plot}", highlight=False)
    if empty:
        print(f"kvdiag: {', '.join(empty)}: no completed request (no print_timing block)",
              file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK
