"""A streamed chunk judged event by event in C (``seqjudge.c``) against the array judgement.

``kvdiag check`` and the TUI's judging pass judge their streamed chunks in C where a compiler
is at hand (:mod:`kvdiag.analysis.judgement.seqjudge`). On random traces with every page class,
slot aliasing, evicts, invalidates and a ring that cycles within a read, the C walk and the
array judgement (``KVDIAG_COMPILED=0``) must give the same ledger, counts, flows and findings;
the walk must judge most chunks itself, and decline (state untouched) those that need rule 3.
"""

from __future__ import annotations

from typing import Any

import msgspec
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


def _hostile(seed: int) -> list[Any]:
    """A random trace with fields a damaged or hostile writer gives: negative and huge pages,
    slots, layers and streams, empty and reversed runs, writes of no cells."""
    import random

    from kvdiag.model import events as ev

    rng = random.Random(seed)
    wild = (-5, -1, 0, 1, 3, 255, 256, 1 << 20, (1 << 22) - 1, 1 << 40, -(1 << 40))
    out: list[Any] = []
    for e in _trace(seed):
        if rng.random() < 0.15:
            if isinstance(e, ev.Upload):
                p0 = rng.choice(wild)
                e = ev.Upload(e.seq, e.t_ns, e.step, layer=rng.choice(wild), stream=e.stream,
                              pages=(p0, p0 + rng.choice((0, 1, 3, -2))),
                              slot=rng.choice(wild), target=e.target, bytes=e.bytes,
                              reason=e.reason)
            elif isinstance(e, ev.Write):
                c0 = rng.choice(wild) * 256
                e = ev.Write(e.seq, e.t_ns, e.step, layer=e.layer, stream=rng.choice(wild),
                             cells=(c0, c0 + rng.choice((0, 1, 700, -3))), rows=e.rows)
            elif isinstance(e, ev.Read):
                served = tuple(ev.Served(rng.choice(wild), rng.choice(wild), s.source,
                                         rng.choice(wild)) if rng.random() < 0.5 else s
                               for s in e.served)
                e = ev.Read(e.seq, e.t_ns, e.step, layer=e.layer, stream=e.stream, pool=e.pool,
                            ring=e.ring, host=e.host, served=served)
            elif isinstance(e, ev.Evict):
                e = ev.Evict(e.seq, e.t_ns, e.step, slot=rng.choice(wild), layer=e.layer,
                             page=e.page, stream=e.stream, bytes=e.bytes, reason=e.reason)
        out.append(e)
    return out


