"""A run against a baseline: pairs, mean cost, parity, worst bin, and causes named only from the
evidence recorded at the same depth (kvdiag/analysis/perf_compare.py, perf_evidence.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from server_logs import ServerLog, Turn, adapt_line, partition_line, session

from kvdiag.analysis.perf_compare import compare
from kvdiag.analysis.perf_evidence import (
    GRAPHS_DISABLED,
    HOST_READS,
    NOT_EXPLAINED,
    RESIDENT_BELOW,
    RING_STARVED,
    THRASH,
)
from kvdiag.cli import main
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem.perfread import scan_stream

BASE_TPS = [30.0, 28.0, 26.0, 25.0, 24.0, 23.5]
SLOW_TPS = [30.0, 27.5, 25.5, 12.0, 11.0, 23.0]
"""Turns 4 and 5 (decodes at 27,850 and 35,000 tokens: each turn adds 6,400 + 750) are far below
the baseline; the rest within 10 %."""


def log_of(tps: list[float], *, stage: int | None, shape: str = "newer",
           during: dict[int, tuple[str, ...]] | None = None,
           graphs: list[float] | None = None) -> PerfRun:
    log = ServerLog(shape=shape)  # type: ignore[arg-type]
    log.boot(stage_mib=stage)
    turns = session(len(tps), 6400, 750, tps, during=during,
                    graphs_per_token=1.0 if graphs is not None else None)
    if graphs is not None:
        total, fixed = 0, []
        for t, g in zip(turns, graphs, strict=True):
            total += int(t.decode_tokens * g)
            fixed.append(Turn(**{**t.__dict__, "graphs": total}))
        turns = fixed
    for t in turns:
        log.requests(t)
    return scan_stream("stream.log" if stage else "base.log", io.BytesIO(log.text().encode()))


def bin_at(comp, depth: int):  # type: ignore[no-untyped-def]
    return next(b for b in comp.bins if b.lo <= depth < b.hi)


def test_cost_parity_worst_bin() -> None:
    comp = compare(log_of(SLOW_TPS, stage=2048), log_of(BASE_TPS, stage=None))
    assert len(comp.pairs) == 6 and comp.unpaired_run == () and comp.unpaired_base == ()
    assert comp.mean_run == pytest.approx(sum(SLOW_TPS) / 6)
    assert comp.mean_base == pytest.approx(sum(BASE_TPS) / 6)
    assert comp.cost == pytest.approx(sum(SLOW_TPS) / sum(BASE_TPS) - 1)
    assert comp.parity is True and comp.first is not None
    assert comp.first.run.depth_start == 6400
    worst = comp.worst
    assert worst is not None and (worst.lo, worst.hi) == (32768, 36864)
    assert worst.ratio == pytest.approx(11.0 / 24.0)
    assert [(b.lo, round(b.ratio or 0, 3)) for b in comp.slow_bins] == [
        (24576, 0.48), (32768, 0.458)]
    # nothing kv-stream was logged: no cause is named
    for b in comp.slow_bins:
        assert b.causes == () and b.state is not None and not b.state.recorded


def test_no_parity_when_turn_one_differs() -> None:
    comp = compare(log_of([27.0, *SLOW_TPS[1:]], stage=2048), log_of(BASE_TPS, stage=None))
    assert comp.parity is False and comp.first is not None
    assert comp.first.ratio == pytest.approx(0.9)


def test_causes_come_from_the_evidence_at_that_depth() -> None:
    # turn 4 decodes at 27,850–28,600 tokens (109–112 active pages): the window is 60 pages and
    # the ring misses; turn 5 decodes at 35,000–35,750 with a fallback warning; turn 2 (at
    # 13,550, not slow) has partition lines that must not explain anything elsewhere
    during = {
        1: (adapt_line(13600, 20, 30, samples=90, misses=40, busy=99.0, peak=30),),
        3: (adapt_line(27900, 60, 31, samples=120, misses=30, busy=88.0, peak=31),
            adapt_line(27901, 60, 31, samples=120, misses=0, busy=60.0, peak=20),
            partition_line(60, 59, 31, 40, 25.0, 88.0)),
        4: ("ggml_cuda_kv_stream_fattn: fits() is false for layer 5: falling back to "
            "ordinary flash attention over the host buffer",),
    }
    comp = compare(log_of(SLOW_TPS, stage=2048, during=during), log_of(BASE_TPS, stage=None))
    four, five = comp.slow_bins
    assert [c.name for c in four.causes] == [RESIDENT_BELOW, RING_STARVED]
    st = four.state
    assert st is not None and st.resident == (60, 60) and st.active_pages == (109, 112)
    assert (st.evaluations, st.below, st.samples, st.misses, st.starved) == (2, 2, 240, 30, 1)
    assert any("repartition to 59 resident pages/layer < 109 active pages" in e
               for e in four.causes[0].evidence)
    assert [c.name for c in five.causes] == [HOST_READS]
    assert "layer 5" in five.causes[0].evidence[0] and "line " in five.causes[0].evidence[0]
    # turn 2's starved ring is at 13.5K, which is not slow, and explains nothing else
    two = bin_at(comp, 13900)
    assert not two.slow and two.causes == ()


def test_thrash_needs_more_than_twenty_repartitions_in_one_request() -> None:
    many = tuple(partition_line(80 - i, 79 - i, 10 + i, 19 + i, 0.5, 40.0) for i in range(21))
    comp = compare(log_of(SLOW_TPS, stage=2048, during={3: many, 4: many[:20]}),
                   log_of(BASE_TPS, stage=None))
    four, five = comp.slow_bins
    assert THRASH in [c.name for c in four.causes]
    assert THRASH not in [c.name for c in five.causes]  # 20 is not more than 20
    assert five.causes and five.causes[0].name == RESIDENT_BELOW  # 60..79 < 137 active pages


def test_graphs_disabled_against_a_baseline_that_reuses_them() -> None:
    run = log_of(SLOW_TPS, stage=2048, graphs=[1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    base = log_of(BASE_TPS, stage=None, graphs=[1.0] * 6)
    comp = compare(run, base)
    four, five = comp.slow_bins
    assert [c.name for c in four.causes] == [GRAPHS_DISABLED]
    assert "0 CUDA graphs reused over 750 decoded tokens" in four.causes[0].evidence[0]
    assert five.causes == ()
    # a baseline that never reused graphs either explains nothing
    comp = compare(run, log_of(BASE_TPS, stage=None, graphs=[0.0] * 6))
    assert bin_at(comp, 28000).causes == ()


def test_unpaired_requests_are_left_out_of_the_cost() -> None:
    base = log_of(BASE_TPS, stage=None)
    log = ServerLog()
    log.boot(stage_mib=2048)
    turns = session(6, 6400, 750, SLOW_TPS)
    for t in turns[:3]:
        log.requests(t)
    log.requests(Turn(0, 99, 500, 0, 100, 50.0))  # an extra short request between turns
    for t in turns[3:]:
        log.requests(t)
    run = scan_stream("stream.log", io.BytesIO(log.text().encode()))
    comp = compare(run, base)
    assert len(comp.pairs) == 6 and [r.request.task for r in comp.unpaired_run] == [99]
    assert comp.cost == pytest.approx(sum(SLOW_TPS) / sum(BASE_TPS) - 1)


def test_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = {}
    for name, tps, stage in (("base", BASE_TPS, None), ("stream", SLOW_TPS, 2048)):
        log = ServerLog(shape="older", outer="journald")
        log.boot(stage_mib=stage)
        for t in session(6, 6400, 750, tps):
            log.requests(t)
        paths[name] = tmp_path / f"{name}.log"
        paths[name].write_text(log.text())
    assert main(["perf", str(paths["stream"]), "--baseline", str(paths["base"])]) == 0
    out = capsys.readouterr().out
    cost = (sum(SLOW_TPS) / sum(BASE_TPS) - 1) * 100
    assert f"mean cost: {cost:+.1f} %" in out
    assert "turn-1 parity: 30.00 against 30.00 tok/s at depth 6400 (+0.0 %): parity" in out
    assert "worst bin: 32K–36K tokens, 11.00 against 24.00 tok/s (-54.2 %)" in out
    assert out.count(f"cause: {NOT_EXPLAINED}") == 2
    assert main(["perf", str(paths["stream"]), "--baseline", str(paths["base"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (comp,) = data["comparisons"]
    assert comp["mean_cost"] == pytest.approx(cost / 100)
    assert comp["turn1"]["parity"] is True and comp["worst_bin"]["lo"] == 32768
    slow = [b for b in comp["bins"] if b["slow"]]
    assert [b["causes"][0]["name"] for b in slow] == [NOT_EXPLAINED, NOT_EXPLAINED]
    assert [r["decode_tps"] for r in data["runs"][0]["requests"]] == SLOW_TPS


def test_cli_refuses_bad_bins_and_empty_runs(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain.log"
    plain.write_text("nothing to see\n")
    assert main(["perf", str(plain)]) == 1
    assert "no completed request" in capsys.readouterr().err
    assert main(["perf", str(plain), "--bin-tokens", "1000"]) == 2
    assert "multiple of 256" in capsys.readouterr().err
    assert main(["perf", str(plain), "--max-rows", "-1"]) == 2  # was taken as "all"
    assert "--max-rows -1: want 0 (all) or a positive count" in capsys.readouterr().err
    assert main(["perf", str(tmp_path / "missing.log")]) == 2
