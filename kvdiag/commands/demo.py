"""The demo: capture the two-slot scenario on the best executor, then show it.

Captures ``two-slot-concurrent`` with the upstream runtime (membership dispatch, shared
bookkeeping: the server aborts on the fits assert) and ``slot1-first`` (the silent slot-1
divergence), then opens the TUI on them — or prints the ``check`` report when there is no
terminal to draw on.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="kvdiag-demo",
                        help="where the traces go (default: ./kvdiag-demo)")
    parser.add_argument("--executor", default="auto", choices=("auto", "numpy", "cupy"),
                        help="auto: CuPy on a GPU, else NumPy (default: auto)")
    parser.add_argument("--no-tui", action="store_true", help="print the reports instead")


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from kvdiag.cli import build_parser
    from kvdiag.commands.capture import capture_from_args
    from kvdiag.commands.check import check_file
    from kvdiag.errors import UsageError

    out = Path(args.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output-dir {out}: cannot make it a directory: "
                         f"{exc.strerror or exc}") from None
    traces: list[Path] = []
    for scenario in ("two-slot-concurrent", "slot1-first"):
        path = out / f"{scenario}.kvtrace"
        # the capture command's own parser fills every option's default; the demo's folder
        # is its own, so its traces are replaced on each run (--force)
        capture_from_args(build_parser().parse_args(
            ["capture", "--scenario", scenario, "-o", str(path), "--executor", args.executor,
             "--force"]))
        traces.append(path)
    if not args.no_tui and sys.stdout.isatty():
        import importlib

        try:
            tui = importlib.import_module("kvdiag.tui.app")
        except ImportError:
            pass
        else:
            code: int = tui.run_tui([str(p) for p in traces],
                                    debug=bool(getattr(args, "debug", False)))
            return code
    for path in traces:
        check_file(str(path))
    return 0
