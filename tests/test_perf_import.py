"""``kvdiag import`` carries each request's timing into the trace as ``timing`` events (1.2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_logs import ServerLog, Turn, partition_line

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader


def import_events(tmp_path: Path, text: str) -> list[ev.AnyEvent | ev.Unknown]:
    log = tmp_path / "server.log"
    log.write_text(text)
    out = tmp_path / "server.kvtrace"
    assert main(["import", str(log), "-o", str(out)]) == 0
    with TraceReader.open(out) as reader:
        assert reader.version_text == "1.3"
        events = list(reader)
        assert reader.problems == []
    return events


@pytest.mark.parametrize("shape", ["newer", "older"])
def test_each_request_becomes_a_timing_event(tmp_path: Path, shape: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    log = ServerLog(shape=shape, outer="router")  # type: ignore[arg-type]
    log.boot(np=2)
    log.requests(
        Turn(0, 7, 20000, 12000, 100, 21.5, prompt_tps=1111.0, graphs=90,
             during=(partition_line(80, 79, 10, 19, 3.0, 70.0),)),
        Turn(1, 8, 30000, 0, 64, 17.0, truncated=True, graphs=150))
    log.boot(stage_mib=None)
    log.requests(Turn(0, 0, 5000, 0, 32, 40.0, graphs=31))
    events = import_events(tmp_path, log.text())
    timings = [e for e in events if isinstance(e, ev.Timing)]
    assert [(t.boot, t.slot, t.task) for t in timings] == [(0, 0, 7), (0, 1, 8), (1, 0, 0)]
    a, b, c = timings
    assert (a.depth_start, a.depth_end, a.cached, a.prompt_tokens) == (20000, 20100, 12000, 8000)
    assert a.decode_tps == pytest.approx(21.5) and a.prompt_tps == pytest.approx(1111.0)
    assert a.decode_ms == pytest.approx(100 / 21.5 * 1000, abs=0.01)
    assert (b.truncated, b.depth_end, c.depth_start) == (True, 30064, 5000)
    assert (a.graphs_reused, c.graphs_reused) == ((90, 31) if shape == "newer" else (None, None))
    # the new prompt line's time: the repartition logged in between lies inside the request
    rep = next(e for e in events if isinstance(e, ev.Repartition))
    assert a.started_ns is not None and a.started_ns < rep.t_ns < a.t_ns
    assert all(t.started_ns is not None and t.started_ns < t.t_ns for t in timings)
    assert "timing 3" in capsys.readouterr().out


def test_a_log_of_timings_alone_is_importable(tmp_path: Path) -> None:
    """A plain server (no kv-stream lines at all) still gives a trace: its requests."""
    log = ServerLog()
    log.boot(stage_mib=None)
    log.requests(Turn(0, 1, 4000, 0, 50, 30.0))
    events = import_events(tmp_path, log.text())
    assert [type(e).__name__ for e in events] == ["Timing", "End"]


def test_perf_reads_the_imported_trace_as_it_reads_the_log(tmp_path: Path) -> None:
    from server_logs import adapt_line, session

    from kvdiag.analysis.perf_compare import compare
    from kvdiag.judged.perf import load

    runs = {}
    for name, tps, stage, during in (
            ("base", [30.0, 28.0, 26.0, 25.0], None, {}),
            ("stream", [30.0, 27.0, 12.0, 24.0], 2048,
             {2: (adapt_line(20800, 50, 20, samples=100, misses=9, busy=95.0, peak=20),
                  "kv_stream: layer 2 falls back to the zero-copy host read")})):
        log = ServerLog(outer="compose")
        log.boot(stage_mib=stage)
        for t in session(4, 6400, 750, tps, during=during):
            log.requests(t)
        path = tmp_path / f"{name}.log"
        path.write_text(log.text())
        trace = tmp_path / f"{name}.kvtrace"
        assert main(["import", str(path), "-o", str(trace)]) == 0
        from_log, from_trace = load(str(path)), load(str(trace))
        assert from_trace.config == {k: v for k, v in from_log.config.items()}
        runs[name] = (from_log.run, from_trace.run)
    (log_run, log_base), (trace_run, trace_base) = zip(runs["stream"], runs["base"],
                                                       strict=True)
    assert trace_run.kind == "trace" and log_run.kind == "log"
    for a, b in zip(log_run.requests, trace_run.requests, strict=True):
        assert (a.slot, a.task, a.depth_start, a.depth_end, a.decode_tps, a.truncated) == (
            b.slot, b.task, b.depth_start, b.depth_end, b.decode_tps, b.truncated)
        assert len(a.notes) == len(b.notes)
    from_log, from_trace = compare(log_run, log_base), compare(trace_run, trace_base)
    assert from_log.cost == pytest.approx(from_trace.cost)
    assert [[c.name for c in b.causes] for b in from_log.slow_bins] == [
        [c.name for c in b.causes] for b in from_trace.slow_bins] == [
        ["resident window below the active pages", "ring starved", "fallback to host reads"]]
