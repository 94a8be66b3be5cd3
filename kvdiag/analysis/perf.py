"""A run's requests by depth: per-request figures and depth bins (``kvdiag perf``, docs/perf.md).

Pure functions over a :class:`~kvdiag.model.perf.PerfRun`. Depth is the number of tokens in the
slot's context; a request decodes from ``depth_start`` to ``depth_end`` (brief §7.3), so its
decode rate belongs to that range, and a request sits in the bin of the middle of its decode.
A bin's rate is token-weighted (its decoded tokens over its decode time): a long request counts
for what it decoded, not once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kvdiag.model.perf import PerfRun, RequestTiming

DEFAULT_BIN_TOKENS = 4096
"""16 pages of 256 tokens: narrow enough to separate the turns of a multi-turn session of a
few thousand tokens each, wide enough to hold a decode of several hundred tokens."""


class RequestRow(msgspec.Struct, gc=False):
    """One request with what is derived from its lines. A msgspec Struct made positionally (a
    log holds millions of requests: a fifth of a slotted dataclass's cost, measured), not
    tracked by the cyclic garbage collector (it refers to a request and numbers: no cycle)."""

    index: int
    """Its position in :attr:`PerfRun.requests`."""
    request: RequestTiming
    depth_start: int | None
    depth_end: int | None
    depth_derived: bool
    """Depth taken from the release line and the decoded tokens (no ``new prompt`` line was
    read for it: the log began mid-request)."""
    graphs_delta: int | None
    """CUDA graphs reused while it ran: its ``graphs reused`` minus the previous request's of
    the same boot (the printed figure is the context's running count, brief §1.11)."""

    @property
    def decode_tps(self) -> float | None:
        r = self.request
        if r.decode_tps is not None:
            return r.decode_tps
        if r.decode_ms and r.decode_tokens:
            return r.decode_tokens * 1000.0 / r.decode_ms
        return None

    @property
    def ms_per_token(self) -> float | None:
        """Decode ms over decoded tokens (the printed ``ms per token`` has two decimals only;
        it is the fallback)."""
        r = self.request
        if r.decode_ms is not None and r.decode_tokens:
            return r.decode_ms / r.decode_tokens
        return r.ms_per_token

    @property
    def depth_mid(self) -> float | None:
        if self.depth_start is None:
            return None
        end = self.depth_end if self.depth_end is not None else self.depth_start
        return (self.depth_start + end) / 2

    @property
    def capped(self) -> bool:
        """The context capped it (``truncated = 1``): its decode stopped early."""
        return bool(self.request.truncated)

    @property
    def order(self) -> tuple[int, int]:
        """Where it began in its run (boot, start line or time; the timing line otherwise)."""
        r = self.request
        return r.boot, r.started if r.started is not None else r.line


def rows(run: PerfRun) -> list[RequestRow]:
    """Every request of ``run`` with its derived depth and graph reuse, in completion order."""
    out: list[RequestRow] = []
    append = out.append
    last_graphs: dict[int, int] = {}
    for i, r in enumerate(run.requests):
        start, end, graphs = r.depth_start, r.depth_end, r.graphs_reused
        if start is not None and end is not None and graphs is None:  # the usual request
            append(RequestRow(i, r, start, end, False, None))
            continue
        derived = False
        if start is None and end is not None and r.decode_tokens is not None:
            start, derived = max(0, end - r.decode_tokens), True
        if end is None and start is not None and r.decode_tokens is not None:
            end = start + r.decode_tokens
        delta = None
        if graphs is not None:
            before = last_graphs.get(r.boot, 0)
            delta = graphs - before if graphs >= before else graphs
            last_graphs[r.boot] = graphs
        append(RequestRow(i, r, start, end, derived, delta))
    return out


@dataclass(frozen=True)
class DepthBin:
    """Requests whose decode's middle lies in ``[lo, hi)`` tokens."""

    lo: int
    hi: int
    requests: tuple[int, ...]
    """Row indices."""
    decode_tokens: int
    decode_ms: float
    capped: int

    @property
    def decode_tps(self) -> float | None:
        return self.decode_tokens * 1000.0 / self.decode_ms if self.decode_ms > 0 else None

    @property
    def label(self) -> str:
        return f"{_k(self.lo)}–{_k(self.hi)}"


def _k(tokens: int) -> str:
    return f"{tokens / 1024:g}K" if tokens % 1024 == 0 else str(tokens)


def depth_bins(table: Sequence[RequestRow], width: int = DEFAULT_BIN_TOKENS,
               include_capped: bool = True) -> list[DepthBin]:
    """The bins of ``width`` tokens that hold a request, in depth order."""
    if width <= 0:
        raise ValueError("bin width must be positive")
    # one pass, summing as it goes: a log holds millions of requests
    members: dict[int, list[int]] = {}
    tokens_of: dict[int, int] = {}
    ms_of: dict[int, float] = {}
    capped_of: dict[int, int] = {}
    double = 2 * width
    for row in table:
        start, r = row.depth_start, row.request
        ms, tokens = r.decode_ms, r.decode_tokens
        if start is None or ms is None or not tokens:
            continue
        truncated = r.truncated
        if truncated and not include_capped:
            continue
        end = row.depth_end
        # the bin of the decode's middle, (start + end) / 2 // width, in integers
        key = (start + (start if end is None else end)) // double
        if key in members:
            members[key].append(row.index)
            tokens_of[key] += tokens
            ms_of[key] += ms
        else:
            members[key] = [row.index]
            tokens_of[key] = tokens
            ms_of[key] = ms
            capped_of[key] = 0
        if truncated:
            capped_of[key] += 1
    return [DepthBin(lo=b * width, hi=(b + 1) * width, requests=tuple(members[b]),
                     decode_tokens=tokens_of[b], decode_ms=ms_of[b], capped=capped_of[b])
            for b in sorted(members)]


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
