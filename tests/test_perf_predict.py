"""The model beside the measurement: the multiturn-growth scenario, the session played under the
adaptive controller, the calibration on a baseline, and what would have to change where the
model and a measurement disagree (kvdiag/kvstream/session.py, analysis/perf_predict.py)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from seed_arm117 import seed_logs
from server_logs import ServerLog, session

from kvdiag.analysis.perf import rows
from kvdiag.analysis.perf_predict import GAP, calibrate, predict
from kvdiag.cli import main
from kvdiag.judged.perf import LoadedRun, choose_profile, predict_run, replay
from kvdiag.kvstream.config import PRESETS, RuntimeConfig
from kvdiag.kvstream.profiles import load_profile
from kvdiag.kvstream.scenarios import SCENARIOS, Scheduler, multiturn_growth
from kvdiag.kvstream.session import play
from kvdiag.kvstream.timing import H200
from kvdiag.postmortem.perfread import scan_stream

ARM117 = RuntimeConfig(**PRESETS["arm117"], adaptive=True, layout="per-stream",
                       dispatch="fits")


def test_multiturn_growth_keeps_the_conversation_and_caps_it() -> None:
    sc = SCENARIOS["multiturn-growth"]
    assert [r.cont for r in sc.requests] == [False] + [True] * 11
    sched = Scheduler(sc.requests, 1, 512, 65536)
    decode_depth: dict[int, int] = {}
    for ub in sched.ubatches():
        if ub.phase == "decode":
            for lane in ub.lanes:
                for req, cell in zip(lane.requests, lane.cells, strict=True):
                    decode_depth.setdefault(req, cell)
    # turn k decodes from 7,150·k − 750 cells; turns 10–12 do not fit and are refused
    assert decode_depth == {k - 1: 7150 * k - 750 for k in range(1, 10)}
    assert sorted(sched.rejected) == [9, 10, 11] and sched.truncated == set()
    assert sched.kept == {k: 7150 * k for k in range(1, 9)}


def test_a_conversation_the_context_stops_is_truncated() -> None:
    sc = multiturn_growth(turns=3, new_tokens=300, output_tokens=400, slots=2)
    sched = Scheduler(sc.requests, 2, 512, 1024)
    steps = {i: 0 for i in range(6)}
    for ub in sched.ubatches():
        if ub.phase == "decode":
            for req in ub.requests:
                steps[req] += 1
    # per slot: 300 + 400 = 700 cells; the second turn has 324 left: 300 prompt, 24 decoded
    assert [steps[i] for i in range(6)] == [400, 24, 0, 400, 24, 0]
    assert sorted(sched.truncated) == [1, 4] and sorted(sched.rejected) == [2, 5]


def test_the_session_model_streams_only_past_the_resident_window() -> None:
    small = ARM117.replace(stage_mib=512)
    model = play(small, multiturn_growth(turns=6), H200)
    pool = model.plan.pool
    assert pool is not None and pool.resident_pages_per_layer == 124
    first, *_, last = [m for m in model.requests if m.decode_steps]
    assert first.samples == 0 and first.attention_us == pytest.approx(first.resident_us)
    assert last.active_pages[1] > last.resident_pages[1] and last.samples > 0
    assert last.attention_us > 2 * last.resident_us
    # the 2048 MiB pool of the seed holds every page of the session: nothing streams
    seed = play(ARM117, multiturn_growth(), H200)
    assert all(m.samples == 0 and m.resident_pages == (501, 501)
               for m in seed.requests if m.decode_steps)


@pytest.fixture(scope="module")
def seed():  # type: ignore[no-untyped-def]
    base, stream = seed_logs()
    from kvdiag.logimport.header import BootSniffer, chosen_boot, plan_of, runtime_config

    out = []
    for name, text in (("stream.log", stream), ("base.log", base)):
        sniffer = BootSniffer()
        run = scan_stream(name, io.BytesIO(text.encode()), hook=sniffer.feed)
        plan, _ = plan_of(chosen_boot(run.boots), sniffer.info)
        out.append(LoadedRun(run, runtime_config(chosen_boot(run.boots), plan)))
    return out


def test_the_seed_as_the_model_gives_it(seed) -> None:  # type: ignore[no-untyped-def]
    run, base = seed
    profile, why = choose_profile(None, None)
    assert profile is H200 and why.startswith("the run's GPU is unknown")
    pred = predict_run(run, base, profile, why, None, {})
    assert pred.config.n_streamed == 9 and pred.config.stage_mib == 2048
    assert pred.pool["resident_pages_per_layer"] == 501 and pred.pool["ring_slots"] == 10
    turns = [p for p in pred.predicted if not p.row.capped]
    assert len(turns) == 9
    # the model keeps every page resident at every turn: it predicts the baseline's curve
    base_tps = [r.decode_tps for r in rows(base.run) if not r.capped]
    for p, b in zip(turns, base_tps, strict=True):
        assert p.model.resident_pages[0] >= p.model.active_pages[1]
        assert p.predicted_tps == pytest.approx(b, rel=1e-6)
    # turn 1 agrees; the dip (turns 6 and 7) does not, and neither the resident window nor
    # the dispatch route of the model can cost what the measurement lost there
    assert not turns[0].disagrees and turns[5].disagrees and turns[6].disagrees
    page = pred.pool["page_bytes"]
    for p in turns[5:7]:
        gap_ms = (p.row.ms_per_token or 0) - (p.predicted_ms or 0)
        window, route, other = p.mechanisms
        assert "nothing streams here" in window and "cannot explain it" in window
        # every page of the 9 layers through the ring: one H2D copy per page at the profile's
        # rate, the attention waiting for it
        ring_all = float(re.search(r"grows by only ([\d.]+) ms", window).group(1))  # type: ignore[union-attr]
        pages = 9 * p.model.active_pages[1]
        assert ring_all == pytest.approx(pages * page / (H200.h2d_gbps * 1e6), rel=0.05)
        assert ring_all < gap_ms
        assert "fallback alone cannot explain it" in route
        assert f"{gap_ms:.1f} ms/token" in other


def test_a_named_card_and_a_measurement_the_model_explains(seed, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run, base = seed
    card = load_profile("rtx-3060-12gb")
    pred = predict_run(run, base, card, "--profile rtx-3060-12gb", None, {"stage_mib": 512})
    assert pred.pool["resident_pages_per_layer"] == 124
    # past 124 pages/layer (31,744 tokens) the 512 MiB pool streams through the ring
    deep = [p for p in pred.predicted if not p.row.capped and p.model.active_pages[1] > 124]
    assert deep and all(p.model.samples > 0 for p in deep)
    assert all(p.attention_ms > p.model.resident_us / 1000 for p in deep)
    # a run measured at exactly the model's prediction: the model explains it, nothing listed
    exact = []
    for p in pred.predicted:
        exact.append(p.predicted_tps or p.row.decode_tps or 1.0)
    log = ServerLog()
    log.boot(stage_mib=512, streamed=9)
    for t in session(12, 6400, 750, [round(x, 2) for x in exact]):
        log.requests(t)
    again = scan_stream("model.log", io.BytesIO(log.text().encode()))
    table = sorted(rows(again), key=lambda r: r.order)
    model = play(pred.config, replay(table), card)
    cost = model.cost
    out = predict(table, list(model.requests), calibrate(rows(base.run), cost), cost)
    assert all(p.gap is None or abs(p.gap) < 0.001 for p in out)
    assert not any(p.disagrees for p in out) and GAP == 0.15


def test_cli_predict_says_the_gpu_is_unknown_and_uses_a_named_card(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, stream = seed_logs()
    (tmp_path / "base.log").write_text(base)
    (tmp_path / "stream.log").write_text(stream)
    args = ["perf", str(tmp_path / "stream.log"), "--baseline", str(tmp_path / "base.log"),
            "--predict"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "GPU: the run's GPU is unknown (its log names none); predicted with the h200" in out
    assert "501 resident pages/layer + 10 ring slots at boot" in out
    assert "request 7 at depth 49300→50050: measured 8.79 tok/s, predicted 22.00" in out
    assert main([*args, "--profile", "rtx-5080", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    (pred,) = data["predictions"]
    assert pred["profile"]["name"] == "NVIDIA GeForce RTX 5080"
    assert pred["profile"]["source"].startswith("spec sheet, not a measurement")
    assert pred["calibrated"] is True
    dip = next(r for r in pred["requests"] if r["depth_start"] == 49300)
    assert dip["disagrees"] is True and len(dip["mechanisms"]) == 3
    # a run whose log does not give the model's shape is refused in one line
    plain = tmp_path / "plain.log"
    log = ServerLog()
    log.line("slot update_slots: id  0 | task 1 | new prompt, n_ctx_slot = 4096, n_keep = 0, "
             "task.n_tokens = 100")
    log.line("slot print_timing: id  0 | task 1 |        eval time =    1000.00 ms /    10 tokens"
             " (  100.00 ms per token,    10.00 tokens per second)")
    plain.write_text(log.text())
    assert main(["perf", str(plain), "--predict"]) == 2
    err = capsys.readouterr().err
    assert "does not give the model's" in err and "--stage-mib" in err
