"""Named scenarios and the server-like scheduler that turns requests into ubatches.

The scheduler follows llama-server's continuous batching: every iteration each active slot
contributes its remaining prompt tokens or one decode token; with several KV streams the batch
is split "equally" (each ubatch takes the same number of tokens from every stream in it), so a
ubatch holding two slots has 4-D K/V views (ne[3] = 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Request:
    slot: int
    prompt: int
    decode: int
    after: int | None = None
    """Index of the request that must finish before this one arrives (None: at start)."""
    at: int = 0
    """Server iteration (one prompt chunk or decode token per busy slot) it arrives at."""
    cont: bool = False
    """It continues its slot's conversation: the cells of the slot's previous request stay
    (the server's prompt cache kept them, ``memory_seq_rm [n, end)``), ``prompt`` counts only
    the new tokens, and positions go on from there. The context caps such a conversation as
    the server does with context shift off: a prompt that does not fit the free cells is
    rejected (no ubatch), a decode stops when the cells run out (``truncated``)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    config: dict[str, Any]
    """Settings the scenario needs (e.g. np)."""
    requests: tuple[Request, ...]
    sizing: dict[str, Any] = field(default_factory=dict)
    """Context/pool sizing used with the default (small) preset only."""


@dataclass(frozen=True)
class Lane:
    """The tokens of one KV stream in a ubatch: which request each belongs to, the cell it is
    written to and its position in its sequence."""

    stream: int
    requests: tuple[int, ...]
    cells: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class Ubatch:
    """One graph evaluation: ``tokens`` tokens for each stream in ``streams``."""

    index: int
    streams: tuple[int, ...]
    slots: tuple[int, ...]
    requests: tuple[int, ...]
    tokens: int
    lanes: tuple[Lane, ...]

    @property
    def phase(self) -> str:
        return "prefill" if self.tokens > 1 else "decode"


SEED_TURNS = 12
SEED_NEW_TOKENS = 6400
SEED_OUTPUT_TOKENS = 750


def multiturn_growth(turns: int = SEED_TURNS, new_tokens: int = SEED_NEW_TOKENS,
                     output_tokens: int = SEED_OUTPUT_TOKENS, slots: int = 1) -> Scenario:
    """A chat session per slot that grows every turn: each turn sends the conversation so far
    plus ``new_tokens`` and decodes ``output_tokens``; the server's cache keeps the
    conversation, so only the new tokens are prefilled (``Request.cont``). With several slots
    the sessions run side by side.

    The default is the seed's session (PR #117, round 2: 1 session × 12 turns, 750 output
    tokens, turns 10–12 capped by the 65,536-token context). The seed says "~8K" tokens per
    turn, but 9 uncapped turns of 8,192 + 750 tokens need 80,478 cells; a turn of 6,400 + 750
    tokens is the size at which turns 1–9 fit and turn 10 does not, as the seed reports."""
    if min(turns, new_tokens, output_tokens, slots) <= 0:
        raise ValueError("turns, new tokens, output tokens and slots must be positive")
    requests: list[Request] = []
    for slot in range(slots):
        for turn in range(turns):
            requests.append(Request(slot=slot, prompt=new_tokens, decode=output_tokens,
                                    after=len(requests) - 1 if turn else None, cont=turn > 0))
    return Scenario(
        "multiturn-growth",
        f"{slots} slot(s), each a session of {turns} turns: {new_tokens} new tokens and "
        f"{output_tokens} decoded per turn, the conversation kept in the cache",
        dict(np=slots), tuple(requests), dict(ctx=65536, stage_mib=64))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "single-slot",
            "np 1: one request, prefill then decode; the baseline that must stay exact",
            dict(np=1),
            (Request(slot=0, prompt=600, decode=16),),
            dict(stage_mib=12),
        ),
        Scenario(
            "two-slot-concurrent",
            "np 2, non-unified: two requests decode in the same ubatches (4-D K/V views)",
            dict(np=2),
            (Request(slot=0, prompt=600, decode=16), Request(slot=1, prompt=600, decode=16)),
            dict(stage_mib=12),
        ),
        Scenario(
            "slot1-first",
            "np 2: a fresh boot's first request lands on slot 1, then slot 0, then slot 1 again",
            dict(np=2),
            (
                Request(slot=1, prompt=600, decode=16),
                Request(slot=0, prompt=600, decode=16, after=0),
                Request(slot=1, prompt=500, decode=8, after=1),
            ),
            dict(stage_mib=12),
        ),
        Scenario(
            "late-join",
            "np 2: slot 1 is decoding when a short request lands on slot 0 and finishes first",
            dict(np=2),
            (Request(slot=1, prompt=600, decode=24), Request(slot=0, prompt=300, decode=4, at=6)),
            dict(stage_mib=12),
        ),
        Scenario(
            "pool-pressure",
            "np 1, context far beyond the resident window: most pages stream through the ring",
            dict(),
            (Request(slot=0, prompt=3000, decode=16),),
            dict(ctx=16384, stage_mib=6),
        ),
        multiturn_growth(),
    )
}


