"""Unit tests of the runtime model's rules: fits conditions, views, bookkeeping, scheduler."""

from __future__ import annotations

import pytest

from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.dispatch import route
from kvdiag.kvstream.fits import block_tokens, fits
from kvdiag.kvstream.resident import LayerIdentityError, ResidentCache, classify
from kvdiag.kvstream.scenarios import Request, Scheduler
from kvdiag.kvstream.views import AddressMap, attention_node
from kvdiag.model.pages import Holder

CFG = RuntimeConfig(layers=2, ctx=4096, np=2, stage_mib=12)


def node(cfg: RuntimeConfig = CFG, layer: int = 0, streams: tuple[int, ...] = (0,),
         tokens: int = 1, n_kv: int = 512):  # type: ignore[no-untyped-def]
    return attention_node(cfg, layer, streams, tokens, n_kv, AddressMap())


def test_single_stream_view_fits() -> None:
    n = node()
    assert n.k.ne == (256, 512, 4, 1)
    assert n.k.nb == (34, 34 * 8 * 4, 34 * 8, 34 * 8 * 4 * 2048)
    r = fits(n, 475136)
    assert r.ok and r.failed == () and r.membership


def test_two_stream_view_fails_exactly_the_ne3_conditions() -> None:
    n = node(streams=(0, 1))
    assert n.k.ne[3] == 2 and n.q.ne[3] == 2 and n.dst.ne == (256, 24, 1, 2)
    r = fits(n, 475136)
    assert r.failed == ("Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1")
    assert route("membership", r) == "abort"
    assert route("fits", r) == "fallback"


def test_view_of_stream_1_is_offset_by_one_stream() -> None:
    a, b = node(streams=(0,)), node(streams=(1,))
    assert b.k.data - a.k.data == a.k.nb[3] == 272 * 4 * 2048


def test_non_streamed_layer_fails_runtime_identity_and_routes_ordinary() -> None:
    cfg = CFG.replace(streamed_layers=1)
    n = node(cfg, layer=1)
    assert n.k.buffer == "CUDA0" and n.k.runtime is None
    r = fits(n, 475136)
    assert r.failed[:2] == ("K.runtime!=NULL", "V.runtime!=NULL") and not r.membership
    assert route("membership", r) == "ordinary" and route("fits", r) == "ordinary"


def test_geometry_failures_are_named() -> None:
    cfg = RuntimeConfig(layers=1, head_dim=128, n_head=8, n_head_kv=2, stage_mib=64)
    r = fits(node(cfg), 10 << 20)
    assert "Q.ne[0]==256" in r.failed and "V.ne[0]==256" in r.failed
    n = node(n_kv=300)
    assert "K.ne[1]%256==0" in fits(n, 475136).failed


def test_block_tokens_needs_one_page_in_the_stage() -> None:
    n = node()
    assert block_tokens(n.k, n.v, 475136) == 256
    assert block_tokens(n.k, n.v, 475135) == 0
    assert block_tokens(n.k, n.v, 2 * 475136) == 512
    assert "block_tokens(stage_bytes)>0" in fits(n, 400000).failed


def cache(layout: str) -> ResidentCache:
    return ResidentCache(layout, layer_count=2, pages_per_layer=4, ring_slots=10, n_stream=2,
                         kv_size=2048)  # type: ignore[arg-type]


def test_shared_layout_marks_pages_from_global_rows() -> None:
    c = cache("shared")
    # stream 1, cells 0..2 → global rows 2048..2050 → page 8: outside the 4-page window
    assert c.mark_dirty_rows([2048, 2049, 2050]) == set()
    # stream 0, cells 300, 700 → pages 1 and 2 of every layer
    assert c.mark_dirty_rows([300, 700]) == {(0, None, 1), (0, None, 2), (1, None, 1),
                                             (1, None, 2)}


def test_per_stream_layout_marks_pages_from_local_cells() -> None:
    c = cache("per-stream")
    assert c.window(0) == 2
    assert c.mark_dirty_rows([2048 + 300]) == {(0, 1, 1), (1, 1, 1)}
    assert c.slot((1, 1, 1)) == 10 + 4 + 2 + 1


