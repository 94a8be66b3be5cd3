"""Following a name that kernels/kvtrace.h may write as a segment set (``KVTRACE_MAX_MB``):
the newest segment is followed with a :class:`~kvdiag.follow.tail.Tail`, and when the writer
starts the next one, following moves to it.

A name is a set when it names one by the rules every reader shares
(:func:`kvdiag.trace.segments.find_set`: the ``KVTRACE_FILE`` path that is not itself a file,
the folder holding one set, a quoted glob); until either the file or a segment exists, both
are waited for. Each segment starts with a header and a ``snapshot`` event (docs/
trace-format.md, "Segments"), so it is judged on its own: the move to the next segment is a
:class:`~kvdiag.follow.tail.Reset` like a rotation, after the rest of the current segment
was read. A segment already compressed (``.zst``, closed) is not followed; the newest plain
one is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kvdiag.errors import InputError
from kvdiag.follow.tail import BLOCK, Reset, Tail
from kvdiag.trace.segments import find_set

LOOK_EVERY_S = 0.25
"""Seconds between two looks for a newer segment while the followed one does not grow."""


def is_set_name(path: str) -> bool:
    """Does ``path`` name a set whatever exists (a folder, a glob)?"""
    return os.path.isdir(path) or any(c in path for c in "*?[")


class SegmentTail:
    """:class:`Tail`'s interface over a name that may be a segment set."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tail: Tail | None = None
        self.segment: Path | None = None
        """The segment followed now (None: a plain file, or nothing found yet)."""
        self._index = -1
        self._looked = 0.0

    @property
    def opened(self) -> bool:
        return self.tail is not None and self.tail.opened

    @property
    def generation(self) -> int:
        return self.tail.generation if self.tail is not None else 0

    def reopen(self) -> int | None:
        return self.tail.reopen() if self.tail is not None else None

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()

    def _start(self) -> bool:
        """Decide, once something exists under the name, what to follow."""
        if not is_set_name(self.path) and os.path.lexists(self.path):
            self.tail = Tail(self.path)  # a plain file (the Tail refuses what is not one)
            return True
        newest = self._newest()
        if newest is None:
            return False
        self.segment, self._index = newest
        self.tail = Tail(str(self.segment))
        return True

    def _newest(self) -> tuple[Path, int] | None:
        found = find_set(self.path)
        if found is None:
            if os.path.isdir(self.path):
                raise InputError(f"{self.path}: is a directory, not a file to follow (it holds "
                                 "no trace segment set)")
            return None
        plain = [p for p in found[1] if not p.compressed]
        if not plain:
            return None  # every segment closed and compressed: nothing is being written
        part = plain[-1]
        return part.path, part.index

    def poll(self, limit: int = BLOCK) -> bytes | Reset | None:
        if self.tail is None and not self._start():
            return None
        assert self.tail is not None
        got = self.tail.poll(limit)
        if got is not None or self.segment is None:
            return got
        now = time.monotonic()
        if now - self._looked < LOOK_EVERY_S:
            return None
        self._looked = now
        newest = self._newest()
        if newest is None or newest[1] <= self._index:
            return None
        rest = self.tail.poll(limit)  # what the writer added before it moved on
        if rest is not None:
            return rest
        old = self.segment.name
        self.tail.close()
        self.segment, self._index = newest
        self.tail = Tail(str(self.segment))
        return Reset(f"segment {old} is complete; following the next one, {self.segment.name}, "
                     "from its start (judged from its snapshot)")