@dataclass
class _Live:
    index: int
    request: Request
    stream: int
    prompt_left: int
    decode_left: int
    position: int = 0
    kept: int = 0
    """Cells the request found kept from its slot's conversation."""

    @property
    def done(self) -> bool:
        return self.prompt_left == 0 and self.decode_left == 0


class _Cells:
    """Cell ownership of one stream: requests take the lowest free cells (find_slot); a
    slot's cells are freed when its next request starts (memory_seq_rm)."""

    def __init__(self, kv_size: int) -> None:
        self.owner = np.full(kv_size, -1, np.int64)
        self.n_free = kv_size
        self.low = 0
        """No free cell below this index (cells are taken lowest first): a long session takes
        one cell per decode step without scanning the cells it already holds."""

    def free(self, requests: set[int]) -> None:
        if requests:
            freed = np.flatnonzero(np.isin(self.owner, list(requests)))
            if len(freed):
                self.owner[freed] = -1
                self.n_free += len(freed)
                self.low = min(self.low, int(freed[0]))

    def keep(self, old: int, new: int) -> int:
        """Hand the cells of request ``old`` to ``new`` (a continued conversation); returns
        how many."""
        held = self.owner == old
        self.owner[held] = new
        return int(held.sum())

    def free_cells(self) -> int:
        return self.n_free

    def take(self, request: int, n: int, slot: int) -> list[int]:
        cells = np.empty(0, np.int64)
        if n <= self.n_free:
            start = self.low
            while len(cells) < n and start < len(self.owner):
                window = self.owner[start:start + max(4 * n, 1024)]
                found = np.flatnonzero(window == -1)[:n - len(cells)] + start
                if not len(cells):
                    self.low = int(found[0]) if len(found) else start + len(window)
                cells = np.concatenate([cells, found])
                start += len(window)
        if len(cells) < n:
            raise ValueError(
                f"request {request} on slot {slot} needs more than the {len(self.owner)} "
                "cells of its stream (raise --ctx)")
        self.owner[cells] = request
        self.n_free -= n
        return [int(c) for c in cells]


