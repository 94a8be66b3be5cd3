"""The adaptive resident/ring partition of the fixed page pool (brief §1.10; [PLAN], [PLAN-H]).

The pool holds ``total`` pages: ``resident`` pages per layer for each of ``layers`` layers, the
rest is the transfer ring. After an evaluation the llama layer (``kv_stream_adapt``) asks
:func:`adapt_partition` whether to move the boundary:

- the *overlap target* is the largest resident count ≤ the active pages (and leaving the
  minimum ring) whose ring holds at least ``ratio`` × the pages one layer streams;
- *starved*: above that target, or (above the target less one page) missing more than 1 % of
  the deadlines while the copy engine is below 80 % busy; *overprovisioned*: at most 1 %
  misses, copy engine below 50 % busy and ring peak occupancy below 50 %;
- entering the decode layout above the target jumps straight to it; after the cooldown a ring
  grown past the target less one page comes back to that floor; a starved streak of
  ``grow`` evaluations demotes one page from every layer (or jumps to the target when above
  it); an overprovisioned streak of ``shrink`` evaluations promotes one page per layer when
  the ring keeps its minimum plus one page per layer.

The invariant ``resident × layers + ring == total`` and the ring minimum are checked first,
with the runtime's own error strings, so that a trace or log that breaks them is recognised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

MISS_THRESHOLD = 0.01
"""Deadline miss ratio above which the ring is starved ([PLAN])."""
COPY_SATURATED = 0.80
"""Copy-engine busy ratio at or above which more ring cannot help ([PLAN])."""
COPY_LIGHT = 0.50
RING_LIGHT = 0.50
FEEDBACK_GROWTH_PAGES = 1
"""How far below the overlap target feedback may push the resident count ([PLAN])."""
NEVER = 2**32 - 1
"""``evaluations_since_repartition`` before the first repartition (UINT32_MAX upstream)."""


class PartitionError(ValueError):
    """A partition the runtime would reject; the message is the runtime's own ([PLAN])."""


@dataclass(frozen=True)
class Tuning:
    """Partition parameters and their defaults ([PLAN-H])."""

    ratio: float = 1.10
    """Target ring working-set ratio: ring slots per page one attention layer streams."""
    grow: int = 3
    """Starved evaluations in a row before a growth step."""
    shrink: int = 8
    """Overprovisioned evaluations in a row before a promotion."""
    cooldown: int = 64
    """Evaluations after a repartition before the next one."""


@dataclass(frozen=True)
class PoolShape:
    total: int
    """Pages in the fixed pool (resident + ring)."""
    layers: int
    minimum_ring: int


@dataclass(frozen=True)
class Partition:
    """The boundary and the controller's streak counters."""

    resident: int
    """Resident pages per layer."""
    ring: int
    starved: int = 0
    overprovisioned: int = 0
    since_repartition: int = NEVER


@dataclass(frozen=True)
class Feedback:
    """One evaluation's timing feedback, as ratios in [0, 1]."""

    miss: float
    """Deadline misses / samples."""
    busy: float
    """Copy-stream busy time / evaluation time."""
    ring_peak: float
    """Peak ring occupancy / ring slots."""


def check(shape: PoolShape, previous: Partition, active: int, tuning: Tuning,
          feedback: Feedback) -> None:
    """The validity checks ``llama_kv_stream_partition_adapt`` makes, in its order."""
    if shape.total == 0 or shape.layers == 0:
        raise PartitionError("KV stream partition geometry must be non-zero")
    if min(tuning.grow, tuning.shrink, tuning.cooldown) <= 0:
        raise PartitionError("KV stream partition hysteresis must be non-zero")
    if not all(0.0 <= r <= 1.0 for r in (feedback.miss, feedback.busy, feedback.ring_peak)):
        raise PartitionError("KV stream partition metrics must be ratios")
    if not math.isfinite(tuning.ratio) or tuning.ratio <= 0.0:
        raise PartitionError("KV stream target working-set ratio must be positive")
    if previous.resident > active:
        raise PartitionError("resident KV pages exceed active pages")
    if previous.resident * shape.layers + previous.ring != shape.total:
        raise PartitionError("previous KV stream partition does not cover the fixed pool")
    if previous.ring < shape.minimum_ring:
        raise PartitionError("previous KV stream ring is below its minimum")


def overlap_target(shape: PoolShape, active: int, ratio: float) -> int:
    """Largest resident count whose ring covers ``ratio`` × the pages one layer streams.

    The condition ``total − r·L ≥ ratio·(active − r)`` only gets easier as r falls (while
    ratio < L), so the largest r that satisfies it is found by bisection; when even r = 0
    fails, 0 is the answer, as upstream's descending search ends there.
    """
    maximum = min(active, (shape.total - shape.minimum_ring) // shape.layers)

    def fits(resident: int) -> bool:
        return (resident == active
                or shape.total - resident * shape.layers >= ratio * (active - resident))

    if fits(maximum):
        return maximum
    if ratio >= shape.layers or not fits(0):
        return 0
    low, high = 0, maximum
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def adapt_partition(shape: PoolShape, previous: Partition, active: int, feedback: Feedback,
                    entering_decode: bool, tuning: Tuning = Tuning()) -> tuple[Partition, bool]:
    """One ``kv_stream_adapt`` decision: the next partition and whether it changed.

    ``active`` is the active pages per layer (ceil(active tokens / 256)). Raises
    :class:`PartitionError` where the runtime would report invalid partition feedback.
    """
    check(shape, previous, active, tuning, feedback)
    target = overlap_target(shape, active, tuning.ratio)
    floor = target - FEEDBACK_GROWTH_PAGES if target > FEEDBACK_GROWTH_PAGES else 0
    resident = previous.resident
    below_target = resident > target
    feedback_starved = (resident > floor and feedback.miss > MISS_THRESHOLD
                        and feedback.busy < COPY_SATURATED)
    starved = below_target or feedback_starved
    light = (feedback.miss <= MISS_THRESHOLD and feedback.busy < COPY_LIGHT
             and feedback.ring_peak < RING_LIGHT)
    streaks = replace(previous,
                      starved=previous.starved + 1 if starved else 0,
                      overprovisioned=previous.overprovisioned + 1 if light else 0)
    cooled = previous.since_repartition >= tuning.cooldown
    new: int | None = None
    if entering_decode and below_target:
        new = target
    elif cooled and resident < floor:
        new = floor
    elif cooled and starved and streaks.starved >= tuning.grow and resident > 0:
        new = target if below_target else resident - 1
    elif (cooled and light and streaks.overprovisioned >= tuning.shrink and resident < target
          and previous.ring >= shape.minimum_ring + shape.layers):
        new = resident + 1
    if new is None:
        return streaks, False
    return Partition(resident=new, ring=shape.total - new * shape.layers,
                     since_repartition=0), True
