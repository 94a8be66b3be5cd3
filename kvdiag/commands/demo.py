"""(not implemented yet)"""

from __future__ import annotations

import argparse

from kvdiag.errors import KvdiagError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="*")


def run(args: argparse.Namespace) -> int:
    raise KvdiagError("demo: not implemented yet")
