"""Which binaries symbolize a log (issue 11 #4, #5): files found at the module paths the log
printed are used unless ``--no-auto-binaries`` (``--binary`` overrides them), and every binary is
checked against the log first: by build-id when the log states one, else by the log's
symbol+offset frames, and by ELF machine. A binary from another build or machine is refused for
its module with one ``binary-mismatch`` problem and the frames stay as logged."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import native_ggml
from tests.postmortem_helpers import run_command, run_json

READELF = shutil.which("readelf")
pytestmark = pytest.mark.skipif(native_ggml.GCC is None, reason="needs gcc to build binaries")


@pytest.fixture
def crash(tmp_path: Path) -> tuple[native_ggml.Built, Path]:
    built = native_ggml.build(tmp_path / "build")
    log = tmp_path / "server.log"
    log.write_bytes(native_ggml.run(built, "abort", backtrace=True) + b"Aborted (core dumped)\n")
    return built, log


def _lib_frames(data: dict[str, Any], lib: Path) -> list[dict[str, Any]]:
    (c,) = data["crashes"]
    return [f for f in c["frames"] if f["module"] == str(lib)]


def _abort_line(built: native_ggml.Built) -> int:
    src = built.src.read_text().splitlines()
    return 1 + next(i for i, t in enumerate(src) if 'GGML_ABORT("fatal error")' in t)


# -- #4 binaries at the logged paths ---------------------------------------------------------


def test_module_at_the_logged_path_is_used_and_named(crash: tuple[native_ggml.Built, Path],
                                                     capsys: Any) -> None:
    built, log = crash
    code, data = run_json([str(log), "--no-cache"], capsys)
    assert code == 1
    plan = [f for f in _lib_frames(data, built.lib)
            if f["function"] == "ggml_kv_stream_plan_pages"]
    assert [(f["file"], f["line"]) for f in plan] == [(str(built.src), _abort_line(built))]
    (lib_use,) = [b for b in data["binaries"] if b["path"] == str(built.lib)]
    assert (lib_use["origin"], lib_use["checked_by"]) == ("logged-path", "frames")
    # every frame of the library was placed and checked (glibc sym+0xOFF frames)
    assert re.fullmatch(r"(\d) frame\(s\) land in the functions they name; \1 frame\(s\) agree "
                        r"on one page-aligned load address; \d return address\(es\) follow a call "
                        r"instruction", lib_use["evidence"]), lib_use["evidence"]
    assert not any(b["path"].endswith("libc.so.6") for b in data["binaries"])  # runtime lib
    code, text = run_command([str(log), "--no-cache"], capsys)
    # rich folds long paths: compare without whitespace
    want = f"symbolized with {built.lib} found at the logged path"
    assert "".join(want.split()) in "".join(text.split())
    # turned off: the frames stay as logged
    code, data = run_json([str(log), "--no-auto-binaries"], capsys)
    assert data["binaries"] == []
    assert all(f["file"] is None for f in _lib_frames(data, built.lib))


def test_binary_option_overrides_the_logged_path(crash: tuple[native_ggml.Built, Path],
                                                 tmp_path: Path, capsys: Any) -> None:
    built, log = crash
    copy = tmp_path / "elsewhere" / "libggml-base.so.0.9.7"
    copy.parent.mkdir()
    shutil.copy(built.lib, copy)
    code, data = run_json([str(log), "--no-cache", "--binary", str(copy)], capsys)
    assert code == 1
    paths = {b["path"]: b["origin"] for b in data["binaries"]}
    assert paths[str(copy)] == "option" and str(built.lib) not in paths
    assert any(f["line"] == _abort_line(built) for f in _lib_frames(data, built.lib))


# -- #5 cross-checking ---------------------------------------------------------------------


def _first_failed_check(log: bytes, lib: Path) -> str:
    """What ``nm`` says about the log's ``libggml-base.so(sym+0xOFF)[0xADDR]`` frames in
    ``lib``, in the order the checks run (issue 16 #5): an offset beyond its symbol's size,
    else a load address (ADDR − value − OFF) that is not a page multiple, else two different
    load addresses, else a return address after no call."""
    printed = [(sym.decode(), int(off, 16), int(addr, 16)) for sym, off, addr in re.findall(
        rb"libggml-base\.so\((\w+)\+0x([0-9a-f]+)\)\[0x([0-9a-f]+)\]", log)]
    assert len(printed) >= 3
    nm = subprocess.run(["nm", "-S", str(lib)], capture_output=True, text=True,
                        check=True).stdout
    syms = {m.group(3): (int(m.group(1), 16), int(m.group(2), 16))
            for m in re.finditer(r"^([0-9a-f]+) ([0-9a-f]+) [Tt] (\w+)$", nm, re.M)}
    for sym, off, _addr in printed:
        if off > syms[sym][1]:
            return rf"the log's frame {sym}\+0x{off:x} lands in "
    bases = [addr - syms[sym][0] - off for sym, off, addr in printed]
    for (sym, off, _addr), base in zip(printed, bases, strict=True):
        if base % 0x1000:
            return (rf"the log's frame {sym}\+0x{off:x} puts its load address at {base:#x}, "
                    "which is not a page boundary")
    if len(set(bases)) > 1:
        return r"the log's frames \S+ and \S+ put it at different load addresses"
    return r"the log's frame \S+ returns to 0x[0-9a-f]+ in it, where no call instruction ends"


@pytest.mark.parametrize("opt", ["-Os", "-O0"])
def test_binary_from_another_build_is_refused(crash: tuple[native_ggml.Built, Path],
                                              tmp_path: Path, capsys: Any, opt: str) -> None:
    built, log = crash
    other = native_ggml.build(tmp_path / "other", opt=opt)
    why = _first_failed_check(log.read_bytes(), other.lib)
    code, data = run_json([str(log), "--no-cache", "--no-auto-binaries",
                           "--binary", str(other.lib)], capsys)
    assert code == 1
    assert data["binaries"] == []
    (p,) = [p for p in data["problems"] if p.get("code") == "binary-mismatch"]
    assert p["source"] == str(other.lib)
    assert re.search(r"is not the build the log ran: " + why, p["message"]), p["message"]
    assert "\n" not in p["message"]
    frames = _lib_frames(data, built.lib)
    assert frames and all(f["file"] is None for f in frames)  # raw frames kept
    assert [f["function"] for f in frames][:2] == ["ggml_print_backtrace", "ggml_abort"]
    # the same file rebuilt at the logged path after the crash is refused the same way
    shutil.copy(other.lib, built.lib)
    code, data = run_json([str(log), "--no-cache"], capsys)
    assert any(p.get("code") == "binary-mismatch" and p["source"] == str(built.lib)
               for p in data["problems"])
    code, text = run_command([str(log), "--no-cache"], capsys)
    assert "binary-mismatch" in text


@pytest.mark.parametrize(("machine", "name"), [(183, "AArch64"), (243, "RISC-V"), (40, "ARM")])
def test_elf_for_another_machine_is_refused(crash: tuple[native_ggml.Built, Path],
                                            tmp_path: Path, capsys: Any, machine: int,
                                            name: str) -> None:
    built, log = crash
    assert b"/x86_64-linux-gnu/" in log.read_bytes()  # the log shows its machine
    foreign = tmp_path / "foreign" / "libggml-base.so"
    foreign.parent.mkdir()
    data = bytearray(built.lib.read_bytes())
    data[18:20] = struct.pack("<H", machine)  # e_machine (ELF header, gABI)
    foreign.write_bytes(bytes(data))
    code, out = run_json([str(log), "--no-cache", "--binary", str(foreign)], capsys)
    assert code == 1  # refused, not an input error: the log is still analysed
    (p,) = [p for p in out["problems"] if p.get("code") == "binary-mismatch"]
    assert f"it is an ELF for {name}, the log comes from x86-64" in p["message"]
    assert all(f["file"] is None for f in _lib_frames(out, built.lib))


@pytest.mark.skipif(READELF is None, reason="needs binutils readelf for the build-id")
def test_build_id_stated_by_the_log_decides(crash: tuple[native_ggml.Built, Path],
                                            tmp_path: Path, capsys: Any) -> None:
    built, _log = crash
    assert READELF is not None
    notes = subprocess.run([READELF, "-n", str(built.lib)], capture_output=True, text=True,
                           check=True).stdout
    real = re.search(r"Build ID: ([0-9a-f]+)", notes)
    assert real is not None
    nm = subprocess.run(["nm", "-D", str(built.lib)], capture_output=True, text=True,
                        check=True).stdout
    step = int(re.search(r"([0-9a-f]+) T ggml_graph_compute_step", nm).group(1), 16)  # type: ignore[union-attr]

    def coredump(build_id: str) -> Path:
        log = tmp_path / f"core-{build_id[:6]}.log"
        log.write_text(
            "Process 4411 (minserver) of user 1000 dumped core.\n\n"
            f"Module {built.lib} with build-id {build_id}\n"
            "Stack trace of thread 4411:\n"
            "#0  0x00007f2b1c49e95c __pthread_kill_implementation (libc.so.6 + 0x8e95c)\n"
            "#1  0x00007f2b1c44cfb2 raise (libc.so.6 + 0x3cfb2)\n"
            f"#2  0x00007f2b1c7a{step + 0x13 & 0xfff:03x} ggml_graph_compute_step "
            f"(libggml-base.so + 0x{step + 0x13:x})\n")
        return log

    code, data = run_json([str(coredump(real.group(1))), "--no-cache", "--no-auto-binaries",
                           "--binary", str(built.lib)], capsys)
    assert data["binaries"] == [{"path": str(built.lib), "origin": "option",
                                 "checked_by": "build-id",
                                 "evidence": "its build-id is the one the log states"}]
    (c,) = data["crashes"]
    assert any(f["function"] == "ggml_graph_compute_step" and f["file"] == str(built.src)
               for f in c["frames"])
    wrong = "".join(reversed(real.group(1)))
    code, data = run_json([str(coredump(wrong)), "--no-cache", "--no-auto-binaries",
                           "--binary", str(built.lib)], capsys)
    assert code == 1
    (p,) = [p for p in data["problems"] if p.get("code") == "binary-mismatch"]
    assert f"its build-id {real.group(1)[:16]}… is not the log's {wrong[:16]}…" in p["message"]


@pytest.mark.skipif(native_ggml.GDB is None, reason="needs gdb for a real gdb capture")
def test_gdb_frames_without_offsets_refuse_another_build(tmp_path: Path, capsys: Any) -> None:
    """gdb prints ``0xADDR in f () from lib`` for a library without debug info: one load
    address must put every such frame inside its named function in the binary, and the return
    addresses must follow calls there."""
    built = native_ggml.build(tmp_path / "run")
    subprocess.run(["strip", "--strip-debug", str(built.lib)], check=True)
    log = tmp_path / "gdb.log"
    log.write_bytes(native_ggml.run_gdb(built, "abort"))
    assert re.search(rb"in ggml_graph_compute_step \(\) from ", log.read_bytes())
    for opt in ("-O0", "-Os"):
        other = native_ggml.build(tmp_path / f"other{opt}", opt=opt)
        code, data = run_json([str(log), "--no-cache", "--no-auto-binaries",
                               "--binary", str(other.lib)], capsys)
        assert code == 1 and data["binaries"] == [], opt
        (p,) = [p for p in data["problems"] if p.get("code") == "binary-mismatch"]
        assert re.search(r"cannot lie inside \w+ in it at any load address|need different load "
                         r"addresses|do not follow a call instruction", p["message"]), p
        assert all(f["file"] is None for f in _lib_frames(data, built.lib))
    same = native_ggml.build(tmp_path / "same")  # the same build, with its DWARF
    code, data = run_json([str(log), "--no-cache", "--no-auto-binaries",
                           "--binary", str(same.lib)], capsys)
    assert data["binaries"][0]["checked_by"] == "frames"
    plan = [f for f in _lib_frames(data, built.lib) if f["function"] == "ggml_kv_stream_plan_pages"]
    assert [f["line"] for f in plan] == [_abort_line(same)]


_PROG = r"""
#include <execinfo.h>
#include <stdlib.h>
__attribute__((noinline)) void kv_abort(void) {
    void *b[16];
    backtrace_symbols_fd(b, backtrace(b, 16), 2);
    abort();
}
__attribute__((noinline)) int kv_fattn(int n) { if (n > 1) kv_abort(); return n; }
int main(int argc, char **argv) { (void)argv; return kv_fattn(argc) + 1; }
"""


def test_gdb_frames_with_a_source_but_no_module_are_not_taken_as_the_executables(
        tmp_path: Path, capsys: Any) -> None:
    """gdb writes "from LIB" only for code without debug info, so a libc with its debug
    symbols installed shows as ``0x7ffff7… in __GI_raise (…) at ../sysdeps/…:26`` with no
    module. GIVEN such frames above the executable's own (no debug info: ``in kv_fattn ()``),
    WHEN the log is read with the right executable, THEN it is used and its frames land in the
    functions they name — libc's addresses are not read as addresses in it (it was refused as
    "not the build the log ran", returning outside its code)."""
    src, prog = tmp_path / "prog.c", tmp_path / "prog"
    src.write_text(_PROG)
    assert native_ggml.GCC is not None
    subprocess.run([native_ggml.GCC, "-O1", "-fPIE", "-pie", str(src), "-o", str(prog)],
                   check=True)
    run = subprocess.run([str(prog), "x"], capture_output=True, cwd=tmp_path)
    own = re.findall(rb"prog\(\+0x([0-9a-f]+)\)\[0x([0-9a-f]+)\]", run.stderr)[:3]
    assert len(own) == 3, run.stderr
    gdb = [
        "#0  __pthread_kill_implementation (threadid=<optimized out>, signo=signo@entry=6, "
        "no_tid=no_tid@entry=0) at ./nptl/pthread_kill.c:44",
        "#1  0x00007ffff7e5ff4f in __pthread_kill_internal (signo=6, threadid=<optimized out>) "
        "at ./nptl/pthread_kill.c:78",
        "#2  0x00007ffff7e10fb2 in __GI_raise (sig=sig@entry=6) at ../sysdeps/posix/raise.c:26",
        "#3  0x00007ffff7dfb472 in __GI_abort () at ./stdlib/abort.c:79",
        *(f"#{4 + i}  0x{int(addr, 16):016x} in {name} ()"
          for i, ((_off, addr), name) in enumerate(zip(own, ("kv_abort", "kv_fattn", "main"),
                                                       strict=True))),
    ]
    log = tmp_path / "server.log"
    # and as gdb prints the executable's frames where it has debug info: with a source too
    with_source = [*gdb[:4], *(f"{line} at prog.c:{n}" for n, line in enumerate(gdb[4:], 5))]
    for frames in (gdb, with_source):
        log.write_text("main: build = 1 (x)\nprog.c:6: GGML_ASSERT(fits) failed\n\n"
                       "Program received signal SIGABRT, Aborted.\n" + "\n".join(frames) + "\n")
        code, data = run_json([str(log), "--no-cache", "--binary", str(prog)], capsys)
        assert code == 1  # the crash
        assert [p for p in data["problems"] if p.get("code", "").startswith("binary")] == []
        (used,) = data["binaries"]
        assert used["checked_by"] == "frames" and "follow a call instruction" in used["evidence"]
        (c,) = data["crashes"]
        assert [(f["function"], f["file"]) for f in c["frames"][:4]] == [
            ("__pthread_kill_implementation", "./nptl/pthread_kill.c"),
            ("__pthread_kill_internal", "./nptl/pthread_kill.c"),
            ("__GI_raise", "../sysdeps/posix/raise.c"), ("__GI_abort", "./stdlib/abort.c")]


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs binutils objcopy")
def test_a_separate_debug_file_symbolizes_its_module(tmp_path: Path, capsys: Any) -> None:
    """GIVEN a stripped build's glibc backtrace and its separate debug file (``objcopy
    --only-keep-debug``: DWARF and symbols, its code NOBITS), WHEN it is given as ``--binary
    prog.debug``, THEN it stands for ``prog``: frames get the source lines addr2line gives, and
    the return addresses it cannot check (no code bytes) are said — it was "not used: no
    frame of the log is in prog.debug", and for a gdb log "not the build the log ran"."""
    src, prog = tmp_path / "prog.c", tmp_path / "prog"
    src.write_text(_PROG)
    assert native_ggml.GCC is not None
    subprocess.run([native_ggml.GCC, "-g", "-O1", "-fPIE", "-pie", str(src), "-o", str(prog)],
                   check=True)
    debug = tmp_path / "prog.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(prog), str(debug)], check=True)
    subprocess.run(["strip", "-s", str(prog)], check=True)
    run = subprocess.run(["./prog", "x"], capture_output=True, cwd=tmp_path)
    log = tmp_path / "server.log"
    log.write_bytes(b"main: build = 1 (x)\nprog.c:6: GGML_ASSERT(fits) failed\n" + run.stderr)
    lines = _PROG.splitlines()
    want = [("kv_abort", 1 + next(i for i, t in enumerate(lines) if "backtrace_symbols_fd" in t)),
            ("kv_fattn", 1 + next(i for i, t in enumerate(lines) if "kv_abort();" in t)),
            ("main", 1 + next(i for i, t in enumerate(lines) if "kv_fattn(argc)" in t))]
    code, data = run_json([str(log), "--no-cache", "--binary", str(debug)], capsys)
    assert code == 1 and [p for p in data["problems"] if p.get("code", "").startswith("binary")
                          ] == []
    (used,) = data["binaries"]
    assert "no code bytes: a separate debug file" in used["evidence"]
    (c,) = data["crashes"]
    assert [(f["function"], f["line"]) for f in c["frames"][:3]] == want
    assert all(f["file"] == str(src) for f in c["frames"][:3])
    # the same frames as gdb prints them for a stripped executable
    own = re.findall(rb"prog\(\+0x[0-9a-f]+\)\[0x([0-9a-f]+)\]", run.stderr)[:3]
    gdb = "\n".join(f"#{i + 1}  0x{int(a, 16):016x} in {name} ()"
                    for i, (a, (name, _line)) in enumerate(zip(own, want, strict=True)))
    log.write_text("prog.c:6: GGML_ASSERT(fits) failed\n#0  0x00007ffff7e5ff4f in raise () "
                   "from /lib/x86_64-linux-gnu/libc.so.6\n" + gdb + "\n")
    code, data = run_json([str(log), "--no-cache", "--binary", str(debug)], capsys)
    assert [p for p in data["problems"] if p.get("code", "").startswith("binary")] == []
    (c,) = data["crashes"]
    assert [(f["function"], f["line"]) for f in c["frames"][1:4]] == want


