"""``kvdiag devices --profile`` on a real GPU: the measured figures are plausible for the link
and memory NVML reports, and the saved file loads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.kvstream.profiles import load_profile

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:::cupy")]


def test_measured_profile_is_saved_and_plausible(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    try:
        from kvdiag.executors.cupy_exec import load_cupy

        load_cupy()
    except Exception as exc:
        pytest.skip(f"no usable GPU: {exc}")
    out = tmp_path / "p.json"
    assert main(["devices", "--profile", "--json", "--save", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    p = load_profile(str(out))
    assert p.hbm_read_gbps == data["hbm_read_gbps"]
    # device memory is an order of magnitude faster than any PCIe link; PCIe Gen3-6 x16 moves
    # 10-130 GB/s; a launch takes between 0.5 and 50 µs
    assert p.hbm_read_gbps > 10 * p.h2d_gbps
    assert 5 < p.h2d_gbps < 130 and 5 < p.zero_copy_read_gbps < 130
    assert 0.5 < p.launch_us < 50
    report = Path(__import__("os").environ.get("KVDIAG_GPU_REPORT", "/dev/null"))
    with report.open("a") as f:
        f.write(f"device profile: {json.dumps(data)}\n")
