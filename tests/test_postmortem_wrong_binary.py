"""A wrong ``--binary`` is refused, not used (issue 16 #5).

Programs of two different sources are built here with gcc under one name and run, so the logs
are real glibc backtraces; binutils (``nm``, ``objdump``) is the independent oracle of where
symbols are and which addresses follow a call. ELF files for other machines are made by hand
(``tests/elf_builder``) with instruction words encoded from the architecture manuals."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvdiag.postmortem.callsite import check_return_address
from kvdiag.postmortem.elfindex import ElfImage
from tests import elf_builder, native_ggml
from tests.postmortem_helpers import run_command, run_json

OBJDUMP = shutil.which("objdump")
NM = shutil.which("nm")
needs_gcc = pytest.mark.skipif(native_ggml.GCC is None or OBJDUMP is None or NM is None,
                               reason="needs gcc and binutils objdump/nm")

# The program that crashed: three calls deep, then a glibc backtrace and abort().
SOURCE_A = r"""
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
static void dump(void) { void *b[32]; int n = backtrace(b, 32); backtrace_symbols_fd(b, n, 2);
                         abort(); }
__attribute__((noinline)) void leaf(int x) { if (x > 3) dump(); printf("%d\n", x); }
__attribute__((noinline)) void mid(int x) { leaf(x + 1); leaf(x + 2); }
__attribute__((noinline)) void top(int x) { mid(x * 2); }
int main(int c, char **v) { (void)v; top(c + 1); return 0; }
"""
# Another program with the same function names whose functions are large enough to hold the
# log's offsets, some of which fall right after a call in it (what let issue 11's checks pass).
SOURCE_B = r"""
#include <stdlib.h>
volatile int sink;
__attribute__((noinline)) void note(int x) { sink += x; }
__attribute__((noinline)) void leaf(int x) { note(x); note(x * 3); note(x + 7); note(x ^ 5);
    note(x - 1); note(x * x); note(x + 11); if (x > 1000) abort(); }
__attribute__((noinline)) void mid(int x) { note(x + 1); leaf(x); }
__attribute__((noinline)) void top(int x) { note(x + 3); mid(x * 2); note(4); }
int main(int c, char **v) { (void)v; note(c + 5); top(c + 1); note(6); return 0; }
"""
# A crash in a signal handler's stack: the frame after the sigreturn trampoline is the PC the
# signal interrupted, which follows no call.
SOURCE_SIGNAL = r"""
#include <execinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
static void handler(int sig) { void *b[32]; int n = backtrace(b, 32);
    backtrace_symbols_fd(b, n, 2); _exit(128 + sig); }
