"""The judgement of raw events agrees with the model's own annotation, read by read and page by
page, and follows what each slot holds on hand-written traces.

GIVEN every named scenario captured by the model (both layouts, both dispatch policies, the
unified cache where the scenario has several slots, and ring-heavy variants where one read
cycles through the ring), WHEN the Judge sees the events, THEN every page's verdict equals the
annotated ``ranges`` (source, holder stream, class, version lag), and the judgement never
reads the annotation (stripping it changes nothing).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdiag.analysis.judgement import Judge
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.runner import Runner
from kvdiag.kvstream.scenarios import SCENARIOS, Scenario
from kvdiag.model import events as ev
from kvdiag.model.geometry import Tensor
from tests.judged_captures import CASES, RING_CASES, capture
from tests.test_kvstream_properties import SMALL, ListSink, schedules


def annotated_pages(e: ev.Read) -> dict[int, tuple[str, int, str, int]]:
    return {page: (r.source, r.holder, r.cls, r.version_lag)
            for r in e.ranges for page in range(r.begin, r.end)}


def judge_and_compare(events: tuple[Any, ...] | list[Any]) -> Counter[tuple[str, str]]:
    """Assert judged == annotated for every page of every read; return pages per
    (source, class)."""
    j = Judge(detail=True)
    seen: Counter[tuple[str, str]] = Counter()
    for e in events:
        j.feed(e)
        if isinstance(e, ev.Read):
            assert e.served, f"read #{e.seq} has no served runs"
            judged = {p.page: (p.source, (p.holder.stream if p.holder else -1)
                               if p.cls == "foreign" else e.stream, p.cls, p.lag)
                      for p in j.pages(e)}
            assert judged == annotated_pages(e), f"read #{e.seq} step {e.step} layer {e.layer}"
            assert sum(s.end - s.begin for s in e.served) == e.pool + e.ring + e.host
            assert j.last is not None and sum(j.last.counts) == e.pool + e.ring + e.host
            for p in j.pages(e):
                seen[(p.source, p.cls)] += 1
    snap = j.snapshot()
    assert snap.residency["cross_check"] == {"annotation_disagrees": 0, "versions_disagree": 0,
                                           "snapshot_replaced": 0}
    # what check runs (no per-page detail: exact pages take the quick path) judges the same
    quick = Judge().feed_all(events).snapshot()
    assert quick.residency == snap.residency
    assert [f.title for f in quick.findings] == [f.title for f in snap.findings]
    return seen


def test_the_matrix_covers_every_scenario_and_the_unified_cache() -> None:
    assert len(CASES) == 36  # multiturn-growth (np 1) adds 4
    assert {c[0] for c in CASES} == set(SCENARIOS)
    assert sum(1 for c in CASES if c[3]) == 12  # three two-slot scenarios × 2 × 2


@pytest.mark.parametrize(("name", "layout", "dispatch", "unified"), CASES)
def test_judged_pages_equal_the_model_annotation(
    name: str, layout: str, dispatch: str, unified: bool
) -> None:
    events = capture(name, layout, dispatch, unified)
    seen = judge_and_compare(events)
    reads = sum(1 for e in events if isinstance(e, ev.Read))
    aborted_at_first_node = any(isinstance(e, ev.Abort) and e.step == 0 for e in events)
    assert reads > 0 or aborted_at_first_node
    assert sum(seen.values()) == sum(e.pool + e.ring + e.host for e in events
                                     if isinstance(e, ev.Read))


@pytest.mark.parametrize(("name", "layout", "extra"), RING_CASES,
                         ids=[f"{n}-{lay}-{'-'.join(map(str, x.values()))}"
                              for n, lay, x in RING_CASES])
def test_ring_heavy_captures_equal_the_model_annotation(name: str, layout: str,
                                                        extra: dict[str, Any]) -> None:
    events = capture(name, layout, "fits", False, **extra)
    seen = judge_and_compare(events)
    assert seen[("ring", "exact")] > 0


def test_one_read_cycles_through_the_ring_in_the_matrix() -> None:
    """The ring rule's cycling case occurs: a read names one ring slot for two pages."""
    events = capture("pool-pressure", "shared", "fits", False, stage_mib=3, ring_slots=1)
    most = 0
    for e in events:
        if isinstance(e, ev.Read):
            uses = Counter(s.slot + i for s in e.served if s.source == "ring"
                           for i in range(s.end - s.begin))
            most = max(most, max(uses.values(), default=0))
    assert most >= 2


def test_the_matrix_exercises_every_verdict_and_source() -> None:
    aliasing = judge_and_compare(capture("slot1-first", "shared", "membership", False))
    assert aliasing[("pool", "stale")] > 0 and aliasing[("pool", "foreign")] > 0
    assert judge_and_compare(capture("pool-pressure", "shared", "membership", False))[
        ("ring", "exact")] > 0
    assert judge_and_compare(capture("two-slot-concurrent", "shared", "fits", False))[
        ("host", "exact")] > 0
    fixed = judge_and_compare(capture("slot1-first", "per-stream", "membership", False))
    assert set(fixed) == {("pool", "exact")}


def test_judgement_ignores_the_annotation_and_the_write_versions() -> None:
    """Strip ``ranges`` and ``versions`` (what a native trace lacks): same verdicts."""
    events = capture("slot1-first", "shared", "membership", False)
    full, bare = Judge(detail=True), Judge(detail=True)
    for e in events:
        full.feed(e)
        stripped: Any = e
        if isinstance(e, ev.Write):
            stripped = msgspec.structs.replace(e, versions=())
        elif isinstance(e, ev.Read):
            stripped = msgspec.structs.replace(e, ranges=())
        bare.feed(stripped)
        if isinstance(e, ev.Read):
            assert bare.pages(stripped) == full.pages(e)
    a, b = full.snapshot(), bare.snapshot()
    assert a.residency["read_classes"] == b.residency["read_classes"]
    assert [f.title for f in a.findings] == [f.title for f in b.findings]


def test_stale_verdict_names_the_copy_the_lag_and_the_missed_write() -> None:
    """The first stale page of slot1-first (shared): its copy was made by an upload earlier
    than the write that made the host page newer; that write is the flow's start."""
    events = capture("slot1-first", "shared", "membership", False)
    j = Judge(flows=True, detail=True)
    for e in events:
        j.feed(e)
        if isinstance(e, ev.Read):
            stale = [v for v in j.pages(e) if v.cls == "stale"]
            if stale:
                v = stale[0]
                assert v.holder is not None and v.holder.stream == e.stream == 1
                assert v.lag == v.version - v.holder.version >= 1
                assert v.holder.step < e.step
                page_writes = [w for w in events if isinstance(w, ev.Write) and w.seq < e.seq
                               and (w.layer, w.stream) == (e.layer, e.stream)
                               and w.cells[0] // 256 <= v.page <= (w.cells[1] - 1) // 256]
                assert page_writes[-1].step == e.step  # the write the copy missed
                assert page_writes[-1].seq in j.missed_writes()
                return
    raise AssertionError("no stale page found")


# -- hand-written traces -------------------------------------------------------------------

def W(seq: int, step: int, layer: int, stream: int, c0: int, c1: int) -> ev.Write:
    return ev.Write(seq, 0, step, layer=layer, stream=stream, cells=(c0, c1), rows=(c0, c1))


def U(seq: int, step: int, layer: int, stream: int, p0: int, p1: int, slot: int,
      target: str = "resident") -> ev.Upload:
    return ev.Upload(seq, 0, step, layer=layer, stream=stream, pages=(p0, p1), slot=slot,
                     target=target, bytes=1,  # type: ignore[arg-type]
                     reason="ring" if target == "ring" else "miss")


def R(seq: int, step: int, layer: int, stream: int, *served: tuple[int, int, str, int]
      ) -> ev.Read:
    runs = tuple(ev.Served(*s) for s in served)  # type: ignore[arg-type]
    n = {src: sum(s.end - s.begin for s in runs if s.source == src)
         for src in ("pool", "ring", "host")}
    return ev.Read(seq, 0, step, layer=layer, stream=stream, pool=n["pool"], ring=n["ring"],
                   host=n["host"], served=runs)


def F(seq: int, step: int, layer: int) -> ev.Fits:
    """The FA node of ``layer`` dispatched to the streamed kernel (its read follows)."""
    blank = Tensor("", "", (0, 0, 0, 0), (0, 0, 0, 0))
    return ev.Fits(seq, 0, step, node="__fattn__", layer=layer, q=blank, k=blank, v=blank,
                   dst=blank, stage_bytes=1, result=True, route="streamed")


def classes(j: Judge, read: ev.Read) -> list[tuple[int, str, str]]:
    """(page, class, holder) after feeding ``read``."""
    j.detail = True  # pages() lists every page
    j.feed(read)
    return [(p.page, p.cls, "-" if p.holder is None else
             f"L{p.holder.layer}s{p.holder.stream}p{p.holder.page}v{p.holder.version}")
            for p in j.pages(read)]


def test_a_ring_slot_reused_by_another_layer_within_one_step_is_foreign() -> None:
    """Layer 0 copies pages 2..3 into ring slots 0..1; before layer 0 reads them, layer 1
    copies its own pages into the same slots (no consumed gating). Layer 0 reads layer 1's
    bytes: foreign, holding layer 1's pages — not "stale", not exact."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 1024), W(2, 0, 1, 0, 0, 1024),
              U(3, 0, 0, 0, 2, 4, 0, "ring"), U(4, 0, 1, 0, 2, 4, 0, "ring")):
        j.feed(e)
    assert classes(j, R(5, 0, 0, 0, (2, 4, "ring", 0))) == [
        (2, "foreign", "L1s0p2v1"), (3, "foreign", "L1s0p3v1")]
    assert classes(j, R(6, 0, 1, 0, (2, 4, "ring", 0))) == [
        (2, "exact", "L1s0p2v1"), (3, "exact", "L1s0p3v1")]
    (finding,) = [f for f in j.snapshot().findings if f.rule == "foreign-page-read"]
    assert "2 foreign ring page(s)" in finding.title and "another layer's" in finding.title
    assert "ring slots 0..1" in finding.evidence[0].text
    assert "held layer 1 stream 0 pages 2..3" in finding.evidence[0].text


def test_a_ring_that_cycles_within_one_read_judges_each_page_by_its_copy() -> None:
    """Four ring pages through two ring slots, copied after the layer's FA node was
    dispatched: each slot is copied twice before the read; the read consumed the copies in
    order (the consumed event gates reuse): all exact. A write to page 4 after its copy makes
    exactly that page stale."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), F(2, 0, 0), U(3, 0, 0, 0, 2, 4, 0, "ring"),
              U(4, 0, 0, 0, 4, 6, 0, "ring")):
        j.feed(e)
    read = R(5, 0, 0, 0, (2, 4, "ring", 0), (4, 6, "ring", 0))
    assert [c[:2] for c in classes(j, read)] == [(2, "exact"), (3, "exact"), (4, "exact"),
                                                 (5, "exact")]
    j.feed(W(6, 0, 0, 0, 4 * 256, 4 * 256 + 1))
    again = msgspec.structs.replace(read, seq=7)
    got = classes(j, again)
    assert [c[:2] for c in got] == [(2, "exact"), (3, "exact"), (4, "stale"), (5, "exact")]


def test_a_prefetch_that_overruns_the_ring_before_the_dispatch_is_foreign() -> None:
    """The same four pages through two slots, copied before the FA node was dispatched (a
    prefetch at the start of the ubatch): no copy can have waited for a kernel not launched
    yet, so pages 2-3 were replaced by pages 4-5 before the read began — foreign, holding
    them (kvrt's --ring-prefetch with more ring pages than slots: its bytes say so)."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), U(2, 0, 0, 0, 2, 4, 0, "ring"),
              U(3, 0, 0, 0, 4, 6, 0, "ring"), F(4, 0, 0)):
        j.feed(e)
    read = R(5, 0, 0, 0, (2, 4, "ring", 0), (4, 6, "ring", 0))
    assert classes(j, read) == [(2, "foreign", "L0s0p4v1"), (3, "foreign", "L0s0p5v1"),
                                (4, "exact", "L0s0p4v1"), (5, "exact", "L0s0p5v1")]
    # one copy after the dispatch: it cycled within the read, the one before did not
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), U(2, 0, 0, 0, 2, 4, 0, "ring"), F(3, 0, 0),
              U(4, 0, 0, 0, 4, 6, 0, "ring")):
        j.feed(e)
    assert [c[:2] for c in classes(j, msgspec.structs.replace(read, seq=5))] == [
        (2, "exact"), (3, "exact"), (4, "exact"), (5, "exact")]


def test_without_a_dispatch_a_ring_cycling_within_a_read_is_not_judged() -> None:
    """No fits event of the layer: nothing says whether the copy that replaced a page came
    after the read began, so the replaced pages are not judged (and the fits kind is said to
    be missing, with those pages), never guessed exact or foreign."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), U(2, 0, 0, 0, 2, 4, 0, "ring"),
              U(3, 0, 0, 0, 4, 6, 0, "ring")):
        j.feed(e)
    got = classes(j, R(4, 0, 0, 0, (2, 4, "ring", 0), (4, 6, "ring", 0)))
    assert [c[:2] for c in got] == [(2, "not judged"), (3, "not judged"), (4, "exact"),
                                    (5, "exact")]
    snap = j.snapshot()
    assert snap.residency["not_judged"] == {"fits": 2}
    (fits,) = [f for f in snap.findings if f.details.get("what") == "fits"]
    assert fits.details["pages"] == 2 and "2 page(s) not judged" in fits.title


def test_a_ring_cycle_overwritten_by_another_view_in_between_is_foreign() -> None:
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), W(2, 0, 0, 1, 0, 6 * 256), F(3, 0, 0),
              U(4, 0, 0, 0, 2, 3, 0, "ring"), U(5, 0, 0, 1, 0, 1, 0, "ring"),
              U(6, 0, 0, 0, 3, 4, 0, "ring")):
        j.feed(e)
    got = classes(j, R(7, 0, 0, 0, (2, 3, "ring", 0), (3, 4, "ring", 0)))
    assert got == [(2, "foreign", "L0s1p0v1"), (3, "exact", "L0s0p3v1")]


def test_a_read_split_into_two_events_is_one_ring_batch() -> None:
    """kvtrace.h writes a read of more than KVTRACE_READ_RUNS runs as several events: the
    second part still consumes the copies made before the first."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 6 * 256), F(2, 0, 0), U(3, 0, 0, 0, 2, 3, 0, "ring"),
              U(4, 0, 0, 0, 3, 4, 0, "ring"), U(5, 0, 0, 0, 4, 5, 0, "ring")):
        j.feed(e)
    assert classes(j, R(6, 0, 0, 0, (2, 3, "ring", 0)))[0][1] == "exact"
    assert classes(j, R(7, 0, 0, 0, (3, 4, "ring", 0)))[0][1] == "exact"
    assert classes(j, R(8, 0, 0, 0, (4, 5, "ring", 0)))[0][1] == "exact"


def test_a_ring_copy_from_an_earlier_step_is_judged_by_what_the_slot_still_holds() -> None:
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 1024), U(2, 0, 0, 0, 3, 4, 0, "ring")):
        j.feed(e)
    assert classes(j, R(3, 1, 0, 0, (3, 4, "ring", 0)))[0][:2] == (3, "exact")
    j.feed(W(4, 1, 0, 0, 3 * 256, 3 * 256 + 1))
    assert classes(j, R(5, 2, 0, 0, (3, 4, "ring", 0)))[0][:2] == (3, "stale")
    j.feed(U(6, 2, 0, 0, 1, 2, 0, "ring"))
    j.feed(R(7, 2, 0, 0, (1, 2, "ring", 0)))
    assert classes(j, R(8, 3, 0, 0, (3, 4, "ring", 0)))[0][:2] == (3, "foreign")


def test_pool_and_ring_slots_are_separate_namespaces() -> None:
    """Ring slot 0 and pool slot 0 are different places (the ring is its own area)."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 1024), U(2, 0, 0, 0, 0, 1, 0), U(3, 0, 0, 0, 3, 4, 0, "ring")):
        j.feed(e)
    got = classes(j, R(4, 0, 0, 0, (0, 1, "pool", 0), (3, 4, "ring", 0)))
    assert [c[:2] for c in got] == [(0, "exact"), (3, "exact")]


