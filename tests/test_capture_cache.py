"""Captures with the NumPy executor's views and threads decide and compute exactly what the
recorded captures made before them did (tests/capture_fixtures.py), and what the same executor
does with no view kept and one thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.capture_fixtures import CASES, capture_case, decisions, gemm_fingerprint, load


def _assert_same_events(recorded: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    assert len(got) == len(recorded)
    for i, (old, new) in enumerate(zip(recorded, got, strict=True)):
        mismatched = {name: (value, new.get(name)) for name, value in old.items()
                      if new.get(name) != value}
        assert not mismatched, f"event {i} ({old['kind']}, step {old['step']}): {mismatched}"


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_capture_matches_the_recording_made_before_the_caches(case: str, tmp_path: Path) -> None:
    doc = load(case)
    if doc["gemm_fingerprint"] != gemm_fingerprint():
        pytest.skip("this machine's BLAS rounds GEMMs differently from the machine that "
                    "recorded the fixtures")
    code = capture_case(case, tmp_path / "t.kvtrace")
    assert code == doc["exit"]
    got = decisions(tmp_path / "t.kvtrace")
    _assert_same_events(doc["events"], got)
    outputs = [e for e in got if e["kind"] == "output"]
    assert outputs or case == "two-slot-abort"
