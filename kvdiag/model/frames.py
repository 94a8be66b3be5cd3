"""Stack frames from backtraces, before and after symbolization."""

from __future__ import annotations

import msgspec


class Frame(msgspec.Struct, frozen=True, omit_defaults=True):
    """One frame. ``inlined`` frames share the address of the physical frame they sit in;
    ``unverified`` frames took their function and source from a binary that nothing in the log
    could check against (``postmortem.binaries``): they may name another build's code."""

    index: int
    module: str | None = None
    offset: int | None = None
    address: int | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    inlined: bool = False
    in_app: bool = True
    unverified: bool = False
