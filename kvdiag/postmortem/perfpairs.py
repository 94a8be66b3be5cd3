"""The usual request read in bulk for ``kvdiag perf``: runs of requests that print the usual
matches one after the other, made into records a few dozen matches at a time.

A log holds millions of requests, and most print the same matches of
:data:`~kvdiag.postmortem.timinglines.SLOT_LINES` one after the other (a server with one request
in flight at a time, or slots that take turns): the ``new prompt`` line with the cache line
after it, then either the older-shape ``print_timing`` block with the release after it (a pair:
the shape of bench_logscan's log) or the newer shape's ``prompt eval time`` line and its ``eval
time`` line with ``total time``, ``graphs reused`` and the release after it (a triple). Read one
match at a time (:meth:`~kvdiag.postmortem.perfscan.PerfScanner._walk`) each costs microseconds
of Python: groups, line count, the pending request, figures, the record. Here the matches are
classified by their last group (``lastindex``: which alternative matched, and whether the next
lines were read with it), the runs of such requests are found by one search over those classes,
and a run's numbers are decoded at once (one msgspec decode per kind of match, into typed
tuples: the same conversion the per-match path makes), its line numbers counted between
consecutive matches and its records made by one ``map``: no bytecode runs per request.

A request is read here only where the per-match path would make exactly the same record from
it: its matches of one slot and task (a task ``>= 0``) and, in the newer shape, the prompt's
line then the decode's; no request in flight on that slot (the per-match path would close it
first); no rare-anchor line between its matches (its note would be the request's); both figure
sets decoded as JSON with non-zero counts (``nan``/``inf`` and empty sets take the per-match
path's conversions); a truncation flag printed. Everything else — interleaved slots, the 2024
and late-2023 forms, late 2024's release before the timing, unfinished requests — goes through
the per-match path, in log order with the runs.

Where the C helpers are built (:mod:`kvdiag.compiled`: ``perfbytes.c`` finds where the pattern
can match, ``perfpairs.c`` beside this module) the usual requests of both shapes are read in C,
without
the pattern's match objects (:func:`walk_compiled`): their numbers come as the text the groups
would hold and go through the same decode and the same checks; a request the checks send to
the per-match path is matched there by the pattern.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, islice, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Protocol, overload

import msgspec

from kvdiag import compiled
from kvdiag.model.perf import RequestTiming
from kvdiag.postmortem import perfbytes
from kvdiag.postmortem.perfpending import Pending
from kvdiag.postmortem.timinglines import BLOCK, NEW_PROMPT, SLOT_LINES, TIMING


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
_PROMPT = TIMING + 4
"""``lastindex`` of a newer-shape ``prompt eval time`` line read alone."""
_EVAL = TIMING + 7
"""``lastindex`` of a newer-shape timing line read with its release, with ``truncated``."""
_RUNS = re.compile(b"(?:" + re.escape(bytes((_NEW, _BLOCK))) + b")+|(?:"
                   + re.escape(bytes((_NEW, _PROMPT, _EVAL))) + b")+")
"""Runs of the usual request's matches: pairs (older shape) or triples (newer shape)."""
_LAST = attrgetter("lastindex")
_START = re.Match.start
_NEW_GROUPS = itemgetter(1, 2, NEW_PROMPT, NEW_PROMPT + 1, NEW_PROMPT + 2)
"""slot, task, n_ctx_slot, the prompt's tokens, what the cache kept."""
_BLOCK_GROUPS = itemgetter(1, 2, *range(BLOCK, BLOCK + 10))
"""slot, task, prompt and decode figures (ms, tokens, ms per token, tokens per second), the
release's tokens and truncated flag."""
_TIMING_GROUPS = itemgetter(1, 2, *range(TIMING + 1, TIMING + 5))
"""slot, task, the line's figures."""
_EVAL_GROUPS = itemgetter(1, 2, *range(TIMING + 1, TIMING + 5), TIMING + 6, TIMING + 7)
"""slot, task, the decode figures, the release's tokens and truncated flag."""
_NAME = itemgetter(TIMING)
"""Which timing line (``rompt eval`` or ``val``: the group begins after ``[pe]``)."""
_GRAPHS = itemgetter(TIMING + 5)
_NEWS = msgspec.json.Decoder(list[tuple[int, int, int, int, int]])
_BLOCKS = msgspec.json.Decoder(
    list[tuple[int, int, float, int, float, float, float, int, float, float, int, int]])
