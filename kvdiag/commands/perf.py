"""Why is it slow: each request's decode rate against context depth, against a baseline run.

Reads llama-server logs (the print_timing block and the slot lines around it) or traces with
``timing`` events (``kvdiag import`` writes them) and reports, per request, the slot, depth at
start and end, prompt and decode tok/s, ms per token and whether the context capped it; per
depth bin the decode rate and the kv-stream partition the run recorded there. With
``--baseline`` it aligns the runs on depth: the mean cost over the requests both completed
uncapped, turn-1 parity, the worst bin, and for every bin more than 10 % below the baseline the
partition state and the causes the recorded evidence names (or "not explained by what the log
records"). ``--predict`` plays the run's own requests through the runtime model (the adaptive
controller and a device profile) and sets its rate beside the measured one, calibrated on the
baseline; where they differ by more than 15 % it says what would have to change (docs/perf.md).
Exit 0; 1 when a run holds no completed request; 2 on bad input.
"""

from __future__ import annotations

import argparse

from kvdiag.commands._shape import add_shape_args


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
                        help="save decode tok/s against depth for each run (and the model's "
                             "curve with --predict), with the partition on the same axis")
    parser.add_argument("--force", action="store_true",
                        help="replace the --plot file if it exists")
    parser.add_argument("--predict", action="store_true",
                        help="the runtime model's rate for the run's own requests beside the "
                             "measured one (calibrated on --baseline)")
    parser.add_argument("--profile", metavar="NAME|PATH",
                        help="device profile for --predict: h200 (measured), a built-in "
                             "consumer card (rtx-3060-12gb, rtx-3090, rtx-4060-ti-16gb, "
                             "rtx-4090, rtx-5060-ti-16gb, rtx-5070-ti, rtx-5080, rtx-5090: "
                             "spec-sheet figures) or a saved one (kvdiag devices --profile); "
                             "default: the card the log names, else h200")
    add_shape_args(parser, skip=("adaptive", "kv-unified", "no-native-quants"))


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from rich.console import Console

    from kvdiag.analysis.perf import DEFAULT_BIN_TOKENS, depth_bins, rows
    from kvdiag.analysis.perf_compare import compare
    from kvdiag.analysis.perf_evidence import state_at, unattached
    from kvdiag.commands._shape import shape_overrides
    from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, UsageError
    from kvdiag.judged.perf import choose_profile, predict_run, require_runs
    from kvdiag.report import perf as rp

    width = DEFAULT_BIN_TOKENS if args.bin_tokens is None else args.bin_tokens
    if width <= 0 or width % 256:
        raise UsageError(f"--bin-tokens {width}: want a positive multiple of 256 (a page)")
    if args.max_rows < 0:
        raise UsageError(f"--max-rows {args.max_rows}: want 0 (all) or a positive count")
    if args.profile and not args.predict:
        raise UsageError("--profile is for --predict")
    plot = None
    if args.plot:
        # where the plot goes is checked before any log is read, as every output is
        from kvdiag.files.outputs import plan_output
        from kvdiag.report.sweep import plot_format

        plot = plan_output(args.plot, force=args.force, flag="--plot", stdout=False)
        plot_format(plot)
    loaded = require_runs(args.runs)
    base_loaded = require_runs([args.baseline])[0] if args.baseline else None
    runs = [x.run for x in loaded]
    base = base_loaded.run if base_loaded is not None else None
    tables = [rows(r) for r in runs]
    bins = [depth_bins(t, width, include_capped=False) for t in tables]
    states = [[state_at(r, t, b, loose) for b in bs]
              for r, t, bs, loose in zip(runs, tables, bins, [unattached(r) for r in runs],
                                         strict=True)]
    comparisons = [compare(r, base, width) for r in runs] if base is not None else []
    predictions = []
    if args.predict:
        profile, why = choose_profile(args.profile, *(x.device for x in loaded),
                                      base_loaded.device if base_loaded else None)
        overrides = shape_overrides(args)
        predictions = [predict_run(x, base_loaded, profile, why, args.preset, overrides)
                       for x in loaded if x.run.requests]
    empty = [r.name for r in [*runs, *([base] if base else [])] if not r.requests]
    predicted_runs = [x.run for x in loaded if x.run.requests] if predictions else []
    if plot is not None:
        from kvdiag.report.perf_plot import save_plot

        curves = [(f"{r.name}: model ({p.profile.name})", *p.curve())
                  for r, p in zip(predicted_runs, predictions, strict=True)]
        save_plot([*runs, *([base] if base else [])], plot, width,
                  baseline=base.name if base else None, predicted=curves)
    if args.json:
        base_rows = rows(base) if base is not None else []
        base_bins = depth_bins(base_rows, width, include_capped=False)
        out: dict[str, object] = {
            "runs": [rp.run_json(r, t, b, s) for r, t, b, s in zip(runs, tables, bins, states,
                                                                  strict=True)],
            "baseline": None if base is None else rp.run_json(
                base, base_rows, base_bins, [state_at(base, base_rows, b) for b in base_bins]),
            "comparisons": [rp.comparison_json(c) for c in comparisons],
            "predictions": [rp.prediction_json(p) for p in predictions],
        }
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_FINDINGS if empty else EXIT_OK
    console = Console(width=None if sys.stdout.isatty() else 160)
    for r, t, b, s in zip(runs, tables, bins, states, strict=True):
        console.print(f"run {rp.run_summary(r)}", highlight=False)
        for p in r.problems:
            console.print(f"  note: {p.message}" + (f" (line {p.line})" if p.line else ""),
                          highlight=False)
        if not r.requests:
            console.print("  no completed request: no print_timing block was read",
                          style="yellow")
            continue
        console.print(rp.requests_table(r, t, args.max_rows))
        console.print(rp.bins_table(r, b, s))
    if base is not None:
        console.print(f"baseline {rp.run_summary(base)}", highlight=False)
        for r, comp in zip(runs, comparisons, strict=True):
            if not comp.bins:
                continue
            console.print(rp.comparison_table(comp, r.name, base.name))
            for line in rp.comparison_lines(comp):
                console.print(line, highlight=False, markup=False)
    for r, pred in zip(predicted_runs, predictions, strict=True):
        console.print(rp.prediction_table(r.name, pred.predicted, pred.calibration is not None))
        for line in rp.prediction_lines(pred):
            console.print(line, highlight=False, markup=False)
    if args.plot:
        console.print(f"plot saved to {args.plot}", highlight=False)
    if empty:
        print(f"kvdiag: {', '.join(empty)}: no completed request (no print_timing block)",
              file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK
