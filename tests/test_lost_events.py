"""Events lost from a trace (gaps in seq): said as ``events-lost``, and the pages whose slot
content the lost events may have changed are not judged (docs/trace-format.md, "Lost events").

The judgement finds the gaps (:mod:`kvdiag.analysis.judgement.gaps`); a streamed chunk marks
them by position (the C walk and the arrays), a list of events by the state between lists:
all must give the same verdicts.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvdiag import compiled
from kvdiag.analysis.judgement import Judge
from kvdiag.model import events as ev
from tests.test_judgement_fastpath import _judged, _lists, _small_chunks, _trace


def _cut(events: list[Any], seed: int) -> tuple[list[Any], int]:
    """``events`` with some lost: single events here and there and one run of 25 (seqs kept).
    Returns the events kept and how many were lost between the first and last kept."""
    rng = random.Random(seed * 7 + 1)
    n = len(events)
    run = rng.randrange(n // 4, n // 2)
    lost = {i for i in range(1, n - 1) if rng.random() < 0.03} | set(range(run, run + 25))
    kept = [e for i, e in enumerate(events) if i not in lost]
    return kept, len(lost)


def _uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})


@pytest.mark.parametrize("seed", range(12))
def test_a_trace_with_events_lost_is_judged_alike_every_way(
        monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """GIVEN a random trace (every class, aliasing, ring cycling, evicts, invalidates) with
    events deleted: single ones and a run of 25
    WHEN it is judged page by page in lists, streamed (the C walk where built) and streamed
    by the arrays alone
    THEN every read's counts, non-exact runs, flows, the summary and the findings are equal,
    and the gaps are counted exactly."""
    events, lost = _cut(_trace(seed), seed)
    detailed = Judge(ledger=True, detail=True)
    for chunk in _lists(events):
        detailed.feed_all(chunk)
    want = _judged(detailed)
    snap = detailed.snapshot()
    assert snap.lost is not None and snap.lost["events"] == lost
    (finding,) = [f for f in snap.findings if f.rule == "events-lost"]
    assert finding.severity.name == "WARNING"
    assert f"{lost} event(s) missing from the trace" in finding.title
    _small_chunks(monkeypatch)
    assert _judged(Judge(ledger=True).feed_all(iter(events))) == want
    _uncompiled(monkeypatch)
    assert _judged(Judge(ledger=True).feed_all(iter(events))) == want


def test_the_gapped_matrix_leaves_pages_not_judged_and_judges_refilled_slots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is worth making: over the seeds, pages read after a gap from
    slots not refilled since are not judged (lost-events), and pages read from slots an
    upload refilled after the gap are judged again (exact, stale or foreign)."""
    not_judged = judged_after = 0
    for seed in range(12):
        events, _ = _cut(_trace(seed), seed)
        snap = Judge().feed_all(iter(events)).snapshot()
        res = snap.residency
        not_judged += res["not_judged"].get("lost-events", 0)
        first_gap = snap.lost["first"][0]["last_seq"] if snap.lost else 0
        later = [e for e in events if type(e) is ev.Read and e.seq > first_gap and e.served]
        judged_after += len(later)
        assert res["read_classes"]["exact"] + res["read_classes"]["foreign"] > 0
    assert not_judged > 100
    assert judged_after > 100


def _ev(cls: type, seq: int, step: int = 0, **fields: Any) -> Any:
    return cls(seq, seq * 10, step, **fields)


def test_a_slot_refilled_after_the_gap_is_judged_one_not_refilled_is_not() -> None:
    """GIVEN pages 0 and 1 uploaded to pool slots 0 and 1, then seqs 4-5 lost (they could
    have been an evict or an upload of another stream's page), then page 1 uploaded again
    WHEN page 0 and page 1 are read
    THEN page 0 is not judged (lost-events), page 1 is exact: its copy is after the gap."""
    events = [
        _ev(ev.Write, 1, layer=0, stream=0, cells=(0, 512), rows=(0, 512)),
        _ev(ev.Upload, 2, layer=0, stream=0, pages=(0, 1), slot=0, target="resident",
            bytes=1, reason="miss"),
        _ev(ev.Upload, 3, layer=0, stream=0, pages=(1, 2), slot=1, target="resident",
            bytes=1, reason="miss"),
        _ev(ev.Upload, 6, step=1, layer=0, stream=0, pages=(1, 2), slot=1, target="resident",
            bytes=1, reason="dirty"),
        _ev(ev.Read, 7, step=1, layer=0, stream=0, pool=2, ring=0, host=0,
            served=(ev.Served(0, 2, "pool", 0),)),
    ]
    for feed in ("list", "stream"):
        judge = Judge()
        if feed == "list":
            for e in events:
                judge.feed(e)
        else:
            judge.feed_all(iter(events))
        snap = judge.snapshot()
        assert snap.residency["read_classes"] == {"exact": 1, "stale": 0, "foreign": 0,
                                                  "not_judged": 1}, feed
        assert snap.residency["not_judged"] == {"lost-events": 1}
        assert snap.lost == {"events": 2, "gaps": 1, "declared_dropped": 0, "first": [
            {"first_seq": 4, "last_seq": 5, "events": 2, "step_before": 0, "step_after": 1,
             "onto_snapshot": False}]}
        (f,) = [f for f in snap.findings if f.rule == "events-lost"]
        assert f.title.startswith("2 event(s) missing from the trace: seq 4–5 (2 events) "
                                  "between step 0 and step 1;")
        assert "1 page(s) in 1 read(s)" in f.title
        assert f.evidence[0].seq == 6 and f.evidence[0].step == 1


def test_no_gap_no_finding_and_a_lost_start_is_said() -> None:
    """Seqs 1, 2, 3: nothing lost. A trace whose first event is seq 3 (not a snapshot) lost
    seqs 1-2 before it; one whose first event is a segment's snapshot lost nothing."""
    w = [_ev(ev.Write, s, layer=0, stream=0, cells=(0, 1), rows=(0, 1)) for s in (1, 2, 3)]
    snap = Judge().feed_all(iter(w)).snapshot()
    assert snap.lost is None and snap.summary()["lost_events"] == {"events": 0, "gaps": 0}
    assert not [f for f in snap.findings if f.rule == "events-lost"]
    snap = Judge().feed_all(w[2:]).snapshot()
    assert snap.lost is not None and snap.lost["first"][0]["first_seq"] == 1
    assert snap.lost["first"][0]["step_before"] is None
    (f,) = [f for f in snap.findings if f.rule == "events-lost"]
    assert "seq 1–2 (2 events) before the first event" in f.title
    snapshot = _ev(ev.Snapshot, 40, reason="rotate")
    snap = Judge().feed_all([snapshot, _ev(ev.Write, 41, layer=0, stream=0, cells=(0, 1),
                                           rows=(0, 1))]).snapshot()
    assert snap.lost is None
