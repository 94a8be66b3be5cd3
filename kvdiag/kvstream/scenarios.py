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

    @property
    def done(self) -> bool:
        return self.prompt_left == 0 and self.decode_left == 0


class _Cells:
    """Cell ownership of one stream: requests take the lowest free cells (find_slot); a
    slot's cells are freed when its next request starts (memory_seq_rm)."""

    def __init__(self, kv_size: int) -> None:
        self.owner = np.full(kv_size, -1, np.int64)

    def free(self, requests: set[int]) -> None:
        if requests:
            self.owner[np.isin(self.owner, list(requests))] = -1

    def take(self, request: int, n: int, slot: int) -> list[int]:
        cells = np.flatnonzero(self.owner == -1)[:n]
        if len(cells) < n:
            raise ValueError(
                f"request {request} on slot {slot} needs more than the {len(self.owner)} "
                "cells of its stream (raise --ctx)")
        self.owner[cells] = request
        return [int(c) for c in cells]


@dataclass
class Scheduler:
    requests: tuple[Request, ...]
    n_stream: int
    n_ubatch: int
    kv_size: int
    _finished: set[int] = field(default_factory=set)

    def stream_of(self, slot: int) -> int:
        return slot if self.n_stream > 1 else 0

    def ubatches(self) -> Iterator[Ubatch]:
        live: dict[int, _Live] = {}
        cells = {s: _Cells(self.kv_size) for s in range(self.n_stream)}
        previous: dict[int, int] = {}  # slot -> request that last used it
        index = 0
        iteration = 0
        while len(self._finished) < len(self.requests):
            for i, r in enumerate(self.requests):
                arrived = (r.after is None or r.after in self._finished) and iteration >= r.at
                if i not in live and i not in self._finished and arrived:
                    if any(x.request.slot == r.slot for x in live.values()):
                        continue  # the slot is busy: the request waits
                    stream = self.stream_of(r.slot)
                    if r.slot in previous:
                        cells[stream].free({previous[r.slot]})
                    previous[r.slot] = i
                    live[i] = _Live(i, r, stream, r.prompt, r.decode)
            if not live:
                if any(r.at > iteration for i, r in enumerate(self.requests)
                       if i not in self._finished):
                    iteration += 1  # the server idles until the next arrival
                    continue
                raise ValueError("scenario requests wait on each other forever")
            iteration += 1
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
