"""Which binaries to symbolize with, and whether each is the build the log ran.

Binaries come from ``--binary`` and, unless turned off, from the module paths the log printed
when a regular file is at that path on this machine (a crash analysed where it happened).
Runtime libraries (libc, libstdc++, …: ``backtrace.is_in_app`` by file name) are not picked up
that way: their frames are never in-app and their symbols are in the log already.

Nothing is trusted on its name alone. A binary is refused for its module when:

* its ELF machine differs from the one the log shows (``/x86_64-linux-gnu/`` paths, glibc's
  ``_avx``/``_evex``/``_erms`` function variants, ``aarch64``/``riscv64`` paths) or, when the
  log shows none, from the machine most of the other binaries are for;
* the log states a build-id for the module (systemd-coredump) and the binary's differs;
* otherwise, any frame of its module fails one of these:

  - a frame that names a symbol lands in it: ``sym+0xOFF`` (glibc) inside ``sym`` in this
    binary, a ``function (module + 0xOFF)`` frame (systemd-coredump) inside a symbol of that
    name, gdb's ``0xADDR in f () from lib`` inside ``f`` at some load address;
  - all frames of the module imply one load address (absolute address minus link-time
    address), a multiple of the page size, and none for an executable that is not position
    independent — another build puts its symbols elsewhere;
  - every return address follows a call instruction (``callsite``): another build of the same
    source often keeps an offset inside the same function, seldom on a call boundary, and this
    is the only check that offset-only frames (``prog(+0x11c7)``) allow.

Frames whose address is a PC (a debugger's innermost frame, the frame a signal interrupted) are
not return addresses. What could not be checked (a machine without a call decoder, a log with
no frame that can be placed) is said: such a binary is used as ``unchecked`` and the frames it
named are marked unverified.

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
from kvdiag.postmortem.callsite import check_return_address
from kvdiag.postmortem.demangle import demangle
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
        # gdb writes "from LIB" only for code without debug info: a frame with a source
        # location and no module may be any library's (libc's, with its debug symbols
        # installed: "#1 0x7ffff7e5ff4f in __pthread_kill_internal (...) at ./nptl/
        # pthread_kill.c:78"), so it is the executable's only when it defines the function
        return is_main and (fr.file is None or bool(
            fr.function and mod.image.symbols_named(base_name(fr.function))))
    return module_key(fr.module) == module_key(mod.path)


#: Frames that are a signal's trampoline: the frame after one is where the signal came, a PC.
SIGNAL_FRAMES = frozenset({"<signal handler called>", "__restore_rt", "_sigtramp",
                           "__kernel_rt_sigreturn"})
#: Forms whose innermost frame is the thread's PC (gdb, lldb and systemd-coredump unwind a
#: stopped thread; an Android tombstone prints ``pc``), not a return address.
_PC_FORMS = ("gdb", "lldb", "coredump", "android")


def is_pc(bt: Backtrace, pos: int) -> bool:
    """Whether frame ``pos`` holds a PC rather than a return address (looked up as it is, not
    one byte back): the innermost frame of a debugger's stack, or the frame a signal
    interrupted — the one rule of the binary check and of symbolization. glibc's ``backtrace_symbols`` prints
    the sigreturn trampoline (``__restore_rt``, a local symbol) as an unnamed libc frame."""
    if pos == 0:
        return bt.form in _PC_FORMS
    prev = bt.frames[pos - 1]
    if (prev.function or "") in SIGNAL_FRAMES:
        return True
    return (bt.form == "glibc" and prev.function is None and prev.module is not None
            and module_key(prev.module) == "libc")


CheckedBy = Literal["build-id", "frames", "unchecked"]


@dataclass
class _Placed:
    """A frame of the module with its link-time address in the binary, once known."""

    bt: Backtrace
    pos: int
    fr: Frame
    label: str
    vaddr: int | None


@dataclass
class Verdict:
    """What ``verify`` found: ``refusal`` (None when the binary may be used), what vouched for
    it, a line saying what was checked (and what could not be), and how many of the log's
    frames are in its module."""

    refusal: str | None
    checked_by: CheckedBy
    evidence: str = ""
    frames: int = 0
    #: return addresses that follow a call as this binary's machine decodes it
    calls: int = 0


class _Mismatch(Exception):
    """A check failed; the message is the reason."""


class _FrameChecks:
    """The checks of one binary against the log's frames of its module (see the module
    docstring); each failure raises ``_Mismatch``."""

    def __init__(self, mod: Module, placed: list[_Placed]) -> None:
        self.image = mod.image
        self.mod = mod
        self.placed = placed
        self.named = 0
        #: (load bias, label, whether the bias depends on the binary)
        self.exact: list[tuple[int, str, bool]] = []
        self.ranged: list[tuple[set[int], str]] = []
        self.calls = 0
        self.undecoded = False
        self.no_bytes = False

    def run(self) -> str:
        for p in self.placed:
            self._place(p)
        self._biases()
        for p in self.placed:
            self._returns(p)
        return self._evidence()

    def _lands_in(self, p: _Placed, vaddr: int, name: str, exact_name: bool) -> None:
        at = self.image.symbol_at(vaddr)
        if exact_name:
            value = self.image.symbol_address(name)
            ok = at is not None and (at[0] == name or at[1] == value)
        else:
            ok = at is not None and base_name(demangle(at[0])) == base_name(name)
            if at is None and not self.image.symbols_named(base_name(name)):
                return  # a local function a stripped binary keeps no symbol for
        if not ok:
            where = f"lands in {demangle(at[0])}" if at is not None else "lands in no function"
            raise _Mismatch(f"the log's frame {p.label} {where} in it")
        self.named += 1

    def _place(self, p: _Placed) -> None:
        image, bt, pos, fr = self.image, p.bt, p.pos, p.fr
        ref = bt.symrefs[pos] if pos < len(bt.symrefs) else None
        pc_adjust = 0 if is_pc(bt, pos) else 1
        if ref is not None:
            sym, off = ref
            value = image.symbol_address(sym)
            p.label = f"{sym}+0x{off:x}"
            if value is None:
                raise _Mismatch(f"the log's frame {p.label} names a symbol it does not have")
            p.vaddr = value + off
            self._lands_in(p, p.vaddr - pc_adjust if off > 0 else p.vaddr, sym, True)
            if fr.address is not None:
                self.exact.append((fr.address - p.vaddr, p.label, True))
        elif fr.offset is not None:
            p.vaddr = image.base_vaddr + fr.offset
            p.label = (f"{fr.function} at offset 0x{fr.offset:x}" if fr.function else
                       f"{os.path.basename(fr.module or '')}+0x{fr.offset:x}")
            if fr.function:
                self._lands_in(p, p.vaddr - pc_adjust if fr.offset > 0 else p.vaddr,
                               fr.function, False)
            if fr.address is not None:
                self.exact.append((fr.address - p.vaddr, p.label, False))
        elif fr.address is not None:
            p.label = f"{fr.function or '??'} at 0x{fr.address:x}"
            if image.is_exec:  # not relocated: the log's addresses are link-time addresses
                p.vaddr = fr.address
                if fr.function:
                    self._lands_in(p, p.vaddr - pc_adjust, fr.function, False)
            elif fr.function and image.symbols_named(base_name(fr.function)):
                found = biases(self.mod, fr.address + 1 - pc_adjust, fr.function)
                if not found:
                    raise _Mismatch(f"the log's frame {p.label} cannot lie inside "
                                    f"{base_name(fr.function)} in it at any load address")
                self.ranged.append((found, p.label))

    def _biases(self) -> None:
        """One load bias for the module: every frame with an absolute address and a link-time
        address implies one, it is a multiple of the page size (glibc ``_dl_map_segments``
        maps at page boundaries) and 0 for an executable that is not position independent."""
        exact = {bias for bias, _label, _dep in self.exact}
        for bias, label, _dep in self.exact:
            if self.image.is_exec and bias != 0:
                raise _Mismatch("it is not position independent, so it runs at its link "
                                f"addresses, yet the log's frame {label} implies a load offset "
                                f"of {bias:+#x}")
            if bias % PAGE:
                raise _Mismatch(f"the log's frame {label} puts its load address at {bias:#x}, "
                                "which is not a page boundary as every load address is")
        if len(exact) > 1:
            b1, l1, _ = self.exact[0]
            b2, l2, _ = next(e for e in self.exact if e[0] != b1)
            raise _Mismatch(f"the log's frames {l1} and {l2} put it at different load "
                            f"addresses ({b1:#x} and {b2:#x})")
        common: set[int] | None = set(exact) if exact else None
        for found, label in self.ranged:
            common = found if common is None else common & found
            if not common:
                raise _Mismatch(f"the log's frames of this module (up to {label}) need "
                                "different load addresses in it")
        if common is None or len(common) != 1:
            return
        bias = next(iter(common))
        for p in self.placed:
            if p.vaddr is None and p.fr.address is not None:
                p.vaddr = p.fr.address - bias

    def _returns(self, p: _Placed) -> None:
        if p.vaddr is None:
            return
        if is_pc(p.bt, p.pos):
            if self.image.code and not self.image.in_code(p.vaddr):
                raise _Mismatch(f"the log's frame {p.label} is at 0x{p.vaddr:x} in it, "
                                "outside its executable code")
            return
        result = check_return_address(self.image, p.vaddr)
        if result == "call":
            self.calls += 1
            return
        if result == "unknown":
            self.undecoded = True
            return
        if result == "no-bytes":
            self.no_bytes = True
            return
        why = {"no-call": "where no call instruction ends",
               "outside-code": "outside its executable code",
               "misaligned": "where no instruction of "
                             f"{MACHINES.get(self.image.machine, 'its machine')} can end"}[result]
        raise _Mismatch(f"the log's frame {p.label} returns to 0x{p.vaddr:x} in it, {why}")

    def _evidence(self) -> str:
        said: list[str] = []
        if self.named:
            said.append(f"{self.named} frame(s) land in the functions they name")
        tied = sum(1 for _b, _l, dep in self.exact if dep)
        if tied and not self.image.is_exec:
            said.append(f"{len(self.exact)} frame(s) agree on one page-aligned load address")
        if self.calls:
            said.append(f"{self.calls} return address(es) follow a call instruction")
        if self.undecoded:
            name = MACHINES.get(self.image.machine, f"machine {self.image.machine}")
            said.append(f"return addresses not checked (no call decoder for {name})")
        if self.no_bytes:
            said.append("return addresses not checked (the file holds no code bytes: a "
                        "separate debug file)")
        return "; ".join(said)

    @property
    def checked(self) -> bool:
        tied = any(dep for _b, _l, dep in self.exact)
        return bool(self.named or self.calls or (tied and not self.image.is_exec))


def machine_name(machine: int) -> str:
    return MACHINES.get(machine, f"machine {machine}")


def verify(scan: LogScan, mod: Module, is_main: bool, machine: int | None,
           machine_from: str = "the log comes from") -> Verdict:
    """Whether ``mod`` is the build the log ran: its ELF machine against ``machine`` (what the
    log shows, or the other binaries' machine: ``machine_from`` says which), the build-id the
    log states, else the frames of its module (the module docstring lists the checks)."""
    image = mod.image
    frames = [(bt, pos, fr) for bt, pos, fr in _frames(scan) if _belongs(fr, mod, is_main)]
    if machine is not None and image.machine != machine:
        return Verdict(f"it is an ELF for {machine_name(image.machine)}, {machine_from} "
                       f"{machine_name(machine)}", "unchecked", frames=len(frames))
    stated = {bid for name, bid in scan.build_ids if module_key(name) == module_key(mod.path)}
    if stated and image.build_id:
        if image.build_id in stated:
            return Verdict(None, "build-id", "its build-id is the one the log states",
                           len(frames))
        return Verdict(f"its build-id {image.build_id[:16]}… is not the log's "
                       f"{sorted(stated)[0][:16]}…", "build-id", frames=len(frames))
    checks = _FrameChecks(mod, [_Placed(bt, pos, fr, "", None) for bt, pos, fr in frames])
    try:
        evidence = checks.run()
    except _Mismatch as exc:
        return Verdict(str(exc), "frames", frames=len(frames))
    return Verdict(None, "frames" if checks.checked else "unchecked", evidence, len(frames),
                   checks.calls)