__attribute__((noinline)) void poke(int *p, int x) { p[x] = x; }
__attribute__((noinline)) void work(int x) { poke((int *)0xffff800000001000UL, x); }
int main(int c, char **v) { (void)v; signal(SIGSEGV, handler); work(c); return 0; }
"""


def _build(folder: Path, source: str, *flags: str, name: str = "prog") -> Path:
    assert native_ggml.GCC is not None
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "prog.c"
    src.write_text(source)
    out = folder / name
    subprocess.run([native_ggml.GCC, "-g", "-O1", *flags, "-o", str(out), str(src)],
                   check=True, capture_output=True, timeout=120)
    return out


def _crash_log(prog: Path, log: Path, *, keep_libc: bool = True) -> bytes:
    """Run ``prog`` (it aborts or dies by a signal after printing its backtrace) and write what
    a terminal shows, with the abort line a crash needs; ``keep_libc`` False drops the libc
    frames (whose multiarch path tells the machine)."""
    proc = subprocess.run([f"./{prog.name}", "1", "2", "3"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, cwd=prog.parent, timeout=60, check=False)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stdout.splitlines(keepends=True)
             if keep_libc or b"libc.so" not in ln]
    data = b"/src/prog.c:5: fatal error\n" + b"".join(lines) + b"Aborted (core dumped)\n"
    log.write_bytes(data)
    return data


def _after_calls(binary: Path) -> set[int]:
    """Addresses objdump shows right after a call instruction in ``binary``."""
    assert OBJDUMP is not None
    out = subprocess.run([OBJDUMP, "-d", "-w", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    found: set[int] = set()
    for m in re.finditer(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t(.*)$", out, re.M):
        if re.match(r"(?:(?:bnd|notrack|addr32|data16|cs|ds)\s+)*call", m.group(3)):
            found.add(int(m.group(1), 16) + len(m.group(2).split()))
    return found


def _symbols(binary: Path) -> dict[str, tuple[int, int]]:
    assert NM is not None
    out = subprocess.run([NM, "-S", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    return {m.group(3): (int(m.group(1), 16), int(m.group(2), 16))
            for m in re.finditer(r"^([0-9a-f]+) ([0-9a-f]+) [Tt] (\w+)$", out, re.M)}


def _frames_of(data: dict[str, Any], module: str) -> list[dict[str, Any]]:
    (crash,) = data["crashes"]
    return [f for f in crash["frames"] if f["module"] and f["module"].endswith("/" + module)]


def _mismatch(data: dict[str, Any]) -> str:
    (p,) = [p for p in data["problems"] if p.get("code") == "binary-mismatch"]
    assert "\n" not in p["message"]
    return str(p["message"])


# -- offset-only glibc frames: prog(+0xOFF) ---------------------------------------------------


@needs_gcc
def test_offset_only_frames_of_another_build_are_refused(tmp_path: Path, capsys: Any) -> None:
    ran = _build(tmp_path / "ran", SOURCE_A)
    other = _build(tmp_path / "other", SOURCE_B)
    log = tmp_path / "crash.log"
    text = _crash_log(ran, log)
    offsets = [int(o, 16) for o in re.findall(rb"^\./prog\(\+0x([0-9a-f]+)\)", text, re.M)]
    assert len(offsets) >= 4, text  # leaf, mid, top, main, _start
    # the oracle: the first of the log's return addresses objdump shows after no call
    after = _after_calls(other)
    first_bad = next(off for off in offsets if off not in after)
    code, data = run_json([str(log), "--no-cache", "--binary", str(other)], capsys)
    assert code == 1 and data["binaries"] == []
    assert (f"is not the build the log ran: the log's frame prog+0x{first_bad:x} returns to "
            f"0x{first_bad:x} in it, where no call instruction ends") in _mismatch(data)
    frames = _frames_of(data, "prog")
    assert [int(f["offset"], 16) for f in frames] == offsets  # raw frames kept
    assert all(f["function"] is None and f["file"] is None for f in frames)
    # the build that ran: every return address follows a call in it, and it is used
    assert set(offsets) <= _after_calls(ran)
    code, data = run_json([str(log), "--no-cache", "--binary", str(ran)], capsys)
    (use,) = data["binaries"]
    assert use["checked_by"] == "frames"
    assert use["evidence"] == f"{len(offsets)} return address(es) follow a call instruction"
    named = [f["function"] for f in _frames_of(data, "prog") if not f["inlined"]]
    assert named[:4] == ["leaf", "mid", "top", "main"]
    assert not any(f["unverified"] for f in _frames_of(data, "prog"))


# -- glibc frames with a symbol: prog(sym+0xOFF)[0xADDR] ---------------------------------------


@needs_gcc
def test_symbol_offset_frames_of_another_build_are_refused(tmp_path: Path,
                                                           capsys: Any) -> None:
    ran = _build(tmp_path / "ran", SOURCE_A, "-rdynamic")
    other = _build(tmp_path / "other", SOURCE_B, "-rdynamic")
    log = tmp_path / "crash.log"
    text = _crash_log(ran, log)
    printed = [(s.decode(), int(o, 16), int(a, 16)) for s, o, a in re.findall(
        rb"^\./prog\((\w+)\+0x([0-9a-f]+)\)\[0x([0-9a-f]+)\]", text, re.M)]
    assert [p[0] for p in printed][:4] == ["leaf", "mid", "top", "main"]
    syms = _symbols(other)
    outside = [(s, o) for s, o, _a in printed if o > syms[s][1]]
    if outside:
        want = f"the log's frame {outside[0][0]}+0x{outside[0][1]:x} lands in "
    else:
        # every offset lies inside its function there: the load address each frame implies
        # (ADDR - value - OFF) tells the builds apart
        s, o, a = next(p for p in printed if (p[2] - syms[p[0]][0] - p[1]) % 0x1000)
        want = (f"the log's frame {s}+0x{o:x} puts its load address at "
                f"{a - syms[s][0] - o:#x}, which is not a page boundary")
    code, data = run_json([str(log), "--no-cache", "--binary", str(other)], capsys)
    assert code == 1 and data["binaries"] == []
    assert want in _mismatch(data)
    assert [f["function"] for f in _frames_of(data, "prog")][:4] == ["leaf", "mid", "top", "main"]
    assert all(f["file"] is None for f in _frames_of(data, "prog"))
    code, data = run_json([str(log), "--no-cache", "--binary", str(ran)], capsys)
    (use,) = data["binaries"]
    n = len(printed)
    assert use["evidence"] == (f"{n} frame(s) land in the functions they name; {n} frame(s) "
                               f"agree on one page-aligned load address; {n} return "
                               "address(es) follow a call instruction")


@needs_gcc
def test_executable_that_is_not_position_independent(tmp_path: Path, capsys: Any) -> None:
    """``-no-pie``: glibc prints ``./prog[0xADDR]``, link-time addresses."""
    ran = _build(tmp_path / "ran", SOURCE_A, "-no-pie")
    other = _build(tmp_path / "other", SOURCE_B, "-no-pie")
    log = tmp_path / "crash.log"
    text = _crash_log(ran, log)
    addrs = [int(a, 16) for a in re.findall(rb"^\./prog\[0x([0-9a-f]+)\]", text, re.M)]
    assert len(addrs) >= 4
    _code, data = run_json([str(log), "--no-cache", "--binary", str(ran)], capsys)
    assert data["binaries"][0]["evidence"] == \
        f"{len(addrs)} return address(es) follow a call instruction"
    first_bad = next(a for a in addrs if a not in _after_calls(other))
    _code, data = run_json([str(log), "--no-cache", "--binary", str(other)], capsys)
    assert f"returns to 0x{first_bad:x} in it, where no call instruction ends" in _mismatch(data)


@needs_gcc
def test_frame_a_signal_interrupted_is_not_a_return_address(tmp_path: Path,
                                                            capsys: Any) -> None:
    ran = _build(tmp_path / "ran", SOURCE_SIGNAL)
    log = tmp_path / "crash.log"
    text = _crash_log(ran, log)
    lines = text.decode().splitlines()
    trampoline = next(i for i, ln in enumerate(lines) if "libc.so.6(+0x" in ln)
    interrupted = int(re.search(r"\(\+0x([0-9a-f]+)\)", lines[trampoline + 1]).group(1), 16)  # type: ignore[union-attr]
    assert interrupted not in _after_calls(ran)  # the store in poke(), not a return address
    _code, data = run_json([str(log), "--no-cache", "--binary", str(ran)], capsys)
    (use,) = data["binaries"]
    assert use["checked_by"] == "frames", data["problems"]
    names = [f["function"] for f in _frames_of(data, "prog") if not f["inlined"]]
    assert names[:4] == ["handler", "poke", "work", "main"]


# -- other machines ---------------------------------------------------------------------------


def _patched(binary: Path, machine: int, folder: Path) -> Path:
    folder.mkdir()
    out = folder / binary.name
    data = bytearray(binary.read_bytes())
    data[18:20] = struct.pack("<H", machine)  # e_machine (gABI, ELF header)
    out.write_bytes(bytes(data))
    return out


@needs_gcc
def _function_cells(out: str) -> list[str]:
    """The backtrace table's function cells of the text report, each whole (a cell wrapped
    onto the row's next lines joined)."""
    cells: list[str] = []
    for row in out.splitlines():
        parts = row.split("│")
        if len(parts) < 5:
            continue
        index, func = parts[1].strip(), parts[2].strip()
        if index:
            cells.append(func)
        elif cells and func:
            cells[-1] += " " + func
    return cells