_PROMPTS = msgspec.json.Decoder(list[tuple[int, int, float, int, float, float]])
_EVALS = msgspec.json.Decoder(list[tuple[int, int, float, int, float, float, int, int]])
CHUNK = 64
"""Matches taken from the pattern's pass at a time (:func:`walk`)."""
MIN_RUN = 2
"""Fewer requests than this in a row are read one match at a time (the bulk steps' fixed
cost)."""


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


def walk(s: PerfScanner, buf: bytes, matches: Iterator[re.Match[bytes]], rare: list[int],
         ri: int, lines: int, counted: int) -> tuple[int, int, int]:
    """What ``s._walk`` does over the slot-line matches ``matches`` of ``buf`` (in order), the
    runs of pairs in bulk; returns the line count up to ``counted``, ``counted`` and the next
    rare index."""
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
        # a request's first matches wait for the rest of it in the next chunk
        carry = 0
        if len(got) == CHUNK:
            if ms[-1].lastindex == _NEW:
                carry = 1
            elif ms[-1].lastindex == _PROMPT and len(ms) > 1 and ms[-2].lastindex == _NEW:
                carry = 2
        last = ms[len(ms) - carry:]
        del ms[len(ms) - carry:]
        if ms:
            lines, counted, ri = _chunk(s, buf, ms, rare, ri, lines, counted)
            s._walk_end = ms[-1].end()  # where the late-2023 form may follow (perfscan._region)
        if carry:
            ms = last
        elif len(got) < CHUNK:
            return lines, counted, ri
        else:
            ms = []


def _chunk(s: PerfScanner, buf: bytes, ms: Sequence[re.Match[bytes]], rare: list[int],
           ri: int, lines: int, counted: int, read: _Read | None = None) -> tuple[int, int, int]:
    """:func:`walk` over the matches ``ms`` (``read``: what the compiled pass read of them)."""
    if read is None:
        try:
            kinds = bytes(map(_LAST, ms))
        except (TypeError, ValueError):  # no group matched (not a shape of the pattern today)
            return s._walk(buf, ms, rare, ri, lines, counted)
        starts: list[int] = list(map(_START, ms))
        pre = None
    else:
        kinds, starts, pre = read
    done = 0
    for run in _RUNS.finditer(kinds):
        a, b = run.span()
        u = 2 if kinds[a + 1] == _BLOCK else 3  # matches a request
        if b - a < u * MIN_RUN:
            continue
        if done < a:
            lines, counted, ri = s._walk(buf, ms[done:a], rare, ri, lines, counted)
        # a rare-anchor line inside the run is read in its place: between two requests as the
        # per-match path reads it, and a request it falls into goes that path (the line's note
        # is the request's)
        while a < b:
            if ri < len(rare) and rare[ri] < starts[a]:
                lines, counted, ri = s._rare_before(buf, rare, ri, starts[a], lines, counted)
            k, inside = b, 0
            if ri < len(rare) and rare[ri] < starts[b - 1]:
                k = bisect_right(starts, rare[ri], a, b)  # the first match after it
                inside = (k - a) % u  # after a new prompt: in its request
                k -= inside
            if k > a:
                lines, counted = _requests(s, buf, ms, starts, a, k, u, rare, ri, lines,
                                           counted, pre)
                a = k
            if inside:
                lines, counted, ri = s._walk(buf, ms[a:a + u], rare, ri, lines, counted)
                a += u
        done = b
    if done < len(ms):
        lines, counted, ri = s._walk(buf, ms[done:], rare, ri, lines, counted)
    return lines, counted, ri


def _columns(ms: Sequence[re.Match[bytes]], a: int, b: int, u: int) -> list[Any] | None:
    """The fields of the requests ``ms[a:b]`` (``u`` matches each) as columns: slot, task,
    n_ctx_slot, depth at start, cached, prompt ms, tokens, tokens per second, decode ms,
    tokens, ms per token, tokens per second, depth at end, truncated (0/1), graphs reused; then
    the slot and task of each later match of a request. None when one is not read so here."""
    news = _decode(_NEWS, map(_NEW_GROUPS, ms[a:b:u]))
    if news is None:
        return None
    if u == 2:
        blocks = _decode(_BLOCKS, map(_BLOCK_GROUPS, ms[a + 1:b:2]))
        if blocks is None:
            return None
        return _pair_columns(news, blocks)
    prompts, evals = ms[a + 1:b:3], ms[a + 2:b:3]
    n = len(prompts)
    if (list(map(_NAME, prompts)).count(b"rompt eval") != n
            or list(map(_NAME, evals)).count(b"val") != n):
        return None
    pe = _decode(_PROMPTS, map(_TIMING_GROUPS, prompts))
    ev = _decode(_EVALS, map(_EVAL_GROUPS, evals))
    if pe is None or ev is None:
        return None
    graphs = list(map(_GRAPHS, evals))
    return _triple_columns(news, pe, ev, [None if x is None else int(x) for x in graphs])


