"""Run a scenario through the KV-stream runtime model on an executor and record a trace.

The trace goes to -o OUT through a temporary file beside it, renamed when the run ends (also
when a signal ends it: status error), and removed if writing fails; an existing OUT is
replaced only with --force; '-' writes the trace to standard output. Exit status: 0 ran to the
end, 3 ended in a modelled abort, 2 bad options, sizes the runtime or this machine cannot hold
(the limit is named), or an output that may not or cannot be written.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvdiag.commands._shape import add_shape_args

if TYPE_CHECKING:
    from kvdiag.kvstream.scenarios import Scenario

SCENARIO_NAMES = (
    "single-slot", "two-slot-concurrent", "slot1-first", "late-join", "pool-pressure",
    "multiturn-growth",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="two-slot-concurrent", choices=SCENARIO_NAMES,
                        help="what the server does (default: two-slot-concurrent)")
    parser.add_argument("-o", "--output", required=True,
                        help="trace file to write (.kvtrace); '-' writes it to standard output")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--executor", default="auto", choices=("auto", "numpy", "cupy"),
                        help="auto: CuPy on a GPU, else NumPy")
    parser.add_argument("--layout", choices=("shared", "per-stream"),
                        help="resident bookkeeping: shared (upstream, (layer, page)) or "
                             "per-stream (fixed, (layer, stream, page)); default shared")
    parser.add_argument("--dispatch", choices=("membership", "fits"),
                        help="FA dispatcher: membership (upstream, then assert) or fits "
                             "(fixed, fall back); default membership")
    parser.add_argument("--steps", type=int, help="decode steps per request")
    parser.add_argument("--prompt-tokens", type=int, help="prompt tokens per request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the K/V/Q values")
    parser.add_argument("--telemetry-ms", type=int, default=100,
                        help="NVML sampling interval on a GPU capture (0: off; default 100)")
    parser.add_argument("--profile", default="h200", metavar="NAME|PATH",
                        help="device profile whose bandwidths model the adaptive controller's "
                             "feedback on the NumPy executor (default: h200, measured; "
                             "`kvdiag devices --profile` makes one)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_shape_args(parser)


def run(args: argparse.Namespace) -> int:
    return capture_from_args(args)


def scenario_from_args(args: Any) -> Scenario:
    """The named scenario with --steps / --prompt-tokens applied to every request."""
    import dataclasses

    from kvdiag.errors import UsageError
    from kvdiag.kvstream.scenarios import SCENARIOS

    scenario = SCENARIOS[args.scenario]
    for flag, field in (("steps", "decode"), ("prompt_tokens", "prompt")):
        value = getattr(args, flag, None)
        if value is None:
            continue
        if value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {value}")
        scenario = dataclasses.replace(scenario, requests=tuple(
            dataclasses.replace(r, **{field: value}) for r in scenario.requests))
    return scenario


def capture_from_args(args: Any) -> int:
    """The ``capture`` subcommand: exit 0 ran to the end, 3 modelled abort, 2 usage error."""
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from kvdiag.commands._shape import build_config
    from kvdiag.errors import EXIT_ABORTED, EXIT_OK
    from kvdiag.files.outputs import plan_output
    from kvdiag.runs.capture import capture, check_scenario_fits, ctx_rounding_note
    from kvdiag.runs.limits import check_seed, check_telemetry_ms

    check_telemetry_ms(args.telemetry_ms)
    check_seed(args.seed)
    from kvdiag.kvstream.profiles import load_profile

    scenario = scenario_from_args(args)
    cfg = build_config(args, base=scenario.config, sizing=scenario.sizing)
    check_scenario_fits(cfg, scenario)
    profile = load_profile(args.profile)
    out = plan_output(args.output, force=args.force)
    console = Console(stderr=True)
    from kvdiag.kvstream.plan import multiseq_warning

    warning = multiseq_warning(cfg)
    notes = [line for line in (ctx_rounding_note(args.ctx),
                               f"warning: {warning}" if warning else None) if line is not None]

    def print_notes() -> None:
        for line in notes:
            print(line, file=sys.stderr)  # one line each, never wrapped
    if args.quiet or not console.is_terminal:
        result = capture(cfg, scenario, out, args.executor, args.seed,
                         telemetry_ms=args.telemetry_ms, on_start=print_notes,
                         profile=profile)
    else:
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar:
            task = bar.add_task(f"capturing {scenario.name}", total=None)
            result = capture(cfg, scenario, out, args.executor, args.seed,
                             progress=lambda done, total: bar.update(task, completed=done,
                                                                     total=total),
                             telemetry_ms=args.telemetry_ms, on_start=print_notes,
                             profile=profile)
    r = result.result
    line = (f"{scenario.name} on {result.executor} ({cfg.layout} layout, {cfg.dispatch} "
            f"dispatch): {r.status} after {r.steps} step(s), {result.events} events → "
            f"{out.display}")
    if r.abort is not None:
        line += f"; abort: {r.abort.message}"
    else:
        line += f"; max |Δ| vs resident reference {r.max_abs_delta:.3g}"
    # with -o - standard output carries the trace itself
    print(line, file=sys.stderr if out.to_stdout else sys.stdout)
    return EXIT_ABORTED if r.status == "aborted" else EXIT_OK
