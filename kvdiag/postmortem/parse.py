"""The streaming driver: bytes in, a bounded ``LogScan`` out.

Most lines of a server log are routine slot lines that no rule needs one by one, so the driver
reads large blocks and looks only for a few anchor substrings (``ANCHORS``) with ``bytes.find``;
only lines that contain an anchor are decoded and parsed. Two kinds of *window* switch to
parsing every line: a boot window (from the first configuration line until the server says it
is ready) and a crash window (from the first crash line until the log is quiet again). When a
crash window opens, the bytes just before it are read backwards for the slot timeline.

A death needs no anchor word to be found: a dying process prints its last lines and stops, so
where a server's output ends (the end of each log, and each restart) the lines since the last
window are read back (:meth:`LogParser._read_back`) for a signal line in any words, a stack of
any library, an uncaught exception. That costs no search pass over the routine lines.

Memory stays bounded: one block, the tail of the previous block, and capped lists of records.
"""

from __future__ import annotations

import gzip
import os
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import BinaryIO

from kvdiag.files.logs import READ_ERRORS, describe_break
from kvdiag.files.text import Damage
from kvdiag.model.logrecords import (
    Abort,
    BootConfig,
    ConfigItem,
    Crash,
    FirstRequest,
    FitsLine,
    GpuError,
    LogLine,
    LogScan,
    Problem,
    Replaced,
    SignalLine,
    SlotEvent,
    StreamEvent,
)
from kvdiag.postmortem import deathlines, grammar, serverlog
from kvdiag.postmortem.backtrace import is_noise, is_thread_header, parse_frame
from kvdiag.postmortem.bootfold import BootAccumulator
from kvdiag.postmortem.crashblock import CrashBlock
from kvdiag.postmortem.lines import MAX_LINE_CHARS, clean
from kvdiag.postmortem.scanhelper import ScanHelper
from kvdiag.postmortem.slots import active_slots

#: Substrings that mark a line worth parsing. Each names what it catches. The instrumented
#: ``fits=false`` lines (domain brief §4.5) are read when looking back from a crash instead:
#: they matter only next to the abort they explain.
ANCHORS: tuple[bytes, ...] = (
    b"_ASSERT",  # GGML_ASSERT(...) failed; legacy "GGML_ASSERT: file:line: cond"
    b"ssertion",  # MSVC "Assertion failed: ..."; glibc "Assertion `x' failed."
    b" error",  # CUDA/ROCm/SYCL error lines, "…cu:102: CUDA error" aborts
    b"llama_",  # boot configuration (llama_context:, llama_kv_cache:, llama_model_loader:)
    b"kv_stream",  # kv_stream_adapt, ring latency, kv-stream allocation failures
    b"SEGV",  # SIGSEGV (gdb, lldb, Go runtime), systemd "status=11/SEGV"
    b"fault",  # "Segmentation fault"
    # GGML_ABORT's "<…/ggml/…/x.c>:<line>: <message>" with no other anchor word, and
    # ggml_print_backtrace (in every backtrace form): one search finds both
    b"ggml",
)
#: With a helper process (``scanhelper``), the main process searches these and the helper the
#: rest, plus the newline count; the split balances the measured search costs.
MAIN_ANCHORS = ANCHORS[:4]
HELPER_ANCHORS = ANCHORS[4:]
#: Files smaller than this are not worth starting a helper process for.
PARALLEL_MIN_BYTES = 64 << 20
#: Extra anchors while a boot still waits for its first request.
LAUNCH_ANCHORS: tuple[bytes, ...] = (b"processing task", *serverlog.ANCHORS,
                                     b"is processing [task")
"""``launch_slot_`` (2024-), the 2024 ``server_log`` form (text or JSON, either key spelling),
2023's ``slot N is processing [task id: N]``: a request launched, so the boot was ready."""

