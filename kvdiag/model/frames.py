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


def python_stack_title(thread: str | None, name: str | None, current: bool) -> str:
    """``Python stack, thread 0x… [name] (the thread the signal hit)``: how every surface
    names one thread's faulthandler stack (a log's crash, a trace's abort)."""
    where = f", thread {thread}" if thread else ""
    if name:
        where += f" [{name}]"
    return f"Python stack{where}" + (" (the thread the signal hit)" if current else "")


def python_frame_text(fr: Frame) -> str:
    """``function file.py:line`` of a Python frame, the file without folders; ``???`` for
    what faulthandler could not read, as it prints it."""
    file = fr.file.replace("\\", "/").rsplit("/", 1)[-1] if fr.file else "???"
    return f"{fr.function or '???'} {file}:{fr.line if fr.line is not None else '???'}"
