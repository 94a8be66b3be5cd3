"""The judgement's flows as a streaming surface asks for them: ``Judge.flows()`` right after a
read (the writes its stale and foreign pages missed, with the class), equal to the ledger's
``flows`` rows; ``Judge.live_writes()`` the writes a later read can still miss."""

from __future__ import annotations

from kvdiag.analysis.judgement import Judge
from kvdiag.model import events as ev
from tests.judged_captures import capture
from tests.test_judgement import R, U, W


def test_flows_name_the_missed_write_and_the_class_that_missed_it() -> None:
    """Stream 0's page 0 is written twice after slot 0 got its copy (stale, missing write 4);
    slot 1 holds stream 1's page (foreign, missing stream 0's last write of page 1: 2)."""
    j = Judge()
    for e in (W(1, 0, 0, 0, 0, 512), W(2, 0, 0, 0, 256, 300), W(3, 0, 0, 1, 0, 512),
              U(4, 0, 0, 0, 0, 1, 0), U(5, 0, 0, 1, 1, 2, 1), W(6, 0, 0, 0, 10, 11)):
        j.feed(e)
    j.feed(R(7, 0, 0, 0, (0, 2, "pool", 0)))
    assert j.flows() == [(2, "foreign"), (6, "stale")]
    assert j.missed_writes() == [2, 6]
    # writes 1 and 3's pages were written again (1 by 6 and 2); 3 is stream 1's page 0's last
    assert j.live_writes() == {2, 3, 6}
    j.feed(R(8, 0, 0, 1, (1, 2, "pool", 1)))
    assert j.flows() == []  # slot 1 holds stream 1's current page 1


def test_streamed_flows_equal_the_ledger_on_a_capture() -> None:
    events = capture("slot1-first", "shared", "membership", False)
    streamed: list[tuple[int, int, str]] = []
    j = Judge(ledger=True)
    for e in events:
        j.feed(e)
        if isinstance(e, ev.Read):
            streamed += [(w, e.seq, c) for w, c in j.flows()]
    flows = j.snapshot().ledger.flows.array  # type: ignore[union-attr]
    ledger = [(int(r["write_seq"]), int(r["read_seq"]), ("exact", "stale", "foreign")[r["cls"]])
              for r in flows]
    assert streamed == ledger and len(ledger) > 0
    assert {c for *_, c in ledger} == {"stale", "foreign"}
