"""Commands that never multiply a matrix ask numpy's OpenBLAS for one thread (kvdiag.cli).

numpy starts a BLAS thread per core when it is imported; check, diff, the TUI and the other
readers of traces and logs import numpy for the judgement's arrays and never use BLAS, so the
threads only cost CPU. Commands that may run an executor's attention keep the default, and a
value the user set is never changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_trace_blockscan import HEADER, step_lines

_PROBE = ("import os, sys; from kvdiag import cli; code = cli.main(sys.argv[1:]); "
          "print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)")


def _blas(args: list[str], env: dict[str, str] | None = None) -> str:
    run_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    run_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, env=run_env, check=False, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("BLAS ")]
    assert lines, done.stderr
    return lines[-1].split(" ", 1)[1]


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEADER + b"\n".join(step_lines(5)) + b"\n")
    return path


def test_check_asks_for_one_blas_thread(trace: Path) -> None:
    assert _blas(["check", str(trace), "--json"]) == "1"


def test_a_users_choice_is_kept(trace: Path) -> None:
    assert _blas(["check", str(trace), "--json"], {"OPENBLAS_NUM_THREADS": "3"}) == "3"


def _chosen(command: str, first: str = "") -> str:
    code = (f"import os; {first}from kvdiag import cli; cli._one_blas_thread({command!r}); "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True, timeout=60).stdout.strip()


def test_a_command_that_may_run_attention_keeps_the_default() -> None:
    assert [_chosen(c) for c in ("capture", "sweep", "demo", "diff", "tui")] == [
        "None", "None", "None", "1", "1"]


def test_nothing_is_set_once_numpy_is_imported() -> None:
    """Too late to matter (its threads have started): the environment is left alone."""
    assert _chosen("check", first="import numpy; ") == "None"