def test_upload_rule() -> None:
    c = cache("shared")
    c.mark_dirty_rows([0])
    first = c.plan_page(0, 0, 0, q_width=1, last_chunk=False)
    assert first.upload == "miss"
    c.uploaded(first.key, first.slot, Holder(0, 0, 0, 1))
    assert c.plan_page(0, 0, 0, 1, False).upload is None  # dirty flag cleared by the upload
    c.mark_dirty_rows([5])
    assert c.plan_page(0, 0, 0, 1, False).upload == "dirty"
    c.precise = [False, False]
    c.dirty.clear()
    assert c.plan_page(0, 0, 0, q_width=8, last_chunk=False).upload == "wide-query"
    assert c.plan_page(0, 0, 0, q_width=1, last_chunk=True).upload == "last-chunk"
    assert c.plan_page(0, 0, 0, q_width=1, last_chunk=False).upload is None


def test_a_dirty_mark_outlives_its_ubatch_only_in_the_per_stream_layout() -> None:
    # stream 1 page 0 is resident, then a ubatch writes it but uploads nothing (its FA fell
    # back), then the next ubatch writes only page 1
    marks: dict[str, str | None] = {}
    for layout in ("shared", "per-stream"):
        c = cache(layout)
        first = c.plan_page(0, 1, 0, 1, False)
        c.uploaded(first.key, first.slot, Holder(0, 1, 0, 1))
        c.mark_dirty_rows([0, 2048])  # global rows: stream 0 cell 0, stream 1 cell 0
        c.mark_dirty_rows([2048 + 256])  # stream 1 cell 256: page 1
        marks[layout] = c.plan_page(0, 1, 0, 1, False).upload
    assert marks == {"shared": None, "per-stream": "dirty"}  # upstream forgets, the fix not


def test_shared_slots_alias_across_streams() -> None:
    c = cache("shared")
    s0 = c.plan_page(0, 0, 1, 1, False)
    s1 = c.plan_page(0, 1, 1, 1, False)
    assert s0.slot == s1.slot and s0.key == s1.key == (0, None, 1)
    c.uploaded(s0.key, s0.slot, Holder(0, 0, 1, 3))
    assert classify(c.holders[s1.slot], 0, 1, 1, 3) == "foreign"
    assert classify(c.holders[s0.slot], 0, 0, 1, 4) == "stale"
    assert classify(c.holders[s0.slot], 0, 0, 1, 3) == "exact"


def test_layer_identity_is_learned_and_bounded() -> None:
    c = cache("shared")
    assert c.learn(0x1000) == (0, True)
    assert c.learn(0x2000) == (1, True)
    assert c.learn(0x1000) == (0, False)
    with pytest.raises(LayerIdentityError):
        c.learn(0x3000)
    c.forget_layers()
    assert c.learn(0x3000) == (0, True)


def test_scheduler_splits_two_slots_equally() -> None:
    s = Scheduler((Request(0, 600, 2), Request(1, 600, 2)), n_stream=2, n_ubatch=512,
                  kv_size=2048)
    ubs = list(s.ubatches())
    assert [(u.streams, u.tokens) for u in ubs] == [
        ((0, 1), 256), ((0, 1), 256), ((0, 1), 88), ((0, 1), 1), ((0, 1), 1)]
    assert [(lane.cells, lane.positions) for lane in ubs[3].lanes] == [((600,), (600,))] * 2


def test_scheduler_runs_dependent_requests_in_order_and_resets_cells() -> None:
    s = Scheduler((Request(1, 300, 1), Request(0, 300, 1, after=0), Request(1, 100, 0, after=1)),
                  n_stream=2, n_ubatch=512, kv_size=2048)
    ubs = list(s.ubatches())
    assert [(u.streams, u.tokens, u.lanes[0].cells[0]) for u in ubs] == [
        ((1,), 300, 0), ((1,), 1, 300), ((0,), 300, 0), ((0,), 1, 300), ((1,), 100, 0)]


