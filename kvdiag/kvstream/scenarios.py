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


@dataclass(frozen=True)
class Request:
    slot: int
    prompt: int
    decode: int
    after: int | None = None
    """Index of the request that must finish before this one arrives (None: at start)."""


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
class Ubatch:
    """One graph evaluation: ``tokens`` tokens for each stream in ``streams``."""

    index: int
    streams: tuple[int, ...]
    slots: tuple[int, ...]
    requests: tuple[int, ...]
    tokens: int
    cell_begin: tuple[int, ...]
    """First cell written per stream (cells are positions: one sequence per stream)."""

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
    cells: int = 0

    @property
    def done(self) -> bool:
        return self.prompt_left == 0 and self.decode_left == 0


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
        index = 0
        while len(self._finished) < len(self.requests):
            for i, r in enumerate(self.requests):
                arrived = r.after is None or r.after in self._finished
                if i not in live and i not in self._finished and arrived:
                    if any(x.request.slot == r.slot for x in live.values()):
                        continue  # the slot is busy: the request waits
                    live[i] = _Live(i, r, self.stream_of(r.slot), r.prompt, r.decode)
            if not live:
                raise ValueError("scenario requests wait on each other forever")
            # one server iteration: prompt remainder or one decode token per slot
            want = {i: (x.prompt_left if x.prompt_left else 1) for i, x in live.items()}
            while want:
                order = sorted(want, key=lambda i: live[i].stream)
                cap = max(1, self.n_ubatch // len(order))
                k = min(min(want.values()), cap)
                for i in order:
                    x = live[i]
                    if x.cells + k > self.kv_size:
                        raise ValueError(
                            f"request {i} on slot {x.request.slot} needs more than the "
                            f"{self.kv_size} cells of its stream (raise --ctx)"
                        )
                yield Ubatch(
                    index=index,
                    streams=tuple(live[i].stream for i in order),
                    slots=tuple(live[i].request.slot for i in order),
                    requests=tuple(order),
                    tokens=k,
                    cell_begin=tuple(live[i].cells for i in order),
                )
                index += 1
                for i in order:
                    x = live[i]
                    x.cells += k
                    if x.prompt_left:
                        x.prompt_left -= k
                    else:
                        x.decode_left -= k
                    want[i] -= k
                    if want[i] == 0:
                        del want[i]
            for i in [i for i, x in live.items() if x.done]:
                del live[i]
                self._finished.add(i)