@needs_c
@pytest.mark.parametrize("seed", range(3))
def test_hostile_values_are_judged_alike(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """GIVEN a trace whose pages, slots, layers and streams are out of every believable range
    WHEN it is streamed with the C walk and with the array judgement
    THEN both judge it alike (out-of-range counted, nothing read outside the state; the
    array judgement once sized an array by an evict's slot of 2^40)."""
    events = _hostile(seed)
    _small_chunks(monkeypatch)
    with_c = _streamed(events)
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert _streamed(events) == with_c


def _eventful(seed: int) -> list[Any]:
    """A random page trace with what the C accumulator hands back to Python between its
    events: steps of both phases (decode loops), repartitions and adapt evaluations, fits
    decisions of every outcome, outputs with and without a reference, warnings, aborts and
    an End."""
    import random

    from kvdiag.model import events as ev
    from tests.test_compiled_columns import _BLANK

    rng = random.Random(seed)
    out: list[Any] = []
    for e in _trace(seed):
        out.append(e)
        r = rng.random()
        if r < 0.04:
            out.append(ev.Step(e.seq, 0, e.step, phase=rng.choice(("prefill", "decode")),
                               streams=(0, 1), tokens=1, n_kv=256))
        elif r < 0.07:
            out.append(ev.Repartition(e.seq, 0, e.step, resident=(0, 4), ring=(4, 8),
                                      reason="miss"))
        elif r < 0.09:
            out.append(ev.Adapt(e.seq, 0, e.step, active=1, resident=4, ring=4, samples=10,
                                misses=rng.randrange(11)))
        elif r < 0.25:
            route = rng.choice(("streamed", "streamed", "fallback", "abort", "ordinary"))
            out.append(ev.Fits(e.seq, 0, e.step, node=f"__fattn__-{rng.randrange(4)}",
                               layer=rng.randrange(4), q=_BLANK, k=_BLANK, v=_BLANK,
                               dst=_BLANK, stage_bytes=1, result=rng.random() < 0.7,
                               route=route, failed=("Q->ne[3] == 1",) if rng.random() < 0.3
                               else ()))
        elif r < 0.29:
            ref = rng.random() < 0.5
            out.append(ev.Output(e.seq, 0, e.step, stream=rng.randrange(2), checksum="0a",
                                 ref_checksum="0b" if ref else "",
                                 max_abs_delta=rng.random() if ref else None,
                                 tolerance=0.5 if ref else None, worst_layer=1 if ref else None))
        elif r < 0.30:
            out.append(ev.Warn(e.seq, 0, e.step, message="fits() false: fallback",
                               code="fits-fallback"))
        elif r < 0.305:
            out.append(ev.Abort(e.seq, 0, e.step, message="abort",
                                condition="ggml_cuda_kv_stream_fattn_fits(dst)"))
    last = out[-1]
    out.append(ev.End(last.seq + 1, 0, last.step + 7, status="completed", steps=last.step + 1,
                      events=len(out)))
    return [msgspec.structs.replace(e, seq=i + 1) for i, e in enumerate(out)]


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_what_the_accumulator_hands_back_is_judged_alike(monkeypatch: pytest.MonkeyPatch,
                                                         seed: int) -> None:
    """GIVEN a stream with steps, repartitions, fits decisions of every outcome, outputs,
    warnings, aborts and an End between its page events
    WHEN it is streamed with the C accumulator and walk, and with neither (KVDIAG_COMPILED=0)
    THEN the summary (counts, routes, steps, residency), the findings and the ledger's fits
    and outputs tables are equal."""
    events = _eventful(seed)

    def run() -> tuple[Any, ...]:
        judge = Judge(ledger=True)
        judge.feed_all(iter(events))
        snap = judge.snapshot()
        led = snap.ledger
        assert led is not None
        plain = Judge().feed_all(iter(events)).snapshot()
        return (_judged(judge), led.fits.array.tolist(), led.outputs.array.tolist(),
                msgspec.json.encode([plain.summary(), list(plain.findings)]))

    _small_chunks(monkeypatch)
    with_c = run()
    assert json_has(with_c[3], "fallback") and json_has(with_c[3], "mismatch")
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert run() == with_c


def json_has(doc: bytes, word: str) -> bool:
    return word.encode() in doc


@needs_c
def test_a_block_the_c_pass_declines_keeps_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a stream where one small block holds an integer beyond ±2^62 (the C pass declines
    it: the Python path takes its columns) and the blocks after it are accumulated in C
    WHEN it is judged with and without C
    THEN the ledger and the summary are equal (the declined block's events keep their rows)."""
    from kvdiag.model import events as ev

    events = _trace(3)
    k = next(i for i, e in enumerate(events) if isinstance(e, ev.Write) and i > 200)
    w = events[k]
    events[k] = ev.Write(w.seq, w.t_ns, w.step, layer=w.layer, stream=w.stream,
                         cells=(1 << 63, (1 << 63) + 1), rows=w.rows)

    class Blocks:
        def blocks(self) -> Any:
            for at in range(0, len(events), 50):
                yield events[at:at + 50]

    def run() -> tuple[Any, ...]:
        judge = Judge(ledger=True)
        judge.feed_all(Blocks())
        return _judged(judge)

    _small_chunks(monkeypatch)
    with_c = run()
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert run() == with_c
