"""Provenance derived from raw events equals the model's own annotation, read by read.

GIVEN every named scenario captured by the model (both layouts, both dispatch policies, and
the unified cache where the scenario has several slots), WHEN the derivation sees only the
write, upload, invalidate and read.served events, THEN every read's derived ranges equal the
annotated ``ranges`` page by page (same source, holder stream, class and version lag).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdiag.analysis.provenance import Provenance
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.kvstream.config import PRESETS, RuntimeConfig
from kvdiag.kvstream.runner import Runner
from kvdiag.kvstream.scenarios import SCENARIOS, Scenario
from kvdiag.model import events as ev
from tests.test_kvstream_properties import SMALL, ListSink, schedules


def _cases() -> list[tuple[str, str, str, bool]]:
    out = []
    for name, sc in SCENARIOS.items():
        unified = (False, True) if sc.config.get("np", 1) > 1 else (False,)
        for layout in ("shared", "per-stream"):
            for dispatch in ("membership", "fits"):
                out += [(name, layout, dispatch, u) for u in unified]
    return out


CASES = _cases()


@functools.cache
def capture(name: str, layout: str, dispatch: str, unified: bool) -> tuple[Any, ...]:
    """The scenario at a small shape (2 layers, 4 query heads; prompts ≤ 300 tokens, ≤ 4 decode
    steps; pool-pressure keeps 1500 prompt tokens so pages stream through the ring)."""
    sc = SCENARIOS[name]
    values: dict[str, Any] = dict(PRESETS["small"])
    values.update(sc.sizing)
    values.update(sc.config)
    values.update(layers=2, n_head=4, layout=layout, dispatch=dispatch, kv_unified=unified)
    prompt = 1500 if name == "pool-pressure" else 300
    small = dataclasses.replace(sc, requests=tuple(
        dataclasses.replace(r, prompt=min(r.prompt, prompt), decode=min(r.decode, 4))
        for r in sc.requests))
    sink = ListSink()
    Runner(RuntimeConfig(**values), small, NumpyExecutor()).run(sink)
    return tuple(sink.events)


def derive_and_compare(events: tuple[Any, ...] | list[Any]) -> Counter[tuple[str, str]]:
    """Assert derived == annotated for every read; return pages per (source, class)."""
    p = Provenance()
    seen: Counter[tuple[str, str]] = Counter()
    for e in events:
        p.feed(e)
        if isinstance(e, ev.Read):
            assert e.served, f"read #{e.seq} has no served runs"
            assert p.ranges(e) == e.ranges, f"read #{e.seq} step {e.step} layer {e.layer}"
            assert sum(s.end - s.begin for s in e.served) == e.pool + e.ring + e.host
            for r in e.ranges:
                seen[(r.source, r.cls)] += r.end - r.begin
    return seen


def test_the_matrix_covers_every_scenario_and_the_unified_cache() -> None:
    assert len(CASES) == 36  # multiturn-growth (np 1) adds 4
    assert {c[0] for c in CASES} == set(SCENARIOS)
    assert sum(1 for c in CASES if c[3]) == 12  # three two-slot scenarios × 2 × 2


@pytest.mark.parametrize(("name", "layout", "dispatch", "unified"), CASES)
def test_derived_provenance_equals_the_model_annotation(
    name: str, layout: str, dispatch: str, unified: bool
) -> None:
    events = capture(name, layout, dispatch, unified)
    seen = derive_and_compare(events)
    reads = sum(1 for e in events if isinstance(e, ev.Read))
    aborted_at_first_node = any(isinstance(e, ev.Abort) and e.step == 0 for e in events)
    assert reads > 0 or aborted_at_first_node
    assert sum(seen.values()) == sum(e.pool + e.ring + e.host for e in events
                                     if isinstance(e, ev.Read))


def test_the_matrix_exercises_every_verdict_and_source() -> None:
    """The comparison above is not vacuous: stale and foreign pool pages, ring pages and host
    (fallback) pages all occur, where the two bugs and the pool sizing say they must."""
    aliasing = derive_and_compare(capture("slot1-first", "shared", "membership", False))
    assert aliasing[("pool", "stale")] > 0 and aliasing[("pool", "foreign")] > 0
    assert derive_and_compare(capture("pool-pressure", "shared", "membership", False))[
        ("ring", "exact")] > 0
    assert derive_and_compare(capture("two-slot-concurrent", "shared", "fits", False))[
        ("host", "exact")] > 0
    fixed = derive_and_compare(capture("slot1-first", "per-stream", "membership", False))
    assert set(fixed) == {("pool", "exact")}


def test_derivation_ignores_the_annotation_and_the_write_versions() -> None:
    """Strip ``ranges`` and ``versions`` (what a native trace lacks): same verdicts."""
    events = capture("slot1-first", "shared", "membership", False)
    p, bare = Provenance(), Provenance()
    for e in events:
        p.feed(e)
        stripped: Any = e
        if isinstance(e, ev.Write):
            stripped = msgspec.structs.replace(e, versions=())
        elif isinstance(e, ev.Read):
            stripped = msgspec.structs.replace(e, ranges=())
        bare.feed(stripped)
        if isinstance(e, ev.Read):
            assert bare.ranges(stripped) == e.ranges


def test_stale_verdict_names_the_copy_and_the_lag() -> None:
    """The first stale page of slot1-first (shared): its copy was made by an upload earlier
    than the write that made the host page newer."""
    events = capture("slot1-first", "shared", "membership", False)
    p = Provenance()
    for e in events:
        p.feed(e)
        if isinstance(e, ev.Read):
            stale = [v for v in p.pages(e) if v.cls == "stale"]
            if stale:
                v = stale[0]
                assert v.copy is not None and v.copy.stream == e.stream == 1
                assert v.lag == v.version - v.copy.version >= 1
                assert v.copy.step < e.step
                page_writes = [w for w in events if isinstance(w, ev.Write) and w.seq < e.seq
                               and (w.layer, w.stream) == (e.layer, e.stream)
                               and w.cells[0] // 256 <= v.page <= (w.cells[1] - 1) // 256]
                assert page_writes[-1].step == e.step  # the write the copy missed
                return
    raise AssertionError("no stale page found")


def test_invalidate_empties_every_slot() -> None:
    w = ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, 10), rows=(0, 10))
    up = ev.Upload(2, 0, 0, layer=0, stream=0, pages=(0, 1), slot=5, target="resident",
                   bytes=1, reason="miss")
    read = ev.Read(4, 0, 1, layer=0, stream=0, pool=1, ring=0, host=0,
                   served=(ev.Served(0, 1, "pool", 5),))
    p = Provenance()
    for e in (w, up):
        p.feed(e)
    assert p.ranges(read) == (ev.ReadRange(0, 1, "pool", 0, "exact"),)
    p.feed(ev.Invalidate(3, 0, 1, reason="reconfigure"))
    assert p.ranges(read) == (ev.ReadRange(0, 1, "pool", -1, "foreign"),)


def test_a_ring_copy_counts_only_in_its_own_step() -> None:
    up = ev.Upload(1, 0, 0, layer=0, stream=0, pages=(3, 5), slot=0, target="ring",
                   bytes=1, reason="ring")
    read = ev.Read(2, 0, 0, layer=0, stream=0, pool=0, ring=2, host=0,
                   served=(ev.Served(3, 5, "ring", 0),))
    p = Provenance()
    p.feed(up)
    assert p.ranges(read) == (ev.ReadRange(3, 5, "ring", 0, "exact"),)
    later = msgspec.structs.replace(read, step=1)
    assert p.ranges(later) == (ev.ReadRange(3, 5, "ring", -1, "foreign"),)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), np_=st.integers(1, 3), layers=st.integers(1, 2),
       stage=st.integers(2, 5), layout=st.sampled_from(["shared", "per-stream"]),
       dispatch=st.sampled_from(["membership", "fits"]))
def test_random_schedules_derive_the_annotation(data: st.DataObject, np_: int, layers: int,
                                                stage: int, layout: str, dispatch: str) -> None:
    cfg = RuntimeConfig(layers=layers, np=np_, stage_mib=stage, layout=layout,  # type: ignore[arg-type]
                        dispatch=dispatch, **SMALL)  # type: ignore[arg-type]
    sink = ListSink()
    Runner(cfg, Scenario("random", "", {}, data.draw(schedules(np_))), NumpyExecutor()).run(sink)
    derive_and_compare(sink.events)


def test_out_of_range_pages_and_slots_are_ignored_not_allocated() -> None:
    """A damaged or hostile trace (a page index of 10^12) neither hangs nor allocates: the
    events are left out of the derivation and counted."""
    huge = 10**12
    p = Provenance()
    p.feed(ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, huge), rows=(0, huge)))
    p.feed(ev.Write(2, 0, 0, layer=0, stream=0, cells=(-512, 10), rows=(0, 10)))
    p.feed(ev.Upload(3, 0, 0, layer=0, stream=0, pages=(0, 1), slot=huge, target="resident",
                     bytes=1, reason="miss"))
    p.feed(ev.Upload(4, 0, 0, layer=0, stream=0, pages=(0, huge), slot=0, target="ring",
                     bytes=1, reason="ring"))
    read = ev.Read(5, 0, 0, layer=0, stream=0, pool=1, ring=0, host=0,
                   served=(ev.Served(0, huge, "pool", 0), ev.Served(-3, 1, "host", -1)))
    assert p.exact_pages(read) is None
    assert p.ranges(read) == () and p.pages(read) == []
    assert p.out_of_range == 4 + 2 + 2


def test_repeated_ring_copies_in_one_step_stay_bounded_and_the_last_wins() -> None:
    p = Provenance()
    p.feed(ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, 256 * 4), rows=(0, 1024)))
    for i in range(1000):
        p.feed(ev.Upload(2 + i, 0, 0, layer=0, stream=0, pages=(0, 4), slot=0, target="ring",
                         bytes=1, reason="ring"))
    assert len(p._ring[(0, 0)][1]) == 1
    read = ev.Read(5000, 0, 0, layer=0, stream=0, pool=0, ring=4, host=0,
                   served=(ev.Served(0, 4, "ring", 0),))
    assert p.exact_pages(read) == 4
    p.feed(ev.Write(5001, 0, 0, layer=0, stream=0, cells=(300, 301), rows=(300, 301)))
    assert p.ranges(read) == (ev.ReadRange(0, 1, "ring", 0, "exact"),
                              ev.ReadRange(1, 2, "ring", 0, "stale", 1),
                              ev.ReadRange(2, 4, "ring", 0, "exact"))
    (stale,) = [v for v in p.pages(read) if v.cls == "stale"]
    assert stale.copy is not None and stale.copy.seq == 1001  # the last copy of page 1
