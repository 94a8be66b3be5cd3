"""The seed's own numbers through ``kvdiag perf`` (tests/seed_arm117.py says what is published
and what is filled in)."""

from __future__ import annotations

import io

import pytest
from seed_arm117 import seed_logs

from kvdiag.analysis.perf_compare import compare
from kvdiag.analysis.perf_evidence import NOT_EXPLAINED
from kvdiag.postmortem.perfread import scan_stream


@pytest.fixture(scope="module")
def runs():  # type: ignore[no-untyped-def]
    base, stream = seed_logs()
    return (scan_stream("stream.log", io.BytesIO(stream.encode())),
            scan_stream("base.log", io.BytesIO(base.encode())))


def test_the_seed_table_gives_its_cost_and_parity(runs) -> None:  # type: ignore[no-untyped-def]
    run, base = runs
    comp = compare(run, base)
    assert len(comp.pairs) == 12 and len(comp.uncapped) == 9  # turns 10–12 capped
    assert round(comp.mean_run or 0, 2) == 17.25 and round(comp.mean_base or 0, 2) == 24.26
    assert round((comp.cost or 0) * 100, 1) == -28.9
    assert comp.first is not None and comp.parity is True
    assert (comp.first.run.decode_tps, comp.first.base.decode_tps) == (31.52, 31.54)
    worst = comp.worst
    assert worst is not None and 40_000 <= worst.lo < worst.hi <= 53_248
    assert worst.run is not None and worst.run.decode_tps == pytest.approx(8.79, abs=0.01)


def test_the_dip_is_not_explained_by_what_the_logs_record(runs) -> None:  # type: ignore[no-untyped-def]
    run, base = runs
    comp = compare(run, base)
    dip = [b for b in comp.slow_bins if b.lo >= 40_960 and b.hi <= 53_248]
    assert [round(b.run.decode_tps or 0, 2) for b in dip if b.run] == [10.78, 8.79]
    for b in comp.slow_bins:
        assert b.causes == () and b.state is not None and not b.state.recorded
    from kvdiag.report.perf import comparison_lines

    text = "\n".join(comparison_lines(comp))
    assert "mean cost: -28.9 % (17.25 against 24.26 tok/s" in text
    assert "turn-1 parity: 31.52 against 31.54 tok/s at depth 6400 (-0.1 %): parity" in text
    assert text.count(f"cause: {NOT_EXPLAINED}") == len(comp.slow_bins) == 7