def test_another_architecture_is_refused_without_a_hint_in_the_log(tmp_path: Path,
                                                                  capsys: Any) -> None:
    ran = _build(tmp_path / "ran", SOURCE_A)
    log = tmp_path / "crash.log"
    text = _crash_log(ran, log, keep_libc=False)
    assert b"x86_64" not in text and b"libc" not in text
    offsets = [int(o, 16) for o in re.findall(rb"^\./prog\(\+0x([0-9a-f]+)\)", text, re.M)]
    arm = _patched(ran, 183, tmp_path / "arm")
    _code, data = run_json([str(log), "--no-cache", "--binary", str(arm)], capsys)
    first = offsets[0]
    why = ("where no instruction of AArch64 can end" if first % 4
           else "where no call instruction ends")
    assert f"the log's frame prog+0x{first:x} returns to 0x{first:x} in it, {why}" in \
        _mismatch(data)
    # a machine kvdiag has no call decoder for: used, but said to be unverified everywhere
    s390 = _patched(ran, 22, tmp_path / "s390")
    _code, data = run_json([str(log), "--no-cache", "--binary", str(s390)], capsys)
    (use,) = data["binaries"]
    assert use["checked_by"] == "unchecked"
    assert use["evidence"] == "return addresses not checked (no call decoder for S/390)"
    frames = [f for f in _frames_of(data, "prog") if f["function"]]
    assert frames and all(f["unverified"] for f in frames)
    _code, out = run_command([str(log), "--no-cache", "--binary", str(s390)], capsys)
    flat = " ".join(out.split())
    assert f"UNVERIFIED: symbolized with {s390} (--binary), but nothing in the log could " \
           "check that it is the build that ran" in flat
    # the function column wraps where the source paths (under pytest's folder) are long
    assert "leaf [unverified]" in _function_cells(out)
    evidence = [e["text"] for f in data["findings"] for e in f["evidence"]]
    assert "first in-app frame: dump prog.c:5 [unverified]" in evidence


