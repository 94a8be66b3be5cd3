"""The committed sample traces still read cleanly and say what traces/README.md promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdiag.judged.trace import analyse_file

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.mark.parametrize(("name", "rules"), [
    ("single-slot", set()),
    ("two-slot-upstream", {"fits-dispatch-mismatch", "abort"}),
    ("two-slot-fits-dispatch", {"fallback"}),
    ("slot1-first-shared", {"stale-page-read", "foreign-page-read", "stream-divergence"}),
    ("slot1-first-per-stream", set()),
    ("late-join-fits-dispatch", {"fallback", "stale-page-read", "stream-divergence", "abort"}),
])
def test_sample_trace(name: str, rules: set[str]) -> None:
    result = analyse_file(TRACES / f"{name}.kvtrace")
    assert result.problems == []
    assert {f.rule for f in result.findings} == rules
    assert result.summary["status"] in ("completed", "aborted")
    assert result.header.scenario["seed"] == 0