_SIG_MAIN = r"""
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
int kv_read(const int *p, int n);
static void handler(int sig) {
    void *b[32];
    int n = backtrace(b, 32);
    fprintf(stderr, "caught signal %d\n", sig);
    backtrace_symbols_fd(b, n, 2);
    _exit(139);
}
int main(int argc, char **argv) {
    (void)argv;
    signal(SIGSEGV, handler);
    return kv_read(0, argc);
}
"""
_SIG_LIB = r"""
static inline __attribute__((always_inline)) int load(const int *p, int i) {
    return p[i * 256];
}
__attribute__((noinline)) int kv_read(const int *p, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += load(p, i);
    return s;
}
"""


@pytest.mark.skipif(shutil.which("addr2line") is None, reason="needs binutils addr2line")
def test_the_frame_a_signal_interrupted_is_looked_up_at_its_pc(tmp_path: Path,
                                                                capsys: Any) -> None:
    """GIVEN a SIGSEGV in a library, caught by a handler that prints glibc's backtrace (the
    sigreturn trampoline shows as an unnamed libc frame before the faulting one), WHEN the log
    is symbolized, THEN the faulting frame is looked up at its PC, as addr2line gives it — the
    binary check already took it as a PC, the symbolizer looked one byte back: the line
    before the fault."""
    (tmp_path / "main.c").write_text(_SIG_MAIN)
    (tmp_path / "lib.c").write_text(_SIG_LIB)
    lib = tmp_path / "libkvsig.so"
    assert native_ggml.GCC is not None
    subprocess.run([native_ggml.GCC, "-g", "-O2", "-fPIC", "-shared", str(tmp_path / "lib.c"),
                    "-o", str(lib)], check=True)
    subprocess.run([native_ggml.GCC, "-g", "-O2", str(tmp_path / "main.c"), "-o",
                    str(tmp_path / "prog"), str(lib), f"-Wl,-rpath,{tmp_path}"], check=True)
    run = subprocess.run(["./prog", "x"], capture_output=True, cwd=tmp_path)
    assert b"caught signal 11" in run.stderr and b"libc.so.6(+0x" in run.stderr
    off = int(re.findall(rb"libkvsig\.so\(kv_read\+0x([0-9a-f]+)\)", run.stderr)[0], 16)
    sym = int(subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True)
              .stdout.split(" T kv_read")[0].rsplit("\n", 1)[-1].split()[0], 16)

    def line_at(addr: int) -> int:
        out = subprocess.run(["addr2line", "-e", str(lib), hex(addr)], capture_output=True,
                             text=True, check=True).stdout
        return int(out.strip().split(":")[-1].split()[0])

    at_pc, before = line_at(sym + off), line_at(sym + off - 1)
    assert at_pc != before, "the fault must start its line for this test to tell them apart"
    log = tmp_path / "server.log"
    log.write_bytes(b"main: build = 1 (x)\n" + run.stderr + b"Segmentation fault\n")
    code, data = run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
    (c,) = data["crashes"]
    (fault,) = [f for f in c["frames"] if f["module"] == str(lib)]
    assert code == 1 and (fault["function"], fault["line"]) == ("kv_read", at_pc)