@needs_gcc
def test_odd_machine_among_the_binaries_is_refused(tmp_path: Path, capsys: Any) -> None:
    built = native_ggml.build(tmp_path / "b")
    log = tmp_path / "crash.log"
    ran = native_ggml.run(built, "abort", backtrace=True)
    log.write_bytes(b"".join(ln for ln in ran.splitlines(keepends=True) if b"libc" not in ln)
                    + b"Aborted (core dumped)\n")
    lib = _patched(built.lib, 22, tmp_path / "s390")
    _code, data = run_json([str(log), "--no-cache", "--no-auto-binaries", "--binary",
                           str(built.server), "--binary", str(lib)], capsys)
    assert ("it is an ELF for S/390, the log's return addresses in minserver follow calls as "
            "code for x86-64") in _mismatch(data)
    assert [b["path"] for b in data["binaries"]] == [str(built.server)]


@needs_gcc
def test_binary_no_frame_is_in_is_not_said_to_be_used(tmp_path: Path, capsys: Any) -> None:
    ran = _build(tmp_path / "ran", SOURCE_A)
    elsewhere = _build(tmp_path / "tool", SOURCE_B, name="tool")
    log = tmp_path / "crash.log"
    _crash_log(ran, log)
    _code, data = run_json([str(log), "--no-cache", "--binary", str(elsewhere)], capsys)
    assert data["binaries"] == []
    (p,) = [p for p in data["problems"] if p.get("code") == "binary-unused"]
    assert p["message"] == ("not used for symbolizing: no frame of the log is in tool (its "
                            "frames name libc, prog)")
    _code, out = run_command([str(log), "--no-cache", "--binary", str(elsewhere)], capsys)
    assert "symbolized with" not in out


