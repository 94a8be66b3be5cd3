"""Help a C/C++/CUDA runtime write kvdiag traces through kernels/kvtrace.h.

native --include-dir prints the folder that holds kvtrace.h (for -I); native --example prints a
complete small C++ kv-stream runtime that uses every macro a fork needs (build and run lines in
its first comment; kernels/native_tests/kvtrace_example.cpp). docs/native-bridge.md says where
each macro goes in a kv-stream runtime.
"""

from __future__ import annotations

import argparse

HEADER = "kvtrace.h"
EXAMPLE = "native_tests/kvtrace_example.cpp"


def configure(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--include-dir", action="store_true",
                      help="print the folder holding kvtrace.h (use as -I)")
    what.add_argument("--example", action="store_true",
                      help="print a complete small C++ kv-stream runtime that writes a trace "
                           "through kvtrace.h (build and run lines at its top)")


def run(args: argparse.Namespace) -> int:
    # kernel_dir finds kernels/ in a wheel (kvdiag/_kernels) or a checkout; that module needs
    # numpy but neither CuPy nor a GPU.
    from kvdiag.errors import EXIT_OK, InputError
    from kvdiag.executors.cuda_kernels import kernel_dir

    folder = kernel_dir()
    if not (folder / HEADER).is_file():
        raise InputError(f"{folder / HEADER} is missing from this kvdiag installation")
    if args.include_dir:
        print(folder)
        return EXIT_OK
    example = folder / EXAMPLE
    try:
        text = example.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {example}: {exc.strerror or exc}") from None
    print(text, end="")
    return EXIT_OK
