"""kvdiag sweep: stage-size parsing, the summary's best/enough/cliff, the points against a
captured trace of the same configuration, and the CLI's outputs."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from kvdiag.analysis.sweep import SweepPoint, summarise
from kvdiag.cli import main
from kvdiag.kvstream.config import PRESETS, RuntimeConfig
from kvdiag.kvstream.scenarios import SCENARIOS, Scenario
from kvdiag.kvstream.timing import H200
from kvdiag.model import events as ev
from kvdiag.runs.sweep import PointSpec, run_point, run_sweep, stage_range
from kvdiag.trace import TraceReader


def test_stage_ranges() -> None:
    assert stage_range("256:1024:256") == [256, 512, 768, 1024]
    assert stage_range("512,2048") == [512, 2048]
    for bad in ("0:10:2", "10:2:2", "1:10:0", "a,b", "1:2", "-4"):
        with pytest.raises(ValueError, match="--stage-mib"):
            stage_range(bad)


def point(mib: int, tps: float, np_: int = 1) -> SweepPoint:
    return SweepPoint(stage_mib=mib, np=np_, status="completed", decode_tokens=1000,
                      eval_us=1000 / tps * 1e6)


def test_summary_names_the_best_the_smallest_enough_stage_and_the_cliff() -> None:
    pts = [point(256, 100.0), point(512, 110.0), point(768, 905.0), point(1024, 1000.0),
           point(1280, 995.0), point(512, 50.0, np_=2)]
    (one, two) = summarise(pts)
    assert one.best is not None and one.best.stage_mib == 1024
    assert one.enough is not None and one.enough.stage_mib == 768  # 905 >= 0.9 x 1000
    assert one.cliff is not None and (one.cliff[0].stage_mib, one.cliff[1].stage_mib) == (512, 768)
    assert two.best is not None and two.best.stage_mib == 512 and two.cliff is None


def test_a_flat_sweep_has_no_cliff() -> None:
    (s,) = summarise([point(m, 1000.0 - m / 100) for m in (256, 512, 768)])
    assert s.cliff is None and s.enough is not None and s.enough.stage_mib == 256


SHORT = ["--prompt-tokens", "1200", "--steps", "6"]


def _short() -> Scenario:
    s = SCENARIOS["pool-pressure"]
    return dataclasses.replace(s, requests=tuple(
        dataclasses.replace(r, prompt=1200, decode=6) for r in s.requests))


def _cfg(stage_mib: int) -> RuntimeConfig:
    scenario = SCENARIOS["pool-pressure"]
    return RuntimeConfig(**{**PRESETS["small"], **scenario.sizing, **scenario.config,
                            "stage_mib": stage_mib, "adaptive": True})


def test_a_point_agrees_with_a_captured_trace_of_the_same_configuration(tmp_path: Path) -> None:
    p = run_point(PointSpec(_cfg(8), _short(), "decisions", H200))
    out = tmp_path / "pp.kvtrace"
    assert main(["capture", "--scenario", "pool-pressure", "--stage-mib", "8", "--adaptive",
                 "--executor", "numpy", "-q", "-o", str(out), *SHORT]) == 0
    decode = False
    sums = dict(pool=0, ring=0, bytes=0, samples=0, misses=0, reps=0, tokens=0, eval_us=0.0)
    with TraceReader.open(out) as r:
        assert r.header.extra["feedback"]["profile"]["name"] == "NVIDIA H200"
        for e in r:
            if isinstance(e, ev.Step):
                decode = e.phase == "decode"
                sums["tokens"] += e.tokens * len(e.streams) if decode else 0
            elif isinstance(e, ev.Repartition):
                sums["reps"] += 1
            elif decode and isinstance(e, ev.Read):
                sums["pool"] += e.pool
                sums["ring"] += e.ring
            elif decode and isinstance(e, ev.Upload):
                sums["bytes"] += e.bytes
            elif decode and isinstance(e, ev.Adapt):
                sums["samples"] += e.samples or 0
                sums["misses"] += e.misses or 0
                sums["eval_us"] += e.eval_us or 0.0
    assert (p.pool_pages_read, p.ring_pages_read, p.upload_bytes) == (
        sums["pool"], sums["ring"], sums["bytes"])
    assert (p.samples, p.misses, p.repartitions, p.decode_tokens) == (
        sums["samples"], sums["misses"], sums["reps"], sums["tokens"])
    assert p.eval_us == pytest.approx(sums["eval_us"])
    assert p.status == "completed" and p.decode_tokens == 6 and p.invalidations >= 1


@pytest.mark.slow
def test_parallel_and_serial_sweeps_give_the_same_points() -> None:
    specs = [PointSpec(_cfg(m), _short(), "decisions", H200) for m in (2, 6, 12)]
    serial = run_sweep(specs, workers=1)
    parallel = run_sweep(specs, workers=2)
    assert serial == parallel
    assert serial[0].status == "refused" and "refuse this pool" in (serial[0].error or "")
    assert (serial[2].tokens_per_s or 0) > (serial[1].tokens_per_s or 0)


def test_cli_json_plot_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg = tmp_path / "s.svg"
    assert main(["sweep", "--stage-mib", "4,12", "-j", "1", "--json", "--plot", str(svg),
                 *SHORT]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["stage_mib"] for p in data["points"]] == [4, 12]
    assert data["summary"][0]["best_stage_mib"] == 12
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    assert main(["sweep", "--stage-mib", "12:4:2"]) == 2
    assert "--stage-mib '12:4:2'" in capsys.readouterr().err
    assert main(["sweep", "--stage-mib", "4", "--plot", str(tmp_path / "x.pdf")]) == 2


def test_cli_text_marks_best_and_names_the_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--stage-mib", "2,12", "-j", "1", "-q", *SHORT]) == 0
    out = capsys.readouterr().out
    assert "refused" in out and "best, ≥90%" in out
    assert "np 1, 2 MiB refused: the runtime would refuse this pool" in out
    assert "tok/s (modelled attn) vs stage MiB" in out and "\x1b[" not in out


def test_a_missing_dependency_is_one_line_not_an_internal_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN an installation without plotext, a package kvdiag requires (a wheel installed
    without its dependencies: the GPU machine's sweep said "internal error: No module named
    'plotext'")
    WHEN a sweep draws its terminal plot
    THEN one line names the missing package and the fix, with exit 69; a module kvdiag does
    not require stays an internal error (70)."""
    monkeypatch.setitem(sys.modules, "plotext", None)
    assert main(["sweep", "--stage-mib", "12", "-j", "1", "-q", *SHORT]) == 69
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvdiag: error: plotext is not installed, and kvdiag needs it: the "
                   "installation is incomplete (pip install kvdiag installs it)"]
    from kvdiag import cli

    assert {"plotext", "pynvml", "elftools", "textual_plotext", "msgspec"} <= \
        cli._required_modules()
    assert "cupy" not in cli._required_modules() and "duckdb" not in cli._required_modules()
    from kvdiag.report import sweep as report_sweep

    def broken(*args: object, **kwargs: object) -> str:
        raise ModuleNotFoundError("No module named 'not_a_dependency'", name="not_a_dependency")

    monkeypatch.setattr(report_sweep, "terminal_plot", broken)
    monkeypatch.delitem(sys.modules, "plotext")
    assert main(["sweep", "--stage-mib", "12", "-j", "1", "-q", *SHORT]) == 70
    assert "internal error: ModuleNotFoundError" in capsys.readouterr().err
