"""The ``kvdiag`` command.

Each subcommand lives in ``kvdiag/commands/<name>.py`` with ``configure(parser)`` and
``run(args) -> int``; those modules import only argparse at top level and load the heavy parts
inside ``run``, so ``kvdiag check`` never pays for (or needs) textual, cupy or pynvml.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Sequence
from typing import Any

from kvdiag import __version__
from kvdiag.errors import EXIT_USAGE, KvdiagError

#: Exit code of an internal error (a bug in kvdiag), as sysexits.h's EX_SOFTWARE.
EXIT_INTERNAL = 70
#: Exit code of an incomplete installation (a package kvdiag needs is missing), as sysexits.h's
#: EX_UNAVAILABLE.
EXIT_UNAVAILABLE = 69
_IMPORT_NAMES = {"nvidia-ml-py": "pynvml", "pyelftools": "elftools",
                 "textual-plotext": "textual_plotext"}
"""Import names of the dependencies whose distribution is named otherwise."""

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
    "sql",
    "devices",
    "tui",
    "demo",
    "native",
)


#: What ``kvdiag --help`` says kvdiag is (the README's first paragraph, shortened).
DESCRIPTION = (
    "Make adaptive KV-cache streaming in llama.cpp-style CUDA runtimes debuggable: reproduce "
    "the two-slot failures in a modelled runtime and record every decision in a trace, check "
    "and compare traces headlessly (CI exit codes), replay them in a terminal UI, and read "
    "llama-server crash logs.\n\n"
    "Run 'kvdiag COMMAND --help' for a command's options. Exit status: 0 fine, 1 findings "
    "(what counts as one, and any other code, each command's --help says), 2 bad input, "
    "usage, or an output that may not or cannot be written (standard output and error "
    "included), 69 a package kvdiag needs is not installed, 70 an internal error, 130 "
    "interrupted.")

_LITERAL = re.compile(r"``(.+?)``")


def plain(text: str) -> str:
    """Docstring markup (``double backticks``) as a terminal shows it: the literal alone."""
    return _LITERAL.sub(r"\1", text)


def summary(doc: str | None) -> str | None:
    """A command's one-line summary: the first paragraph of its module docstring, whole (a
    summary that goes on past the docstring's first line must not be cut there)."""
    if not doc or not doc.strip():
        return None
    first = doc.strip().split("\n\n", 1)[0]
    return plain(" ".join(first.split()))


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped to the terminal without breaking paths or flags at a hyphen
    (``docs/log-`` / ``import.md``), and with the description's paragraphs kept apart."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(plain(" ".join(text.split())), width, break_on_hyphens=False,
                             break_long_words=False) or [""]

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
        return "\n\n".join(
            textwrap.fill(plain(" ".join(p.split())), width, initial_indent=indent,
                          subsequent_indent=indent, break_on_hyphens=False,
                          break_long_words=False) for p in paragraphs)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2, takes no
    abbreviations (``postmortem LOG --debug`` must not mean ``--debug-dir``), and accepts
    ``--debug`` after any subcommand as well as before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
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
    parser = _Parser(prog="kvdiag", description=DESCRIPTION, top=True)
    parser.add_argument("--version", action="version", version=f"kvdiag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"kvdiag.commands.{name}")
        # a command named after a Python keyword lives in "<name>_.py" (import_.py)
        p = sub.add_parser(name.rstrip("_"), help=summary(module.__doc__),
                           description=module.__doc__)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def keep_lines_whole() -> None:
    """When standard output and standard error are one file (``2>&1`` into a pipe or a CI
    log), flush output at each line end: block buffering would otherwise put a message written
    to stderr inside a half-written output line (issue 16 #7)."""
    try:
        same = os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return  # not a file descriptor (captured in tests, embedded): nothing to interleave
    if same and isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
        sys.stdout.reconfigure(line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code. A failed write to standard output or error
    is exit 2 (files.stdio), whatever the command decided."""
    from kvdiag.files.stdio import StreamWriteError, checked_streams

    args_list = list(sys.argv[1:] if argv is None else argv)
    keep_lines_whole()  # before the streams are wrapped: the wrappers copy line buffering
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
        _one_blas_thread(str(args.command))
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
    except ModuleNotFoundError as exc:
        said = _missing_dependency(exc)
        if said is None:
            return _internal(exc, debug)
        if debug:
            traceback.print_exc()
        print(f"kvdiag: error: {said}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Exception as exc:
        return _internal(exc, debug)


def _internal(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"kvdiag: internal error: {type(exc).__name__}: {exc}"
          f"{'' if debug else ' (rerun with --debug)'}", file=sys.stderr)
    return EXIT_INTERNAL


_LINEAR_ALGEBRA = frozenset({"capture", "sweep", "demo", "native", "devices"})
"""Commands that may run an executor's attention (numpy's matmul on BLAS threads)."""


def _one_blas_thread(command: str) -> None:
    """Numpy's OpenBLAS starts a thread per core when numpy is imported, and they cost CPU
    (0.2 against 0.1 s for ``import numpy`` on the 2-core VM, measured) for commands that never
    multiply a matrix: those ask for one, unless the user chose a number."""
    if command not in _LINEAR_ALGEBRA and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The line for an import that failed because the installation lacks a package, else None
    (an internal error). kvdiag's own import of a package it requires is one; so is any
    import that another package made (textual importing ``markdown_it``, rich ``pygments``):
    kvdiag runs that package's code only because it needs it, so what it needs is missing
    from the installation too. kvdiag's own import of a module it does not require is a bug
    in kvdiag."""
    missing = (exc.name or "").partition(".")[0]
    if not missing or missing == "kvdiag":
        return None
    importer = _importer(exc)
    dist = _distribution(importer) if importer not in (None, "kvdiag") else None
    if dist is None:
        # kvdiag's own import (or code that no installed package holds)
        if missing not in _required_modules():
            return None
        return (f"{missing} is not installed, and kvdiag needs it: the installation is "
                "incomplete (pip install kvdiag installs it)")
    package = _requirement_for(dist, missing)
    return (f"{missing} is not installed, and {dist}, which kvdiag uses, needs it: the "
            f"installation is incomplete (pip install {package or 'kvdiag'} installs it)")


def _importer(exc: BaseException) -> str | None:
    """The top-level package whose code ran the failed import (the innermost frame of the
    traceback outside importlib), or None when there is none."""
    name = None
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__")
        if isinstance(module, str) and not module.startswith("importlib"):
            name = module.partition(".")[0]
        tb = tb.tb_next
    return name


def _distribution(module: str | None) -> str | None:
    """The installed distribution that holds the top-level ``module``."""
    from importlib.metadata import packages_distributions

    dists = packages_distributions().get(module or "")
    return dists[0] if dists else None


def _requirement_for(dist: str, module: str) -> str | None:
    """The requirement of ``dist`` that provides ``module``, by name: the same name, or one
    that starts with it (``markdown-it-py`` for ``markdown_it``)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires(dist) or []
    except PackageNotFoundError:
        return None
    want = module.lower()
    for req in reqs:
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]
        norm = re.sub(r"[-_.]+", "_", name.lower())
        if norm == want or norm.startswith(want + "_"):
            return name
    return None


def _required_modules() -> set[str]:
    """Import names of the packages kvdiag's installation requires (its metadata's
    requirements without an extra: cupy, matplotlib and duckdb say themselves what to
    install)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("kvdiag") or []
    except PackageNotFoundError:
        return set()
    names = set()
    for req in reqs:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
        names.add(_IMPORT_NAMES.get(name, name.replace("-", "_")))
    return names


def _say(line: str) -> None:
    """A last line on standard error, if it can still be written."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, KvdiagError):
        pass


if __name__ == "__main__":
    sys.exit(main())
