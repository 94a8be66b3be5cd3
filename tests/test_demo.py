"""The README's main job, headless: ``kvdiag demo`` captures both scenarios and, without a
terminal, prints their check reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdiag.cli import main


def test_demo_captures_both_scenarios_and_reports_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--no-tui", "--executor", "numpy", "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["slot1-first.kvtrace",
                                                     "two-slot-concurrent.kvtrace"]
    assert "two-slot-concurrent on numpy" in text and "aborted after 1 step(s)" in text
    assert "fits-dispatch-mismatch" in text and "Q.ne[3]==1 (Q.ne[3]=2)" in text
    assert "foreign-page-read" in text and "stream-divergence" in text
