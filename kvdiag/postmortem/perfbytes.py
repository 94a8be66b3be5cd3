"""Where ``kvdiag perf``'s patterns can match in a block, found in C (``perfbytes.c``): the
compiled pattern then runs only there.

Reading a log for ``kvdiag perf`` (:mod:`kvdiag.postmortem.perfscan`) was mostly sre passing
over every byte: the slot-line pattern (:data:`~kvdiag.postmortem.timinglines.SLOT_LINES`)
searched for its ``id`` and tried its alternatives at each of the ~10 slot lines of a request
of which it reads 2, and each rare anchor (:data:`~kvdiag.postmortem.timinglines.RARE_ANCHORS`)
cost a pass of its own, comparing every byte (benchmarks/results/bench_perf.txt: 0.8-0.9 s and
0.5-0.8 s per 256 MiB of bench_logscan's log). One C pass over the block finds both: the
offsets of the anchors, as the five searches found them, and the offsets where the slot-line
pattern can begin — its ``id``, the slot prefix and the first bytes of a message it reads,
each a condition the pattern itself implies, so that no match is lost; the pattern still
decides at each (:func:`matches`) and reads what it matched as before. So the records are
those of the pattern's own search: the tests hold the two ways equal on logs of every shape
and prefix and on random bytes (tests/test_perf_bytes.py).

At those offsets ``perfpairs.c`` reads the usual request (``new prompt`` with its cache line,
then the older shape's ``print_timing`` block with its release or the newer shape's two timing
lines with what follows them),
following the pattern's first choice at each of its choice points and leaving to the pattern
every line that takes another; the numbers go to the bulk step as their printed text
(:func:`kvdiag.postmortem.perfpairs.walk_compiled`). After that the pattern's matching was
most of what was left (~2.5 us a match, two a request).

Where the helper cannot be built (no compiler, no Python headers; ``KVDIAG_COMPILED=0``:
:mod:`kvdiag.compiled`) the scanner searches with the patterns alone, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvdiag import compiled
from kvdiag.postmortem.timinglines import RARE_ANCHORS, SLOT_LINES

_SOURCE = Path(__file__).with_name("perfbytes.c")
_MODULE = f"{__package__}._perfbytes"


def module() -> Any:
    """The compiled helper, or None (:func:`kvdiag.compiled.load` says why)."""
    return compiled.load(_SOURCE, _MODULE)


def scan(c: Any, buf: bytes, start: int, end: int) -> tuple[memoryview, list[int]]:
    """In ``buf[start:end]``: the offsets where :data:`SLOT_LINES` can match, and the rare
    anchors' offsets in order (what the scanner's five searches give)."""
    raw, rare = c.scan(buf, start, end, RARE_ANCHORS)
    return memoryview(raw).cast("q"), rare


def matches(buf: bytes, starts: Iterable[int], end: int,
            after: list[int] | None = None) -> Iterator[re.Match[bytes]]:
    """:data:`SLOT_LINES`' matches in ``buf`` up to ``end`` from the offsets ``starts`` (a
    superset of where one begins, in order): ``SLOT_LINES.finditer``'s matches, as it skips
    what a match read (an offset inside the match before is no match of finditer's).
    ``after``: where the match before ended, kept up to date as they are made."""
    match = SLOT_LINES.match
    last = after if after is not None else [0]
    for p in starts:
        if p >= last[0]:
            m = match(buf, p, end)
            if m is not None:
                last[0] = m.end()
                yield m
