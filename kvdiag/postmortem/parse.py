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
from collections import deque
from collections.abc import Callable, Iterable
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
from kvdiag.postmortem.bootfold import BootAccumulator
from kvdiag.postmortem.crashblock import CrashBlock
from kvdiag.postmortem.crashwindow import (
    KEEP_FITS,
    LOOKBACK_BYTES,
    MAX_CRASHES,
    CrashWindows,
    positions,
)
from kvdiag.postmortem.lines import MAX_LINE_CHARS, clean_cut
from kvdiag.postmortem.scanhelper import ScanHelper

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
BOOT_CAPITALS: tuple[bytes, ...] = (grammar.KV_STREAM_CAPITALS, b"KV stream")
"""kv-stream's words in capitals, which boot lines hold and no other anchor does: the port's
``LLAMA_KV_STREAM_ALLOW_MULTISEQ`` warning (the grammar's ``_MULTISEQ``; its text is not public,
domain brief §9, so it may name only the variable) and its ``KV streaming device filter = CUDA0
(n layers)`` line (§5.1, printed without a public prefix). The boot window reads them where it
is open; it closes ``BOOT_MAX_LINES`` lines after the boot's last configuration line (debug
output in between), and then only these anchors find them. They are printed before the first
request, so they are searched only while a boot waits for it: searched in every block they cost
~16 % of the scan (benchmarks/results/bench_logscan.txt, 2026-12-02). ``TREAM`` is also
``GGML_CUDA_KV_STREAM_*`` and ``KV-STREAM``."""
#: Extra anchors while a boot still waits for its first request.
LAUNCH_ANCHORS: tuple[bytes, ...] = (b"processing task", *serverlog.ANCHORS,
                                     b"is processing [task", *BOOT_CAPITALS)
"""``launch_slot_`` (2024-), the 2024 ``server_log`` form (text or JSON, either key spelling),
2023's ``slot N is processing [task id: N]``: a request launched, so the boot was ready; and
:data:`BOOT_CAPITALS`."""

BLOCK = 8 << 20
BOOT_MAX_LINES = 5000
MAX_PROBLEMS = 100
MAX_RAW_LINE = 1 << 20
#: Bytes kept of the end of a line longer than ``MAX_RAW_LINE`` (``lines.clean`` reads its
#: first and last characters).
LONG_LINE_END = MAX_LINE_CHARS * 2
KEEP_STREAM = 200


class LogParser(CrashWindows):
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
        self._crash_end = 0
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
        # of a line past MAX_RAW_LINE: its last bytes, where a death's text ends it (lines.clean)
        end_of_long = b""
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
                    end_of_long = (end_of_long + data)[-LONG_LINE_END:]
                    continue
                carry += data
                if len(carry) > MAX_RAW_LINE:
                    self._long_line()
                    skipping = True
                    end_of_long = carry[-LONG_LINE_END:]
                    carry = carry[:MAX_RAW_LINE]
                continue
            if carry or skipping:
                head = (carry + data[:first_nl] if not skipping else
                        carry + (end_of_long + data[:first_nl])[-LONG_LINE_END:]) + b"\n"
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
                end_of_long = tail[-LONG_LINE_END:]
                tail = tail[:MAX_RAW_LINE]
            carry = tail
        if carry:
            self._problem("last line has no line end (truncated log?)", self._lineno + 1)
            last = (carry + end_of_long if skipping else carry) + b"\n"
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
        local = sorted({p for a in HELPER_ANCHORS for p in positions(data, a, start, end)})
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
        text, level, cut = clean_cut(raw)
        if cut and not self._long_reported:
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

    # -- problems ---------------------------------------------------------------------------

    def _long_line(self) -> None:
        if not self._long_reported:
            self._long_reported = True
            self._problem(f"very long line: only its first and last {MAX_LINE_CHARS // 2} "
                          "characters are read (first here)", self._lineno + 1)

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
