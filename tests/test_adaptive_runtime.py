"""The controller coupled to the model's resident cache: events, reshaping, invalidation."""

from __future__ import annotations

from kvdiag.kvstream.adaptive import AdaptiveRuntime
from kvdiag.kvstream.pool import plan_pool
from kvdiag.kvstream.resident import ResidentCache
from kvdiag.kvstream.timing import H200
from kvdiag.model import events as ev
from kvdiag.model.pages import Holder

PAGE = 475_136
MIB = 1 << 20


def runtime(stage_mib: int = 64, layers: int = 4, fixed: bool = False) -> AdaptiveRuntime:
    pool = plan_pool(stage_mib * MIB, PAGE, layers, 0, None)
    cache = ResidentCache("shared", layers, pool.resident_pages_per_layer, pool.ring_slots,
                          n_stream=1, kv_size=65536)
    return AdaptiveRuntime(cache, pool, H200, fixed_ring=fixed)


def kinds(events: list[tuple[type, dict[str, object]]]) -> list[type]:
    return [cls for cls, _ in events]


def test_no_pressure_records_the_evaluation_and_changes_nothing() -> None:
    rt = runtime()
    resident = rt.pool.resident_pages_per_layer  # 31 pages of 256 tokens
    out = rt.after_evaluation(n_kv=resident * 256, query_tokens=1, streams=1)
    assert kinds(out) == [ev.Adapt]
    fields = out[0][1]
    assert (fields["samples"], fields["misses"], fields["resident"]) == (0, 0, resident)


def test_decode_beyond_residency_concentrates_the_layout_and_clears_the_cache() -> None:
    rt = runtime(stage_mib=256, layers=16)  # 564 pages: 34 per layer, ring 20
    pool = rt.pool
    assert (pool.resident_pages_per_layer, pool.ring_slots) == (34, 20)
    rt.cache.uploaded((0, None, 0), pool.ring_slots, Holder(0, 0, 0, 1))
    rt.cache.loaded.add((0, None, 0))
    out = rt.after_evaluation(n_kv=42 * 256, query_tokens=1, streams=1)
    # 42 active pages: the overlap target stays 34, so no repartition, but the deficit of
    # 8 x 16 pages moves into max(min(16, ceil(128/20)), ceil(128/42)) = 7 split layers
    assert kinds(out) == [ev.Adapt, ev.Invalidate] and out[1][1] == {"reason": "layout"}
    cache = rt.cache
    assert sum(cache.layer_pages) == 34 * 16 and cache.ring_slots == 20
    assert sorted(set(cache.layer_pages)) == [42 - 128 // 7 - 1, 42 - 128 // 7, 42]
    assert sum(1 for p in cache.layer_pages if p < 42) == 7
    assert cache.layer_offsets == [sum(cache.layer_pages[:i]) for i in range(16)]
    assert not cache.loaded and not cache.holders
    assert out[0][1]["layout"] == 42
    # the next token in the same page: same layout, nothing cleared
    assert kinds(rt.after_evaluation(n_kv=42 * 256 - 100, query_tokens=1, streams=1)) == [ev.Adapt]


def test_entering_decode_far_beyond_residency_jumps_to_the_overlap_target() -> None:
    rt = runtime()  # 4 layers, 141 pages: 33 per layer, ring 9
    out = rt.after_evaluation(n_kv=73 * 256, query_tokens=1, streams=1)
    rep = dict(out)[ev.Repartition]
    # 141 - 4 r >= 1.1 (73 - r)  =>  r <= 20
    assert rep["resident"] == (33, 20) and rep["ring"] == (9, 61)
    assert rep["reason"] == "grow-ring"
    assert dict(out)[ev.Invalidate] == {"reason": "repartition"}
    assert rt.cache.ring_slots == 61


def test_a_fixed_ring_never_repartitions() -> None:
    rt = runtime(fixed=True)
    active = rt.pool.resident_pages_per_layer + 40
    for i in range(200):
        out = rt.after_evaluation(n_kv=active * 256 + i, query_tokens=1, streams=1)
        assert ev.Repartition not in kinds(out)
    assert rt.controller.partition.resident == rt.pool.resident_pages_per_layer
