"""``capture`` refuses sizes its scenario cannot run in, before running (issue 11 #10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvdiag.kvstream.scenarios import SCENARIOS
from kvdiag.runs.capture import stream_cells_needed

KVDIAG = [sys.executable, "-m", "kvdiag"]


def capture(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVDIAG, "capture", "--executor", "numpy", "-q", "-o",
                           str(tmp_path / "t.kvtrace"), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (["--scenario", "slot1-first", "--ctx", "700"],
     "scenario slot1-first needs 616 KV cells in stream 0 (500 prompt + 8 decode, 600 prompt "
     "+ 16 decode tokens per request) but --ctx 700 gives 512 per stream (np 2): raise --ctx "
     "to 1280 or lower --steps / --prompt-tokens"),
    (["--scenario", "single-slot", "--prompt-tokens", "9000"],
     "scenario single-slot needs 9016 KV cells in stream 0 (9000 prompt + 16 decode tokens per "
     "request) but --ctx 4096 gives 4096 per stream: raise --ctx to 9216 or lower --steps / "
     "--prompt-tokens"),
    (["--scenario", "late-join", "--kv-unified", "--steps", "1000000000000"],
     "needs 2000000000900 KV cells in stream 0"),
    (["--scenario", "single-slot", "--steps", "0"], "--steps must be positive, got 0"),
    (["--scenario", "single-slot", "--prompt-tokens", "0"],
     "--prompt-tokens must be positive, got 0"),
])
def test_sizes_the_scenario_cannot_run_in_are_one_line_usage_errors(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = capture(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "t.kvtrace").exists()  # refused before anything was written


def test_ctx_not_a_multiple_of_256_is_rounded_with_a_note(tmp_path: Path) -> None:
    proc = capture(tmp_path, "--scenario", "single-slot", "--ctx", "1000", "--steps", "1",
                   "--prompt-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert ("note: --ctx 1000 is rounded up to 1024 (n_ctx is padded to a multiple of 256)"
            in proc.stderr)


def test_the_bound_is_exactly_what_the_smallest_ctx_that_runs_needs(tmp_path: Path) -> None:
    # late-join with np 2 needs 624 cells on slot 1's stream: 768 after padding, which
    # n_ctx 1280 gives (1280 // 2 = 640, padded) and n_ctx 1024 does not (512)
    assert stream_cells_needed(SCENARIOS["late-join"], 2) == {1: 624, 0: 304}
    assert stream_cells_needed(SCENARIOS["late-join"], 1) == {0: 928}
    ran = capture(tmp_path, "--scenario", "late-join", "--ctx", "1280")
    # 3: the run reached the modelled upstream abort, i.e. it ran rather than being refused
    assert ran.returncode in (0, 3) and ran.stdout.startswith("late-join on numpy"), ran.stderr
    assert capture(tmp_path, "--scenario", "late-join", "--ctx", "1024").returncode == 2
