"""Reading a large log's requests in two halves at once (``kvdiag perf``).

Every slot line of interest goes through Python (:mod:`kvdiag.postmortem.perfscan`), so on a
machine with an idle second core a large regular file is cut at a line boundary near its middle
and a second process reads the second half (``python -m kvdiag.postmortem.perfsplit PATH START
END``, its result msgpack-encoded on stdout) while this one reads the first. The halves are then
joined: a request the second half saw without its start (an :class:`~kvdiag.postmortem.perfscan.Orphan`)
is completed with the first half's request in flight on that slot; the second half's lines,
notes and boots follow the first's. The cut never falls inside an older-shape ``print_timing``
block (its figures follow its header on lines of their own). If the second process fails, this
one reads the second half itself: the result is the same, only slower. A log of the late-2023
form is read in one process: its timing blocks are paired with release lines that follow them
(:mod:`kvdiag.postmortem.perflate`), which a cut between them would separate; a second half
that holds the form is read again by this process, after its first half.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add, attrgetter
from typing import TYPE_CHECKING, Any

import msgspec

from kvdiag.model.logrecords import BootConfig, ConfigItem, LogLine, Problem
from kvdiag.model.perf import AdaptPage, AdaptPages, PerfRun, RequestTiming, StreamNote
from kvdiag.postmortem.parse import PARALLEL_MIN_BYTES, spare_core
from kvdiag.postmortem.perfnotes import MAX_NOTES
from kvdiag.postmortem.perfpending import Orphan
from kvdiag.postmortem.perfpending import Pending as _Pending
from kvdiag.postmortem.perfscan import BLOCK_BYTES, PerfScanner
from kvdiag.postmortem.timinglines import LATE_ANCHOR, OLD_HEADER

_FIELDS = RequestTiming.__struct_fields__
_LINE, _BOOT, _STARTED, _NOTES = (_FIELDS.index(f) for f in ("line", "boot", "started", "notes"))
if TYPE_CHECKING:
    Columns = tuple[list[Any], ...]
else:
    Columns = tuple[tuple(list[f.type] for f in msgspec.structs.fields(RequestTiming))]
"""The second half's requests as one list per field of
:class:`~kvdiag.model.perf.RequestTiming`, in the fields' order (each list typed as its field):
sent so and joined a column at a time, without a Python step or an object per request
(msgspec.structs.replace for each of a 1 GiB log's 327,000 requests cost ~0.7 s while the first
process waited; a tuple per request, ~0.3 s per 81,000: the collector walks them)."""


class Half(msgspec.Struct):
    """What the second process read of its half (lines counted from the half's start)."""

    requests: Columns
    """Its requests, a list per field (:data:`Columns`)."""
    notes: list[StreamNote]
    notes_dropped: int
    adapt: list[AdaptPage]
    boots: list[BootConfig]
    orphans: list[Orphan]
    unfinished: int
    lines: int
    problems: list[Problem]
    config: list[ConfigItem]
    first_active_line: int | None
    boot_notes: int | None
    late: bool = False
    """It holds the late-2023 form: not joined, but read again after the first half."""


def split_point(path: str, size: int) -> int:
    """A line start near the middle of the file, after any older-shape print_timing block
    that would otherwise straddle it (0 when none is found)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, size // 2 - 4096))
        data = fh.read(1 << 20)
    base = max(0, size // 2 - 4096)
    if LATE_ANCHOR in data:
        return 0
    first = data.find(b"\n", 4096) + 1
    if first <= 0:
        return 0
    cut = first
    for _ in range(8):
        # the three lines before the cut may not hold a header whose figures follow it
        start = cut - 1
        for _ in range(3):
            start = data.rfind(b"\n", 0, start - 1) + 1
        m = OLD_HEADER.search(data, start, cut)
        if m is None:
            return base + cut
        for _ in range(4):  # past the header's three lines
            nl = data.find(b"\n", cut)
            if nl < 0:
                return 0
            cut = nl + 1
    return 0


def read_range(scanner: PerfScanner, path: str, start: int, end: int,
               hook: Callable[[bytes], None] | None = None) -> None:
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            data = fh.read(min(BLOCK_BYTES, left))
            if not data:
                break
            left -= len(data)
            if hook is not None and not scanner.requests:
                hook(data)
            scanner.feed(data)
    scanner.drain()


def _second_half(path: str, start: int, end: int, source: str) -> Half:
    scanner = PerfScanner(path, source, continuation=True)
    read_range(scanner, path, start, end)
    run = scanner.finish()
    columns = tuple(list(map(attrgetter(f), run.requests)) for f in _FIELDS)
    return Half(columns, list(run.notes), run.notes_dropped, list(run.adapt),
                list(run.boots), scanner.orphans, run.unfinished, run.lines,
                list(run.problems), scanner.carried_config, scanner.first_active_line,
                scanner.boot_notes, scanner.late.seen)


def _start(path: str, start: int, end: int, source: str) -> subprocess.Popen[bytes] | None:
    # the child must import this same kvdiag, wherever it was imported from
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "kvdiag.postmortem.perfsplit", path, str(start), str(end),
             source], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None


def _collect(proc: subprocess.Popen[bytes] | None) -> Half | None:
    if proc is None:
        return None
    try:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            return None
        half = msgspec.msgpack.decode(out, type=Half)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return half if len(set(map(len, half.requests))) == 1 else None


def usable(path: str, size: int) -> bool:
    return size >= PARALLEL_MIN_BYTES and os.path.isfile(path) and spare_core()


def scan_split(path: str, size: int, source: str | None = None,
               hook: Callable[[bytes], None] | None = None) -> PerfRun | None:
    """The run of ``path`` read in two halves at once; None when the file cannot be cut.
    ``hook`` sees the first half's blocks (the boot lines are there)."""
    source = source or path
    cut = split_point(path, size)
    if cut <= 0 or cut >= size:
        return None
    proc = _start(path, cut, size, source)
    first = PerfScanner(path, source)
    try:
        read_range(first, path, 0, cut, hook)
    except BaseException:
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    half = _collect(proc) or _second_half(path, cut, size, source)
    if half.late or first.late.seen:
        read_range(first, path, cut, size)
        return first.finish()
    join(first, half)
    return first.finish()


def _shift(line: LogLine, by: int) -> LogLine:
    return msgspec.structs.replace(line, line=line.line + by)


def join(first: PerfScanner, half: Half) -> None:
    """Continue ``first`` (which read the log up to the cut) with the second ``half``."""
    lines, boot0 = first._lines, first._boot_index
    # a log's first boot line does not start a new boot index (there was none before), so a
    # second half holding it numbers its boots one too high
    fresh = not first.boot.boots and bool(half.boots)

    def boot_of(b: int) -> int:
        return boot0 + b - 1 if fresh and b else boot0 + b

    for item in half.config:  # the first half's last boot goes on in the second
        first._config(msgspec.structs.replace(item, where=_shift(item.where, lines)))
    base = len(first.notes)
    kept = max(0, min(len(half.notes), MAX_NOTES - base))
    before = first._last_active
    first.notes.extend(msgspec.structs.replace(
        n, line=n.line + lines, boot=boot_of(n.boot),
        depth=before if (n.depth is None and n.boot == 0 and (
            half.first_active_line is None or n.line < half.first_active_line)) else n.depth)
        for n in half.notes[:kept])
    first.notes_dropped += half.notes_dropped + len(half.notes) - kept

    def moved(ids: Iterable[int]) -> list[int]:
        return [base + i for i in ids if i < kept]

    # the first half's requests in flight at the cut: the second half's notes until each ended
    ends: dict[int, int | None] = {}
    for o in half.orphans:
        ends.setdefault(o.slot, o.notes_until)
    for slot, flying in first._pending.items():
        until = ends.get(slot, half.boot_notes)
        flying.notes.extend(moved(range(kept if until is None else min(until, kept))))
    # requests the first half began and the second half finished (or saw more of)
    for o in half.orphans:
        p = first._pending.get(o.slot)
        if p is None or (o.task is not None and p.task is not None and p.task != o.task):
            if p is not None:
                del first._pending[o.slot]
                first._close(o.slot, p, None, None)
            p = first._pending[o.slot] = _Pending(
                o.task, None if o.started is None else o.started + lines)
            p.notes.extend(moved(o.notes))
        for name in ("cached", "prompt", "decode", "graphs"):
            value = getattr(o, name)
            if value is not None:
                setattr(p, name, value)
        if o.line:
            p.line = o.line + lines
        if o.ended != "end":
            del first._pending[o.slot]
            first._close(o.slot, p, o.depth_end, o.truncated)
    cols: list[Any] = list(half.requests)
    if cols[_LINE]:
        cols[_LINE] = map(add, cols[_LINE], repeat(lines))
        started = cols[_STARTED]
        cols[_STARTED] = ([None if x is None else x + lines for x in started]
                          if None in started else map(add, started, repeat(lines)))
        if fresh or boot0:
            cols[_BOOT] = map(boot_of, cols[_BOOT])
        notes = cols[_NOTES]
        if notes.count(()) != len(notes):
            cols[_NOTES] = [tuple(moved(n)) for n in notes]
        first.requests.extend(map(RequestTiming, *cols))
    first.unfinished += half.unfinished
    pages = AdaptPages()
    for page in (*first.adapt.result(), *(msgspec.structs.replace(
            p, boot=boot_of(p.boot), first_line=p.first_line + lines) for p in half.adapt)):
        pages.merge(page)
    first.adapt = pages
    if half.boots:
        # the second half's new boots: the first half's requests in flight ended with its own
        if not fresh:
            first._end_boot()
        first._boot_index = boot_of(len(half.boots))
        first.extra_boots.extend(msgspec.structs.replace(
            b, line=b.line + lines, evidence=tuple(_shift(e, lines) for e in b.evidence))
            for b in half.boots)
    first.problems.extend(msgspec.structs.replace(
        p, line=None if p.line is None else p.line + lines) for p in half.problems)
    first._lines = lines + half.lines


def main(argv: list[str]) -> int:
    path, start, end, source = argv[0], int(argv[1]), int(argv[2]), argv[3]
    half = _second_half(path, start, end, source)
    sys.stdout.buffer.write(msgspec.msgpack.encode(half))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