def test_invalidate_and_evict_empty_slots() -> None:
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 10), U(2, 0, 0, 0, 0, 2, 5)):
        j.feed(e)
    assert [c[1] for c in classes(j, R(3, 0, 0, 0, (0, 2, "pool", 5)))] == ["exact", "exact"]
    j.feed(ev.Evict(4, 0, 0, slot=6, layer=0, page=1, stream=0, bytes=1, reason="replaced"))
    assert classes(j, R(5, 0, 0, 0, (0, 2, "pool", 5))) == [(0, "exact", "L0s0p0v1"),
                                                            (1, "foreign", "-")]
    j.feed(ev.Invalidate(6, 0, 1, reason="reconfigure"))
    assert [c[1] for c in classes(j, R(7, 1, 0, 0, (0, 2, "pool", 5)))] == ["foreign"] * 2


def test_a_slot_holding_another_streams_page_is_foreign_and_says_whose() -> None:
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 10), W(2, 0, 0, 1, 0, 10), U(3, 0, 0, 1, 0, 1, 7)):
        j.feed(e)
    assert classes(j, R(4, 0, 0, 0, (0, 1, "pool", 7))) == [(0, "foreign", "L0s1p0v1")]
    (f,) = [f for f in j.snapshot().findings if f.rule == "foreign-page-read"]
    assert f.title.startswith("stream 0 read 1 foreign resident page(s) holding other bytes "
                              "(1 another stream's)")


def test_without_uploads_slot_pages_are_not_judged_and_said_so() -> None:
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 10), ev.Step(2, 0, 0, phase="decode", streams=(0,), tokens=1,
                                             n_kv=256)):
        j.feed(e)
    assert classes(j, R(3, 0, 0, 0, (0, 2, "pool", 0), (2, 3, "host", -1))) == [
        (0, "not judged", "-"), (1, "not judged", "-"), (2, "exact", "-")]
    snap = j.snapshot()
    assert snap.residency["read_classes"] == {"exact": 1, "stale": 0, "foreign": 0,
                                              "not_judged": 2}
    rules = {f.rule for f in snap.findings}
    assert "foreign-page-read" not in rules and "stale-page-read" not in rules
    upload = [f for f in snap.findings if f.rule == "not-recorded"
              and f.details.get("what") == "upload"]
    assert upload and upload[0].details["pages"] == 2
    assert "inferred from the trace" in upload[0].title


def test_without_writes_exact_versus_stale_is_not_judged_but_foreign_is() -> None:
    j = Judge()
    for e in (U(1, 0, 0, 0, 0, 2, 0), U(2, 0, 0, 1, 5, 6, 2)):
        j.feed(e)
    got = classes(j, R(3, 0, 0, 0, (0, 3, "pool", 0)))
    assert [c[:2] for c in got] == [(0, "not judged"), (1, "not judged"), (2, "foreign")]
    (w,) = [f for f in j.snapshot().findings if f.details.get("what") == "write"]
    assert w.rule == "not-recorded" and w.details["pages"] == 2


