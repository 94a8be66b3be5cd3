"""8 Perf: decode tok/s against depth for the open runs, the partition and misses on the same
axis, a cursor per request and the request's bin against the baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
from seed_arm117 import seed_logs
from server_logs import ServerLog, adapt_line, session
from textual.pilot import Pilot
from textual.widgets import Static
from textual_plotext import PlotextPlot

from kvdiag.cli import main
from kvdiag.tui.app import KvdiagApp
from tests.test_tui_pilot import drive, show, text
from tests.test_tui_telemetry_plot import cursor, series


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("perf")
    base, stream = seed_logs()
    (root / "base.log").write_text(base)
    (root / "stream.log").write_text(stream)
    # a streaming run whose kv_stream_adapt lines record the partition and misses
    log = ServerLog()
    log.boot(stage_mib=512)
    during = {k: (adapt_line(7150 * (k + 1) - 700, 124 - k, 13 + 9 * k, samples=100,
                             misses=10 * k, busy=50.0 + k, peak=10),) for k in range(6)}
    for t in session(6, 6400, 750, [30.0, 27.0, 24.0, 20.0, 15.0, 11.0], during=during):
        log.requests(t)
    (root / "adapt.log").write_text(log.text())
    assert main(["import", str(root / "adapt.log"), "-o", str(root / "adapt.kvtrace")]) == 0
    return {p.stem + p.suffix: p for p in root.iterdir()}


def test_the_runs_the_partition_and_the_request_cursor(runs: dict[str, Path]) -> None:
    """GIVEN the seed's streaming and baseline logs WHEN Perf is shown THEN both runs' rates
    are plotted by depth, the cursor follows ←/→ from request to request, and the request's
    bin against the baseline says what the comparison says."""

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "8")
        rate = app.screen.query_one("#perf-rate", PlotextPlot)
        got = series(rate)
        assert set(got) >= {"stream.log", "base.log (baseline)"}
        depths, tps = got["stream.log"]
        assert depths[:2] == [6144.0, 14336.0]  # the centres of the 4K–8K and 12K–16K bins
        assert [round(v, 2) for v in tps[:9]] == [31.52, 20.10, 17.30, 15.20, 13.45, 10.78,
                                                  8.79, 16.70, 21.41]
        assert cursor(rate) == [6775.0]  # the first request's decode, 6,400–7,150
        await show(pilot, *["right"] * 6)
        assert cursor(rate) == [49675.0]
        words = " ".join(text(app).split())
        assert "request 7 of 12 · slot 0 task 6 · depth 49300→50050 · decode 8.79 tok/s" in words
        assert "bin 48K–52K against base.log: 0.40 (-60.0 %)" in words
        assert "cause: not explained by what the log records" in words
        assert "whole run: mean cost -28.9 % over 9 uncapped pairs · turn-1 parity" in words
        partition = app.screen.query_one("#perf-partition", PlotextPlot)
        assert list(series(partition)) == ["active pages"]
        assert not app.screen.query_one("#perf-misses", PlotextPlot).display
        await show(pilot, "end")
        assert "request 12 of 12" in text(app) and "truncated" in text(app)

    drive([runs["stream.log"], runs["base.log"]], script, size=(140, 60))


def test_a_trace_with_timing_events_and_its_recorded_partition(runs: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "8")
        words = " ".join(text(app).split())
        assert "adapt.kvtrace: 6 request(s) · no baseline open" in words
        partition = series(app.screen.query_one("#perf-partition", PlotextPlot))
        depth, resident = partition["resident pages/layer"]
        assert resident == [124.0, 123.0, 122.0, 121.0, 120.0, 119.0]
        assert depth == [256.0 * -(-(7150 * (k + 1) - 700) // 256) for k in range(6)]
        misses = series(app.screen.query_one("#perf-misses", PlotextPlot))
        assert misses["miss %"][1] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
        await show(pilot, "b")
        assert any("no other open file has request timings" in n.message
                   for n in app._notifications)

    drive([runs["adapt.kvtrace"]], script, size=(140, 60))


def test_a_file_without_timing_says_so(runs: dict[str, Path]) -> None:
    plain = runs["base.log"].parent / "plain.log"
    plain.write_text("nothing here\n")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "8")
        assert "no request timing in this file" in text(app)

    drive([plain], script)


def test_the_model_beside_the_measurement(runs: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN the seed's streaming run and its baseline WHEN p is pressed on Perf THEN the
    model's decode tok/s is drawn against depth beside the measured curves, the same figures
    ``kvdiag perf --predict`` gives, and its disagreements are listed with the mechanism that
    would have to change; p again hides it."""
    import asyncio
    import json

    from kvdiag.commands.tui import predictor
    from kvdiag.tui.export import wait_loaded

    stream, base = runs["stream.log"], runs["base.log"]
    assert main(["perf", str(stream), "--baseline", str(base), "--predict", "--json"]) == 0
    (expected,) = json.loads(capsys.readouterr().out)["predictions"]
    tps = [r["predicted_tps"] for r in expected["requests"] if r["predicted_tps"]]
    assert len(tps) >= 9

    async def run() -> None:
        app = KvdiagApp([str(stream), str(base)], predictor=predictor(None))
        async with app.run_test(size=(140, 70)) as pilot:
            await wait_loaded(app, timeout=60)
            await show(pilot, "8")
            rate = app.screen.query_one("#perf-rate", PlotextPlot)
            assert not any("model" in str(name) for name in series(rate))
            await show(pilot, "p")
            await app.workers.wait_for_complete()
            await pilot.pause()
            got = series(rate)
            depths, model = got["stream.log: model (NVIDIA H200)"]
            assert model == pytest.approx(tps)
            assert depths[0] == 6775.0  # the first request's decode, 6,400–7,150
            detail = app.screen.query_one("#perf-detail", Static)
            words = " ".join(str(detail.render()).split())
            assert "GPU: the run's GPU is unknown" in words
            assert "request 7 at depth 49300→50050: measured 8.79 tok/s, predicted 22.00" in words
            assert "what would have to change:" in words
            await show(pilot, "p")
            assert not any("model" in str(name) for name in series(rate))

    asyncio.run(run())


