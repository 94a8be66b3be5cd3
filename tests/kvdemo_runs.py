"""kvdemo (kernels/native_demo, a real ggml) built once and run once per configuration, for
every test that reads its traces (tests/test_native_ggml.py, tests/test_corpus_kvdemo.py);
tests/conftest.py holds the session fixtures ``kvdemo`` and ``kvdemo_run``. Not a test
module."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests import native_build as nb

SCHEDULES = ("two-slot-concurrent", "slot1-first")
LAYOUTS = ("shared", "per-stream")
DISPATCHES = ("membership", "fits")


@dataclass(frozen=True)
class DemoRun:
    trace: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def runtime(self) -> int:
        m = re.search(r"^kv buffer (\S+) type (\S+) size \d+ runtime (\d+)$", self.stdout, re.M)
        assert m, self.stdout[:500]
        assert m[1] == m[2] == "CUDA_KV_Stream_Host"
        return int(m[3])

    def k_data(self, layer: int) -> int:
        m = re.search(rf"^layer {layer} k (\d+) v (\d+) stream_stride (\d+)$", self.stdout, re.M)
        assert m, self.stdout[:500]
        return int(m[1])

    def deltas(self) -> dict[int, list[tuple[int, float]]]:
        """stream -> [(step, max |Δ|)] as the program printed them."""
        out: dict[int, list[tuple[int, float]]] = {}
        for m in re.finditer(r"^step (\d+) stream (\d+) max\|delta\| (\S+)$", self.stdout, re.M):
            out.setdefault(int(m[2]), []).append((int(m[1]), float(m[3])))
        return out


def build(out: Path) -> Path | str:
    """The kvdemo executable built into ``out``, or why it cannot be built here."""
    reason = nb.missing_tools()
    if reason:
        return reason
    try:
        ggml = nb.ensure_ggml()
    except nb.NativeUnavailable as exc:
        return f"ggml cannot be fetched or built here: {exc}"
    assert ggml.info["sha256"] == nb.SDIST_SHA256
    assert ggml.info["ggml_commit"] == nb.GGML_COMMIT
    exe, _seconds = nb.build_demo(ggml, out)
    return exe


def runner(kvdemo: Path, out: Path) -> Callable[[str, str, str], DemoRun]:
    """``go(schedule, layout, dispatch)``: kvdemo's run of that configuration, once."""
    done: dict[tuple[str, str, str], DemoRun] = {}

    def go(schedule: str, layout: str, dispatch: str) -> DemoRun:
        key = (schedule, layout, dispatch)
        if key not in done:
            trace = out / f"{schedule}-{layout}-{dispatch}.kvtrace"
            env = {**os.environ, "KVTRACE_FILE": str(trace), "GGML_NO_BACKTRACE": "1"}
            proc = subprocess.run(
                [str(kvdemo), "--schedule", schedule, "--layout", layout, "--dispatch", dispatch],
                env=env, capture_output=True, text=True, timeout=120, check=False)
            done[key] = DemoRun(trace, proc.returncode, proc.stdout, proc.stderr)
        return done[key]

    return go


