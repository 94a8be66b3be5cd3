"""A log's requests, read for ``kvdiag perf``: each completed request's depth and timing, and
the kv-stream lines logged around it (:class:`~kvdiag.model.perf.PerfRun`).

The log is read in blocks (bytes in, one bounded state out, like the post-mortem scanner
:mod:`kvdiag.postmortem.parse`). Slot lines are recognised on the raw bytes by one pattern
(:mod:`kvdiag.postmortem.timinglines`; the 2024 form's pairs in :mod:`kvdiag.postmortem.perfkv`);
the few other lines that matter — boot configuration, ``kv_stream_adapt`` partition and trace
lines, fallback warnings, ``fits=false`` — are found by substring, cleaned with
:func:`kvdiag.postmortem.lines.clean` and parsed with the post-mortem grammar
(:mod:`kvdiag.postmortem.perfnotes`). Where the pattern can match and where the substrings are
is found in one C pass over each block (:mod:`kvdiag.postmortem.perfbytes`); without it, by
the pattern's and the substrings' own searches, on a large regular file and an idle second core
the substrings' in a helper process (:mod:`kvdiag.postmortem.scanhelper`), as the post-mortem
scan does. Opening and driving the scanner is :mod:`kvdiag.postmortem.perfread`.

How a request is assembled, per slot (brief §7.3): ``new prompt`` opens it (depth at start,
slot size), the cache line says what was kept, ``print_timing`` gives the prompt and decode
figures (and ``graphs reused``), ``stop processing`` closes it (depth at end, truncated); the
servers of late 2024 released first and printed the timing after (``slot.release();
slot.print_timings();`` in ``update_slots``), so a release read before the timing waits for it. A
request opened and never given its timing — the process died, the request failed, the log
ends — is counted as unfinished. A kv-stream line belongs to every request in flight on any
slot when it is logged (the runtime is shared by the slots). A new boot ends what was in flight.
"""

from __future__ import annotations

import heapq
import os
import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import chain

import msgspec

from kvdiag.model.logrecords import (
    BootConfig,
    ConfigItem,
    Problem,
)
from kvdiag.model.perf import AdaptPages, PerfRun, RequestTiming, StreamNote
from kvdiag.postmortem import perfbytes, perfkv, perfpairs
from kvdiag.postmortem.bootfold import BootAccumulator
from kvdiag.postmortem.perflate import LateForm
from kvdiag.postmortem.perfnotes import OtherLines
from kvdiag.postmortem.perfpending import Orphan
from kvdiag.postmortem.perfpending import Pending as _Pending
from kvdiag.postmortem.scanhelper import ScanHelper
from kvdiag.postmortem.timinglines import (
    BLOCK,
    CACHED,
    GRAPHS,
    KV,
    LATE_LINES,
    NEW_PROMPT,
    OLD_HEADER,
    RARE_ANCHORS,
    SLOT_LINES,
    STOP,
    TIMING,
    figure_sets,
    late_in,
    two_sets,
)

BLOCK_BYTES = 1 << 20
"""Bytes read at a time. Each block is passed over several times (the compiled pass or the
slot-line pattern and each rare anchor, the matches, the line count): a block the size of a
core's L2 cache stays there between the passes (1 MiB read the 256 MiB bench_perf log ~10 %
faster than 8 MiB, measured before the compiled pass)."""
MAX_RAW_LINE = 1 << 20
_RARE = [re.compile(re.escape(a)) for a in RARE_ANCHORS]