def test_a_declared_record_list_overrides_inference() -> None:
    """A writer that declares it records uploads: a read of a slot never uploaded is foreign
    (declared), where the same trace without a declaration is not judged (inferred)."""
    events = [W(1, 0, 0, 0, 0, 10), R(2, 0, 0, 0, (0, 1, "pool", 0))]
    inferred = Judge().feed_all(events).snapshot()
    declared = Judge(records=["write", "upload", "read.served", "step"]).feed_all(
        events).snapshot()
    assert inferred.residency["read_classes"]["not_judged"] == 1
    assert declared.residency["read_classes"]["foreign"] == 1
    assert declared.completeness.source == "declared"
    # and invalidate: declared without it while a page is read from a slot
    assert {k.kind for k in declared.completeness.missing} == {"fits", "output", "invalidate"}


def test_a_trace_of_nothing_judges_nothing_and_says_so() -> None:
    end = ev.End(1, 0, 0, status="completed", steps=0, events=0)
    snap = Judge().feed_all([end]).snapshot()
    (f,) = snap.findings
    assert f.rule == "not-recorded" and "nothing was judged" in f.title
    assert snap.steps.count == 0


def test_steps_are_the_span_of_step_numbers_recorded_or_not() -> None:
    warn = [ev.Warn(i + 1, 0, s, message="x") for i, s in enumerate((0, 0, 1, 2))]
    snap = Judge().feed_all(warn).snapshot()
    assert (snap.steps.count, snap.steps.recorded) == (3, 0)
    assert "numbered by the writer" in snap.steps.text()
    # no step events; and with neither reads nor fits nor an abort, reads are not recorded
    assert [f.details["what"] for f in snap.findings if f.rule == "not-recorded"] == [
        "step", "read"]


def test_the_ledger_counts_equal_the_totals() -> None:
    events = capture("slot1-first", "shared", "membership", False)
    j = Judge(ledger=True).feed_all(events)
    snap = j.snapshot()
    assert snap.ledger is not None
    reads = snap.ledger.reads.array
    rc = snap.residency["read_classes"]
    assert int(reads["stale"].sum()) == rc["stale"] > 0
    assert int(reads["foreign"].sum()) == rc["foreign"] > 0
    pieces = snap.ledger.pieces.array
    assert int((pieces["end"] - pieces["begin"]).sum()) == rc["stale"] + rc["foreign"]
    assert len(snap.ledger.flows) > 0
    read_rows = [i for i, e in enumerate(events) if isinstance(e, ev.Read)]
    assert reads["row"].tolist() == read_rows
    stale_steps = sorted({e.step for e in events if isinstance(e, ev.Read)
                          and any(r.cls == "stale" for r in e.ranges)})
    assert snap.ledger.steps_with("stale").tolist() == stale_steps


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), np_=st.integers(1, 3), layers=st.integers(1, 2),
       stage=st.integers(2, 5), layout=st.sampled_from(["shared", "per-stream"]),
       dispatch=st.sampled_from(["membership", "fits"]))
def test_random_schedules_judge_as_the_annotation(data: st.DataObject, np_: int, layers: int,
                                                  stage: int, layout: str,
                                                  dispatch: str) -> None:
    cfg = RuntimeConfig(layers=layers, np=np_, stage_mib=stage, layout=layout,  # type: ignore[arg-type]
                        dispatch=dispatch, **SMALL)  # type: ignore[arg-type]
    sink = ListSink()
    Runner(cfg, Scenario("random", "", {}, data.draw(schedules(np_))), NumpyExecutor()).run(sink)
    judge_and_compare(sink.events)


def test_out_of_range_pages_and_slots_are_not_believed_not_allocated() -> None:
    huge = 10**12
    j = Judge(detail=True)
    j.feed(ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, huge), rows=(0, huge)))
    j.feed(ev.Write(2, 0, 0, layer=0, stream=0, cells=(-512, 10), rows=(0, 10)))
    j.feed(ev.Upload(3, 0, 0, layer=0, stream=0, pages=(0, 1), slot=huge, target="resident",
                     bytes=1, reason="miss"))
    j.feed(ev.Upload(4, 0, 0, layer=0, stream=0, pages=(0, huge), slot=0, target="ring",
                     bytes=1, reason="ring"))
    read = ev.Read(5, 0, 0, layer=0, stream=0, pool=1, ring=0, host=0,
                   served=(ev.Served(0, huge, "pool", 0), ev.Served(-3, 1, "host", -1)))
    j.feed(read)
    assert j.pages(read) == []
    assert j.snapshot().residency["out_of_range"] == 4 + 2


