"""The usual request read in bulk for ``kvdiag perf``: runs of a ``new prompt`` match followed
by its request's older-shape ``print_timing`` match, made into records a block at a time.

A log holds millions of requests, and most print the same two matches of
:data:`~kvdiag.postmortem.timinglines.SLOT_LINES` one after the other: the ``new prompt`` line
with the cache line after it, then the ``print_timing`` block with the release after it (the
shape of bench_logscan's log, and of a server with one request in flight at a time). Read one
match at a time (:meth:`~kvdiag.postmortem.perfscan.PerfScanner._walk`) each costs microseconds of
Python: groups, line count, the pending request, figures, the record. Here a block's matches are
classified by their last group (``lastindex``: which alternative matched, and whether the next
line was read with it), the runs of such pairs are found by one search over those classes, and a
run's numbers are decoded at once (one msgspec decode of all its groups, into typed tuples: the
same conversion the per-match path makes), its line numbers counted between consecutive matches
and its records made by one ``map`` — the interpreter runs no bytecode per request.

A pair is read here only where the per-match path would make exactly the same record from it:
the two matches of one slot and task (a task ``>= 0``), no request in flight on that slot (the
per-match path would close it first), no rare-anchor line between them (its note would be the
request's), both figure sets decoded as JSON with non-zero counts (``nan``/``inf`` and empty
sets take the per-match path's conversions), a truncation flag printed. Everything else — other
shapes, interleaved slots, the 2024 and late-2023 forms, unfinished requests — goes through the
per-match path, in log order with the runs.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate, chain, islice, repeat
from operator import attrgetter, itemgetter
from typing import Any, Protocol

import msgspec

from kvdiag.model.perf import RequestTiming
from kvdiag.postmortem.perfpending import Pending
from kvdiag.postmortem.timinglines import BLOCK, NEW_PROMPT, SLOT_LINES


class PerfScanner(Protocol):
    """What this module uses of :class:`kvdiag.postmortem.perfscan.PerfScanner` (which imports
    this module, so it is named here by its shape)."""

    source: str
    requests: list[RequestTiming]
    _pending: dict[int, Pending]
    _opened: set[int]
    _served: bool
    _boot_index: int
    _walk_end: int

    def _walk(self, buf: bytes, matches: Iterable[re.Match[bytes]], rare: list[int], ri: int,
              lines: int, counted: int) -> tuple[int, int, int]: ...

    def _rare_before(self, buf: bytes, rare: list[int], ri: int, pos: int, lines: int,
                     counted: int) -> tuple[int, int, int]: ...


_NEW = NEW_PROMPT + 2
"""``lastindex`` of a ``new prompt`` match that read the cache line after it."""
_BLOCK = BLOCK + 9
"""``lastindex`` of an older-shape block match that read its release, with ``truncated``."""
_RUNS = re.compile(b"(?:" + re.escape(bytes((_NEW, _BLOCK))) + b")+")
_LAST = attrgetter("lastindex")
_START = re.Match.start
_NEW_GROUPS = itemgetter(1, 2, NEW_PROMPT, NEW_PROMPT + 1, NEW_PROMPT + 2)
"""slot, task, n_ctx_slot, the prompt's tokens, what the cache kept."""
_BLOCK_GROUPS = itemgetter(1, 2, *range(BLOCK, BLOCK + 10))
"""slot, task, prompt and decode figures (ms, tokens, ms per token, tokens per second), the
release's tokens and truncated flag."""
_NEWS = msgspec.json.Decoder(list[tuple[int, int, int, int, int]])
_BLOCKS = msgspec.json.Decoder(
    list[tuple[int, int, float, int, float, float, float, int, float, float, int, int]])
CHUNK = 64
"""Matches taken from the pattern's pass at a time (:func:`walk`)."""
MIN_RUN = 2
"""Fewer pairs than this in a row are read one match at a time (the bulk steps' fixed cost)."""


def _decode(decoder: msgspec.json.Decoder[Any], rows: Iterable[tuple[bytes, ...]]
            ) -> list[Any] | None:
    """The rows' numbers in one decode: each row's printed numbers are a JSON array's items.
    None when one is not JSON (``nan``, a missing group)."""
    try:
        rows_json: list[Any] = decoder.decode(
            b"[[" + b"],[".join(map(b",".join, rows)) + b"]]")
        return rows_json
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return None


def walk(s: PerfScanner, buf: bytes, start: int, end: int, rare: list[int], ri: int,
         lines: int, counted: int) -> tuple[int, int, int]:
    """What ``s._walk`` does over the slot lines of ``buf[start:end]``, the runs of pairs in
    bulk; returns the line count up to ``counted``, ``counted`` and the next rare index."""
    matches = SLOT_LINES.finditer(buf, start, end)
    ms: list[re.Match[bytes]] = []
    while True:
        # a few dozen matches at a time: a match holds its 29 groups' marks (~580 bytes, past
        # pymalloc's small objects), and a block's thousand of them alive at once cost more to
        # allocate than the whole pass saves (measured: the pattern's pass 1.0-1.2 s per 256 MiB
        # listed whole, 0.8 s in chunks of 32-64, as one match at a time)
        got = list(islice(matches, CHUNK))
        ms += got
        if not ms:
            return lines, counted, ri
        carry = len(got) == CHUNK and ms[-1].lastindex == _NEW  # its pair is in the next chunk
        if carry:
            last = ms.pop()
        if ms:
            lines, counted, ri = _chunk(s, buf, ms, rare, ri, lines, counted)
            s._walk_end = ms[-1].end()  # where the late-2023 form may follow (perfscan._region)
        if carry:
            ms = [last]
        elif len(got) < CHUNK:
            return lines, counted, ri
        else:
            ms = []


