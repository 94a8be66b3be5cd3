"""Capture one scenario at many stage sizes in parallel and show where the rate falls off.

Every point runs with the adaptive partition controller; its feedback, and the modelled
attention rate, come from a device profile (``--profile``, default the measured H200). The
table gives, per point: pool pages, resident pages per layer and ring slots (start→end),
the resident share of what the decode steps read, the deadline miss ratio, MiB over PCIe per
decoded token, repartitions and the modelled rate; the summary marks the best rate, the
smallest stage keeping ≥ 90 % of it and the cliff. ``--executor decisions`` (the default)
skips the data plane: decisions do not depend on the numbers. Exit 0; 2 on bad input.
"""

from __future__ import annotations

import argparse

from kvdiag.commands._shape import add_shape_args
from kvdiag.commands._values import count_list
from kvdiag.commands.capture import SCENARIO_NAMES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="pool-pressure", choices=SCENARIO_NAMES,
                        help="what the server does (default: pool-pressure)")
    parser.add_argument("--stage-mib", dest="stages", required=True, metavar="START:STOP:STEP",
                        help="stage sizes to try: START:STOP:STEP (STOP included) or a list "
                             "like 512,1024,2048")
    parser.add_argument("--np", dest="np_values", default=None, metavar="N[,N...]",
                        type=count_list("slot counts", "1,2"),
                        help="slot counts to sweep (default: the scenario's)")
    parser.add_argument("--executor", default="decisions",
                        choices=("decisions", "numpy", "cupy", "auto"),
                        help="decisions: no data plane (fast); numpy/cupy also compute the "
                             "attention (default: decisions)")
    parser.add_argument("--profile", default="h200", metavar="NAME|PATH",
                        help="device profile for the modelled feedback and rate (default h200)")
    parser.add_argument("--steps", type=int, help="decode steps per request")
    parser.add_argument("--prompt-tokens", type=int, help="prompt tokens per request")
    parser.add_argument("-j", "--jobs", type=int,
                        help="worker processes (default: all cores; one with --executor cupy, "
                             "whose points share the GPU)")
    parser.add_argument("--plot", metavar="OUT.svg|OUT.png", help="also save the plots to a file")
    parser.add_argument("--force", action="store_true", help="replace the --plot file if it "
                        "exists")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_shape_args(parser, skip=("np", "stage-mib", "adaptive"))


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import sys

    from rich.console import Console

    from kvdiag.analysis.sweep import summarise
    from kvdiag.commands._shape import build_config
    from kvdiag.commands.capture import scenario_from_args
    from kvdiag.errors import EXIT_OK, UsageError
    from kvdiag.files.outputs import plan_output
    from kvdiag.kvstream.profiles import load_profile
    from kvdiag.report.console import print_renderables
    from kvdiag.report.sweep import (
        plot_format,
        save_plot,
        summary_lines,
        sweep_table,
        terminal_plot,
    )
    from kvdiag.runs.capture import check_scenario_fits
    from kvdiag.runs.limits import capture_bytes, check_memory, check_sweep_points
    from kvdiag.runs.sweep import PointSpec, run_sweep, stage_range

    # where the plot goes is checked first: a sweep can run for minutes
    plot = (plan_output(args.plot, force=args.force, flag="--plot", stdout=False)
            if args.plot else None)
    if plot is not None:
        plot_format(plot)
    try:
        stages = stage_range(args.stages)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    nps: list[int | None] = list(args.np_values) if args.np_values else [None]
    if args.jobs is not None and args.jobs <= 0:
        raise UsageError(f"--jobs must be positive, got {args.jobs}")
    check_sweep_points(len(stages) * len(nps))
    scenario = scenario_from_args(args)
    profile = load_profile(args.profile)
    jobs = args.jobs if args.jobs is not None else (1 if args.executor == "cupy" else None)
    specs = []
    for n in nps:
        for mib in stages:
            args.stage_mib, args.np, args.adaptive = mib, n, True
            cfg = build_config(args, base=scenario.config, sizing=scenario.sizing)
            check_scenario_fits(cfg, scenario)  # in every point, before any runs
            specs.append(PointSpec(cfg, scenario, args.executor, profile))
    # the largest point, as many at once as there are workers, must fit before any starts
    workers = min(jobs or os.cpu_count() or 1, len(specs))
    executor = "numpy" if args.executor == "auto" else args.executor
    largest = max(specs, key=lambda s: sum(capture_bytes(s.cfg, scenario, executor).values()))
    check_memory(largest.cfg, scenario, executor, copies=workers)
    console = Console(stderr=True)
    if args.quiet or args.json or not console.is_terminal:
        points = run_sweep(specs, jobs)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar:
            task = bar.add_task(f"sweeping {scenario.name}", total=len(specs))
            points = run_sweep(specs, jobs, progress=lambda _p: bar.advance(task))
    summaries = summarise(points)
    title = (f"{scenario.name}: {len(stages)} stage sizes, profile {profile.name}, "
             f"executor {args.executor}")
    if plot is not None:
        save_plot(points, summaries, plot, title)
    if args.json:
        json.dump({"scenario": scenario.name, "profile": profile.name,
                   "executor": args.executor, "points": [p.as_json() for p in points],
                   "summary": [s.as_json() for s in summaries]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    print_renderables([sweep_table(points, summaries, title)])
    if any(p.tokens_per_s for p in points):
        width = Console().width if sys.stdout.isatty() else 100
        print(terminal_plot(points, width=min(100, width), color=sys.stdout.isatty()))
    for line in summary_lines(points, summaries):
        print(line)
    if args.plot:
        print(f"plots saved to {args.plot}")
    return EXIT_OK