BLOCK = 8 << 20
LOOKBACK_BYTES = 1 << 20
LOOKBACK_LINES = 4000
TIMELINE = 40
PRE_STACK_LINES = 300
CRASH_QUIET = 200
CRASH_MAX_LINES = 20000
BOOT_MAX_LINES = 5000
MAX_CRASHES = 500
MAX_PROBLEMS = 100
MAX_RAW_LINE = 1 << 20
KEEP_STREAM = 200
KEEP_FITS = 64
MAX_BUILD_IDS = 512


class LogParser:
    """Feed one or more sources with ``feed``; ``result()`` gives the ``LogScan``."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self.boot = BootAccumulator()
        self.first_requests: list[FirstRequest] = []
        self.crashes: list[Crash] = []
        self.stream_events: deque[StreamEvent] = deque(maxlen=KEEP_STREAM)
        self.stream_event_count = 0
        self.fits: deque[FitsLine] = deque(maxlen=KEEP_FITS)
        self.config_failures: list[StreamEvent] = []
        self.problems: list[Problem] = []
        self.build_ids: dict[tuple[str, str], None] = {}
        self.replaced: list[Replaced] = []
        self.lines = 0
        self.bytes = 0
        self._reset_source("")

    # -- per source -------------------------------------------------------------------------

    def _reset_source(self, name: str) -> None:
        self._name = name
        self._lineno = 0
        self._crash: CrashBlock | None = None
        self._crash_meta: tuple[tuple[SlotEvent, ...], tuple[int, ...]] = ((), ())
        self._crash_quiet = 0
        self._crash_lines = 0
        self._server_went_on = False
        self._boot_lines = 0
        self._seen_to = 0
        self._cur: tuple[bytes, int] = (b"", 0)
        self._awaiting_launch = False
        self._damage = Damage()
        self._long_reported = False
        self._prev_tail = b""
        self._region_start = 0
        self._helper: ScanHelper | None = None

    def feed(self, name: str, stream: BinaryIO, *, leading_nuls: int = 0) -> None:
        """Read ``stream`` to its end (or to where it breaks, which is reported).

        NUL bytes are dropped and bytes that are not UTF-8 replaced (files.text); how many, in
        how many lines, is a problem of the source and a :class:`Replaced` record.
        ``leading_nuls`` counts NULs dropped before ``stream`` (files.logs.OpenLog)."""
        self.sources.append(name)
        self._reset_source(name)
        if leading_nuls:
            self._damage.nul_start(leading_nuls)
        # read1 hands over what one underlying read produced, so a stream that breaks
        # (a cut gzip member) still delivers everything decoded before the break
        read = getattr(stream, "read1", None) or stream.read
        self._helper = _start_helper(name, stream)
        consumed = 0
        try:
            self._feed_blocks(read, consumed)
        finally:
            if self._helper is not None:
                self._helper.close()
                self._helper = None
        if self._crash is None:
            tail = self._prev_tail
            self._read_back(tail, self._lineno, len(tail) >= LOOKBACK_BYTES)
        self._close_crash()
        self.lines += self._lineno
        self._report_damage()

    def _report_damage(self) -> None:
        d = self._damage
        if not d.replaced:
            return
        self.replaced.append(Replaced(source=self._name, nul_bytes=d.nul_bytes,
                                      invalid_bytes=d.invalid_bytes, lines=d.lines,
                                      first_line=d.first_line))
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(source=self._name, line=d.first_line,
                                         message=f"{d.summary()}; first at line {d.first_line}",
                                         code="bytes-replaced"))

    # -- a source that grows (kvdiag check --follow) ---------------------------------------

    def begin(self, name: str) -> None:
        """Start a source that arrives in pieces (:meth:`feed_lines`), as a followed log does."""
        self.sources.append(name)
        self._reset_source(name)

    def feed_lines(self, data: bytes) -> None:
        """Complete lines of the source begun last (``data`` ends with a newline)."""
        self.bytes += len(data)
        self.lines += data.count(b"\n")
        self._region(data, 0, len(data))
        self._remember(data, 0, len(data))

    @property
    def open_crash_line(self) -> int | None:
        """The first line of a crash whose lines may still be coming (its backtrace), else
        None; crashes that begin before it are all in :attr:`crashes`."""
        return self._crash.start.line if self._crash is not None else None

    def close_crash(self) -> None:
        """End the crash being read: the source went quiet (a dying server prints its abort
        and backtrace at once, then stops)."""
        self._close_crash()

    def _feed_blocks(self, read: Callable[[int], bytes], consumed: int) -> None:
        carry = b""
        skipping = False
        while True:
            at: int | None = consumed
            try:
                data = read(BLOCK)
            except READ_ERRORS as exc:
                self._problem(f"input breaks after line {self._lineno}: {describe_break(exc)}",
                              None)
                break
            if not data:
                break
            consumed += len(data)
            self.bytes += len(data)
            if data.find(b"\0") >= 0:
                data = self._damage.nul_block(data, self._lineno + 1)
                # the helper searches the file's own bytes, NULs included: not this block
                at = None
                if not data:
                    continue
            first_nl = data.find(b"\n")
            if first_nl < 0:
                if skipping:
                    continue
                carry += data
                if len(carry) > MAX_RAW_LINE:
                    self._long_line()
                    skipping = True
                    carry = carry[:MAX_RAW_LINE]
                continue
            if carry or skipping:
                head = (carry + data[:first_nl] if not skipping else carry) + b"\n"
                self._region(head, 0, len(head))
                self._remember(head, 0, len(head))
                carry = b""
                skipping = False
                start = first_nl + 1
            else:
                start = 0
            last_nl = data.rfind(b"\n") + 1
            if start < last_nl:
                self._region(data, start, last_nl, at)
                self._remember(data, start, last_nl)
            tail = data[last_nl:]
            if len(tail) > MAX_RAW_LINE:
                self._long_line()
                skipping = True
                tail = tail[:MAX_RAW_LINE]
            carry = tail
        if carry:
            self._problem("last line has no line end (truncated log?)", self._lineno + 1)
            last = carry + b"\n"
            self._region(last, 0, len(last))
            self._remember(last, 0, len(last))

    def _remember(self, data: bytes, start: int, end: int) -> None:
        """Keep the last ``LOOKBACK_BYTES`` of complete lines for looking back from a crash."""
        if end - start >= LOOKBACK_BYTES:
            self._prev_tail = data[end - LOOKBACK_BYTES:end]
        else:
            self._prev_tail = (self._prev_tail + data[start:end])[-LOOKBACK_BYTES:]

    # -- scanning ---------------------------------------------------------------------------

    def _anchors(self, helped: bool) -> tuple[bytes, ...]:
        own = MAIN_ANCHORS if helped else ANCHORS
        return own + LAUNCH_ANCHORS if self._awaiting_launch else own

    def _helper_hits(self, data: bytes, start: int, end: int) -> tuple[list[int], int | None]:
        """The helper's matches in ``data[start:end]`` (absolute positions in ``data``) and the
        region's newline count; searched here instead if the helper is gone."""
        helper = self._helper
        if helper is not None:
            try:
                hits, newlines, size = helper.answer()
                if size == end - start:
                    return [start + h for h in hits], newlines
            except (EOFError, OSError, ValueError):
                pass
            self._helper = None
            helper.close()
        local = sorted({p for a in HELPER_ANCHORS for p in _all(data, a, start, end)})
        return local, None

    def _region(self, data: bytes, start: int, end: int, at: int | None = None) -> None:
        """Lines ``data[start:end]`` (``end`` just after a newline); ``at`` is the file offset
        of ``data[0]`` when a helper process may search part of it."""
        self._damage.invalid_region(data, start, end, self._lineno + 1)
        self._region_start = start
        helped = self._helper is not None and at is not None
        if helped:
            assert self._helper is not None and at is not None
            try:
                self._helper.ask(at + start, at + end)
            except (OSError, ValueError):
                self._helper.close()
                self._helper = None
                helped = False
        pos = start
        anchors = self._anchors(helped)
        nxt = [data.find(a, pos, end) for a in anchors]
        extra: list[int] = []
        total_nl: int | None = None
        if helped:
            extra, total_nl = self._helper_hits(data, start, end)
        ei = 0
        counted = 0
        while pos < end:
            if self._crash is not None or self._boot_lines > 0:
                nl = data.find(b"\n", pos, end)
                self._lineno += 1
                counted += 1
                self._window_line(data[pos:nl], data, pos)
                self._seen_to = self._lineno
                pos = nl + 1
                continue
            if self._anchors(helped) is not anchors:
                anchors = self._anchors(helped)
                nxt = [data.find(a, pos, end) for a in anchors]
            hit = -1
            for i, p in enumerate(nxt):
                if 0 <= p < pos:
                    p = nxt[i] = data.find(anchors[i], pos, end)
                if p >= 0 and (hit < 0 or p < hit):
                    hit = p
            while ei < len(extra) and extra[ei] < pos:
                ei += 1
            if ei < len(extra) and (hit < 0 or extra[ei] < hit):
                hit = extra[ei]
            if hit < 0:
                if total_nl is not None:
                    self._lineno += total_nl - counted
                else:
                    self._lineno += data.count(b"\n", pos, end)
                return
            ls = max(pos, data.rfind(b"\n", pos, hit) + 1)
            skipped = data.count(b"\n", pos, ls)
            self._lineno += skipped + 1
            counted += skipped + 1
            nl = data.find(b"\n", hit, end)
            self._fast_line(data[ls:nl], data, ls)
            pos = nl + 1

    def _where(self, raw: bytes) -> tuple[LogLine, str, str | None]:
        text, level = clean(raw)
        if not self._long_reported and len(raw) > MAX_LINE_CHARS * 4:
            self._long_line()
        return LogLine(self._name, self._lineno, text), text, level

    def _fast_line(self, raw: bytes, data: bytes, ls: int) -> None:
        where, text, _level = self._where(raw)
        recs = grammar.classify(where, text)
        if not recs:
            if deathlines.opens_with_frame(text):
                self._open_crash(where, data, ls)
                self._crash_feed(where, text)
            return
        self._cur = (data, ls)
        for rec in recs:
            if isinstance(rec, Abort | GpuError | SignalLine):
                self._open_crash(where, data, ls)
                self._crash_feed(where, text)
                return
            self._dispatch(rec)

    def _window_line(self, raw: bytes, data: bytes, ls: int) -> None:
        where, text, level = self._where(raw)
        if "build-id" in text:
            self._build_id(text)
        if self._crash is not None and self._crash_feed(where, text, level):
            return
        recs = grammar.classify(where, text)
        self._cur = (data, ls)
        for rec in recs:
            if isinstance(rec, Abort | GpuError | SignalLine):
                self._open_crash(where, data, ls)
                self._crash_feed(where, text)
                return
            self._dispatch(rec)
        if not recs and self._crash is None and deathlines.opens_with_frame(text):
            self._open_crash(where, data, ls)
            self._crash_feed(where, text)
            return
        if self._boot_lines > 0:
            self._boot_lines += 1
            if self._boot_lines > BOOT_MAX_LINES:
                self._boot_lines = 0

    def _dispatch(self, rec: grammar.Record) -> None:
        if isinstance(rec, ConfigItem):
            if rec.key in ("construct", "n_ctx"):
                # a (re)start: whatever ran before it ended here
                if self._crash is None:
                    before, cut = self._bytes_before(*self._cur)
                    self._read_back(before, rec.where.line - 1, cut)
                self._close_crash()
            started = self.boot.add(rec)
            if started:
                self._awaiting_launch = True
            if rec.key == "ready":
                self._boot_lines = 0
            elif self._boot_lines == 0 and not self.boot.ready:
                self._boot_lines = 1
        elif isinstance(rec, SlotEvent):
            if rec.kind == "launch" and self._awaiting_launch and rec.slot is not None:
                self._awaiting_launch = False
                self.boot.served()
                if len(self.first_requests) >= MAX_CRASHES:
                    return
                self.first_requests.append(FirstRequest(
                    where=rec.where, slot=rec.slot, task=rec.task,
                    boot_index=max(0, len(self.boot.boots) - 1)))
        elif isinstance(rec, StreamEvent):
            self.stream_event_count += 1
            if rec.kind == "config_failure":
                if len(self.config_failures) < MAX_PROBLEMS:
                    self.config_failures.append(rec)
            else:
                self.stream_events.append(rec)
        elif isinstance(rec, FitsLine):
            self.fits.append(rec)

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
            elif (grammar.parse_signal(where, text) is not None
                  or deathlines.opens_with_frame(text)
                  or grammar.parse_terminate(text) is not None
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
            if stack_open and k < PRE_STACK_LINES:
                text, _ = clean(raw)
                if (parse_frame(text) is not None or is_thread_header(text)
                        or grammar.parse_signal(LogLine(self._name, n, text), text) is not None
                        or grammar.parse_terminate(text) is not None
                        or text.lstrip().startswith("what():")
                        or grammar.parse_native_api(text) is not None
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
        found = grammar.parse_build_id(text)
        if found is not None and len(self.build_ids) < MAX_BUILD_IDS:
            self.build_ids[found] = None

    # -- problems ---------------------------------------------------------------------------

    def _long_line(self) -> None:
        if not self._long_reported:
            self._long_reported = True
            self._problem(f"very long line cut to {MAX_LINE_CHARS} characters (first here)",
                          self._lineno + 1)

    def _problem(self, message: str, line: int | None, code: str | None = None) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(source=self._name, message=message, line=line,
                                         code=code))

    def result(self) -> LogScan:
        boots: tuple[BootConfig, ...] = tuple(self.boot.boots_final())
        return LogScan(
            sources=tuple(self.sources), boots=boots, first_requests=tuple(self.first_requests),
            crashes=tuple(self.crashes), stream_events=tuple(self.stream_events),
            stream_event_count=self.stream_event_count, fits=tuple(self.fits),
            config_failures=tuple(self.config_failures),
            slot_events_tail=self.crashes[-1].timeline if self.crashes else (),
            problems=tuple(self.problems), lines=self.lines, bytes=self.bytes,
            replaced=tuple(self.replaced),
            build_ids=tuple(self.build_ids),
        )


def _lines_holding(data: bytes, starts: list[int], needles: tuple[bytes, ...]) -> list[int]:
    """Indexes of the lines (``starts``: their offsets in ``data``, then the end) that hold
    any of ``needles``, in order."""
    found: set[int] = set()
    lo, hi = starts[0], starts[-1]
    for needle in needles:
        for p in _all(data, needle, lo, hi):
            found.add(bisect_right(starts, p) - 1)
    return sorted(found)


def _all(data: bytes, needle: bytes, start: int, end: int) -> Iterator[int]:
    p = data.find(needle, start, end)
    while p >= 0:
        yield p
        p = data.find(needle, p + 1, end)


def spare_core() -> bool:
    """Whether a core is idle enough for a helper: on a busy machine two processes contending
    for the cores scan slower than one."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cpus >= 2
    return cpus >= 2 and load < cpus - 0.5


def _start_helper(name: str, stream: BinaryIO) -> ScanHelper | None:
    """A helper process for a large regular file read from its start, when a core is free."""
    if isinstance(stream, gzip.GzipFile) or not spare_core():
        return None
    try:
        if stream.tell() != 0 or not os.path.isfile(name):
            return None
        if os.fstat(stream.fileno()).st_size < PARALLEL_MIN_BYTES:
            return None
        return ScanHelper(name, HELPER_ANCHORS)
    except (OSError, ValueError, AttributeError):
        return None


def scan(sources: Iterable[tuple[str, BinaryIO]]) -> LogScan:
    """Parse every ``(name, stream)`` in order into one ``LogScan``."""
    parser = LogParser()
    for name, stream in sources:
        parser.feed(name, stream)
    return parser.result()
