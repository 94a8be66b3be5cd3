"""The ``kvdiag`` command.

Each subcommand lives in ``kvdiag/commands/<name>.py`` with ``configure(parser)`` and
``run(args) -> int``; those modules import only argparse at top level and load the heavy parts
inside ``run``, so ``kvdiag check`` never pays for (or needs) textual, cupy or pynvml.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from kvdiag import __version__
from kvdiag.errors import EXIT_USAGE, KvdiagError

#: Exit code of an internal error (a bug in kvdiag), as sysexits.h's EX_SOFTWARE.
EXIT_INTERNAL = 70

COMMANDS: tuple[str, ...] = (
    "plan",
    "capture",
    "sweep",
    "check",
    "diff",
    "trace",
    "postmortem",
    "import_",
    "devices",
    "tui",
    "demo",
    "native",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2, takes no
    abbreviations (``postmortem LOG --debug`` must not mean ``--debug-dir``), and accepts
    ``--debug`` after any subcommand as well as before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        top = kwargs.pop("top", False)
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand's parser leaves the top-level value alone unless given
        self.add_argument(
            "--debug", action="store_true", default=False if top else argparse.SUPPRESS,
            help="show tracebacks as well as the one-line errors" if top else argparse.SUPPRESS)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise KvdiagError(f"{self.prog}: {message}", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvdiag", description=__doc__.splitlines()[0] if __doc__ else None,
                     top=True)
    parser.add_argument("--version", action="version", version=f"kvdiag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"kvdiag.commands.{name}")
        doc = (module.__doc__ or "").strip().splitlines()
        # a command named after a Python keyword lives in "<name>_.py" (import_.py)
        p = sub.add_parser(name.rstrip("_"), help=doc[0] if doc else None,
                           description=module.__doc__)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code. A failed write to standard output or error
    is exit 2 (files.stdio), whatever the command decided."""
    from kvdiag.files.stdio import StreamWriteError, checked_streams

    args_list = list(sys.argv[1:] if argv is None else argv)
    failed: list[Any] = []
    try:
        with checked_streams() as streams:
            failed = streams
            return _run(args_list)
    except StreamWriteError as exc:
        broken = next((s.failed for s in failed if s.failed is not None), exc)
        if broken.stream != "error":
            _say(f"kvdiag: error: {broken}")
        return broken.exit_code


def _run(args_list: list[str]) -> int:
    from kvdiag.files.stdio import StreamWriteError

    debug = "--debug" in args_list
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        debug = bool(getattr(args, "debug", False))
        if not getattr(args, "command", None):
            parser.print_help()
            return EXIT_USAGE
        code: int = args._run(args)
        return code
    except SystemExit as exc:  # --help and --version end here; their output is checked
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    except StreamWriteError:
        raise
    except KvdiagError as exc:
        if debug:
            traceback.print_exc()
        print(f"kvdiag: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvdiag: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"kvdiag: internal error: {type(exc).__name__}: {exc}"
              f"{'' if debug else ' (rerun with --debug)'}", file=sys.stderr)
        return EXIT_INTERNAL


def _say(line: str) -> None:
    """A last line on standard error, if it can still be written."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, KvdiagError):
        pass


if __name__ == "__main__":
    sys.exit(main())
