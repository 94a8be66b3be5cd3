"""What one run of a server did for its requests, as ``kvdiag perf`` reads it from a log or a trace.

A run is a llama-server log (read by :mod:`kvdiag.postmortem.perfscan`) or a trace holding
``timing`` events (``kvdiag import`` writes them, format 1.2). Every record keeps where it came
from so that a cause can cite its evidence. Shapes and sources: the slot lines and
``print_timing`` block (domain brief §7.3), the ``kv_stream_adapt`` partition and trace lines and
the fallback warnings around them (§5.3, §3), CUDA graph reuse (§1.11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

import msgspec

from kvdiag.model.logrecords import BootConfig, Problem

_T = TypeVar("_T", int, float)
RunKind = Literal["log", "trace"]
NoteKind = Literal["repartition", "fallback", "fits-false", "feedback", "layout", "warning"]


class RequestTiming(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One request a slot completed: its ``print_timing`` figures and its depth.

    Depth is the number of tokens in the slot's context: ``depth_start`` is the prompt's length
    with what the cache kept (``new prompt, … task.n_tokens = N``, older ``n_prompt_tokens``),
    where decoding begins; ``depth_end`` is ``stop processing: n_tokens = N`` (older
    ``n_past``), where it ended; ``cached`` is what the cache kept
    (``n_tokens = N, memory_seq_rm [N, end)``, older ``kv cache rm [N, end)``).
    ``graphs_reused`` is the ``graphs reused = N`` line, which the server prints from the
    context's cumulative counter (``llama_perf_context(ctx).n_reused``): per request it is the
    difference to the previous request of the same boot. ``line`` is the line of the
    ``eval time`` figures (or of the block's header in the older shape), ``position`` orders
    records of one run (the line in a log, the event's ``seq`` in a trace).

    Not tracked by the cyclic garbage collector (``gc=False``): it holds only numbers, text and
    a tuple of ints, so it can be in no reference cycle, and a log makes millions of them —
    each collection would walk them all again (a quarter of ``kvdiag perf``'s instructions on
    bench_perf's log, measured with callgrind).
    """

    source: str
    line: int
    boot: int
    slot: int | None = None
    task: int | None = None
    prompt_tokens: int | None = None
    prompt_ms: float | None = None
    prompt_tps: float | None = None
    decode_tokens: int | None = None
    decode_ms: float | None = None
    decode_tps: float | None = None
    """As printed (``tokens per second``); computed from ms and tokens when not printed."""
    ms_per_token: float | None = None
    depth_start: int | None = None
    depth_end: int | None = None
    cached: int | None = None
    n_ctx_slot: int | None = None
    truncated: bool | None = None
    graphs_reused: int | None = None
    started: int | None = None
    """Where the request began: the line of its ``new prompt`` (log), or the time of that line
    in ns of the log's clock (trace)."""
    notes: tuple[int, ...] = ()
    """Indices into :attr:`PerfRun.notes` of the kv-stream lines logged while it was in flight."""


class StreamNote(msgspec.Struct, frozen=True, omit_defaults=True):
    """A discrete kv-stream line: a repartition (§5.3), a fallback warning or ``fits=false``
    line (§3, §4.5), invalid feedback or a failed layout publication (§5.3).

    ``depth`` is the active tokens of the last ``kv_stream_adapt`` trace line of the same boot
    before it, when there was one (the line itself does not say)."""

    source: str
    line: int
    boot: int
    kind: NoteKind
    message: str = ""
    depth: int | None = None
    resident: tuple[int, int] | None = None
    """Resident pages per layer before and after (repartition)."""
    ring: tuple[int, int] | None = None
    miss_pct: float | None = None
    busy_pct: float | None = None
    layer: int | None = None


class AdaptPage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every ``kv_stream_adapt: active N, resident R, ring S, …`` line of one boot whose active
    tokens fall in one page (``page`` = ceil(N / 256)), summed: the partition and feedback
    recorded at that depth (brief §1.10, §5.3)."""

    boot: int
    page: int
    evaluations: int
    first_line: int
    resident_min: int
    resident_max: int
    ring_min: int
    ring_max: int
    below: int = 0
    """Evaluations whose resident pages per layer were fewer than the active pages."""
    samples: int = 0
    misses: int = 0
    starved: int = 0
    """Evaluations whose own misses were above 1 % of their samples (the controller's
    threshold, [PLAN])."""
    busy_max: float | None = None
    peak_max: int | None = None
    layout_max: int | None = None


class PerfRun(msgspec.Struct, frozen=True, omit_defaults=True):
    """One run's requests and the kv-stream evidence around them."""

    name: str
    source: str
    kind: RunKind
    requests: tuple[RequestTiming, ...] = ()
    notes: tuple[StreamNote, ...] = ()
    notes_dropped: int = 0
    adapt: tuple[AdaptPage, ...] = ()
    boots: tuple[BootConfig, ...] = ()
    unfinished: int = 0
    """Requests that began (``new prompt``) and have no timing: the server died, the request
    failed, or the log ends first."""
    lines: int = 0
    problems: tuple[Problem, ...] = ()


