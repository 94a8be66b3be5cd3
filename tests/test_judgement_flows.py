"""The judgement's flows as a surface that draws them asks for them: ``Judge.missed(read)`` for
a read of the last chunk fed (the writes its stale and foreign pages missed, with the class),
equal to the ledger's ``flows`` rows; ``Judge.live_writes()`` the writes a later read can
still miss."""

from __future__ import annotations

from kvdiag.analysis.judgement import Judge
from kvdiag.model import events as ev
from tests.judged_captures import capture
from tests.test_judgement import R, U, W


def test_flows_name_the_missed_write_and_the_class_that_missed_it() -> None:
    """Stream 0's page 0 is written after slot 0 got its copy (stale, missing write 6); slot
    1 holds stream 1's page (foreign, missing stream 0's last write of page 1: 2)."""
    j = Judge(flows=True)
    read0, read1 = R(7, 0, 0, 0, (0, 2, "pool", 0)), R(8, 0, 0, 1, (1, 2, "pool", 1))
    j.feed_all([W(1, 0, 0, 0, 0, 512), W(2, 0, 0, 0, 256, 300), W(3, 0, 0, 1, 0, 512),
                U(4, 0, 0, 0, 0, 1, 0), U(5, 0, 0, 1, 1, 2, 1), W(6, 0, 0, 0, 10, 11),
                read0, read1])
    assert j.missed(read0) == [(2, "foreign"), (6, "stale")]
    assert j.missed_writes(j.verdict(read0)) == [2, 6]
    assert j.missed(read1) == []  # slot 1 holds stream 1's current page 1
    # writes 1's pages were written again (by 2 and 6); 3 is stream 1's pages' last
    assert j.live_writes() == {2, 3, 6}


def test_flows_read_by_read_equal_the_ledger_on_a_capture() -> None:
    events = list(capture("slot1-first", "shared", "membership", False))
    j = Judge(ledger=True)
    j.feed_all(events)
    drawn = [(w, e.seq, c) for e in events if isinstance(e, ev.Read) for w, c in j.missed(e)]
    flows = j.snapshot().ledger.flows.array  # type: ignore[union-attr]
    ledger = [(int(r["write_seq"]), int(r["read_seq"]), ("exact", "stale", "foreign")[r["cls"]])
              for r in flows]
    assert sorted(drawn) == sorted(ledger) and len(ledger) > 0
    assert {c for *_, c in ledger} == {"stale", "foreign"}
