"""``kv_stream_adapt``: the per-evaluation controller around the partition rule (brief §1.10).

After every graph evaluation the llama layer hands the controller the active tokens, the
query width and the ring's feedback counters. It

- treats the evaluation as decode-like when this and the previous query width are ≤ 32
  (MAX_DECODE_QUERY_TOKENS);
- sees pressure only while the active pages per layer (ceil(active tokens / 256)) exceed the
  resident pages per layer — without pressure nothing streams and the streaks reset;
- turns the cumulative deadline counters into a delta (errors: "KV stream feedback counters
  moved backwards", "KV stream deadline misses exceed samples"; the evaluation is then
  ignored with "ignoring invalid CUDA feedback: <error>");
- asks :func:`~kvdiag.kvstream.partition.adapt_partition` for the boundary when feedback
  has samples or the decode layout is being entered, unless
  ``GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS`` froze it;
- chooses the decode layout (:func:`~kvdiag.model.decode_layout.decode_layout`) for a
  decode-like evaluation under pressure, the uniform layout otherwise.

A repartition or a layout change invalidates the resident cache wholesale (brief §1.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvdiag.kvstream.partition import (
    NEVER,
    Feedback,
    Partition,
    PartitionError,
    PoolShape,
    Tuning,
    adapt_partition,
)
from kvdiag.model.decode_layout import DecodeLayout, decode_layout
from kvdiag.model.pages import PAGE_TOKENS

MAX_DECODE_QUERY_TOKENS = 32


@dataclass(frozen=True)
class Counters:
    """Cumulative deadline counters of the ring (one-thread sampling kernel, brief §1.6)."""

    samples: int
    misses: int


@dataclass(frozen=True)
class Evaluation:
    """What one ``kv_stream_adapt`` call decided."""

    active_pages: int
    decode_like: bool
    pressure: bool
    before: Partition
    after: Partition
    repartitioned: bool
    layout: DecodeLayout
    layout_changed: bool
    miss_ratio: float | None
    """Deadline misses / samples of this evaluation; None without samples."""
    busy: float
    warnings: tuple[str, ...] = ()

    @property
    def invalidates(self) -> bool:
        """The resident cache is cleared wholesale (repartition or layout change)."""
        return self.repartitioned or self.layout_changed


def feedback_delta(current: Counters, previous: Counters) -> tuple[int, int]:
    """Samples and misses since the previous evaluation ([PLAN] feedback delta)."""
    if current.samples < previous.samples or current.misses < previous.misses:
        raise PartitionError("KV stream feedback counters moved backwards")
    samples = current.samples - previous.samples
    misses = current.misses - previous.misses
    if misses > samples:
        raise PartitionError("KV stream deadline misses exceed samples")
    return samples, misses


def _same_layout(a: DecodeLayout, b: DecodeLayout) -> bool:
    """Two layouts place pages identically (all-layer splits are uniform too)."""
    uniform_a = not a.splits or a.splits == a.layers
    uniform_b = not b.splits or b.splits == b.layers
    if uniform_a or uniform_b:
        return uniform_a and uniform_b and a.mean == b.mean
    return (a.active, a.splits, a.base, a.remainder) == (b.active, b.splits, b.base, b.remainder)


@dataclass
class Controller:
    """The llama layer's adaptive state between evaluations."""

    shape: PoolShape
    partition: Partition
    tuning: Tuning = field(default_factory=Tuning)
    fixed_ring: bool = False
    """``GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS`` is set: the boundary never moves."""
    counters: Counters = Counters(0, 0)
    last_query: int | None = None
    layout: DecodeLayout | None = None

    def evaluate(self, active_tokens: int, query_tokens: int, counters: Counters,
                 busy: float, peak_slots: int) -> Evaluation:
        before = self.partition
        active = -(-active_tokens // PAGE_TOKENS)
        decode_like = (query_tokens <= MAX_DECODE_QUERY_TOKENS
                       and (self.last_query is None or self.last_query <= MAX_DECODE_QUERY_TOKENS))
        self.last_query = query_tokens
        pressure = active > before.resident
        warnings: list[str] = []
        miss_ratio: float | None = None
        samples = 0
        try:
            samples, misses = feedback_delta(counters, self.counters)
            if samples:
                miss_ratio = misses / samples
        except PartitionError as exc:
            warnings.append(f"ignoring invalid CUDA feedback: {exc}")
        self.counters = counters
        previous_layout = self.layout or DecodeLayout(before.resident, 0, self.shape.layers)
        entering = decode_like and pressure and previous_layout.active != active
        after, changed = before, False
        if not pressure:
            after = replace(before, starved=0, overprovisioned=0)
        elif not self.fixed_ring and (samples or entering):
            before_eval = before
            if samples:
                before_eval = replace(before, since_repartition=min(before.since_repartition + 1,
                                                                    NEVER))
            feedback = Feedback(miss=miss_ratio or 0.0, busy=busy,
                                ring_peak=peak_slots / before.ring if before.ring else 0.0)
            try:
                after, changed = adapt_partition(self.shape, before_eval, active, feedback,
                                                 entering, self.tuning)
            except PartitionError as exc:
                warnings.append(f"ignoring invalid partition feedback: {exc}")
        self.partition = after
        if decode_like and active > after.resident:
            layout = decode_layout(after.resident, active, self.shape.layers, after.ring)
        else:
            layout = DecodeLayout(after.resident, 0, self.shape.layers)
        layout_changed = changed or not _same_layout(previous_layout, layout)
        self.layout = layout
        return Evaluation(active, decode_like, pressure, before, after, changed, layout,
                          layout_changed, miss_ratio, busy, tuple(warnings))
