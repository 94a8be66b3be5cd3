#!/usr/bin/env python3
"""Set-up and task runner for a fresh clone: ``python3 dev.py demo`` or ``python3 dev.py test``.

It creates ``.venv`` beside this file on first use, installs kvdiag with its dev extras into
it (with the CuPy extra as well where an NVIDIA driver is present), and runs the task. Only the
Python standard library is used here, so it works before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".kvdiag-installed"


def _run(*cmd: str | Path) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT)


def _has_nvidia_driver() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


def ensure_env() -> None:
    if not PY.exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pyproject = ROOT / "pyproject.toml"
    if STAMP.exists() and STAMP.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    extras = "dev,cuda13" if _has_nvidia_driver() else "dev"
    if _run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip") != 0:
        sys.exit("dev.py: could not upgrade pip in .venv")
    if _run(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]") != 0:
        sys.exit("dev.py: installing kvdiag into .venv failed")
    STAMP.touch()


def task_test(extra: list[str]) -> int:
    for step in (
        (BIN / "ruff", "check", "kvdiag", "tests", "benchmarks", "dev.py"),
        (BIN / "mypy",),
    ):
        if _run(*step) != 0:
            return 1
    return _run(PY, "-m", "pytest", *extra)


def task_demo(extra: list[str]) -> int:
    return _run(BIN / "kvdiag", "demo", *extra)


TASKS = {"test": task_test, "demo": task_demo}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TASKS:
        print(f"usage: python3 dev.py {{{'|'.join(TASKS)}}} [args...]", file=sys.stderr)
        return 2
    ensure_env()
    return TASKS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