class PerfScanner(OtherLines):
    """Feed one log's bytes in order (``feed``), then ``finish`` gives the run."""

    pairs = True
    """Read the usual request's two matches in bulk (:mod:`kvdiag.postmortem.perfpairs`);
    False reads every match one at a time (the same records: tests compare the two)."""
    compiled = True
    """Find where the patterns can match in C where the helper is built
    (:mod:`kvdiag.postmortem.perfbytes`); False searches with the patterns alone (the same
    records: tests compare the two)."""

    def __init__(self, name: str, source: str | None = None, *,
                 continuation: bool = False) -> None:
        self.name = name
        self.source = source or name
        self.continuation = continuation
        """Reading from the middle of a log: requests in flight on a slot before its first
        ``new prompt`` here are :class:`Orphan` records, and the first boot lines continue the
        boot before (unless they start a new one)."""
        self.orphans: list[Orphan] = []
        self.carried_config: list[ConfigItem] = []
        """Boot lines that continue the boot before this part (continuation)."""
        self.boot_notes: int | None = None
        """Notes logged before this part's first new boot (continuation)."""
        self.first_active_line: int | None = None
        """The line of the first kv_stream_adapt trace line of the boot before (continuation):
        notes up to it take their depth from the part before."""
        self.extra_boots: list[BootConfig] = []
        """Boots read by another scanner of a later part (:mod:`perfsplit`)."""
        self._opened: set[int] = set()
        self.requests: list[RequestTiming] = []
        self.notes: list[StreamNote] = []
        self.notes_dropped = 0
        self.adapt = AdaptPages()
        self.boot = BootAccumulator()
        self.problems: list[Problem] = []
        self.unfinished = 0
        self._pending: dict[int, _Pending] = {}
        self._boot_index = 0
        self._served = False
        self._last_active: int | None = None
        self._carry = b""
        self._skipping = False
        self._lines = 0
        self._helper: ScanHelper | None = None
        self._at = 0
        """File offset of the first byte of the next buffer (the carry's start)."""
        self._walk_end = 0
        self.late = LateForm()
        """The late-2023 form's lines (:mod:`kvdiag.postmortem.perflate`)."""

    # -- reading ---------------------------------------------------------------------------

    def use_helper(self, helper: ScanHelper | None) -> None:
        """Search the rare anchors in ``helper`` (started on this file, read from offset 0)."""
        self._helper = helper

    def feed(self, data: bytes) -> None:
        if self._skipping:
            # the rest of a line too long to keep: dropped up to its end
            nl = data.find(b"\n")
            if nl < 0:
                self._at += len(data)
                return
            self._at += nl + 1
            self._lines += 1
            self._skipping = False
            data = data[nl + 1:]
        if not data:
            return
        buf, start = data, 0
        if self._carry:
            buf, start = self._head(data)
        end = buf.rfind(b"\n") + 1
        cut = self._cut(buf, end, start) if end > start else start
        if cut > start:
            self._region(buf, start, cut, self._at)
            self._at += cut - start
        self._carry = buf[cut:]
        if len(self._carry) > MAX_RAW_LINE:
            self._problem(f"a line longer than {MAX_RAW_LINE} bytes after line {self._lines} "
                          "was skipped", self._lines + 1)
            self._at += len(self._carry)
            self._carry = b""
            self._skipping = True

    def _head(self, data: bytes) -> tuple[bytes, int]:
        """Read the carried bytes with the first lines of ``data`` in a small buffer of their
        own; returns the buffer the rest is read from and where in it the rest begins: ``data``
        itself, not a copy of it with the carry in front (a new block-sized buffer each time:
        ~7 % of reading a log, measured). The head holds four lines of ``data``, so an older
        block's header it holds back (:meth:`_cut`) lies in ``data``."""
        k = -1
        for _ in range(4):
            k = data.find(b"\n", k + 1)
            if k < 0:
                return self._carry + data, 0
        head = self._carry + data[:k + 1]
        cut = self._cut(head, len(head))
        if cut:
            self._region(head, 0, cut, self._at)
            self._at += cut
        return data, cut - len(self._carry)

    @staticmethod
    def _cut(buf: bytes, end: int, floor: int = 0) -> int:
        """Where this buffer's work (from ``floor``) ends: after its last complete line, unless
        an older-shape ``print_timing`` header sits in the last three lines — its figures come
        on the next lines, so it waits for the next buffer."""
        start = end
        for _ in range(3):
            start = buf.rfind(b"\n", floor, start - 1) + 1
            if start <= floor:
                start = floor
                break
        m = OLD_HEADER.search(buf, start, end)
        return end if m is None else max(floor, buf.rfind(b"\n", floor, m.start()) + 1)

    def drain(self) -> None:
        """Read what ``feed`` held back when the input ends on a line end (a part of a log
        cut at a line boundary)."""
        if self._carry.endswith(b"\n"):
            carry, self._carry = self._carry, b""
            self._region(carry, 0, len(carry), self._at)
            self._at += len(carry)

    def snapshot(self) -> PerfRun:
        """The run so far, of a log still growing (``kvdiag tui --follow``'s Perf screen): the
        requests completed, the boots and partition seen; requests in flight stay in flight
        and nothing is closed, so feeding goes on."""
        return PerfRun(
            name=os.path.basename(self.name) or self.name, source=self.source, kind="log",
            requests=tuple(self.requests), notes=tuple(self.notes),
            notes_dropped=self.notes_dropped, adapt=self.adapt.result(),
            boots=(*self.boot.boots_final(), *self.extra_boots), unfinished=self.unfinished,
            lines=self._lines, problems=tuple(self.problems))

    def finish(self) -> PerfRun:
        self.drain()
        if self._carry:
            self._problem("last line has no line end (truncated log?); not read",
                          self._lines + 1)
            self._carry = b""
        self._end_boot("end")
        if self.late.unpaired:
            self._problem(
                f"{self.late.unpaired} late-2023 print_timings block(s) could not be paired "
                "with their slot's release line (a release run of another length, several "
                "blocks one of which decoded nothing, or no release before a boot or the end): "
                "read without slot or depth", None)
        return self.snapshot()

    # -- one buffer ------------------------------------------------------------------------

    def _rare_hits(self, buf: bytes, start: int, cut: int, at: int) -> list[int]:
        helper = self._helper
        if helper is not None and cut > start:
            try:
                helper.ask(at, at + cut - start)
                hits, _newlines, size = helper.answer()
                if size == cut - start:
                    return [h + start for h in hits] if start else hits
            except (EOFError, OSError, ValueError):
                pass
            self._helper = None
            helper.close()
        hits = []
        for rx in _RARE:
            hits.extend(m.start() for m in rx.finditer(buf, start, cut))
        hits.sort()
        return hits

    def _region(self, buf: bytes, start: int, cut: int, at: int) -> None:
        """Read the lines of ``buf[start:cut]`` (``at``: the file offset of ``buf[start]``)."""
        c = perfbytes.module() if self.compiled else None
        matches: Iterator[re.Match[bytes]]
        starts: memoryview | None = None
        if c is not None:  # where the patterns can match, found in C
            starts, rare = perfbytes.scan(c, buf, start, cut)
            matches = perfbytes.matches(buf, starts, cut)
        else:
            rare = self._rare_hits(buf, start, cut, at)
            matches = SLOT_LINES.finditer(buf, start, cut)
        late = self.late
        if late.seen:
            lines, counted, ri = self._walk_late(buf, start, cut, rare, 0, self._lines, start)
        else:
            # the late-2023 form only where the later forms' slot lines are not (a log appended
            # across an upgrade changes form once): before the first and after the last
            first = next(matches, None)
            if late_in(buf, start, cut if first is None else first.start()):
                late.seen = True
                lines, counted, ri = self._walk_late(buf, start, cut, rare, 0, self._lines,
                                                     start)
            else:
                lines, counted, ri, tail = self._lines, start, 0, start
                if first is not None:
                    matches = chain((first,), matches)
                    if self.pairs and starts is not None:
                        lines, counted, ri = perfpairs.walk_compiled(
                            self, buf, starts, cut, bisect_left(starts, first.start()), rare, 0,
                            lines, start)
                    elif self.pairs:
                        lines, counted, ri = perfpairs.walk(self, buf, matches, rare, 0, lines,
                                                            start)
                    else:
                        lines, counted, ri = self._walk(buf, matches, rare, 0, lines, start)
                    tail = self._walk_end
                if first is not None and late_in(buf, tail, cut):
                    late.seen = True
                    lines, counted, ri = self._walk_late(buf, tail, cut, rare, ri, lines,
                                                         counted)
        if ri < len(rare):
            lines, counted, ri = self._rare_before(buf, rare, ri, cut, lines, counted)
        self._lines = lines + buf.count(b"\n", counted, cut)

    def _walk(self, buf: bytes, matches: Iterable[re.Match[bytes]], rare: list[int], ri: int,
              lines: int, counted: int) -> tuple[int, int, int]:
        """Read the slot lines ``matches`` of ``buf`` one by one and the rare-anchor lines
        before each, in order; returns the line count up to ``counted``, ``counted`` and the
        next rare index (and leaves the end of the last match in ``_walk_end``)."""
        n_rare = len(rare)
        count = buf.count
        pending = self._pending
        requests = self.requests
        source = self.source
        m = None
        for m in matches:
            pos = m.start()
            if ri < n_rare and rare[ri] < pos:
                lines, counted, ri = self._rare_before(buf, rare, ri, pos, lines, counted)
            g = m.groups()
            last: int = m.lastindex or 0
            if last == KV:  # the 2024 key=value form
                lines += count(b"\n", counted, pos)
                counted = pos
                ls = buf.rfind(b"\n", 0, pos) + 1
                self._kv(int(g[KV - 1]), buf[ls:m.end()], pos - ls, lines + 1)
                continue
            slot = int(g[0])
            if last < CACHED:  # new prompt (and the cache line right after it)
                old = pending.pop(slot, None)
                if old is not None:
                    self._close(slot, old, None, None, "next")
                self._opened.add(slot)
                lines += count(b"\n", counted, pos)
                counted = pos
                task = int(g[1])
                kept = g[NEW_PROMPT + 1]
                pending[slot] = _Pending(task if task >= 0 else None, lines + 1,
                                         int(g[NEW_PROMPT]), int(g[NEW_PROMPT - 1]),
                                         None if kept is None else int(kept))
                self._served = True
                continue
            p = pending.get(slot)
            if p is None or (p.task is not None and g[1] != b"-1" and p.task != int(g[1])):
                p = self._request(slot, int(g[1]))
            stop: bytes | None = None
            trunc: bytes | None = None
            if last >= BLOCK:
                lines += count(b"\n", counted, pos)
                counted = pos
                stop, trunc = g[BLOCK + 7], g[BLOCK + 8]
                if stop is not None and not p.orphan:
                    # the usual whole request, made here: what _close makes of it, without
                    # the steps between (a log holds millions)
                    try:
                        p_ms, p_n, _p_mspt, p_tps, d_ms, d_n, d_mspt, d_tps = two_sets(
                            b"[" + b",".join(g[BLOCK - 1:BLOCK + 7]) + b"]")
                    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
                        p_n = d_n = 0
                    if p_n and d_n:
                        del pending[slot]
                        requests.append(RequestTiming(
                            source, lines + 1, self._boot_index, slot, p.task, p_n, p_ms, p_tps,
                            d_n, d_ms, d_tps, d_mspt, p.depth_start, int(stop), p.cached,
                            p.n_ctx_slot, None if trunc is None else trunc == b"1", p.graphs,
                            p.started, tuple(p.notes)))
                        continue
                p.prompt, p.decode = figure_sets(g, BLOCK - 1, 2)
                p.line = lines + 1
            elif last >= STOP:
                stop, trunc = g[STOP - 1], g[STOP]
            elif last == GRAPHS:
                p.graphs = int(g[GRAPHS - 1])
            elif last >= TIMING:
                lines += count(b"\n", counted, pos)
                counted = pos
                if g[TIMING - 1] == b"val":  # "eval": its group begins after the [pe]
                    p.decode = figure_sets(g, TIMING, 1)[0]
                    p.line = lines + 1
                else:
                    p.prompt = figure_sets(g, TIMING, 1)[0]
                if g[TIMING + 4] is not None:
                    p.graphs = int(g[TIMING + 4])
                stop, trunc = g[TIMING + 5], g[TIMING + 6]
            else:
                kept = g[CACHED - 1] if g[CACHED - 1] is not None else g[CACHED]
                p.cached = int(kept or 0)
            if stop is not None:
                if p.decode is None and p.prompt is None and p.graphs is None:
                    # released before any of its timing (late 2024): the block follows, or
                    # never comes (a cancelled request: unfinished when the slot's next one
                    # opens)
                    p.stopped = (int(stop), None if trunc is None else trunc == b"1")
                    p.stopped_notes = len(self.notes)
                    continue
                del pending[slot]
                self._close(slot, p, int(stop), None if trunc is None else trunc == b"1", "stop")
            elif p.stopped is not None and p.decode is not None:
                del pending[slot]
                self._close(slot, p, *p.stopped, "stop")
        if m is not None:
            self._walk_end = m.end()
        return lines, counted, ri

    def _walk_late(self, buf: bytes, start: int, end: int, rare: list[int], ri: int,
                   lines: int, counted: int) -> tuple[int, int, int]:
        """:meth:`_walk` over ``buf[start:end]`` where the late-2023 form's lines are: those
        and the later forms' slot lines, in order."""
        late = self.late
        for m in heapq.merge(LATE_LINES.finditer(buf, start, end),
                             SLOT_LINES.finditer(buf, start, end), key=_start):
            if m.re is not LATE_LINES:
                lines, counted, ri = self._walk(buf, (m,), rare, ri, lines, counted)
                continue
            pos = m.start()
            if ri < len(rare) and rare[ri] < pos:
                lines, counted, ri = self._rare_before(buf, rare, ri, pos, lines, counted)
            lines += buf.count(b"\n", counted, pos)
            counted = pos
            self._lines = lines
            late.line(self, m, lines + 1)
        return lines, counted, ri

    def _kv(self, slot: int, text: bytes, at: int, line: int) -> None:
        """A line of the 2024 form (:mod:`kvdiag.postmortem.timinglines`): its pairs after the
        message's `` | `` (text) or all of them (JSON), by name."""
        pairs = perfkv.pairs(text, at)
        task = perfkv.task(pairs)
        if b"t_total" in pairs or task < 0:
            return
        p = self._kv_request(slot, task, line)  # any line of the task: its first opens it
        if b"t_token_generation" in pairs and b"n_decoded" in pairs:
            p.decode = perfkv.figures(pairs, b"t_token_generation", b"n_decoded")
            p.line = line
        elif b"t_prompt_processing" in pairs and b"n_prompt_tokens_processed" in pairs:
            p.prompt = perfkv.figures(pairs, b"t_prompt_processing",
                                      b"n_prompt_tokens_processed")
        elif b"p0" in pairs:
            p.cached = perfkv.integer(pairs[b"p0"])
        elif b"n_past" in pairs and b"truncated" in pairs:
            del self._pending[slot]
            self._close(slot, p, perfkv.integer(pairs[b"n_past"]),
                        pairs[b"truncated"] == b"true", "stop")

    def _kv_request(self, slot: int, task: int, line: int) -> _Pending:
        """The request of ``task`` on ``slot``: the 2024 form prints no ``new prompt`` at the
        default verbosity, so a task's first line opens it."""
        p = self._request(slot, task)
        if p.started is None:
            p.started = line
        self._opened.add(slot)
        return p

    def _rare_before(self, buf: bytes, rare: list[int], ri: int, pos: int, lines: int,
                     counted: int) -> tuple[int, int, int]:
        """Read the rare-anchor lines that start before ``pos``; returns the new line count,
        counted position and index."""
        while ri < len(rare) and rare[ri] < pos:
            ls = buf.rfind(b"\n", 0, rare[ri]) + 1
            le = buf.find(b"\n", rare[ri])
            lines += buf.count(b"\n", counted, ls)
            counted = ls
            self._lines = lines
            self._rare(buf[ls:le], lines + 1)
            while ri < len(rare) and rare[ri] < le:
                ri += 1
        return lines, counted, ri

    # -- requests --------------------------------------------------------------------------

    def _request(self, slot: int, task: int) -> _Pending:
        """The request in flight on ``slot`` for ``task``; a different task there ends the one
        that was (a log that began mid-request opens one here)."""
        t = task if task >= 0 else None
        p = self._pending.get(slot)
        if p is None or (t is not None and p.task is not None and p.task != t):
            if p is not None:
                self._close(slot, p, None, None, "next")
            orphan = self.continuation and slot not in self._opened
            p = self._pending[slot] = _Pending(t, orphan=orphan)
            self._served = True
        return p

    def _close(self, slot: int | None, p: _Pending, depth_end: int | None,
               truncated: bool | None, ended: str = "end") -> None:
        notes_until: int | None = None if ended == "end" else len(self.notes)
        if p.stopped is not None:  # it ended at its release, read before its timing
            if depth_end is None:
                depth_end, truncated = p.stopped
            ended, notes_until = "stop", p.stopped_notes
        if p.orphan and slot is not None:
            self.orphans.append(Orphan(
                slot=slot, task=p.task, cached=p.cached, prompt=p.prompt, decode=p.decode,
                line=p.line, graphs=p.graphs, ended=ended, depth_end=depth_end,
                truncated=truncated, notes_until=notes_until,
                started=p.started, notes=tuple(p.notes)))
            return
        if p.decode is None:
            self.unfinished += 1
            return
        d_ms, d_n, d_mspt, d_tps = p.decode
        if d_tps is None and d_ms and d_n:
            d_tps = d_n * 1000.0 / d_ms
        p_ms, p_n, _p_mspt, p_tps = p.prompt if p.prompt is not None else (None, None, None,
                                                                              None)
        if p_tps is None and p_ms and p_n:
            p_tps = p_n * 1000.0 / p_ms
        # positional, in the fields' order: a third of the keyword call's cost, per request
        self.requests.append(RequestTiming(
            self.source, p.line, self._boot_index, slot, p.task, p_n, p_ms, p_tps, d_n, d_ms,
            d_tps, d_mspt, p.depth_start, depth_end, p.cached, p.n_ctx_slot, truncated,
            p.graphs, p.started, tuple(p.notes)))

    def _end_boot(self, ended: str = "boot") -> None:
        self.late.flush(self)
        for slot, p in sorted(self._pending.items()):
            self._close(slot, p, None, None, ended)
        self._pending.clear()
        self._opened.clear()


def _start(m: re.Match[bytes]) -> int:
    return m.start()
