"""partition-thrash, ring-starved and overprovisioned over adapt/repartition events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest

from kvdiag.analysis.judgement.adapt import AdaptAnalyzer
from kvdiag.model import events as ev
from kvdiag.model.findings import Finding

_seq = iter(range(1, 10**6))


def step(i: int, phase: Literal["prefill", "decode"] = "decode") -> ev.Step:
    return ev.Step(seq=next(_seq), t_ns=i, step=i, phase=phase, streams=(0,), tokens=1, n_kv=256)


def adapt(i: int, misses: int, busy: float, peak: int = 2, samples: int = 100,
          active: int = 20_000, resident: int = 40, ring: int = 20) -> ev.Adapt:
    return ev.Adapt(seq=next(_seq), t_ns=i, step=i, active=active, resident=resident, ring=ring,
                    samples=samples, misses=misses, busy_pct=busy, peak=peak)


def rep(i: int, a: int, b: int) -> ev.Repartition:
    return ev.Repartition(seq=next(_seq), t_ns=i, step=i, resident=(a, b),
                          ring=(100 - 4 * a, 100 - 4 * b))


def run(events: list[object]) -> dict[str, Finding]:
    a = AdaptAnalyzer()
    for e in events:
        a.feed(e)
    return {f.rule: f for f in a.findings()}


def test_more_than_twenty_repartitions_in_one_decode_loop_is_thrash() -> None:
    events: list[object] = [step(0, "prefill")]
    for i in range(1, 23):  # 21 repartitions in the first decode loop
        events += [step(i), rep(i, 10 + i % 2, 11 - i % 2)] if i <= 21 else [step(i)]
    events += [step(30, "prefill")] + [x for i in range(31, 51) for x in (step(i), rep(i, 9, 10))]
    got = run(events)
    thrash = got["partition-thrash"]
    assert thrash.details == {"loop": 1, "repartitions": 21}
    assert "(first 20 of 21)" in thrash.title
    assert len(thrash.evidence) == 20


def test_twenty_repartitions_per_loop_are_not_thrash() -> None:
    events: list[object] = []
    for loop in range(3):
        events.append(step(loop * 100, "prefill"))
        events += [x for i in range(20) for x in (step(loop * 100 + i + 1), rep(i, 9, 10))]
    assert "partition-thrash" not in run(events)


def test_sustained_misses_with_headroom_and_when_saturated() -> None:
    starving = [adapt(i, misses=5, busy=40.0) for i in range(8)]
    got = run(starving)["ring-starved"]
    assert "8 evaluations in a row" in got.title and "headroom" in got.title
    assert "FIXED_RING_SLOTS" in got.fix
    saturated = [adapt(i, misses=50, busy=97.0) for i in range(12)]
    got = run(saturated)["ring-starved"]
    assert "saturated" in got.title and "stage-mib" in got.fix
    assert got.details["max_miss_ratio"] == 0.5


def test_misses_interrupted_before_eight_evaluations_are_not_sustained() -> None:
    events = [adapt(i, misses=5 if i % 7 else 0, busy=40.0) for i in range(40)]
    assert "ring-starved" not in run(events)


def test_overprovisioned_needs_streaming_and_a_light_ring() -> None:
    light = [adapt(i, misses=0, busy=10.0, peak=3) for i in range(8)]
    assert "overprovisioned" in run(light)
    all_resident = [adapt(i, misses=0, busy=10.0, peak=3, active=2_000) for i in range(30)]
    assert "overprovisioned" not in run(all_resident)
    busy_ring = [adapt(i, misses=0, busy=10.0, peak=15) for i in range(30)]
    assert "overprovisioned" not in run(busy_ring)
    no_samples = [adapt(i, misses=0, busy=10.0, samples=0) for i in range(30)]
    assert run(no_samples) == {}


def test_check_reports_thrash_from_a_trace(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from trace_samples import header

    from kvdiag.cli import main
    from kvdiag.trace import TraceWriter

    path = tmp_path / "thrash.kvtrace"
    with TraceWriter.create(path, header()) as w:
        w.emit(ev.Step, 0, phase="prefill", streams=(0,), tokens=512, n_kv=512)
        for i in range(1, 26):
            w.emit(ev.Step, i, phase="decode", streams=(0,), tokens=1, n_kv=512)
            w.emit(ev.Repartition, i, resident=(9 + i % 2, 10 - i % 2), ring=(20, 16))
            w.end_step()
    assert main(["check", "--json", str(path)]) == 0  # a warning: the default gate passes
    found = {f["rule"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["partition-thrash"]["severity"] == "warning"
    assert found["partition-thrash"]["details"] == {"loop": 1, "repartitions": 25}
    assert main(["check", "--fail-on", "warning", str(path)]) == 1
