"""Crash fingerprints: what makes two crashes "the same" across logs, builds and runs.

The signature is the assert location (file name without directories, line, condition) or the
GPU error (function, message); only a crash without either (a fatal signal, an uncaught
exception) is told apart by the first in-app frames by function name. A crash that names its
own site is the same crash whether the log carries gdb frames, glibc frames or no backtrace at
all, so frames never take part there. Abort machinery, backtrace helpers, signal trampolines
and system libraries are not in-app (``backtrace.is_in_app``); raw addresses and offsets are
never used because they change with ASLR and with every rebuild. A Python embedding's death
with no native stack is told apart by the Python frames of the thread the signal hit (file
name and function; ``pystack``).
"""

from __future__ import annotations

import hashlib
import re

from kvdiag.model.logrecords import Crash
from kvdiag.postmortem.backtrace import base_name

N_FRAMES = 3
_DIRS = re.compile(r"^.*[\\/]")


def signature(crash: Crash) -> str:
    parts: list[str] = [crash.kind]
    if crash.abort is not None:
        ab = crash.abort
        where = f"{_DIRS.sub('', ab.file)}:{ab.line}" if ab.file else "?"
        parts.append(f"{where} {ab.condition if ab.condition is not None else ab.message}")
    if crash.error is not None:
        parts.append(f"{crash.error.function or '?'}: {crash.error.message}")
    if crash.abort is None and crash.error is None and crash.signal is not None:
        parts.append(crash.signal.signal)
    if crash.abort is not None or crash.error is not None:
        return " | ".join(parts)
    frames = crash.backtrace.frames if crash.backtrace is not None else ()
    names: list[str] = []
    for fr in frames:
        if fr.in_app and fr.function:
            names.append(base_name(fr.function))
            if len(names) == N_FRAMES:
                break
    if not names and crash.python and crash.python[0].current:
        # a Python embedding that printed no native stack: the Python frames of the thread
        # the signal hit name the site (file name and function: no address to drift)
        for fr in crash.python[0].frames:
            if fr.in_app and fr.function:
                names.append(f"{_DIRS.sub('', fr.file or '?')}:{fr.function}")
                if len(names) == N_FRAMES:
                    break
    if names:
        parts.append(" < ".join(names))
    return " | ".join(parts)


def fingerprint(crash: Crash) -> str:
    """12 hex digits of SHA-1 over ``signature``: stable across runs, builds and machines."""
    return hashlib.sha1(signature(crash).encode("utf-8", "replace")).hexdigest()[:12]
