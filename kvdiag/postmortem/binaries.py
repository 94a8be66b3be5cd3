"""Which binaries to symbolize with, and whether each is the build the log ran.

Binaries come from ``--binary`` and, unless turned off, from the module paths the log printed
when a regular file is at that path on this machine (a crash analysed where it happened).
Runtime libraries (libc, libstdc++, …: ``backtrace.is_in_app`` by file name) are not picked up
that way: their frames are never in-app and their symbols are in the log already.

Nothing is trusted on its name alone. A binary is refused for its module when:

* its ELF machine differs from the one the log shows (``/x86_64-linux-gnu/`` paths, glibc's
  ``_avx``/``_evex``/``_erms`` function variants, ``aarch64``/``riscv64`` paths);
* the log states a build-id for the module (systemd-coredump) and the binary's differs;
* otherwise, a frame that names a symbol does not land in it: ``sym+0xOFF`` (glibc) must fall
  inside ``sym`` in this binary, and a ``function (module + 0xOFF)`` frame (systemd-coredump)
  inside a symbol of that name;
* or, on x86-64, most return addresses of the log's frames in this module do not follow a call
  instruction: another build of the same source usually keeps every offset inside the same
  function (a larger -O0 function holds any -O1 offset), but not on call boundaries.

A refused binary leaves its frames raw; the refusal is one ``binary-mismatch`` problem.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import Backtrace, LogScan
from kvdiag.postmortem.backtrace import base_name, is_in_app
from kvdiag.postmortem.demangle import demangle
from kvdiag.postmortem.elfindex import ElfImage
from kvdiag.postmortem.symbolizer import Module, module_key

#: ELF e_machine values (System V gABI, "Machine" table) and the names users know them by.
MACHINES = {3: "x86", 40: "ARM", 62: "x86-64", 183: "AArch64", 243: "RISC-V", 21: "PowerPC64",
            22: "S/390", 258: "LoongArch"}
# Hints of the crashed machine in frame text: Debian/Ubuntu multiarch paths, glibc's sysdeps
# folders and its per-ISA string function variants.
_ARCH_HINTS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"x86_64|x86-64|amd64|_avx|_evex|_sse\d|_ssse3|_erms\b"), 62),
    (re.compile(r"aarch64|arm64"), 183),
    (re.compile(r"riscv64"), 243),
    (re.compile(r"arm-linux-gnueabi|armhf"), 40),
)


PAGE = 0x1000


def biases(mod: Module, address: int, function: str, limit: int = 64) -> set[int]:
    """The load biases (multiples of the page size) that put ``address − 1`` inside a symbol
    named ``function``; at most ``limit`` of them."""
    found: set[int] = set()
    for sym, size in mod.image.symbols_named(base_name(function)):
        hi = address - 1 - sym
        lo = hi - max(size, 1) + 1
        k = -(-lo // PAGE) * PAGE
        while k <= hi and len(found) < limit:
            found.add(k)
            k += PAGE
    return found


def bias_from_name(mod: Module, address: int, function: str) -> int | None:
    """The load bias implied by a frame that names its function, when exactly one page-size
    multiple puts ``address − 1`` inside one symbol of that name."""
    found = biases(mod, address, function, limit=2)
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class Candidate:
    path: str
    origin: Literal["option", "logged-path"]


def _frames(scan: LogScan) -> Iterator[tuple[Backtrace, int, Frame]]:
    for crash in scan.crashes:
        if crash.backtrace is not None:
            for pos, fr in enumerate(crash.backtrace.frames):
                yield crash.backtrace, pos, fr


def candidates(scan: LogScan, explicit: Sequence[str], auto: bool) -> list[Candidate]:
    """``--binary`` paths, then (``auto``) existing regular files at absolute module paths of
    the log's in-app frames whose module no ``--binary`` covers."""
    out = [Candidate(p, "option") for p in explicit]
    if not auto:
        return out
    covered = {module_key(p) for p in explicit}
    for _bt, _pos, fr in _frames(scan):
        mod = fr.module
        if not mod or not mod.startswith("/") or not is_in_app(None, mod):
            continue
        key = module_key(mod)
        if key in covered:
            continue
        try:
            if not stat.S_ISREG(os.stat(mod).st_mode):
                continue
        except OSError:
            continue
        covered.add(key)
        out.append(Candidate(mod, "logged-path"))
    return out


def log_machine(scan: LogScan) -> int | None:
    """The ELF machine the log's frames show, when they show exactly one."""
    seen: set[int] = set()
    for _bt, _pos, fr in _frames(scan):
        for text in (fr.module, fr.file, fr.function):
            if not text:
                continue
            for rx, machine in _ARCH_HINTS:
                if rx.search(text):
                    seen.add(machine)
                    break
    return seen.pop() if len(seen) == 1 else None


def _belongs(fr: Frame, mod: Module, is_main: bool) -> bool:
    if fr.module is None:
        return is_main
    return module_key(fr.module) == module_key(mod.path)


def follows_call(image: ElfImage, vaddr: int) -> bool | None:
    """Whether the x86-64 instruction bytes just before return address ``vaddr`` end in a call
    (Intel SDM vol. 2, CALL: ``E8 rel32``; ``FF /2`` with a register, ``[reg]``, ``[reg+d8]``,
    ``[reg+d32]``, ``[rip+d32]`` or SIB operand, with or without a REX prefix). None when it
    cannot be told (another machine, bytes outside the file)."""
    if image.machine != 62:
        return None
    window = image.code_bytes(vaddr - 8, 8) if vaddr >= 8 else None
    if window is None:
        return None
    if window[-5] == 0xE8:
        return True
    for length in (2, 3, 4, 6, 7):
        insn = window[-length:]
        if insn[0] == 0x41 or insn[0] == 0x48:  # REX.B / REX.W prefix
            insn = insn[1:]
        if len(insn) < 2 or insn[0] != 0xFF or (insn[1] >> 3) & 7 != 2:
            continue
        mod, rm = insn[1] >> 6, insn[1] & 7
        extra = (1 if rm == 4 and mod != 3 else 0) + {0: 4 if rm == 5 else 0, 1: 1, 2: 4,
                                                      3: 0}[mod]
        if len(insn) == 2 + extra:
            return True
    return False