STARVED_MISS_RATIO = 0.01
"""The controller's starvation threshold: deadline misses above 1 % of the samples ([PLAN],
brief §1.10)."""


@dataclass
class _PageSums:
    evaluations: int
    first_line: int
    resident_min: int
    resident_max: int
    ring_min: int
    ring_max: int
    below: int = 0
    samples: int = 0
    misses: int = 0
    starved: int = 0
    busy_max: float | None = None
    peak_max: int | None = None
    layout_max: int | None = None


def _max(old: _T | None, new: _T | None) -> _T | None:
    if new is None:
        return old
    return new if old is None or new > old else old


class AdaptPages:
    """Sums ``kv_stream_adapt`` trace lines into :class:`AdaptPage` records, one per boot and
    active page, so that a log printing one line per evaluation stays small in memory."""

    def __init__(self) -> None:
        self._pages: dict[tuple[int, int], _PageSums] = {}

    def add(self, boot: int, line: int, active: int, resident: int, ring: int,
            samples: int | None = None, misses: int | None = None,
            busy_pct: float | None = None, peak: int | None = None,
            layout: int | None = None) -> None:
        page = -(-active // 256)
        s = self._pages.get((boot, page))
        if s is None:
            s = self._pages[(boot, page)] = _PageSums(0, line, resident, resident, ring, ring)
        s.evaluations += 1
        s.resident_min = min(s.resident_min, resident)
        s.resident_max = max(s.resident_max, resident)
        s.ring_min = min(s.ring_min, ring)
        s.ring_max = max(s.ring_max, ring)
        s.below += resident < page
        if samples:
            s.samples += samples
            s.misses += misses or 0
            s.starved += (misses or 0) > STARVED_MISS_RATIO * samples
        s.busy_max = _max(s.busy_max, busy_pct)
        s.peak_max = _max(s.peak_max, peak)
        s.layout_max = _max(s.layout_max, layout)

    def merge(self, page: AdaptPage) -> None:
        """Add a page summed elsewhere (another part of the same log)."""
        s = self._pages.get((page.boot, page.page))
        if s is None:
            self._pages[(page.boot, page.page)] = _PageSums(**{
                k: getattr(page, k) for k in _PageSums.__dataclass_fields__})
            return
        s.evaluations += page.evaluations
        s.first_line = min(s.first_line, page.first_line)
        s.resident_min = min(s.resident_min, page.resident_min)
        s.resident_max = max(s.resident_max, page.resident_max)
        s.ring_min = min(s.ring_min, page.ring_min)
        s.ring_max = max(s.ring_max, page.ring_max)
        s.below += page.below
        s.samples += page.samples
        s.misses += page.misses
        s.starved += page.starved
        s.busy_max = _max(s.busy_max, page.busy_max)
        s.peak_max = _max(s.peak_max, page.peak_max)
        s.layout_max = _max(s.layout_max, page.layout_max)

    def result(self) -> tuple[AdaptPage, ...]:
        return tuple(AdaptPage(boot=boot, page=page, **vars(s))
                     for (boot, page), s in sorted(self._pages.items()))


class ModelledRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """One request as the runtime model plays it (``kvdiag perf --predict``; made by
    :mod:`kvdiag.kvstream.session`): its decode under the adaptive controller."""

    index: int
    slot: int
    decode_steps: int
    attention_us: float
    """Mean modelled attention time of its decode steps (the streamed layers), µs."""
    resident_us: float
    """The same steps with every page resident (a server without streaming)."""
    active_pages: tuple[int, int]
    resident_pages: tuple[int, int]
    """Resident pages per layer the controller kept over its decode (min, max)."""
    ring_slots: tuple[int, int]
    samples: int = 0
    misses: int = 0
    repartitions: int = 0
    depth_start: int | None = None
    depth_end: int | None = None
    rejected: bool = False
    truncated: bool = False
