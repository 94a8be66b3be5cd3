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


#: What CPython's faulthandler prints in a thread's stack instead of or beside frames, and the
#: note kvdiag keeps for it (Python/traceback.c ``dump_traceback``, ``dump_frame``; 3.8 to
#: 3.14): the postmortem reader reads them, a llama-log export prints them back.
PYTHON_MARKS: dict[str, str] = {
    "Garbage-collecting": "the garbage collector was running",
    "<no Python frame>": "no Python frame (the thread ran only C code)",
    "<tstate is freed>": "the thread state was already freed",
    "<freed frame>": "a frame was already freed",
    "<invalid frame>": "a frame could not be read",
    # faulthandler's MAX_FRAME_DEPTH
    "...": "cut after 100 frames",
}


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
