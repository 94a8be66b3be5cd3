"""Where a process death is found and how its lines become crashes: the crash windows of
:class:`~kvdiag.postmortem.parse.LogParser`.

A crash window opens at a crash line (an anchor hit that :mod:`grammar` reads as an abort, a
GPU error or a signal) or, where a server's output ends (a log's end, a restart), at a line
read back that shows a death in any words (:mod:`deathlines`); the bytes before it are read
backwards for the slot timeline, the ``fits=false`` lines and a stack printed just before it.
Every line after it feeds one :class:`~kvdiag.postmortem.crashblock.CrashBlock` until the log
is quiet again, and closing the window turns the block into ``Crash`` records
(docs/postmortem-json.md "How a death is found").
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator
from itertools import accumulate

from kvdiag.model.logrecords import Crash, FitsLine, LogLine, SlotEvent
from kvdiag.postmortem import crashlines, deathlines, grammar, serverlog
from kvdiag.postmortem.backtrace import is_noise, is_thread_header, parse_frame
from kvdiag.postmortem.bootfold import BootAccumulator
from kvdiag.postmortem.crashblock import CrashBlock
from kvdiag.postmortem.lines import clean
from kvdiag.postmortem.slots import active_slots

LOOKBACK_BYTES = 1 << 20
LOOKBACK_LINES = 4000
TIMELINE = 40
PRE_STACK_LINES = 300
CRASH_QUIET = 200
CRASH_MAX_LINES = 20000
MAX_CRASHES = 500
KEEP_FITS = 64
MAX_BUILD_IDS = 512


class CrashWindows:
    """The crash-window half of :class:`~kvdiag.postmortem.parse.LogParser` (which holds the
    state below and reports problems with ``_problem``)."""

    _name: str
    _crash: CrashBlock | None
    _crash_meta: tuple[tuple[SlotEvent, ...], tuple[int, ...]]
    _crash_quiet: int
    _crash_lines: int
    _server_went_on: bool
    _seen_to: int
    #: the last line an earlier crash block of this source took
    _crash_end: int
    _prev_tail: bytes
    _region_start: int
    boot: BootAccumulator
    crashes: list[Crash]
    fits: deque[FitsLine]
    build_ids: dict[tuple[str, str], None]

    def _problem(self, message: str, line: int | None, code: str | None = None) -> None:
        raise NotImplementedError

    # -- crashes ----------------------------------------------------------------------------

    def _bytes_before(self, data: bytes, ls: int) -> tuple[bytes, bool]:
        """Up to ``LOOKBACK_BYTES`` of complete lines before ``data[ls]`` (this block's, then
        the previous blocks'), and whether the limit cut them (the first line is partial)."""
        lo = max(self._region_start, ls - LOOKBACK_BYTES)
        before = data[lo:ls]
        if len(before) < LOOKBACK_BYTES and self._prev_tail and data is not self._prev_tail:
            before = self._prev_tail[-(LOOKBACK_BYTES - len(before)):] + before
        return before, len(before) >= LOOKBACK_BYTES

    def _open_crash(self, where: LogLine, data: bytes, ls: int) -> None:
        if self._crash is not None:
            return
        self._open_crash_after(where, self._bytes_before(data, ls)[0])

    def _open_crash_after(self, where: LogLine, before: bytes) -> None:
        """A crash block from ``where``; ``before`` are the lines just before it."""
        self._crash = CrashBlock(where)
        self._crash_quiet = 0
        self._crash_lines = 0
        self._server_went_on = False
        self._seen_to = max(self._seen_to, where.line)
        self._crash_meta, stack = self._lookback(before, where.line)
        for w, text in stack:
            self._crash.feed(w, text)

    def _read_back(self, before: bytes, last: int, cut: bool) -> None:
        """Deaths no anchor marked, read back where the server's output ends (the end of a
        log, a restart): ``before`` are the complete lines up to line ``last``, the first one
        partial when ``cut``. Lines up to ``_seen_to`` were parsed one by one already (crash
        and boot windows) and are not read again; at most ``LOOKBACK_LINES`` are. Only lines
        that hold one of ``deathlines.MAY_SHOW_DEATH`` are parsed; one that shows a death opens
        a crash block as an anchor hit does, and every line after it feeds the block until it
        closes."""
        if last <= self._seen_to or not before:
            return
        raws = before.split(b"\n")
        if raws[-1] == b"":
            raws.pop()
        if cut and raws:
            raws.pop(0)
        n = min(len(raws), last - self._seen_to, LOOKBACK_LINES)
        raws = raws[len(raws) - n:]
        starts = list(accumulate((len(r) + 1 for r in raws), initial=len(before) - sum(
            len(r) + 1 for r in raws)))
        candidates = _lines_holding(before, starts, deathlines.MAY_SHOW_DEATH)
        first = last - n + 1
        i = 0
        while i < n:
            if self._crash is None:
                k = bisect_left(candidates, i)
                if k == len(candidates):
                    break
                i = candidates[k]
            text, level = clean(raws[i])
            where = LogLine(self._name, first + i, text)
            if self._crash is not None:
                self._crash_feed(where, text, level)
            elif (crashlines.parse_signal(where, text) is not None
                  or deathlines.opens_with_frame(text)
                  or crashlines.parse_terminate(text) is not None
                  or deathlines.parse_libc_fatal(where, text) is not None):
                self._open_crash_after(where, before[:starts[i]])
                self._crash_feed(where, text)
            else:
                self._oom_kill_other(where.line, text)
            i += 1
        self._seen_to = max(self._seen_to, last)

    def _oom_kill_other(self, line: int, text: str) -> None:
        oom = deathlines.parse_oom_kill(text)
        if oom is not None and not deathlines.is_server_process(oom[1]):
            self._problem(f"the kernel's OOM killer killed process {oom[0]} ({oom[1]}) at line "
                          f"{line}; the log does not say it was the server, so it is not "
                          "counted as a crash", line, "oom-kill-other")

    def _crash_feed(self, where: LogLine, text: str, level: str | None = None) -> bool:
        block = self._crash
        if block is None:
            return False
        self._crash_lines += 1
        self._crash_end = max(self._crash_end, where.line)
        used = block.feed(where, text)
        self._crash_quiet = 0 if used else self._crash_quiet + 1
        if not used and not self._server_went_on and deathlines.server_line(text, level):
            self._server_went_on = True
        if self._crash_quiet > CRASH_QUIET or self._crash_lines > CRASH_MAX_LINES:
            # quiet: the log went on; it is the server's output that went on past the crash
            # only when one of those lines is the server's own
            self._close_crash(ended=not self._server_went_on)
        return used

    def _close_crash(self, *, ended: bool = True) -> None:
        """End the crash block; ``ended`` when the server's output ended with it (the log's
        end, a restart, a followed log gone quiet, only other programs' lines after it) rather
        than going on past it."""
        block = self._crash
        if block is None:
            return
        self._crash = None
        timeline, active = self._crash_meta
        first = block.start.line - LOOKBACK_LINES
        fits = tuple(f for f in self.fits if f.where.source == self._name
                     and f.where.line >= first)
        for crash in block.crashes():
            sig = crash.signal
            if (sig is not None and sig.exception is not None and crash.abort is None
                    and crash.error is None and not ended):
                # faulthandler's exception handler prints every error exception as it is
                # raised, before any handler of the process has seen it (Modules/faulthandler.c
                # returns EXCEPTION_CONTINUE_SEARCH): one the process caught is no death
                self._problem(f"a Windows exception at line {sig.where.line} ({sig.exception}) "
                              "that the process survived: the server's output goes on after "
                              "it, so it is not counted as a crash", sig.where.line,
                              "windows-exception-survived")
                continue
            if crash.kind == "unknown" and not ended:
                # a stack and nothing else, and the log goes on: a death is not shown
                bt = crash.backtrace
                n = len(bt.frames) if bt is not None else 0
                form = bt.form if bt is not None else "?"
                self._problem(f"a backtrace without a known cause at line {crash.where.line} "
                              f"({n} {form} frames); the server's output goes on after it, so it "
                              "is not counted as a crash", crash.where.line, "backtrace-no-cause")
                continue
            if len(self.crashes) >= MAX_CRASHES:
                self._problem(f"more than {MAX_CRASHES} crashes; later ones not kept", None)
                return
            self.crashes.append(Crash(
                where=crash.where, kind=crash.kind, abort=crash.abort, error=crash.error,
                signal=crash.signal, backtrace=crash.backtrace, fingerprint=crash.fingerprint,
                boot_index=len(self.boot.boots) - 1 if self.boot.boots else None,
                active_slots=active, timeline=timeline, fits=fits[-8:], python=crash.python,
            ))

    def _lookback(
        self, before: bytes, line: int
    ) -> tuple[tuple[tuple[SlotEvent, ...], tuple[int, ...]], list[tuple[LogLine, str]]]:
        """Slot lines just before a crash, read backwards from the bytes still in memory
        (``before``, which ends with line ``line - 1``), and a backtrace printed just before
        the crash line (a stack dumped before the shell or systemd reports the signal), with
        the signal handler's own line before that stack."""
        raws = before.split(b"\n")
        if raws and raws[-1] == b"":
            raws.pop()
        events: list[SlotEvent] = []
        fits: list[FitsLine] = []
        stack: list[tuple[LogLine, str]] = []
        stack_open = True
        misses = 0
        n = line - 1
        for k, raw in enumerate(reversed(raws)):
            if k >= LOOKBACK_LINES or n < 1:
                break
            if n <= self._crash_end:
                # an earlier death's lines (its signal line, its stacks) are its own: a server
                # that died, restarted and died again printed them before the restart
                stack_open = False
            if stack_open and k < PRE_STACK_LINES:
                text, _ = clean(raw)
                if (parse_frame(text) is not None or is_thread_header(text)
                        or crashlines.parse_signal(LogLine(self._name, n, text), text) is not None
                        or crashlines.parse_terminate(text) is not None
                        or text.lstrip().startswith("what():")
                        or crashlines.parse_native_api(text) is not None
                        or text.startswith("Exception caught at file:")):
                    stack.append((LogLine(self._name, n, text), text))
                elif not is_noise(text):
                    misses += 1
                    if stack or misses > 20:
                        stack_open = False
            elif stack_open:
                stack_open = False
            if b"build-id" in raw and k < PRE_STACK_LINES:
                self._build_id(clean(raw)[0])
            if b"fits=false" in raw and len(fits) < KEEP_FITS:
                text, _ = clean(raw)
                fl = grammar.parse_fits(LogLine(self._name, n, text), text)
                if fl is not None:
                    fits.append(fl)
            elif b"slot" in raw or b"idle" in raw:
                text, _ = clean(raw)
                ev: SlotEvent | None = None
                if text.startswith("slot ") or serverlog.mentions(text):
                    ev = grammar.parse_slot(LogLine(self._name, n, text), text)
                elif "all slots are idle" in text:
                    ev = SlotEvent(where=LogLine(self._name, n, text), kind="idle",
                                   message=text.strip())
                if ev is not None:
                    events.append(ev)
            n -= 1
        events.reverse()
        stack.reverse()
        known = {(f.where.source, f.where.line) for f in self.fits}
        self.fits.extend(f for f in reversed(fits) if (f.where.source, f.where.line) not in known)
        return (tuple(events[-TIMELINE:]), active_slots(events)), stack

    def _build_id(self, text: str) -> None:
        found = crashlines.parse_build_id(text)
        if found is not None and len(self.build_ids) < MAX_BUILD_IDS:
            self.build_ids[found] = None


def _lines_holding(data: bytes, starts: list[int], needles: tuple[bytes, ...]) -> list[int]:
    """Indexes of the lines (``starts``: their offsets in ``data``, then the end) that hold
    any of ``needles``, in order."""
    found: set[int] = set()
    lo, hi = starts[0], starts[-1]
    for needle in needles:
        for p in positions(data, needle, lo, hi):
            found.add(bisect_right(starts, p) - 1)
    return sorted(found)


def positions(data: bytes, needle: bytes, start: int, end: int) -> Iterator[int]:
    """Every offset of ``needle`` in ``data[start:end]``, overlapping ones included."""
    p = data.find(needle, start, end)
    while p >= 0:
        yield p
        p = data.find(needle, p + 1, end)
