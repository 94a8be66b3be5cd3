"""``kvdiag devices``: GPUs as NVML reports them, and a clear message with exit 1 without one."""

from __future__ import annotations

import json
import types

import pytest

from kvdiag.cli import main
from kvdiag.telemetry import nvml as nvml_mod
from tests.fake_nvml import H200, make_fake_pynvml


def _use(monkeypatch: pytest.MonkeyPatch, fake: types.ModuleType) -> None:
    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: fake)


def test_lists_every_gpu_with_memory_driver_and_link(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = make_fake_pynvml([H200, {**H200, "gen": 4, "bus": "00000000:2A:00.0"}])
    _use(monkeypatch, fake)
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "NVIDIA H200" in ln]
    assert len(lines) == 2
    assert "140.4 GiB" in lines[0] and "580.159.04" in lines[0] and "Gen5 x16" in lines[0]
    assert "13.0" in lines[0] and "9.0" in lines[0]
    assert "Gen4 x16 (max Gen5 x16)" in out
    assert fake.state["shutdown"] == 1  # type: ignore[attr-defined]


def test_json_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, make_fake_pynvml([H200]))
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reason"] is None
    (g,) = data["gpus"]
    assert (g["name"], g["memory_bytes"], g["pcie"], g["compute_capability"]) == (
        "NVIDIA H200", 150_754_820_096, "Gen5 x16", "9.0")


def test_no_driver_says_why_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use(monkeypatch, make_fake_pynvml(init_error="Driver Not Loaded"))
    assert main(["devices"]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.strip() == "no NVIDIA GPU found (FakeNVMLError: Driver Not Loaded)"


def test_driver_without_gpus_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use(monkeypatch, make_fake_pynvml([]))
    assert main(["devices", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"gpus": [], "reason": "NVML reports no GPU"}


def test_a_failing_field_shows_as_not_available(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use(monkeypatch, make_fake_pynvml([H200], failing=("nvmlDeviceGetCurrPcieLinkGeneration",)))
    assert main(["devices"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "H200" in ln)
    assert "Gen" not in row and "n/a" in row