def _chunk(s: PerfScanner, buf: bytes, ms: list[re.Match[bytes]], rare: list[int], ri: int,
           lines: int, counted: int) -> tuple[int, int, int]:
    """:func:`walk` over the matches ``ms``."""
    try:
        kinds = bytes(map(_LAST, ms))
    except (TypeError, ValueError):  # no group matched (not a shape of the pattern today)
        return s._walk(buf, ms, rare, ri, lines, counted)
    starts: list[int] = list(map(_START, ms))
    done = 0
    for run in _RUNS.finditer(kinds):
        a, b = run.span()
        if b - a < 2 * MIN_RUN:
            continue
        if done < a:
            lines, counted, ri = s._walk(buf, ms[done:a], rare, ri, lines, counted)
        # a rare-anchor line inside the run is read in its place: between two pairs as the
        # per-match path reads it, and a pair it falls into goes that path (the line's note is
        # the request's)
        while a < b:
            if ri < len(rare) and rare[ri] < starts[a]:
                lines, counted, ri = s._rare_before(buf, rare, ri, starts[a], lines, counted)
            k, inside = b, 0
            if ri < len(rare) and rare[ri] < starts[b - 1]:
                k = bisect_right(starts, rare[ri], a, b)  # the first match after it
                inside = (k - a) % 2  # after a new prompt: in its pair
                k -= inside
            if k > a:
                lines, counted = _pairs(s, buf, ms, starts, a, k, rare, ri, lines, counted)
                a = k
            if inside:
                lines, counted, ri = s._walk(buf, ms[a:a + 2], rare, ri, lines, counted)
                a += 2
        done = b
    if done < len(ms):
        lines, counted, ri = s._walk(buf, ms[done:], rare, ri, lines, counted)
    return lines, counted, ri


def _pairs(s: PerfScanner, buf: bytes, ms: list[re.Match[bytes]], starts: list[int], a: int,
           b: int, rare: list[int], ri: int, lines: int, counted: int) -> tuple[int, int]:
    """The pairs ``ms[a:b]`` (no rare-anchor line before ``ms[b - 1]`` but those already read):
    the records of those that qualify (the module's docstring) in bulk, the others one match
    at a time, in order. Returns the line count up to ``counted`` and ``counted``."""
    news = _decode(_NEWS, map(_NEW_GROUPS, ms[a:b:2]))
    blocks = _decode(_BLOCKS, map(_BLOCK_GROUPS, ms[a + 1:b:2]))
    if news is None or blocks is None:
        lines, counted, _ri = s._walk(buf, ms[a:b], rare, ri, lines, counted)
        return lines, counted
    slot, task, n_ctx, depth, cached = zip(*news, strict=True)
    (b_slot, b_task, p_ms, p_n, _p_mspt, p_tps, d_ms, d_n, d_mspt, d_tps, stop,
     trunc) = zip(*blocks, strict=True)
    if (slot != b_slot or task != b_task or min(task) < 0 or 0 in p_n or 0 in d_n):
        bad = [i for i in range(len(slot)) if slot[i] != b_slot[i] or task[i] != b_task[i]
               or task[i] < 0 or not p_n[i] or not d_n[i]]
    else:
        bad = []
    pending = s._pending
    i = 0
    n = len(slot)
    for j in chain(bad, (n,)):
        while i < j:
            # a request in flight on a pair's slot is closed by that pair's new prompt: the
            # per-match path reads it
            k = j
            if pending and not pending.keys().isdisjoint(slot[i:j]):
                k = next(x for x in range(i, j) if slot[x] in pending)
            if k > i:
                p0 = a + 2 * i
                at = starts[p0:a + 2 * k]
                acc = list(accumulate(map(buf.count, repeat(b"\n"), chain((counted,), at), at),
                                      initial=lines + 1))
                s.requests.extend(map(
                    RequestTiming, repeat(s.source), acc[2::2], repeat(s._boot_index),
                    slot[i:k], task[i:k], p_n[i:k], p_ms[i:k], p_tps[i:k], d_n[i:k], d_ms[i:k],
                    d_tps[i:k], d_mspt[i:k], depth[i:k], stop[i:k], cached[i:k], n_ctx[i:k],
                    map((1).__eq__, trunc[i:k]), repeat(None), acc[1::2], repeat(())))
                s._opened.update(slot[i:k])
                s._served = True
                lines, counted = acc[-1] - 1, at[-1]
            if k < j:
                lines, counted, _ri = s._walk(buf, ms[a + 2 * k:a + 2 * k + 2], rare, ri,
                                              lines, counted)
                k += 1
            i = k
        if j < n:
            lines, counted, _ri = s._walk(buf, ms[a + 2 * j:a + 2 * j + 2], rare, ri, lines,
                                          counted)
            i = j + 1
    return lines, counted