def _check_frames(scan: LogScan, mod: Module, is_main: bool) -> tuple[str | None, bool]:
    """``(mismatch, checked)``: the first frame that does not land where it says (or, on
    x86-64, return addresses that mostly do not follow a call instruction), and whether any
    frame could be checked at all."""
    image = mod.image
    checked = False
    calls = [0, 0]  # return addresses that follow a call, that do not
    first_bad: str | None = None
    for bt, pos, fr in _frames(scan):
        if not _belongs(fr, mod, is_main):
            continue
        ref = bt.symrefs[pos] if pos < len(bt.symrefs) else None
        vaddr: int | None = None
        if ref is not None:
            sym, off = ref
            value = image.symbol_address(sym)
            if value is None:
                return f"the log's frame {sym}+0x{off:x} names a symbol it does not have", True
            at = image.symbol_at(value + off - 1 if off > 0 else value)
            checked = True
            if at is None or (at[0] != sym and at[1] != value):
                where = f"lands in {demangle(at[0])}" if at is not None else "lands in no symbol"
                return f"the log's frame {sym}+0x{off:x} {where} in it", True
            vaddr, label = value + off, f"{sym}+0x{off:x}"
        elif fr.offset is not None and fr.function:
            vaddr = image.base_vaddr + fr.offset
            label = f"{fr.function} at offset 0x{fr.offset:x}"
            at = image.symbol_at(vaddr - 1 if fr.offset > 0 else vaddr)
            if at is not None:
                checked = True
                if base_name(demangle(at[0])) != base_name(fr.function):
                    return f"the log's frame {label} lands in {demangle(at[0])} in it", True
        if vaddr is None or (pos == 0 and bt.form in ("gdb", "lldb", "coredump")):
            continue  # the innermost frame of a debugger's stack is a PC, not a return address
        after_call = follows_call(image, vaddr)
        if after_call is None:
            continue
        checked = True
        calls[0 if after_call else 1] += 1
        if not after_call and first_bad is None:
            first_bad = label
    bias_problem = _check_biases(scan, mod, is_main, calls)
    if bias_problem is not None:
        return bias_problem, True
    if calls != [0, 0]:
        checked = True
    if calls[1] > calls[0]:
        return (f"{calls[1]} of {sum(calls)} return addresses in the log's frames (first "
                f"{first_bad}) do not follow a call instruction in it"), True
    return None, checked


def _check_biases(scan: LogScan, mod: Module, is_main: bool, calls: list[int]) -> str | None:
    """Frames with a function name and an absolute address only (gdb's ``0xADDR in f () from
    lib``): one load bias must put every such address inside its named function; with that
    bias their return addresses count into ``calls`` like the others."""
    if mod.image.is_exec:
        return None  # not relocated: addresses are link-time addresses, checked as they are
    named: list[tuple[Backtrace, int, Frame, set[int]]] = []
    common: set[int] | None = None
    for bt, pos, fr in _frames(scan):
        if (not _belongs(fr, mod, is_main) or fr.address is None or not fr.function
                or fr.offset is not None or fr.file is not None
                or (pos < len(bt.symrefs) and bt.symrefs[pos] is not None)):
            continue
        if not mod.image.symbols_named(base_name(fr.function)):
            continue  # a local function a stripped binary has no symbol for
        found = biases(mod, fr.address, fr.function)
        if not found:
            return (f"the log's frame {fr.function} at 0x{fr.address:x} cannot lie inside "
                    f"{base_name(fr.function)} in it at any load address")
        common = found if common is None else common & found
        if not common:
            return (f"the log's frames of this module (up to {fr.function} at "
                    f"0x{fr.address:x}) need different load addresses in it")
        named.append((bt, pos, fr, found))
    if common is None or len(common) != 1:
        return None
    bias = next(iter(common))
    for bt, pos, fr, _found in named:
        if pos == 0 and bt.form in ("gdb", "lldb", "coredump"):
            continue
        assert fr.address is not None
        after_call = follows_call(mod.image, fr.address - bias)
        if after_call is not None:
            calls[0 if after_call else 1] += 1
    return None


CheckedBy = Literal["build-id", "frames", "unchecked"]


def verify(scan: LogScan, mod: Module, is_main: bool,
           machine: int | None) -> tuple[str | None, CheckedBy]:
    """``(refusal, checked_by)``: why ``mod`` is not the build the log ran (None when it may
    be used) and what vouched for it."""
    image = mod.image
    if machine is not None and image.machine != machine:
        have = MACHINES.get(image.machine, f"machine {image.machine}")
        want = MACHINES.get(machine, f"machine {machine}")
        return f"it is an ELF for {have}, the log comes from {want}", "unchecked"
    stated = {bid for name, bid in scan.build_ids if module_key(name) == module_key(mod.path)}
    if stated and image.build_id:
        if image.build_id in stated:
            return None, "build-id"
        return (f"its build-id {image.build_id[:16]}… is not the log's "
                f"{sorted(stated)[0][:16]}…"), "build-id"
    mismatch, checked = _check_frames(scan, mod, is_main)
    if mismatch is not None:
        return mismatch, "frames"
    return None, "frames" if checked else "unchecked"
