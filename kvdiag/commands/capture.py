"""Run a scenario through the KV-stream runtime model on an executor and record a trace.

The trace goes to -o OUT through a temporary file beside it, renamed when the run ends (also
when a signal ends it: status error), and removed if writing fails; an existing OUT is
replaced only with --force; '-' writes the trace to standard output. Exit status: 0 ran to the
end, 3 ended in a modelled abort, 2 bad options, sizes the runtime or this machine cannot hold
(the limit is named), or an output that may not or cannot be written.
"""

from __future__ import annotations

import argparse

from kvdiag.commands._shape import add_shape_args

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
    from kvdiag.capture import capture_from_args

    return capture_from_args(args)
