"""A real process death without anchor words: a library that is neither ggml nor llama
faults, the program's own SIGSEGV handler prints ``caught signal 11`` and glibc's
``backtrace_symbols_fd`` frames, then dies of the signal. Built and run here with gcc; the
scan finds the death (end of the log) and the existing symbolizer names the faulting line
from the library's DWARF (glibc ``module(sym+0xOFF)`` frames, issue 11 #3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvdiag.postmortem.resymbolize import resymbolize
from tests import native_ggml
from tests.postmortem_helpers import scan_bytes

pytestmark = pytest.mark.skipif(native_ggml.GCC is None, reason="needs gcc")

LIB = """\
int vendor_sink;
__attribute__((noinline)) int vendor_step(int *p, int n) {
    vendor_sink = n;
    return p[n];  /* FAULT */
}
int vendor_run(int *p) { return vendor_step(p, 3) + 1; }
"""
MAIN = """\
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int vendor_run(int *p);
static void on_signal(int sig) {
    char msg[64];
    void *frames[32];
    int n = snprintf(msg, sizeof msg, "caught signal %d\\n", sig);
    write(2, msg, (size_t)n);
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
int main(void) {
    signal(SIGSEGV, on_signal);
    puts("srv  update_slots: all slots are idle");
    fflush(stdout);
    return vendor_run((int *)0);
}
"""


def test_custom_handler_death_is_found_and_symbolized(tmp_path: Path) -> None:
    assert native_ggml.GCC is not None
    (tmp_path / "vendor.c").write_text(LIB)
    (tmp_path / "main.c").write_text(MAIN)
    lib = tmp_path / "libvendor.so"
    prog = tmp_path / "srv"
    gcc = native_ggml.GCC
    subprocess.run([gcc, "-g", "-O1", "-fPIC", "-shared", "-Wl,--build-id", "-o", str(lib),
                    str(tmp_path / "vendor.c")], check=True, capture_output=True, timeout=120)
    subprocess.run([gcc, "-g", "-O1", "-o", str(prog), str(tmp_path / "main.c"),
                    f"-L{tmp_path}", "-lvendor", f"-Wl,-rpath,{tmp_path}"],
                   check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(prog)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=60, check=False)
    assert proc.returncode == -11
    log = proc.stdout
    assert b"ggml" not in log and b"llama_" not in log and b"SEGV" not in log
    lines = log.decode().splitlines()
    signal_line = 1 + next(i for i, t in enumerate(lines) if t == "caught signal 11")
    (crash,) = scan_bytes(log).crashes
    assert crash.kind == "segfault" and crash.signal is not None
    assert crash.signal.signal == "SIGSEGV" and crash.where.line == signal_line
    scan = resymbolize(scan_bytes(log), [str(lib)], None, use_cache=False)
    (crash,) = scan.crashes
    assert scan.binaries and scan.binaries[0].path == str(lib)
    assert crash.backtrace is not None
    mine = [f for f in crash.backtrace.frames if f.module == str(lib)]
    fault = 1 + LIB.splitlines().index("    return p[n];  /* FAULT */")
    assert (mine[0].function, mine[0].file, mine[0].line) == (
        "vendor_step", str(tmp_path / "vendor.c"), fault)
    assert mine[1].function == "vendor_run"