def test_unified_cache_interleaves_sequences_in_one_stream() -> None:
    s = Scheduler((Request(0, 3, 2), Request(1, 2, 1)), n_stream=1, n_ubatch=512, kv_size=256)
    ubs = list(s.ubatches())
    first = ubs[0].lanes[0]
    assert ubs[0].streams == (0,) and ubs[0].tokens == 5
    assert first.requests == (0, 0, 0, 1, 1) and first.cells == (0, 1, 2, 3, 4)
    assert first.positions == (0, 1, 2, 0, 1)
    decode = ubs[1].lanes[0]
    assert decode.requests == (0, 1) and decode.cells == (5, 6) and decode.positions == (3, 2)
    assert ubs[2].lanes[0].cells == (7,) and ubs[2].lanes[0].positions == (4,)


def test_a_new_request_frees_its_slots_cells_in_a_unified_cache() -> None:
    s = Scheduler((Request(0, 4, 0), Request(1, 2, 0), Request(0, 6, 0, after=0)),
                  n_stream=1, n_ubatch=512, kv_size=256)
    ubs = list(s.ubatches())
    # request 2 reuses request 0's cells 0..3 first, then the lowest free ones after slot 1's
    assert ubs[-1].lanes[0].cells == (0, 1, 2, 3, 6, 7)


def test_scheduler_refuses_overflowing_requests() -> None:
    s = Scheduler((Request(0, 3000, 1),), n_stream=2, n_ubatch=512, kv_size=2048)
    with pytest.raises(ValueError, match="raise --ctx"):
        list(s.ubatches())


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ctx", -1, "--ctx must be positive"),
    ("type_k", "q9_9", "not a supported KV type"),
    ("n_head", 7, "not a multiple of --n-head-kv"),
    ("streamed_layers", 9, "--streamed-layers must be between"),
])
def test_config_rejects_nonsense(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RuntimeConfig(**{field: value})  # type: ignore[arg-type]


def test_judge_counts_every_kind_including_unknown_ones() -> None:
    from kvdiag.analysis.judgement import Judge
    from kvdiag.model import events as ev

    j = Judge()
    j.feed(ev.Step(1, 0, 0, phase="decode", streams=(0,), tokens=1, n_kv=256))
    j.feed(ev.Unknown("gpu_clock", 2, 5, 0, {"mhz": 1980}))
    j.feed(ev.Warn(3, 6, 0, message="x"))
    j.feed(ev.Unknown("gpu_clock", 4, 7, 0, {"mhz": 1970}))
    assert j.counts == {"step": 1, "gpu_clock": 2, "warn": 1}
    summary = j.snapshot().summary()
    assert summary["events"] == 4 and summary["steps"] == 1 and j.last_seq == 4


def test_every_condition_fits_can_fail_has_an_explanation() -> None:
    from kvdiag.model.conditions import EXPLAIN

    cases = [
        fits(node(streams=(0, 1)), 475136),
        fits(node(CFG.replace(streamed_layers=1), layer=1), 475136),
        fits(node(RuntimeConfig(layers=1, head_dim=128, n_head=8, n_head_kv=2, stage_mib=64)), 10),
        fits(node(n_kv=300), 475136, sinks=True),
    ]
    failed = {name for r in cases for name in r.failed}
    assert len(failed) >= 10
    assert failed <= set(EXPLAIN)


def test_a_request_arriving_mid_run_joins_the_next_iteration() -> None:
    s = Scheduler((Request(1, 300, 6), Request(0, 100, 1, at=3)), n_stream=2, n_ubatch=512,
                  kv_size=2048)
    ubs = list(s.ubatches())
    # iterations: prompt of slot 1, 2 lone decodes, then slot 0 joins: one token each
    # (split_equal), slot 0's remaining 99 prompt tokens alone, then both decode together
    assert [(u.streams, u.tokens) for u in ubs[:6]] == [
        ((1,), 300), ((1,), 1), ((1,), 1), ((0, 1), 1), ((0,), 99), ((0, 1), 1)]
    assert [(u.streams, u.tokens) for u in ubs[6:]] == [((1,), 1)] * 2
