"""The ``kvdiag`` command.

Each subcommand lives in ``kvdiag/commands/<name>.py`` with ``configure(parser)`` and
``run(args) -> int``; those modules import only argparse at top level and load the heavy parts
inside ``run``, so ``kvdiag check`` never pays for (or needs) textual, cupy or pynvml.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvdiag import __version__
from kvdiag.errors import EXIT_USAGE, KvdiagError

COMMANDS: tuple[str, ...] = (
    "plan",
    "capture",
    "sweep",
    "check",
    "diff",
    "trace",
    "postmortem",
    "import_",
    "perf",
    "devices",
    "tui",
    "demo",
    "native",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise KvdiagError(f"{self.prog}: {message}", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvdiag", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"kvdiag {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
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
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        if not getattr(args, "command", None):
            parser.print_help()
            return EXIT_USAGE
        code: int = args._run(args)
        return code
    except KvdiagError as exc:
        if debug:
            raise
        print(f"kvdiag: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvdiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if debug:
            raise
        print(
            f"kvdiag: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
            file=sys.stderr,
        )
        return 70


if __name__ == "__main__":
    sys.exit(main())
