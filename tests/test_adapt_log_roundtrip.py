"""An adaptive capture's llama-log export prints the runtime's kv_stream_adapt lines, and
``kvdiag import`` reads them back into the same adapt and repartition events."""

from __future__ import annotations

from pathlib import Path

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader


def _events(path: Path) -> tuple[list[ev.Adapt], list[ev.Repartition]]:
    with TraceReader.open(path) as r:
        events = list(r)
    return ([e for e in events if isinstance(e, ev.Adapt)],
            [e for e in events if isinstance(e, ev.Repartition)])


def test_adapt_and_repartition_lines_round_trip(tmp_path: Path) -> None:
    trace, log, back = tmp_path / "a.kvtrace", tmp_path / "a.log", tmp_path / "b.kvtrace"
    assert main(["capture", "--scenario", "pool-pressure", "--adaptive", "--stage-mib", "4",
                 "--prompt-tokens", "1200", "--steps", "6", "--executor", "numpy", "-q",
                 "-o", str(trace)]) == 0
    assert main(["trace", "export", "--format", "llama-log", str(trace), "-o", str(log)]) == 0
    text = log.read_text()
    assert "W kv_stream_adapt: adaptive KV partition: resident pages/layer 1 -> 0" in text
    assert main(["import", str(log), "-o", str(back)]) == 0
    adapt, reps = _events(trace)
    adapt2, reps2 = _events(back)
    assert reps and [(r.resident, r.ring) for r in reps] == [(r.resident, r.ring) for r in reps2]
    assert [(a.active, a.resident, a.ring, a.samples, a.misses, a.peak, a.layout)
            for a in adapt] == [(a.active, a.resident, a.ring, a.samples, a.misses, a.peak,
                                 a.layout) for a in adapt2]
    assert [round(a.busy_pct or 0, 1) for a in adapt] == [a.busy_pct for a in adapt2]