def _triple_columns(news: list[Any], pe: list[Any], ev: list[Any],
                    graphs: list[int | None]) -> list[Any]:
    """:func:`_columns` of the newer shape's requests from their decoded rows."""
    pe_slot, pe_task, p_ms, p_n, _p_mspt, p_tps = zip(*pe, strict=True)
    ev_slot, ev_task, d_ms, d_n, d_mspt, d_tps, stop, trunc = zip(*ev, strict=True)
    return [*zip(*news, strict=True), p_ms, p_n, p_tps, d_ms, d_n, d_mspt, d_tps, stop, trunc,
            repeat(None) if graphs.count(None) == len(graphs) else graphs, pe_slot, pe_task,
            ev_slot, ev_task]


def _pair_columns(news: list[Any], blocks: list[Any]) -> list[Any]:
    """:func:`_columns` of pairs from their decoded rows."""
    (b_slot, b_task, p_ms, p_n, _p_mspt, p_tps, d_ms, d_n, d_mspt, d_tps, stop,
     trunc) = zip(*blocks, strict=True)
    return [*zip(*news, strict=True), p_ms, p_n, p_tps, d_ms, d_n, d_mspt, d_tps, stop, trunc,
            repeat(None), b_slot, b_task]


def _requests(s: PerfScanner, buf: bytes, ms: Sequence[re.Match[bytes]], starts: list[int],
              a: int, b: int, u: int, rare: list[int], ri: int, lines: int,
              counted: int, pre: list[Any] | None = None) -> tuple[int, int]:
    """The requests ``ms[a:b]``, ``u`` matches each (no rare-anchor line before ``ms[b - 1]``
    but those already read): the records of those that qualify (the module's docstring) in
    bulk, the others one match at a time, in order. Returns the line count up to ``counted``
    and ``counted``."""
    cols = (_columns(ms, a, b, u) if pre is None  # else the requests' part of the columns
            else [c[a // u:b // u] if isinstance(c, tuple | list) else c for c in pre])
    if cols is None:
        lines, counted, _ri = s._walk(buf, ms[a:b], rare, ri, lines, counted)
        return lines, counted
    (slot, task, n_ctx, depth, cached, p_ms, p_n, p_tps, d_ms, d_n, d_mspt, d_tps, stop, trunc,
     graphs) = cols[:15]
    others = cols[15:]  # the slot and task of each later match
    n = len(slot)
    if (any(slot != x for x in others[0::2]) or any(task != x for x in others[1::2])
            or min(task) < 0 or 0 in p_n or 0 in d_n):
        bad = [i for i in range(n) if any(slot[i] != x[i] for x in others[0::2])
               or any(task[i] != x[i] for x in others[1::2]) or task[i] < 0 or not p_n[i]
               or not d_n[i]]
    else:
        bad = []
    if not isinstance(graphs, list):
        graphs = [None] * n
    pending = s._pending
    i = 0
    for j in chain(bad, (n,)):
        while i < j:
            # a request in flight on a request's slot is closed by its new prompt: the
            # per-match path reads it
            k = j
            if pending and not pending.keys().isdisjoint(slot[i:j]):
                k = next(x for x in range(i, j) if slot[x] in pending)
            if k > i:
                at = starts[a + u * i:a + u * k]
                acc = list(accumulate(map(buf.count, repeat(b"\n"), chain((counted,), at), at),
                                      initial=lines + 1))
                s.requests.extend(map(
                    RequestTiming, repeat(s.source), acc[u::u], repeat(s._boot_index),
                    slot[i:k], task[i:k], p_n[i:k], p_ms[i:k], p_tps[i:k], d_n[i:k], d_ms[i:k],
                    d_tps[i:k], d_mspt[i:k], depth[i:k], stop[i:k], cached[i:k], n_ctx[i:k],
                    map((1).__eq__, trunc[i:k]), graphs[i:k], acc[1::u], repeat(())))
                s._opened.update(slot[i:k])
                s._served = True
                lines, counted = acc[-1] - 1, at[-1]
            if k < j:
                lines, counted, _ri = s._walk(buf, ms[a + u * k:a + u * k + u], rare, ri,
                                              lines, counted)
                k += 1
            i = k
        if j < n:
            lines, counted, _ri = s._walk(buf, ms[a + u * j:a + u * j + u], rare, ri, lines,
                                          counted)
            i = j + 1
    return lines, counted


_SOURCE = Path(__file__).with_name("perfpairs.c")
_MODULE = f"{__package__}._perfpairs"
_Read = tuple[bytes, list[int], list[Any] | None]
"""What the compiled pass read of a run of pairs: the kinds of its matches, their starts, the
requests' columns (None: a number that is not JSON; the pattern's groups are read instead)."""
_PAIR_KINDS = bytes((_NEW, _BLOCK))
_TRIPLE_KINDS = bytes((_NEW, _PROMPT, _EVAL))
_GRAPHS_TEXT = msgspec.json.Decoder(list[int | None])


class _Again(Sequence[re.Match[bytes]]):
    """The pattern's matches at offsets the compiled pass read, made where they are asked for
    (requests the bulk step leaves to the per-match path: the pattern's own reading)."""

    def __init__(self, buf: bytes, starts: list[int], end: int) -> None:
        self._buf, self._starts, self._end = buf, starts, end

    def __len__(self) -> int:
        return len(self._starts)

    def _at(self, start: int) -> re.Match[bytes]:
        m = SLOT_LINES.match(self._buf, start, self._end)
        if m is None:  # the compiled pass read a match here: it must be the pattern's
            raise AssertionError(f"no slot-line match at {start}")
        return m

    @overload
    def __getitem__(self, i: int) -> re.Match[bytes]: ...

    @overload
    def __getitem__(self, i: slice) -> list[re.Match[bytes]]: ...

    def __getitem__(self, i: int | slice) -> re.Match[bytes] | list[re.Match[bytes]]:
        if isinstance(i, slice):
            return list(map(self._at, self._starts[i]))
        return self._at(self._starts[i])


def walk_compiled(s: PerfScanner, buf: bytes, starts: memoryview, end: int, lo: int,
                  rare: list[int], ri: int, lines: int, counted: int) -> tuple[int, int, int]:
    """:func:`walk` over the slot lines at ``starts[lo:]`` (the compiled pass's offsets,
    :mod:`kvdiag.postmortem.perfbytes`), the runs of the usual request read in C
    (``perfpairs.c``: each number's printed text, as the pattern's groups hold it) and the rest
    by the pattern, in order. A pattern's match that runs into a run's first line (the C reading
    finds a pair where finditer would not start one) sends the run to the pattern too."""
    after = [0]  # where the pattern's last match ended (perfbytes.matches keeps it)
    c = compiled.load(_SOURCE, _MODULE)
    if c is None:
        return walk(s, buf, perfbytes.matches(buf, starts[lo:], end, after), rare, ri, lines,
                    counted)
    seg = lo  # the first offset not yet read
    for run_lo, run_hi, u, at_raw, news, second, third, graphs, run_end in c.pairs(
            buf, starts.obj, end, lo):
        if run_lo > seg:
            lines, counted, ri = walk(s, buf, perfbytes.matches(buf, starts[seg:run_lo], end,
                                                                after), rare, ri, lines, counted)
            seg = run_lo
        at: list[int] = memoryview(at_raw).cast("q").tolist()
        if after[0] > at[0] or len(at) < u * MIN_RUN:
            continue  # read by the pattern with what follows
        try:
            pre: list[Any] | None = (
                _pair_columns(_NEWS.decode(news), _BLOCKS.decode(second)) if u == 2 else
                _triple_columns(_NEWS.decode(news), _PROMPTS.decode(second),
                                _EVALS.decode(third), _GRAPHS_TEXT.decode(graphs)))
        except msgspec.DecodeError:  # (a ValidationError is one)
            pre = None
        kinds = (_PAIR_KINDS if u == 2 else _TRIPLE_KINDS) * (len(at) // u)
        lines, counted, ri = _chunk(s, buf, _Again(buf, at, end), rare, ri, lines, counted,
                                    (kinds, at, pre))
        s._walk_end = after[0] = run_end
        seg = run_hi
    if seg < len(starts):
        lines, counted, ri = walk(s, buf, perfbytes.matches(buf, starts[seg:], end, after),
                                  rare, ri, lines, counted)
    return lines, counted, ri