@dataclass
class Scheduler:
    requests: tuple[Request, ...]
    n_stream: int
    n_ubatch: int
    kv_size: int
    _finished: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    """Continued requests whose prompt did not fit the free cells (never run)."""
    truncated: set[int] = field(default_factory=set)
    """Continued requests whose decode the context stopped."""
    kept: dict[int, int] = field(default_factory=dict)
    """Cells each continued request found kept from its conversation."""
    kept_from: dict[int, int] = field(default_factory=dict)
    """The request whose cells each continued request took over."""

    def stream_of(self, slot: int) -> int:
        return slot if self.n_stream > 1 else 0

    def ubatches(self) -> Iterator[Ubatch]:
        live: dict[int, _Live] = {}
        cells = {s: _Cells(self.kv_size) for s in range(self.n_stream)}
        previous: dict[int, int] = {}  # slot -> request that last used it
        last_position: dict[int, int] = {}  # slot -> next position of its conversation
        index = 0
        iteration = 0
        while len(self._finished) < len(self.requests):
            for i, r in enumerate(self.requests):
                arrived = (r.after is None or r.after in self._finished) and iteration >= r.at
                if i not in live and i not in self._finished and arrived:
                    if any(x.request.slot == r.slot for x in live.values()):
                        continue  # the slot is busy: the request waits
                    stream = self.stream_of(r.slot)
                    kept, position = 0, 0
                    if r.slot in previous and r.cont:
                        kept = cells[stream].keep(previous[r.slot], i)
                        position = last_position.get(r.slot, 0)
                        if cells[stream].free_cells() < r.prompt:
                            # the server refuses a prompt larger than the context left
                            cells[stream].keep(i, previous[r.slot])
                            self.rejected.add(i)
                            self._finished.add(i)
                            continue
                        self.kept[i] = kept
                        self.kept_from[i] = previous[r.slot]
                    elif r.slot in previous:
                        cells[stream].free({previous[r.slot]})
                    previous[r.slot] = i
                    live[i] = _Live(i, r, stream, r.prompt, r.decode, position, kept)
            if not live and len(self._finished) == len(self.requests):
                return  # the last requests were rejected
            if not live:
                if any(r.at > iteration for i, r in enumerate(self.requests)
                       if i not in self._finished):
                    iteration += 1  # the server idles until the next arrival
                    continue
                raise ValueError("scenario requests wait on each other forever")
            iteration += 1
            # a continued conversation's decode stops when its stream has no free cell left
            for i, x in live.items():
                if (x.request.cont and not x.prompt_left and x.decode_left
                        and not cells[x.stream].free_cells()):
                    x.decode_left = 0
                    self.truncated.add(i)
            for i in [i for i, x in live.items() if x.done]:
                last_position[live[i].request.slot] = live[i].position
                del live[i]
                self._finished.add(i)
            if not live:
                continue
            # one server iteration: prompt remainder or one decode token per slot
            want = {i: (x.prompt_left if x.prompt_left else 1) for i, x in live.items()}
            while want:
                take = self._split(want, live)
                lanes: dict[int, list[tuple[int, int, int]]] = {}
                for i, k in take.items():
                    x = live[i]
                    got = cells[x.stream].take(i, k, x.request.slot)
                    lanes.setdefault(x.stream, []).extend(
                        (i, c, x.position + j) for j, c in enumerate(got))
                    x.position += k
                    if x.prompt_left:
                        x.prompt_left -= k
                    else:
                        x.decode_left -= k
                    want[i] -= k
                    if want[i] == 0:
                        del want[i]
                streams = tuple(sorted(lanes))
                yield Ubatch(
                    index=index,
                    streams=streams,
                    slots=tuple(live[i].request.slot for i in take),
                    requests=tuple(take),
                    tokens=len(lanes[streams[0]]),
                    lanes=tuple(Lane(s, tuple(t[0] for t in lanes[s]),
                                     tuple(t[1] for t in lanes[s]),
                                     tuple(t[2] for t in lanes[s])) for s in streams),
                )
                index += 1
            for i in [i for i, x in live.items() if x.done]:
                last_position[live[i].request.slot] = live[i].position
                del live[i]
                self._finished.add(i)

    def _split(self, want: dict[int, int], live: dict[int, _Live]) -> dict[int, int]:
        """Tokens each request puts in the next ubatch.

        Several streams: split_equal, the same count from every stream (one sequence per
        stream). One stream: split_simple, requests in order until n_ubatch tokens.
        """
        order = sorted(want, key=lambda i: (live[i].stream, i))
        if self.n_stream > 1:
            k = min(min(want.values()), max(1, self.n_ubatch // len(order)))
            return dict.fromkeys(order, k)
        out: dict[int, int] = {}
        room = self.n_ubatch
        for i in order:
            if room == 0:
                break
            out[i] = min(want[i], room)
            room -= out[i]
        return out