def test_many_ring_copies_stay_bounded() -> None:
    j = Judge()
    j.feed(ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, 256 * 4), rows=(0, 1024)))
    j.feed_all(U(2 + i, 0, 0, 0, 0, 4, 0, "ring") for i in range(40000))
    from kvdiag.analysis.judgement.slots import RING_LOG

    assert RING_LOG <= j.state.ring_log.size < RING_LOG + 4 * 8192  # one chunk's copies more
    assert [c[1] for c in classes(j, R(30000, 0, 0, 0, (0, 4, "ring", 0)))] == ["exact"] * 4


def test_unsigned_64_bit_values_are_not_believed_and_do_not_crash() -> None:
    """A trace's integers may be unsigned 64-bit (kvtrace.h writes pointers so): values past
    the signed range in a layer, cells, slot or step are clipped and left out, not a crash."""
    big = (1 << 64) - 1
    events = [
        ev.Write(1, 0, big, layer=big, stream=0, cells=(0, big), rows=(0, 1)),
        ev.Upload(2, 0, 0, layer=0, stream=big, pages=(big - 1, big), slot=big,
                  target="resident", bytes=big, reason="miss"),
        ev.Read(3, 0, 0, layer=big, stream=0, pool=1, ring=0, host=0,
                served=(ev.Served(0, 1, "pool", big),)),
        ev.End(4, 0, 0, status="completed", steps=1, events=3),
    ]
    snap = Judge().feed_all(events).snapshot()
    assert snap.residency["out_of_range"] == 1  # the write; the upload's pages clip to none
    assert snap.residency["read_classes"]["not_judged"] == 1
    assert snap.residency["not_judged"] == {"out-of-range": 1}
    assert snap.steps.last == 1 << 62


def test_an_abort_without_fits_decisions_does_not_make_reads_expected() -> None:
    """The inference expects reads when attention ran, or when nothing says it did not: no fits
    decision and no abort. CompletenessTracker.aborts was never counted, so a crash that killed
    the run before any FA node (its abort all a trace shows) was said to miss its reads."""
    crash = [ev.Step(1, 0, 0, phase="prefill", streams=(0,), tokens=512, n_kv=512),
             W(2, 0, 0, 0, 0, 512),
             ev.Abort(3, 0, 0, message="llama-kv-cache.cpp:812: GGML_ASSERT(n_tokens % "
                      "n_stream == 0) failed", file="llama-kv-cache.cpp", line=812,
                      condition="n_tokens % n_stream == 0")]
    died = Judge().feed_all(crash).snapshot()
    # its write shows a ubatch ran, so a fits decision was due; a read was not
    assert [k.kind for k in died.completeness.missing] == ["fits"]
    assert [f.rule for f in died.findings] == ["abort", "not-recorded", "trace-incomplete"]
    ran = Judge().feed_all(crash[:2]).snapshot()  # the same run, no abort: reads expected
    assert [k.kind for k in ran.completeness.missing] == ["fits", "read"]


def test_pages_lists_every_page_of_a_read_the_run_level_check_found_exact() -> None:
    """A read whose pool slots its chunk leaves alone is found exact run by run, its pages
    not expanded (without ``detail``): ``pages`` still lists each of them (it once listed
    none, and a kvrt comparison saw pages the judgement had not judged)."""
    j = Judge()
    j.feed_all([W(1, 0, 0, 0, 0, 4 * 256), U(2, 0, 0, 0, 0, 4, 8)])
    read = R(3, 1, 0, 0, (0, 4, "pool", 8))
    j.feed(read)
    verdict = j.verdict(read)
    assert verdict is not None and verdict.counts == (4, 0, 0, 0)
    assert [(p.page, p.slot, p.cls, p.version) for p in j.pages(read)] == [
        (0, 8, "exact", 1), (1, 9, "exact", 1), (2, 10, "exact", 1), (3, 11, "exact", 1)]
