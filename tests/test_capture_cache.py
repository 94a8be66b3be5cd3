"""Captures with the NumPy executor's views, threads and compiled kernels decide and compute
exactly what the recorded captures made before them did (tests/capture_fixtures.py), and what
the same executor does with all of them off."""

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


@pytest.mark.slow
def test_views_threads_and_kernels_off_give_the_same_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On any machine (no recording needed): slot1-first, whose stale and foreign reads need
    patched pages and separate references, captured with every speed-up on and with all of
    them off (no kept views, one thread, einsum), gives the same decisions and outputs."""
    from kvdiag.executors import cpu_kernels

    assert capture_case("slot1-first", tmp_path / "fast.kvtrace") == 0
    for name, value in (("KVDIAG_NUMPY_KEEP_VIEWS", "0"), ("KVDIAG_NUMPY_THREADS", "1"),
                        ("KVDIAG_NUMPY_NATIVE", "0")):
        monkeypatch.setenv(name, value)
    cpu_kernels.load.cache_clear()
    try:
        assert capture_case("slot1-first", tmp_path / "plain.kvtrace") == 0
        assert cpu_kernels.load() is None
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()
    fast, plain = decisions(tmp_path / "fast.kvtrace"), decisions(tmp_path / "plain.kvtrace")
    _assert_same_events(plain, fast)
    deltas = [e["max_abs_delta"] for e in fast if e["kind"] == "output"]
    assert max(deltas) > 1.0  # the stale reads were really served
