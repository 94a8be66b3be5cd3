"""What ``kvdiag plan`` says about the pool, the ring and refusals (issue 11 #12)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvdiag.cli import main

KVDIAG = [sys.executable, "-m", "kvdiag"]
WIDE = {"COLUMNS": "200"}


def plan_text(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
              *args: str) -> tuple[int, str, str]:
    for k, v in WIDE.items():
        monkeypatch.setenv(k, v)
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def row(out: str, name: str) -> str:
    """The value cell of row ``name``, its wrapped lines (output that is not a terminal is
    120 columns wide) joined."""
    lines = out.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(f"│ {name} ")]
    assert len(at) == 1, out
    parts = [lines[at[0]].split("│")[2].strip()]
    for line in lines[at[0] + 1:]:
        cells = line.split("│")
        if len(cells) < 3 or cells[1].strip():
            break
        parts.append(cells[2].strip())
    return " ".join(p for p in parts if p)


def test_fixed_ring_slots_are_the_minimum_and_the_remainder_is_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # small preset, 12 MiB: 26 pages, 4 layers; fixed minimum 3 -> 5 resident/layer, ring 6
    code, out, _ = plan_text(capsys, monkeypatch, "--stage-mib", "12", "--ring-slots", "3")
    assert code == 0
    assert row(out, "ring") == (
        "6 slots: GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS=3 sets the minimum (default min(8, "
        "pool pages − layers)); every page left after 5 resident × 4 layers (26 − 20) is a "
        "ring slot")
    assert out.rstrip().endswith("OK: the runtime would boot with this plan")


def test_resident_row_gives_pool_capacity_and_what_this_ctx_uses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = plan_text(capsys, monkeypatch, "--preset", "arm117", "--ctx", "2000")
    assert code == 0
    assert row(out, "resident") == (
        "pool capacity 501 pages/layer (128,256 tokens); this ctx uses 8 pages/layer "
        "(2,048 tokens)")
    # and a context beyond the capacity says how much streams
    _, out, _ = plan_text(capsys, monkeypatch, "--stage-mib", "6", "--ctx", "16384")
    assert row(out, "resident").endswith(
        "this ctx uses 64 pages/layer (16,384 tokens): 63 pages/layer stream through the ring")


def test_a_refused_pool_exits_1_with_the_refusal_as_the_last_line(tmp_path: Path) -> None:
    proc = subprocess.run([*KVDIAG, "plan", "--preset", "arm117", "--stage-mib", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[-1] == (
        "REFUSED: pool refused: pool of 6 pages cannot hold one page per layer for 9 layers "
        "plus a ring")
    doc = json.loads(subprocess.run([*KVDIAG, "plan", "--json", "--preset", "arm117",
                                     "--stage-mib", "3"], capture_output=True, text=True,
                                    timeout=60).stdout)
    assert doc["refusal"].startswith("pool refused: pool of 6 pages")


def test_plan_and_capture_print_the_same_multisequence_warning(tmp_path: Path) -> None:
    plan = subprocess.run([*KVDIAG, "plan", "--np", "3"], capture_output=True, text=True,
                          timeout=60)
    assert plan.returncode == 1
    assert plan.stdout.splitlines()[-1] == (
        "REFUSED: the validator refuses: block KV streaming requires exactly one sequence "
        "(-np 1)")
    warning = ("warning: -np 3 without --kv-unified: the validator refuses to boot ('block KV "
               "streaming requires exactly one sequence (-np 1)') unless "
               "LLAMA_KV_STREAM_ALLOW_MULTISEQ=1; capture models the port with that opt-in set "
               "(plan --allow-multiseq)")
    assert warning in plan.stderr.splitlines()
    capture = subprocess.run([*KVDIAG, "capture", "--scenario", "slot1-first", "--np", "3",
                              "--steps", "1", "--executor", "numpy", "-q", "-o",
                              str(tmp_path / "t.kvtrace")], capture_output=True, text=True,
                             timeout=120)
    assert capture.returncode in (0, 3), capture.stderr
    assert warning in capture.stderr.splitlines()
    opted = subprocess.run([*KVDIAG, "plan", "--np", "3", "--allow-multiseq"],
                           capture_output=True, text=True, timeout=60)
    assert opted.returncode == 0 and warning in opted.stderr.splitlines()
