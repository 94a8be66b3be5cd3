"""Builds tests/fixtures/native/minggml.c (a stand-in ggml abort path and two ops) as a real
shared library with DWARF, installed the way llama-cpp-python installs ggml:
``<root>/env/lib/python3.11/site-packages/llama_cpp/lib/libggml-base.so``, with a small program
that links it. The source is compiled from ``<root>/llama.cpp/ggml/src/ggml.c`` so that
``__FILE__`` (what the abort line prints) is a ggml source path. Not a test module."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NATIVE = Path(__file__).parent / "fixtures" / "native"
GCC = shutil.which("gcc")
GDB = shutil.which("gdb")


@dataclass(frozen=True)
class Built:
    root: Path
    lib: Path
    server: Path
    src: Path


def build(root: Path, opt: str = "-O1", extra: tuple[str, ...] = ()) -> Built:
    assert GCC is not None
    src = root / "llama.cpp" / "ggml" / "src" / "ggml.c"
    src.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(NATIVE / "minggml.c", src)
    libdir = root / "env" / "lib" / "python3.11" / "site-packages" / "llama_cpp" / "lib"
    libdir.mkdir(parents=True, exist_ok=True)
    lib = libdir / "libggml-base.so"
    server = libdir / "minserver"
    subprocess.run([GCC, "-g", opt, "-fPIC", "-shared", "-Wl,--build-id", *extra, "-o", str(lib),
                    str(src)], check=True, capture_output=True, timeout=120)
    subprocess.run([GCC, "-g", "-O1", "-Wl,--build-id", "-o", str(server),
                    str(NATIVE / "minserver.c"), f"-L{libdir}", "-lggml-base",
                    f"-Wl,-rpath,{libdir}"], check=True, capture_output=True, timeout=120)
    return Built(root, lib, server, src)


def run(built: Built, mode: str, backtrace: bool = False) -> bytes:
    """What a terminal shows: stdout and stderr on one stream (``mode`` "abort" or "segv")."""
    env = dict(os.environ)
    env.pop("MINGGML_BACKTRACE", None)
    if backtrace:
        env["MINGGML_BACKTRACE"] = "1"
    proc = subprocess.run([str(built.server), mode], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env, timeout=60, check=False)
    assert proc.returncode < 0, proc.returncode
    return proc.stdout


def run_gdb(built: Built, mode: str) -> bytes:
    """The same run under ``gdb -batch -ex run -ex bt`` (what ggml's gdb backtrace shows)."""
    assert GDB is not None
    proc = subprocess.run([GDB, "-q", "-nx", "-batch", "-ex", "run", "-ex", "bt", "--args",
                           str(built.server), mode], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=120, check=False)
    return proc.stdout