# Instruction words from the manuals cited in kvdiag/postmortem/callsite.py, little-endian.
_MACHINES: dict[str, tuple[int, list[int], int, int, int]] = {
    # name: (e_machine, calls, a non-call, nop, width)
    "AArch64": (183, [0x94000002, 0xD63F0100, 0xD63F091F], 0xD61F0100, 0xD503201F, 4),
    "RISC-V": (243, [0x008000EF, 0x000280E7], 0x0080006F, 0x00000013, 4),
    "PowerPC64": (21, [0x48000009, 0x4E800421, 0x4E800021], 0x48000008, 0x60000000, 4),
    "LoongArch": (258, [0x54000800, 0x4C000181], 0x50000800, 0x03400000, 4),
    "ARM": (40, [0xEB000000, 0xE12FFF33, 0xFA000000], 0xEA000000, 0xE1A00000, 4),
}


def _hand_made(tmp_path: Path, machine: int, words: list[int], width: int = 4) -> Path:
    code = b"".join(w.to_bytes(width, "little") for w in words)
    return elf_builder.build(tmp_path / "libarch.so", machine, code,
                             [("kernel_step", elf_builder.TEXT, len(code))])


def _glibc_log(path: Path, offsets: list[int]) -> Path:
    base = 0x7F3C41200000
    path.write_text("/src/step.c:9: fatal error\n" + "".join(
        f"/opt/rt/libarch.so(+0x{off:x})[0x{base + off:x}]\n" for off in offsets)
        + "Aborted (core dumped)\n")
    return path


@pytest.mark.parametrize("name", list(_MACHINES))
def test_return_addresses_are_decoded_for_the_binarys_machine(tmp_path: Path, capsys: Any,
                                                              name: str) -> None:
    machine, calls, other, nop, width = _MACHINES[name]
    words = [nop]
    for c in [*calls, other]:
        words += [c, nop]
    lib = _hand_made(tmp_path, machine, words)
    after = [elf_builder.TEXT + width * (2 + 2 * i) for i in range(len(calls))]
    not_after = elf_builder.TEXT + width * (2 + 2 * len(calls))
    log = _glibc_log(tmp_path / "good.log", after)
    _code, data = run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
    (use,) = data["binaries"]
    assert use["evidence"] == f"{len(calls)} return address(es) follow a call instruction"
    log = _glibc_log(tmp_path / "bad.log", [*after, not_after])
    _code, data = run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
    assert (f"returns to 0x{not_after:x} in it, where no call instruction ends"
            in _mismatch(data))
    if name == "ARM":
        return  # a Thumb return address may be 2-byte aligned and carries the mode in bit 0
    log = _glibc_log(tmp_path / "odd.log", [after[0] + 2 + (name == "RISC-V")])
    _code, data = run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
    assert f"where no instruction of {name} can end" in _mismatch(data)


def test_riscv_compressed_call_and_unknown_machine(tmp_path: Path) -> None:
    # c.jalr t0 (0x9282) between c.nop (0x0001): a 2-byte call, 2-byte aligned return
    lib = _hand_made(tmp_path, 243, [0x0001, 0x9282, 0x0001, 0x0001], width=2)
    img = ElfImage(str(lib))
    try:
        assert check_return_address(img, elf_builder.TEXT + 4) == "call"
        assert check_return_address(img, elf_builder.TEXT + 6) == "no-call"
        assert check_return_address(img, elf_builder.TEXT + 0x100) == "outside-code"
    finally:
        img.close()
    s390 = elf_builder.build(tmp_path / "s390.so", 22, bytes(16), [("f", 0x1000, 16)])
    img = ElfImage(str(s390))
    try:
        assert check_return_address(img, elf_builder.TEXT + 4) == "unknown"
    finally:
        img.close()


