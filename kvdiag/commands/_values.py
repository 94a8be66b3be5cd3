"""Value forms of the list and size flags (``--np 1,2``, ``--size 160x48``) as argparse types.

A value that does not parse raises ``argparse.ArgumentTypeError``, which argparse turns into
one line that names the flag (``argument --np: …``); the message says what form was expected
and, for a size out of range, which bound it crossed. Light to import (argparse only).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

#: Terminal sizes ``tui --size`` accepts.
MIN_COLUMNS, MAX_COLUMNS = 20, 1000
MIN_ROWS, MAX_ROWS = 5, 500


def count_list(what: str, example: str) -> Callable[[str], list[int]]:
    """A type for a comma list of positive integers, e.g. ``--np 1,2``."""

    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",")]
        bad = [x for x in items if not x.isdigit() or int(x) <= 0]
        if bad:
            which = "an empty item" if bad[0] == "" else repr(bad[0])
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma list of positive {what} (e.g. {example}): "
                f"{which} is not a positive whole number")
        return [int(x) for x in items]

    return parse


def terminal_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` in character cells, each within the bounds above."""
    w, sep, h = text.strip().lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not COLUMNSxROWS in character cells (e.g. 160x48)")
    cols, rows = int(w), int(h)
    for value, lo, hi, unit in ((cols, MIN_COLUMNS, MAX_COLUMNS, "columns"),
                                (rows, MIN_ROWS, MAX_ROWS, "rows")):
        if value < lo:
            raise argparse.ArgumentTypeError(
                f"{text}: {value} {unit} is too small; the minimum is {lo} {unit} "
                f"(at most {hi})")
        if value > hi:
            raise argparse.ArgumentTypeError(
                f"{text}: {value} {unit} is too large; the maximum is {hi} {unit}")
    return cols, rows
