"""A streamed chunk judged event by event in C (``seqjudge.c``) against the array judgement.

``kvdiag check`` and the TUI's judging pass judge their streamed chunks in C where a compiler
is at hand (:mod:`kvdiag.analysis.judgement.seqjudge`). On random traces with every page class,
slot aliasing, evicts, invalidates and a ring that cycles within a read, the C walk and the
array judgement (``KVDIAG_COMPILED=0``) must give the same ledger, counts, flows and findings;
the walk must judge most chunks itself, and decline (state untouched) those that need rule 3.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvdiag import compiled
from kvdiag.analysis.judgement import Judge, seqjudge
from kvdiag.analysis.judgement import judge as judge_module
from tests.test_compiled_columns import _mixed
from tests.test_judgement_fastpath import _judged, _small_chunks, _trace

needs_c = pytest.mark.skipif(compiled.load(seqjudge._SOURCE, seqjudge._MODULE) is None,
                             reason="no C compiler here")


def _streamed(events: list[Any], flows: bool = True) -> tuple[Any, ...]:
    judge = Judge(ledger=True) if flows else Judge()
    judge.feed_all(iter(events))
    if flows:
        return _judged(judge)
    snap = judge.snapshot()
    return snap.summary(), list(snap.findings)


@needs_c
@pytest.mark.parametrize("seed", range(24))
def test_the_c_walk_judges_as_the_arrays_do(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """GIVEN a random trace (every class, aliasing, ring cycling; fits and outputs between)
    WHEN it is streamed in small chunks with the C walk and with the array judgement
    THEN the ledger's reads, pieces and flows, the summary and the findings are equal."""
    events = _mixed(seed) if seed % 2 else _trace(seed)
    _small_chunks(monkeypatch)
    with_c = _streamed(events)
    without = _streamed(events, flows=False)
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert _streamed(events) == with_c
    monkeypatch.undo()
    _small_chunks(monkeypatch)
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert _streamed(events, flows=False) == without


@needs_c
def test_the_walk_judges_most_chunks_and_declines_rule_3(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The comparison above is worth making: the walk judged most chunks itself, and the
    chunks it declined (a ring page whose slot holds another page of its view) were judged
    by the arrays from the state as it was."""
    counted = {"streamed": 0, "declined": 0}
    streamed, prepared = seqjudge.judge_streamed, seqjudge.judge_prepared

    def count_streamed(*args: Any, **kwargs: Any) -> Any:
        counted["streamed"] += 1
        return streamed(*args, **kwargs)

    def count_declined(*args: Any, **kwargs: Any) -> Any:
        counted["declined"] += 1
        return prepared(*args, **kwargs)

    monkeypatch.setattr(judge_module, "judge_streamed", count_streamed)
    monkeypatch.setattr(seqjudge, "judge_prepared", count_declined)
    _small_chunks(monkeypatch)
    for seed in range(24):
        _streamed(_trace(seed))
    assert counted["declined"] >= 3
    assert counted["streamed"] - counted["declined"] >= 60
