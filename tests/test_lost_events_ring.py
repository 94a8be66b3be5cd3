"""Ring rule 3 across events lost from a trace (a gap in seq; docs/trace-format.md, "Lost
events"): a read after the gap whose consumed ring copy may lie in or before the gap is not
judged (``lost-events``), never exact, stale or foreign by copies the trace no longer shows;
what the events after the gap show is judged as before.

Rule 3 (kvdiag/analysis/judgement/slots.py) walks a ring slot's copies back over the read's
*batch*. At a gap the Judge used to close every view's batch, so the first copy after the gap
began a new one, and a walk that reached it without meeting the page's copy called the page
foreign — though the copy the read consumed was made before the gap. Every trace here is
judged five ways (one event at a time, one list, in chunks of 2, streamed with the C walk where
built, streamed by the arrays alone) and all must agree.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from kvdiag import compiled
from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.classes import CLASSES, WHY_KEY
from kvdiag.model import events as ev
from tests.test_judgement import F, R, U, W
from tests.test_judgement_fastpath import _judged

PAGE = 256
"""Cells per page (a write of cells [c0, c1) touches pages c0 // 256 .. (c1 - 1) // 256)."""


def _verdicts(events: list[Any], monkeypatch: pytest.MonkeyPatch
              ) -> tuple[dict[str, int], dict[str, int], dict[int, list[tuple[Any, ...]]]]:
    """Judge ``events`` every way; assert the ways agree; return the read classes, the
    not-judged reasons and, per read seq, its non-exact pages as (begin, end, class, holder
    page, why)."""
    one = Judge(ledger=True, detail=True)
    for e in events:
        one.feed(e)
    want = _judged(one)
    listed = Judge(ledger=True)
    listed.feed_all(list(events))
    assert _judged(listed) == want, "one list"
    pairs = Judge(ledger=True)
    pairs.feed_all(list(events), size=2)
    assert _judged(pairs) == want, "chunks of 2"
    assert _judged(Judge(ledger=True).feed_all(iter(events))) == want, "streamed"
    with monkeypatch.context() as m:
        m.setenv("KVDIAG_COMPILED", "0")
        m.setattr(compiled, "_loaded", {})
        assert _judged(Judge(ledger=True).feed_all(iter(events))) == want, "arrays alone"
    snap = one.snapshot()
    led = snap.ledger
    assert led is not None
    seqs = led.reads.array["seq"].tolist()
    pieces: dict[int, list[tuple[Any, ...]]] = {}
    for p in led.pieces.array.tolist():
        read, begin, end, _src, _slot, cls, _lag, _hl, _hs, h_page = p[:10]
        pieces.setdefault(seqs[read], []).append(
            (begin, end, CLASSES[cls], h_page, WHY_KEY.get(p[13], "")))
    return snap.residency["read_classes"], snap.residency["not_judged"], pieces


def _without(events: list[Any], *seqs: int) -> list[Any]:
    return [e for e in events if e.seq not in seqs]


def _lost(events: list[Any]) -> dict[str, Any] | None:
    return Judge().feed_all(list(events)).snapshot().lost


# layer 0 stream 0 is the view V read through ring slot 0; layer 1 is another view
_CYCLE = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 0), U(3, 0, 0, 0, 2, 3, 0, "ring"),
          W(4, 0, 1, 0, 0, PAGE), U(5, 0, 0, 0, 4, 5, 0, "ring"),
          R(6, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
"""The ring cycles within one read: page 2 copied into slot 0, then page 4 over it after the
dispatch; the read consumed each in turn: both exact."""


def test_a_cycled_page_whose_copy_went_before_the_gap_is_not_judged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the cycling read whole, and with seq 4 lost (a write of another layer: between
    page 2's copy and page 4's)
    THEN whole: both pages exact; with the gap: page 4 exact (its copy is after the gap),
    page 2 not judged (lost-events) — it was called foreign, holding page 4."""
    classes, why, pieces = _verdicts(_CYCLE, monkeypatch)
    assert classes == {"exact": 2, "stale": 0, "foreign": 0, "not_judged": 0}
    assert pieces == {}
    cut = _without(_CYCLE, 4)
    classes, why, pieces = _verdicts(cut, monkeypatch)
    assert classes == {"exact": 1, "stale": 0, "foreign": 0, "not_judged": 1}
    assert why == {"lost-events": 1}
    assert pieces == {6: [(2, 3, "not judged", -1, "lost-events")]}
    assert _lost(cut) == {"events": 1, "gaps": 1, "declared_dropped": 0, "first": [
        {"first_seq": 4, "last_seq": 4, "events": 1, "step_before": 0, "step_after": 0,
         "onto_snapshot": False}]}


def test_a_view_first_seen_after_the_gap_may_have_its_first_copies_in_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN layer 1's events, then seqs 3-4 lost (layer 0's write and its copy of page 2
    into ring slot 0), then layer 0's dispatch, its copy of page 4 over slot 0 and its read
    of pages 2 and 4 — layer 0 appears only after the gap
    THEN page 2 is not judged (lost-events), not foreign: its batch may hold lost copies."""
    whole = [W(1, 0, 1, 0, 0, PAGE), U(2, 0, 1, 0, 0, 1, 3), W(3, 0, 0, 0, 0, 6 * PAGE),
             U(4, 0, 0, 0, 2, 3, 0, "ring"), F(5, 0, 0), U(6, 0, 0, 0, 4, 5, 0, "ring"),
             R(7, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    # the whole trace: page 4's copy came after the dispatch, the ring cycled within the read
    classes, _, pieces = _verdicts(whole, monkeypatch)
    assert pieces == {} and classes["exact"] == 2
    classes, why, pieces = _verdicts(_without(whole, 3, 4), monkeypatch)
    assert why == {"lost-events": 1}
    assert pieces == {7: [(2, 3, "not judged", -1, "lost-events")]}
    assert classes == {"exact": 1, "stale": 0, "foreign": 0, "not_judged": 1}


def test_a_gap_before_the_first_event_leaves_the_batch_open_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the cycling read with seqs 1-2 lost (the trace starts at seq 3, no snapshot: the
    gap is before row 0, and layer 0's write and page 2's copy are gone), then another
    layer's write, layer 0's dispatch, page 4 copied over ring slot 0 and the read
    THEN page 2 is not judged (lost-events), page 4 is exact by its copy after the gap."""
    trace = [W(3, 0, 1, 0, 0, PAGE), F(4, 0, 0), U(5, 0, 0, 0, 4, 5, 0, "ring"),
             R(6, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    classes, why, pieces = _verdicts(trace, monkeypatch)
    assert why == {"lost-events": 1}
    assert pieces == {6: [(2, 3, "not judged", -1, "lost-events")]}
    assert classes == {"exact": 1, "stale": 0, "foreign": 0, "not_judged": 1}
    lost = _lost(trace)
    assert lost is not None and lost["first"][0]["step_before"] is None
    # without a dispatch of the layer on either side of the gap the walk stops at page 4's
    # copy, and were the ring cycling it would go on into the gap: lost-events (the read's
    # own dispatch may be among the lost events), never foreign — it said "fits"
    trace = [W(3, 0, 1, 0, 0, PAGE), U(4, 0, 0, 0, 4, 5, 0, "ring"),
             R(5, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    _, why, pieces = _verdicts(trace, monkeypatch)
    assert pieces == {5: [(2, 3, "not judged", -1, "lost-events")]}
    assert why == {"lost-events": 1}


def test_a_walk_without_a_dispatch_names_the_gap_only_when_it_would_end_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``fits`` of layer 0 anywhere (only layer 1's, before the gap). GIVEN page 2 copied
    into ring slot 0, seq 4 (another layer's write) lost, page 4 copied over it, and the read
    of pages 2 and 4
    THEN whole: page 2 not judged for want of the dispatch (fits: page 2's copy is in the
    walk, only when the read began is unknown); with seq 4 lost: lost-events (page 2's copy
    lies before the gap, where the walk cannot go). With page 2's copy after the gap too, the
    walk's answer is after it: fits again. Without a gap or a dispatch: fits."""
    whole = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 1), U(3, 0, 0, 0, 2, 3, 0, "ring"),
             W(4, 0, 1, 0, 0, PAGE), U(5, 0, 0, 0, 4, 5, 0, "ring"),
             R(6, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    classes, why, pieces = _verdicts(whole, monkeypatch)
    assert pieces == {6: [(2, 3, "not judged", -1, "fits")]} and why == {"fits": 1}
    assert classes == {"exact": 1, "stale": 0, "foreign": 0, "not_judged": 1}
    classes, why, pieces = _verdicts(_without(whole, 4), monkeypatch)
    assert pieces == {6: [(2, 3, "not judged", -1, "lost-events")]}
    assert why == {"lost-events": 1}
    assert classes == {"exact": 1, "stale": 0, "foreign": 0, "not_judged": 1}
    # page 2's copy after the gap: the walk meets it, only the dispatch is unknown
    after = [W(1, 0, 0, 0, 0, 6 * PAGE), W(2, 0, 1, 0, 0, PAGE),
             U(3, 0, 0, 0, 2, 3, 0, "ring"), U(4, 0, 0, 0, 4, 5, 0, "ring"),
             R(5, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    _, why, pieces = _verdicts(_without(after, 2), monkeypatch)
    assert pieces == {5: [(2, 3, "not judged", -1, "fits")]} and why == {"fits": 1}
    # another view's copy older in the walk: foreign were it the cycling, so the gap is not
    # where the walk ends either
    other = [W(1, 0, 0, 0, 0, 6 * PAGE), W(2, 0, 1, 0, 0, PAGE),
             U(3, 0, 1, 0, 0, 1, 0, "ring"), U(4, 0, 0, 0, 4, 5, 0, "ring"),
             R(5, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    _, why, pieces = _verdicts(_without(other, 2), monkeypatch)
    assert pieces == {5: [(2, 3, "not judged", -1, "fits")]} and why == {"fits": 1}
    # no gap at all, no dispatch: fits
    plain = [W(1, 0, 0, 0, 0, 6 * PAGE), U(2, 0, 0, 0, 4, 5, 0, "ring"),
             R(3, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    _, why, pieces = _verdicts(plain, monkeypatch)
    assert pieces == {3: [(2, 3, "not judged", -1, "fits")]} and why == {"fits": 1}


def test_what_the_events_after_the_gap_show_is_judged_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a gap (seq 4, another layer's write), then for view V every copy its read needs
    after the gap: the ring cycling after the dispatch (exact), a prefetch that overran the
    ring before the next dispatch (foreign, holding the page that replaced it), and after a
    recorded read of V a batch without page 2's copy (foreign, holding what the slot holds)
    THEN those verdicts stand, equal to the whole trace's, and nothing is withheld."""
    whole = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 0), U(3, 0, 0, 0, 2, 3, 0, "ring"),
             W(4, 0, 1, 0, 0, PAGE),
             # step 1: cycling after the dispatch, every copy after the gap
             F(5, 1, 0), U(6, 1, 0, 0, 2, 3, 0, "ring"), U(7, 1, 0, 0, 4, 5, 0, "ring"),
             R(8, 1, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0)),
             # step 2: a prefetch overran the ring before the dispatch
             U(9, 2, 0, 0, 2, 3, 0, "ring"), U(10, 2, 0, 0, 4, 5, 0, "ring"), F(11, 2, 0),
             R(12, 2, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0)),
             # step 3: only page 4 copied since the last read: page 2 is not in the slot
             F(13, 3, 0), U(14, 3, 0, 0, 4, 5, 0, "ring"),
             R(15, 3, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    after = {12: [(2, 3, "foreign", 4, "")], 15: [(2, 3, "foreign", 4, "")]}
    assert _verdicts(whole, monkeypatch)[2] == after
    classes, why, pieces = _verdicts(_without(whole, 4), monkeypatch)
    assert pieces == after and why == {}
    assert classes == {"exact": 4, "stale": 0, "foreign": 2, "not_judged": 0}


def test_an_invalidate_after_the_gap_ends_what_the_gap_hides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the cycling read with seq 4 lost and an invalidate after the gap (every slot
    emptied), before page 4's copy
    THEN page 2 is foreign as in the whole trace: any copy of it, lost or not, was emptied."""
    trace = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 0), U(3, 0, 0, 0, 2, 3, 0, "ring"),
             W(4, 0, 1, 0, 0, PAGE), ev.Invalidate(5, 0, 0, reason="reconfigure"),
             U(6, 0, 0, 0, 4, 5, 0, "ring"),
             R(7, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0)),
             # the same in a later read, the gap and the invalidate in chunks before it
             W(8, 1, 1, 0, 0, PAGE), F(9, 1, 0), U(10, 1, 0, 0, 4, 5, 0, "ring"),
             R(11, 1, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    want = {7: [(2, 3, "foreign", 4, "")], 11: [(2, 3, "foreign", 4, "")]}
    assert _verdicts(trace, monkeypatch)[2] == want
    assert _verdicts(_without(trace, 4), monkeypatch)[2] == want
    # the gap after the invalidate: what it hides counts again
    classes, why, pieces = _verdicts(_without(trace, 8), monkeypatch)
    assert pieces == {7: [(2, 3, "foreign", 4, "")],
                      11: [(2, 3, "not judged", -1, "lost-events")]}
    assert why == {"lost-events": 1}
    assert classes == {"exact": 2, "stale": 0, "foreign": 1, "not_judged": 1}


def test_a_dispatch_before_the_gap_judges_as_the_whole_trace_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 3 also remembers each layer's last dispatch (``fits``), and keeps it across the
    gap (batch.State.lose): the dispatch the read's own node made is either recorded after the
    gap or lies before its end, lost or not, like the one remembered, so every copy after the
    gap is after both. GIVEN the step-1 dispatch lost (seq 4) with step 0's remembered, and
    copies of pages 2 and 4 into ring slot 0 after the gap
    THEN the read is exact, as in the whole trace; with step 1's dispatch recorded after the
    copies instead (a prefetch that overran), page 2 is foreign in both."""
    whole = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 0), R(3, 0, 0, 0, (0, 1, "host", 0)),
             F(4, 1, 0), U(5, 1, 0, 0, 2, 3, 0, "ring"), U(6, 1, 0, 0, 4, 5, 0, "ring"),
             R(7, 1, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    assert _verdicts(whole, monkeypatch)[0]["exact"] == 3
    classes, why, pieces = _verdicts(_without(whole, 4), monkeypatch)
    assert classes == {"exact": 3, "stale": 0, "foreign": 0, "not_judged": 0}
    assert why == {} and pieces == {}
    late = [W(1, 0, 0, 0, 0, 6 * PAGE), F(2, 0, 0), R(3, 0, 0, 0, (0, 1, "host", 0)),
            W(4, 1, 1, 0, 0, PAGE), U(5, 1, 0, 0, 2, 3, 0, "ring"),
            U(6, 1, 0, 0, 4, 5, 0, "ring"), F(7, 1, 0),
            R(8, 1, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    assert _verdicts(late, monkeypatch)[2] == {8: [(2, 3, "foreign", 4, "")]}
    assert _verdicts(_without(late, 4), monkeypatch)[2] == {8: [(2, 3, "foreign", 4, "")]}


def test_a_segment_starting_with_its_snapshot_keeps_a_pending_batch_open(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a segment whose first event (row 0) is its snapshot: ring slot 0 holds V's page
    2, V's ring copies wait for their read (``ring_pending``); then V's dispatch, page 4
    copied over slot 0 and the read of pages 2 and 4
    THEN page 2 is not judged (before-snapshot): the batch began before the segment (row -1
    is no "no batch", which made it foreign)."""
    snap = ev.Snapshot(40, 0, 0, reason="rotate",
                       versions=(ev.HostVersions(0, 0, 0, (1, 1, 1, 1, 1, 1)),),
                       ring=(ev.SlotCopies(0, 0, 0, 2, 0, 39, (1,)),), ring_pending=((0, 0),))
    trace = [snap, F(41, 0, 0), U(42, 0, 0, 0, 4, 5, 0, "ring"),
             R(43, 0, 0, 0, (2, 3, "ring", 0), (4, 5, "ring", 0))]
    classes, why, pieces = _verdicts(trace, monkeypatch)
    assert why == {"before-snapshot": 1}
    assert pieces == {43: [(2, 3, "not judged", -1, "before-snapshot")]}
    assert classes["exact"] == 1


def _cycling(seed: int) -> list[Any]:
    """Reads that cycle the ring (more pages than ring slots, each page copied into slot
    ``(p - r0) % slots``), the layer's dispatch before the copies, among them (a prefetch that
    overran) or — in every third seed — never recorded, and other layers' writes between."""
    rng = random.Random(seed)
    layers, slots, pages = rng.randint(1, 3), rng.randint(2, 4), 16
    fits = seed % 3 != 0
    out: list[Any] = []

    def emit(make: Any, *args: Any) -> None:
        out.append(make(len(out) + 1, *args))

    for step in range(10):
        for layer in range(layers):
            if rng.random() < 0.5:
                c = rng.randrange(pages * PAGE)
                emit(W, step, layer, 0, c, min(c + rng.choice((1, 300)), pages * PAGE))
            r0 = rng.randrange(pages - 2 * slots)
            n = rng.randint(slots + 1, 2 * slots)
            at = rng.choice((0, 0, rng.randint(1, n))) if fits else -1
            for p in range(r0, r0 + n):
                if p - r0 == at:
                    emit(F, step, layer)
                emit(U, step, layer, 0, p, p + 1, (p - r0) % slots, "ring")
                if rng.random() < 0.2:
                    emit(W, step, (layer + 1) % layers, 0, 0, PAGE)
            emit(R, step, layer, 0, *((p, p + 1, "ring", (p - r0) % slots)
                                      for p in range(r0, r0 + n)))
    return out


def test_random_cycling_reads_with_events_lost_are_judged_alike_and_name_the_gap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN random traces whose reads cycle the ring, with and without the layers' dispatches,
    each with a few random events lost (seqs kept)
    THEN the five ways agree on every page; whole, no page is not judged for lost events;
    cut, walks that stop for want of a dispatch name the gap where they would end in it
    (lost-events), and the dispatch (fits) only where a copy of the page, or another layer's,
    into its slot since the last gap answers the walk — both occur."""
    whys: Counter[str] = Counter()
    for seed in range(9):
        events = _cycling(seed)
        _, why, _ = _verdicts(events, monkeypatch)
        assert "lost-events" not in why
        rng = random.Random(seed)
        lost = rng.sample(range(2, len(events) - 1), 4)
        cut = _without(events, *lost)
        _, why, pieces = _verdicts(cut, monkeypatch)
        whys.update(why)
        # "fits" only where the walk's answer is after the last gap before the read: a copy of
        # the page, or of another layer, into its slot since then
        by_seq = {e.seq: e for e in cut}
        for seq, runs in pieces.items():
            read = by_seq[seq]
            gap = max((s for s in lost if s < seq), default=0)
            for begin, _end, _cls, _h, reason in runs:
                if reason != "fits":
                    continue
                slot = next(r.slot for r in read.served if r.begin == begin)
                assert any(type(e) is ev.Upload and e.target == "ring" and e.slot == slot
                           and (e.pages[0] == begin or e.layer != read.layer)
                           for e in cut if gap < e.seq < seq), (seed, seq, begin)
    assert whys["lost-events"] > 0 and whys["fits"] > 0
