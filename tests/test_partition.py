"""The adaptive partition rule and the decode layout (brief §1.5, §1.10), rule by rule.

Where a case carries upstream's own numbers ([PLAN] unit tests: a 16-layer target model), the
expected result is upstream's; the others are built here, one per rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdiag.kvstream.adapt import Controller, Counters, feedback_delta
from kvdiag.kvstream.partition import (
    NEVER,
    Feedback,
    Partition,
    PartitionError,
    PoolShape,
    Tuning,
    adapt_partition,
    overlap_target,
)
from kvdiag.model.decode_layout import DecodeLayout, decode_layout

QUIET = Feedback(miss=0.0, busy=0.6, ring_peak=0.6)  # neither starved nor light


def test_entering_decode_jumps_to_the_overlap_target_before_feedback() -> None:
    # upstream: pool 6971 pages, 16 layers, 673 active pages, ring minimum 11, 435/11 -> 418/283
    shape = PoolShape(total=6971, layers=16, minimum_ring=11)
    after, changed = adapt_partition(shape, Partition(435, 11, since_repartition=0), 673,
                                     Feedback(0.0, 0.0, 0.0), entering_decode=True)
    assert changed and (after.resident, after.ring) == (418, 283)
    assert after.resident * 16 + after.ring == 6971


def test_a_starved_streak_reaching_the_grow_hysteresis_demotes_to_the_target() -> None:
    # upstream: pool 630, 16 layers, 257 active, minimum 22; the target is 23 pages per layer
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    assert overlap_target(shape, 257, 1.10) == 23
    prev = Partition(24, 630 - 24 * 16, starved=2)
    after, changed = adapt_partition(shape, prev, 257, QUIET, entering_decode=False)
    assert changed and (after.resident, after.ring) == (23, 262)
    assert (after.starved, after.overprovisioned, after.since_repartition) == (0, 0, 0)


def test_copy_pressure_stops_demotion_at_the_target() -> None:
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    prev = Partition(23, 262, starved=5)
    after, changed = adapt_partition(shape, prev, 257, Feedback(0.20, 0.90, 0.9), False)
    assert not changed and after.resident == 23 and after.starved == 0


def test_feedback_starvation_demotes_one_page_below_the_target_only() -> None:
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    starving = Feedback(miss=0.05, busy=0.40, ring_peak=1.0)
    state = Partition(23, 262)
    for _ in range(2):  # below the grow hysteresis of 3: streak only
        state, changed = adapt_partition(shape, state, 257, starving, False)
        assert not changed
    state, changed = adapt_partition(shape, state, 257, starving, False)
    assert changed and state.resident == 22
    # at the floor (target - 1) feedback no longer starves, even after the cooldown
    state = Partition(22, 630 - 22 * 16)
    for _ in range(10):
        state, changed = adapt_partition(shape, state, 257, starving, False)
        assert not changed and state.starved == 0


def test_misses_with_a_saturated_copy_engine_are_not_starvation() -> None:
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    state = Partition(23, 262)
    for _ in range(5):
        state, changed = adapt_partition(shape, state, 257, Feedback(0.5, 0.85, 1.0), False)
        assert not changed and state.starved == 0


def test_overprovisioned_streak_of_eight_promotes_one_page_per_layer() -> None:
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    light = Feedback(miss=0.0, busy=0.2, ring_peak=0.3)
    state = Partition(21, 630 - 21 * 16)  # below the target 23, above the floor? floor is 22
    # 21 < floor 22: after the cooldown an overgrown ring returns to the floor first
    state, changed = adapt_partition(shape, state, 257, light, False)
    assert changed and state.resident == 22
    state = Partition(22, 630 - 22 * 16, since_repartition=NEVER)
    for i in range(7):
        state, changed = adapt_partition(shape, state, 257, light, False)
        assert not changed and state.overprovisioned == i + 1
    state, changed = adapt_partition(shape, state, 257, light, False)
    assert changed and (state.resident, state.ring) == (23, 630 - 23 * 16)


def test_the_cooldown_holds_every_move_but_decode_entry() -> None:
    shape = PoolShape(total=630, layers=16, minimum_ring=22)
    starving = Feedback(0.5, 0.1, 1.0)
    state = Partition(30, 630 - 30 * 16, starved=10, since_repartition=63)
    state2, changed = adapt_partition(shape, state, 257, starving, False)
    assert not changed and state2.starved == 11
    cooled = Partition(30, 630 - 30 * 16, starved=10, since_repartition=64)
    after, changed = adapt_partition(shape, cooled, 257, starving, False)
    assert changed and after.resident == 23
    entering, changed = adapt_partition(shape, state, 257, QUIET, entering_decode=True)
    assert changed and entering.resident == 23


@pytest.mark.parametrize(("prev", "active", "feedback", "message"), [
    (Partition(10, 10), 100, QUIET, "previous KV stream partition does not cover the fixed pool"),
    (Partition(40, 0), 100, QUIET, "previous KV stream ring is below its minimum"),
    (Partition(30, 40), 20, QUIET, "resident KV pages exceed active pages"),
    (Partition(30, 40), 100, Feedback(1.5, 0.0, 0.0), "KV stream partition metrics must be ratios"),
])
def test_invalid_partitions_raise_the_runtimes_messages(
        prev: Partition, active: int, feedback: Feedback, message: str) -> None:
    shape = PoolShape(total=160, layers=4, minimum_ring=8)
    with pytest.raises(PartitionError, match=message):
        adapt_partition(shape, prev, active, feedback, False)


def test_feedback_counter_errors() -> None:
    assert feedback_delta(Counters(10, 2), Counters(4, 1)) == (6, 1)
    with pytest.raises(PartitionError, match="moved backwards"):
        feedback_delta(Counters(3, 0), Counters(4, 0))
    with pytest.raises(PartitionError, match="misses exceed samples"):
        feedback_delta(Counters(5, 4), Counters(4, 0))


def test_decode_layout_spreads_the_deficit_over_evenly_placed_split_layers() -> None:
    # 16 layers averaging 20 resident pages, 24 active, 40 ring slots: deficit 64 pages
    layout = decode_layout(resident=20, active=24, layers=16, ring=40)
    assert layout.splits == max(min(16, -(-64 // 40)), -(-64 // 24)) == 3
    assert (layout.base, layout.remainder) == (21, 1)
    assert layout.split_layers() == (0, 5, 10)
    caps = [layout.capacity(i) for i in range(16)]
    assert caps[0] == 24 - 21 - 1 and caps[5] == caps[10] == 24 - 21
    assert all(c == 24 for i, c in enumerate(caps) if i not in (0, 5, 10))
    assert sum(24 - c for c in caps) == 64  # exactly the deficit streams
    assert decode_layout(30, 24, 16, 40) == DecodeLayout(30, 24, 16)


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 48), resident=st.integers(0, 600), extra=st.integers(1, 400),
       ring=st.integers(1, 700))
def test_decode_layout_capacity_sums_to_the_pool_share(layers: int, resident: int, extra: int,
                                                       ring: int) -> None:
    active = resident + extra
    layout = decode_layout(resident, active, layers, ring)
    caps = [layout.capacity(i) for i in range(layers)]
    assert sum(caps) == resident * layers
    assert all(0 <= c <= active for c in caps)
    assert sum(1 for c in caps if c < active) <= layout.splits


@settings(max_examples=150, deadline=None)
@given(layers=st.integers(1, 24), pages=st.integers(40, 3000), min_ring=st.integers(1, 8),
       steps=st.lists(st.tuples(st.integers(1, 200_000), st.integers(1, 600),
                                st.integers(0, 50), st.integers(0, 100), st.integers(0, 64)),
                      min_size=1, max_size=60),
       fixed=st.booleans())
def test_the_pool_invariant_holds_under_random_schedules(
        layers: int, pages: int, min_ring: int,
        steps: list[tuple[int, int, int, int, int]], fixed: bool) -> None:
    if pages - min_ring < layers:
        return
    shape = PoolShape(pages, layers, min_ring)
    start = (pages - min_ring) // layers
    ctl = Controller(shape, Partition(start, pages - start * layers), fixed_ring=fixed)
    samples = misses = 0
    for active_tokens, query, new_samples, busy, peak in steps:
        samples += new_samples
        misses += new_samples // 3
        peak = min(peak, ctl.partition.ring)  # the ring cannot hold more than its slots
        ev = ctl.evaluate(active_tokens, query, Counters(samples, misses), busy / 100, peak)
        p = ctl.partition
        assert p.resident * layers + p.ring == pages
        assert p.ring >= min_ring
        if fixed:
            assert p.resident == start and not ev.repartitioned
        assert not ev.warnings


def test_a_prompt_growing_past_residency_grows_the_ring_then_shrinks_after_the_cooldown() -> None:
    shape = PoolShape(total=400, layers=8, minimum_ring=8)
    ctl = Controller(shape, Partition(49, 8))
    samples = misses = 0
    history = []
    # decode from 20 000 tokens (79 pages > 49 resident): entering the decode layout demotes
    for i in range(200):
        samples += 32
        starving = i < 80  # misses while the copy engine has headroom, then light load
        misses += 4 if starving else 0
        ev = ctl.evaluate(20_000 + i, 1, Counters(samples, misses), 0.3 if starving else 0.1,
                          peak_slots=2)
        history.append((ev.after.resident, ev.after.ring, ev.repartitioned))
    moves = [i for i, h in enumerate(history) if h[2]]
    # decode entry jumps to the overlap target (45: 400 - 8r >= 1.1 (79 - r)) at once; the
    # starved ring grows by one page per layer when the cooldown of 64 evaluations ends; the
    # light load gives that page back one cooldown later, after 8 light evaluations
    assert moves == [0, 64, 128]
    assert [history[i][0] for i in moves] == [45, 44, 45]
    assert all(r * 8 + g == 400 for r, g, _ in history)


def test_zero_hysteresis_is_refused() -> None:
    shape = PoolShape(total=160, layers=4, minimum_ring=8)
    with pytest.raises(PartitionError, match="hysteresis must be non-zero"):
        adapt_partition(shape, Partition(30, 40), 100, QUIET, False, Tuning(cooldown=0))