def test_the_model_says_why_it_cannot_play_a_run(runs: dict[str, Path]) -> None:
    """A run whose log gives no model shape: the reason, on the screen, in one line."""
    import asyncio

    from kvdiag.commands.tui import predictor
    from kvdiag.tui.export import wait_loaded

    log = ServerLog()
    log.boot(stage_mib=None)
    for t in session(2, 4000, 100, [30.0, 29.0]):
        log.requests(t)
    plain = runs["base.log"].parent / "unstreamed.log"
    plain.write_text(log.text())

    async def run() -> None:
        app = KvdiagApp([str(plain)], predictor=predictor(None))
        async with app.run_test(size=(140, 60)) as pilot:
            await wait_loaded(app, timeout=60)
            await show(pilot, "8", "p")
            await app.workers.wait_for_complete()
            await pilot.pause()
            detail = app.screen.query_one("#perf-detail", Static)
            words = " ".join(str(detail.render()).split())
            assert "model: --predict: unstreamed.log does not stream KV (no pool line)" in words

    asyncio.run(run())


def test_one_request_is_drawn_with_its_bin_beside_it(tmp_path: Path) -> None:
    """GIVEN a log cut after its first request (a server just started, or followed live)
    WHEN Perf is shown THEN it draws: the request's depth bin centre (6,144) lies left of the
    request (6,400–7,150), and plotext failed on the legend of a series drawn wholly outside
    the axes (IndexError in the viewer)."""
    lines = seed_logs()[1].splitlines(keepends=True)
    log = tmp_path / "first.log"
    log.write_text("".join(lines[:40]))

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "8")
        words = " ".join(text(app).split())
        assert "first.log: 1 request(s)" in words
        depths, _ = series(app.screen.query_one("#perf-rate", PlotextPlot))["first.log"]
        assert depths == [6144.0]

    drive([log], script, size=(140, 60))