# x86-64 call forms (Intel SDM vol. 2A ch. 2, vol. 2B CALL), each after 16 NOPs: the forms
# issue 11's decoder missed are the 5-byte ``REX FF /2`` with SIB+disp8, the 8-byte REX+SIB+
# disp32 one, the SIB form without a base, and ld's ``addr32 call``.
_X86_CALLS = {
    "e8 rel32": "e8 10 00 00 00",
    "call *%rax": "ff d0",
    "call *%r11": "41 ff d3",
    "call *(%rax)": "ff 10",
    "call *0x8(%r12)": "41 ff 54 24 08",
    "call *0x10(%rbx,%rax,8)": "ff 54 c3 10",
    "call *0x100(%rbx,%rax,8)": "ff 94 c3 00 01 00 00",
    "call *0x100(%r11,%rax,8)": "41 ff 94 c3 00 01 00 00",
    "call *0x600000(,%rax,8)": "ff 14 c5 00 00 60 00",
    "call *sym@GOTPCREL(%rip)": "ff 15 00 10 00 00",
    "addr32 call rel32": "67 e8 00 10 00 00",
    "notrack call *%rdx": "3e ff d2",
    "bnd call rel32": "f2 e8 00 10 00 00",
    "lcall *(%rax)": "ff 18",
}
_X86_OTHER = {"jmp *%rax": "ff e0", "jmp rel32": "e9 10 00 00 00", "ret": "c3",
              "mov %rdi,%rax": "48 89 f8", "push *(%rax)": "ff 30"}


@pytest.mark.parametrize(("form", "is_call"), [(f, True) for f in _X86_CALLS]
                         + [(f, False) for f in _X86_OTHER])
def test_x86_64_call_forms(tmp_path: Path, form: str, is_call: bool) -> None:
    insn = bytes.fromhex(_X86_CALLS[form] if is_call else _X86_OTHER[form])
    code = b"\x90" * 16 + insn + b"\x90" * 16
    lib = elf_builder.build(tmp_path / "libx.so", 62, code, [("f", elf_builder.TEXT, len(code))])
    img = ElfImage(str(lib))
    try:
        ret = elf_builder.TEXT + 16 + len(insn)
        assert check_return_address(img, ret) == ("call" if is_call else "no-call")
        assert check_return_address(img, ret - 1) == "no-call"
    finally:
        img.close()


@needs_gcc
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os"])
def test_every_call_objdump_shows_is_a_call_to_the_decoder(tmp_path: Path, opt: str) -> None:
    """The rule refuses a binary on one return address after no call, so the decoder must
    find every call gcc emits: checked against objdump on a C++ program (virtual and
    indirect calls, exceptions) and the library of ``native_ggml``."""
    assert native_ggml.GCC is not None
    gxx = shutil.which("g++")
    binaries = [native_ggml.build(tmp_path / "ggml", opt=opt).lib]
    if gxx is not None:
        out = tmp_path / "crashprog"
        subprocess.run([gxx, opt, "-g", "-fPIC", "-o", str(out),
                        str(native_ggml.NATIVE / "crashprog.cpp")], check=True,
                       capture_output=True, timeout=120)
        binaries.append(out)
    for binary in binaries:
        returns = _after_calls(binary)
        assert len(returns) > 5
        img = ElfImage(str(binary))
        try:
            missed = sorted(r for r in returns if check_return_address(img, r) != "call")
        finally:
            img.close()
        assert missed == [], (binary, [hex(r) for r in missed])


def test_elf_builder_output_is_what_readelf_reads(tmp_path: Path) -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs binutils readelf")
    lib = _hand_made(tmp_path, 183, [0xD503201F, 0x94000002])
    out = subprocess.run([readelf, "-hsW", str(lib)], capture_output=True, text=True,
                         check=True, env={**os.environ, "LC_ALL": "C"}).stdout
    assert "AArch64" in out
    assert re.search(r"0000000000001000\s+8 FUNC\s+GLOBAL DEFAULT\s+1 kernel_step", out), out
