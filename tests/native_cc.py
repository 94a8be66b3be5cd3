"""Compilers and flags for the tests that build C, C++ and CUDA programs around kernels/kvtrace.h
(test_native_header.py, test_native_macros.py, native_runtime.py). Not a test module."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
TESTS_C = KERNELS / "native_tests"
CC = shutil.which("gcc")
CXX = shutil.which("g++")
_LOCAL_NVCC = Path("/usr/local/bin/nvcc")
NVCC = shutil.which("nvcc") or (str(_LOCAL_NVCC) if _LOCAL_NVCC.exists() else None)
# -pedantic, plus the warnings ggml's own build turns on (ggml/cmake/common.cmake: -Wcast-qual,
# -Wshadow, -Wstrict-prototypes, -Wpointer-arith, -Wmissing-prototypes for C,
# -Wmissing-declarations for C++): the header must not add warnings to a fork's build.
STRICT_C = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-Wcast-qual", "-Wshadow",
            "-Wstrict-prototypes", "-Wpointer-arith", "-Wmissing-prototypes"]
STRICT_CXX = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic", "-Wcast-qual",
              "-Wshadow", "-Wmissing-declarations"]


def build(cmd: list[str]) -> None:
    """Run a compiler; a failure shows the command and its whole output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"


def run(exe: Path, cwd: Path, *args: str, trace: str | None = "t_%p.kvtrace",
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a program with KVTRACE_FILE set to ``trace`` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_FILE", "KVTRACE_STATE_12")}
    if trace is not None:
        env["KVTRACE_FILE"] = trace
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_trace(folder: Path) -> Path:
    found = sorted(folder.glob("*.kvtrace"))
    assert len(found) == 1, found
    return found[0]
