"""Properties of the runtime model over random configurations and request schedules.

The claims kvdiag makes about the two fixes must hold for any schedule, not only the named
scenarios: with per-stream bookkeeping (or a single stream) every resident read is exact and
every output equals the fully resident reference; pool sizing always partitions the pool.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdiag.analysis.judgement import Judge, Judgement
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.pool import PoolError, plan_pool
from kvdiag.kvstream.runner import Runner
from kvdiag.kvstream.scenarios import Request, Scenario
from kvdiag.model import events as ev


class ListSink:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, cls: type[Any], step: int, **fields: Any) -> Any:
        e = cls(len(self.events) + 1, 0, step, **fields)
        self.events.append(e)
        return e

    def end_step(self) -> None:
        pass


@st.composite
def schedules(draw: st.DrawFn, n_slots: int) -> tuple[Request, ...]:
    n = draw(st.integers(1, 4))
    requests: list[Request] = []
    for i in range(n):
        after = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        requests.append(Request(slot=draw(st.integers(0, n_slots - 1)),
                                prompt=draw(st.integers(1, 700)),
                                decode=draw(st.integers(0, 4)), after=after))
    return tuple(requests)


def run(cfg: RuntimeConfig, requests: tuple[Request, ...]) -> tuple[Judgement, list[Any]]:
    sink = ListSink()
    runner = Runner(cfg, Scenario("random", "", {}, requests), NumpyExecutor())
    runner.run(sink)
    sink.events.append(ev.End(len(sink.events) + 1, 0, 0, status="completed", steps=0,
                              events=len(sink.events)))
    return Judge().feed_all(sink.events).snapshot(), sink.events


SMALL = dict(head_dim=256, n_head=2, n_head_kv=1, ctx=4096, type_k="q8_0", type_v="q4_0")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), np_=st.integers(1, 3), layers=st.integers(1, 3),
       stage=st.integers(2, 6), dispatch=st.sampled_from(["membership", "fits"]))
def test_per_stream_layout_is_always_exact(data: st.DataObject, np_: int, layers: int,
                                           stage: int, dispatch: str) -> None:
    cfg = RuntimeConfig(layers=layers, np=np_, stage_mib=stage, layout="per-stream",
                        dispatch=dispatch, **SMALL)  # type: ignore[arg-type]
    requests = data.draw(schedules(np_))
    a, events = run(cfg, requests)
    rules = {f.rule for f in a.findings}
    assert not rules & {"stale-page-read", "foreign-page-read", "stream-divergence"}
    # two slots in one ubatch: the upstream dispatcher aborts, the fixed one falls back
    shared_ubatch = any(isinstance(e, ev.Step) and len(e.streams) > 1 for e in events)
    assert ("abort" in rules) == (shared_ubatch and dispatch == "membership")
    assert ("fallback" in rules) == (shared_ubatch and dispatch == "fits")


def test_per_stream_fits_refreshes_a_page_rewritten_by_a_fallback_ubatch() -> None:
    """Found by the property above. Both slots' first requests share ubatch 0 (fallback); slot
    1 finishes its prompt alone in ubatch 1, loading its page 0; both slots' second requests
    share ubatch 2 (fallback), rewriting that page; slot 1 then decodes alone in ubatch 3.
    Ubatch 2's ordinary attention uploads nothing, so its dirty mark for (0, 1, 0) must
    survive ubatch 3's mark_dirty_rows: the page is re-uploaded and read exact."""
    cfg = RuntimeConfig(layers=1, np=2, stage_mib=2, layout="per-stream", dispatch="fits",
                        **SMALL)  # type: ignore[arg-type]
    requests = (Request(slot=0, prompt=1, decode=0), Request(slot=1, prompt=2, decode=0),
                Request(slot=0, prompt=256, decode=0), Request(slot=1, prompt=256, decode=1))
    a, events = run(cfg, requests)
    assert [f.rule for f in a.findings] == ["fallback"]
    steps = [(e.step, e.streams) for e in events if isinstance(e, ev.Step)]
    assert steps == [(0, (0, 1)), (1, (1,)), (2, (0, 1)), (3, (1,))]
    assert [(e.step, e.route) for e in events if isinstance(e, ev.Fits)] == [
        (0, "fallback"), (1, "streamed"), (2, "fallback"), (3, "streamed")]
    uploads = [(e.step, e.stream, e.pages, e.reason) for e in events
               if isinstance(e, ev.Upload) and e.target == "resident"]
    assert uploads == [(1, 1, (0, 1), "miss"), (3, 1, (0, 2), "dirty")]
    last = [e for e in events if isinstance(e, ev.Read) and e.step == 3]
    assert [(r.stream, r.pool, r.host) for r in last] == [(1, 2, 0)]
    assert last[0].ranges == (ev.ReadRange(0, 2, "pool", 1, "exact", 0),)
    outputs = [(e.step, e.stream, e.max_abs_delta, e.checksum == e.ref_checksum)
               for e in events if isinstance(e, ev.Output)]
    assert outputs == [(0, 0, 0.0, True), (0, 1, 0.0, True), (1, 1, 0.0, True),
                       (2, 0, 0.0, True), (2, 1, 0.0, True), (3, 1, 0.0, True)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), np_=st.integers(1, 3), layers=st.integers(1, 3), stage=st.integers(2, 6))
def test_a_single_stream_is_always_exact_even_with_shared_bookkeeping(
    data: st.DataObject, np_: int, layers: int, stage: int
) -> None:
    cfg = RuntimeConfig(layers=layers, np=np_, kv_unified=True, stage_mib=stage,
                        layout="shared", dispatch="membership", **SMALL)  # type: ignore[arg-type]
    a, _ = run(cfg, data.draw(schedules(np_)))
    assert [f.rule for f in a.findings] == []
    assert a.residency["routes"].keys() <= {"streamed"}


@given(pool_mib=st.integers(1, 4096), page_kib=st.integers(64, 2048), layers=st.integers(1, 64),
       conversion_kib=st.integers(0, 2048))
def test_pool_sizing_partitions_the_pool(pool_mib: int, page_kib: int, layers: int,
                                         conversion_kib: int) -> None:
    pool, page, conv = pool_mib << 20, page_kib << 10, conversion_kib << 10
    try:
        p = plan_pool(pool, page, layers, conv)
    except PoolError:
        assert conv > pool or (pool - conv) // page <= layers or \
            ((pool - conv) // page - min(8, (pool - conv) // page - layers)) // layers == 0
        return
    assert p.resident_pages_per_layer * layers + p.ring_slots == p.pool_pages
    assert p.ring_slots >= p.min_ring_slots == min(8, p.pool_pages - layers)
    assert p.pool_pages * page <= pool - conv
