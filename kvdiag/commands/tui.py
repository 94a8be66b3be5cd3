"""Browse traces and server logs in a terminal UI: overview, timeline, fits, pages, backtraces.

Each FILE is a kvtrace trace (kvdiag capture) or a llama-server log (plain or gzip); the kind
is told from the content. ``--export-svg OUT`` draws one screen without a terminal and saves
it as an SVG screenshot (for bug reports) instead of starting the interactive viewer. A missing
file, a directory, a FIFO or binary data is refused before the viewer starts (exit code 2).
``--follow F`` shows one file live while it is written (:mod:`kvdiag.tui.live`); it may not
exist yet, and it is refused with ``--export-svg`` or ``--binary`` (both need a finished file).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvdiag.commands._values import MAX_COLUMNS, MAX_ROWS, MIN_COLUMNS, MIN_ROWS, terminal_size
from kvdiag.errors import UsageError

if TYPE_CHECKING:
    from kvdiag.tui.perfview import ModelCurve, Predictor

SCREEN_NAMES = ("overview", "timeline", "fits", "pages", "backtrace", "telemetry", "findings",
                "perf")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="traces and/or logs")
    parser.add_argument("--follow", action="store_true",
                        help="follow the one FILE (a trace or a llama-server log) as it is "
                             "written: every screen updates live, through rotation and "
                             "truncation, and the file may not exist yet; s pauses")
    parser.add_argument("--export-svg", metavar="OUT",
                        help="save a screenshot of one screen to OUT (no interactive session); "
                             "'-' writes it to standard output")
    parser.add_argument("--force", action="store_true",
                        help="replace the --export-svg file if it exists")
    parser.add_argument("--screen", default="1", metavar="N",
                        help="screen for --export-svg: 1-8 or a name (overview, timeline, fits, "
                             "pages, backtrace, telemetry, findings, perf); default 1")
    parser.add_argument("--size", default=(160, 48), type=terminal_size, metavar="COLSxROWS",
                        help=f"terminal size for --export-svg, {MIN_COLUMNS}x{MIN_ROWS} to "
                             f"{MAX_COLUMNS}x{MAX_ROWS} (default 160x48)")
    parser.add_argument("--step", type=int, default=None,
                        help="step to show on the Pages/Telemetry screens (--export-svg)")
    parser.add_argument("--binary", action="append", default=[], metavar="PATH",
                        help="ELF binary or shared library a logged crash ran (repeatable): "
                             "its backtrace frames are symbolized (as kvdiag postmortem does)")
    parser.add_argument("--debug-dir", metavar="DIR",
                        help="directory with separate debug files (.build-id/xx/yyyy.debug)")
    parser.add_argument("--profile", metavar="NAME|PATH",
                        help="device profile for the model on the Perf screen (key p), as "
                             "kvdiag perf --predict --profile takes it; default: the card the "
                             "log names, else h200")


def predictor(profile: str | None) -> Predictor:
    """``kvdiag perf --predict``'s computation for the Perf screen: the run (and baseline) read
    again with their boot's shape, the model played on the run's requests, its curve and the
    lines ``perf`` prints about it (one computation: :func:`kvdiag.judged.perf.predict_run`)."""

    def predict(path: str, base: str | None) -> ModelCurve:
        from kvdiag.judged.perf import choose_profile, predict_run, require_runs
        from kvdiag.report.perf import prediction_lines
        from kvdiag.tui.perfview import ModelCurve

        (loaded,) = require_runs([path])
        base_loaded = require_runs([base])[0] if base is not None else None
        chosen, why = choose_profile(profile, loaded.device,
                                     base_loaded.device if base_loaded else None)
        pred = predict_run(loaded, base_loaded, chosen, why, None, {})
        depths, tps, _resident = pred.curve()
        return ModelCurve(f"{loaded.run.name}: model ({chosen.name})", depths, tps,
                          prediction_lines(pred))

    return predict


def screen_name(value: str) -> str:
    v = value.strip().lower()
    if v.isdigit() and 1 <= int(v) <= len(SCREEN_NAMES):
        return SCREEN_NAMES[int(v) - 1]
    if v in SCREEN_NAMES:
        return v
    raise UsageError(f"--screen: {value!r} is not 1-8 or one of {', '.join(SCREEN_NAMES)}")


def run(args: argparse.Namespace) -> int:
    screen = screen_name(args.screen)
    size: tuple[int, int] = args.size
    if args.step is not None and args.step < 0:
        raise UsageError(f"--step {args.step}: steps are numbered from 0")
    if args.debug_dir and not args.binary:
        raise UsageError("--debug-dir needs at least one --binary")
    from kvdiag.tui.loading import Symbols

    symbols = Symbols(tuple(args.binary), args.debug_dir)
    from kvdiag.tui.document import detect_kind

    if args.follow:
        _check_follow(args)
    for path in args.files if not args.follow else ():
        detect_kind(path)  # a file the viewer cannot show is refused before it starts
    if args.export_svg:
        from kvdiag.files.outputs import plan_output

        # checked before the files are loaded, which can take a while
        target = plan_output(args.export_svg, force=args.force, flag="--export-svg")
        from kvdiag.tui.export import export_svg

        export_svg(list(args.files), target, screen=screen, size=size, step=args.step,
                   symbols=symbols)
        return 0
    import sys

    if not sys.stdout.isatty():
        raise UsageError("tui: standard output is not a terminal (use --export-svg OUT, or "
                         "kvdiag check / kvdiag postmortem for text reports)")
    from kvdiag.tui.app import run_tui

    return run_tui(list(args.files), symbols, debug=bool(getattr(args, "debug", False)),
                   follow=args.follow, predictor=predictor(args.profile))


def _check_follow(args: argparse.Namespace) -> None:
    """``--follow`` takes one file, written as plain text (it may not exist yet), and shows it
    live in a terminal: a screenshot of a moving file (``--export-svg``) and re-symbolizing a
    log still being written (``--binary``) are refused."""
    if len(args.files) != 1:
        raise UsageError(f"--follow follows one file ({len(args.files)} given)")
    if args.export_svg:
        raise UsageError("--follow shows a file live in a terminal; --export-svg draws a "
                         "finished one (run it without --follow)")
    if args.binary:
        raise UsageError("--binary symbolizes a finished log (run it without --follow)")
    if args.files[0] == "-":
        raise UsageError("--follow follows a file by its name, not standard input")
    from kvdiag.tui.live import check_followable

    check_followable(args.files[0])
