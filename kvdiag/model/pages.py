"""Page identity shared by the runtime model and the analyses that replay it."""

from __future__ import annotations

from typing import NamedTuple

PAGE_TOKENS = 256
"""Tokens per page; the G1 resident cache refuses any other value (brief §1.3)."""

V_ALIGN = 128
"""The V plane of a page starts at the K bytes rounded up to this many bytes (and the streamed
kernel pads K rows of a block to it)."""


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


Key = tuple[int, int | None, int]
"""A bookkeeping key: (layer, stream or None in the shared layout, page)."""


class Holder(NamedTuple):
    """What a pool slot's bytes are: a copy of host page (layer, stream, page) at ``version``.
    (A named tuple: replays build many of them, and a tuple is built several times faster
    than a frozen dataclass.)"""

    layer: int
    stream: int
    page: int
    version: int
