"""Judge.arisen: findings as they first appear while a trace is fed (kvdiag check --follow)."""

from __future__ import annotations

import pytest

from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.findings import identity
from kvdiag.model import events as ev
from tests.judged_captures import capture


@pytest.fixture(scope="module")
def slot1_first() -> tuple[ev.AnyEvent, ...]:
    """slot1-first at the judgement tests' small shape: stale, foreign, divergence."""
    events: tuple[ev.AnyEvent, ...] = capture("slot1-first", "shared", "membership", False)
    return events


def test_each_finding_arises_once_at_the_event_that_makes_it(slot1_first: tuple[ev.AnyEvent, ...]) -> None:
    events = slot1_first
    judge = Judge(None, name="x")
    first_at: dict[str, ev.AnyEvent | ev.Unknown] = {}
    for e in events:
        judge.feed(e)
        for f in judge.arisen():
            assert f.rule not in first_at  # once
            first_at[f.rule] = e
    # the runner's events end without an End event: the run not completing arises at no event
    final = [f for f in judge.snapshot().findings if f.rule != "trace-incomplete"]
    # everything the final judgement finds about events arose while feeding
    assert {f.rule for f in final} == set(first_at)
    # ... at the first read with a stale page / first diverged output, not later
    stale = next(e for e in events if isinstance(e, ev.Read) and any(
        r.cls == "stale" for r in e.ranges))
    assert first_at["stale-page-read"].seq == stale.seq
    diverged = next(e for e in events if isinstance(e, ev.Output) and e.diverged)
    assert first_at["stream-divergence"].seq == diverged.seq
    assert len({identity(f) for f in final}) == len(final)


def test_findings_a_later_event_could_withdraw_do_not_arise(slot1_first: tuple[ev.AnyEvent, ...]) -> None:
    events = [e for e in slot1_first if not isinstance(e, ev.End)]
    judge = Judge(None, name="x")
    judge.feed_all(events[:40])  # reads before any upload: their pages are not judged yet
    got = {f.rule for f in judge.arisen()}
    snap = {f.rule for f in judge.snapshot().findings}
    assert "trace-incomplete" in snap and "trace-incomplete" not in got
    assert "not-recorded" not in got
    judge.feed_all(events[40:])
    later = {f.rule for f in judge.arisen()}
    assert got.isdisjoint(later)  # never twice
    assert got | later == {"stale-page-read", "foreign-page-read", "stream-divergence"}
    assert judge.arisen() == []
