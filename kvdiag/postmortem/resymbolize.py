"""Re-symbolizing parsed backtraces with the binaries the user names (``--binary``).

A frame is looked up when it lacks a function or a source location (gdb's ``??``, glibc's
``module(+0xOFF)``, frames from libraries without line info). Its link-time address comes
from, in order: the module offset (glibc ``(+0xOFF)``, systemd-coredump ``(module + 0xOFF)``),
a symbol plus offset (glibc ``(sym+0xOFF)``), or an absolute address minus the module's load
bias, which is known when another frame of the same module printed both its address and its
offset, or when the binary is not position independent. Addresses are return addresses except
for frame #0 of a debugger's stack and a frame interrupted by a signal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from kvdiag.errors import InputError
from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import Backtrace, BinaryUse, Crash, LogScan, Problem
from kvdiag.postmortem.backtrace import is_in_app
from kvdiag.postmortem.binaries import (
    Candidate,
    bias_from_name,
    candidates,
    is_pc,
    log_machine,
    verify,
)
from kvdiag.postmortem.fingerprint import fingerprint
from kvdiag.postmortem.symbolizer import DEFAULT_BUDGET_S, Module, module_key


def _load_bases(bt: Backtrace) -> dict[str, int]:
    bases: dict[str, int] = {}
    for fr in bt.frames:
        if fr.module and fr.offset is not None and fr.address is not None:
            bases.setdefault(module_key(fr.module), fr.address - fr.offset)
    return bases


class Resymbolizer:
    """Holds the opened binaries for one run."""

    def __init__(self, binaries: Sequence[str], debug_dirs: Sequence[str],
                 use_cache: bool = True, budget_s: float = DEFAULT_BUDGET_S,
                 cache_root: str | None = None) -> None:
        self.modules: dict[str, Module] = {}
        self.main: Module | None = None
        self.unverified: set[str] = set()
        self._open = (debug_dirs, use_cache, budget_s, cache_root)
        try:
            for path in binaries:
                self.add(self.open(path))
        except BaseException:
            self.close()
            raise

    def open(self, path: str) -> Module:
        debug_dirs, use_cache, budget_s, cache_root = self._open
        return Module(path, debug_dirs, use_cache, budget_s, cache_root)

    def add(self, mod: Module, verified: bool = True) -> None:
        """``verified`` False: the frames ``mod`` names are marked ``unverified``."""
        self.modules[module_key(mod.path)] = mod
        if not verified:
            self.unverified.add(module_key(mod.path))
        if self.main is None and is_main(mod):
            self.main = mod

    def close(self) -> None:
        for mod in self.modules.values():
            mod.close()
        self.modules.clear()

    def _module(self, name: str | None) -> Module | None:
        if name is None:
            return self.main if self.main is not None else (
                next(iter(self.modules.values())) if len(self.modules) == 1 else None)
        return self.modules.get(module_key(name))

    def backtrace(self, bt: Backtrace) -> Backtrace:
        bases = _load_bases(bt)
        for fr in bt.frames:
            if fr.address is None or fr.function is None or fr.offset is not None:
                continue
            mod = self._module(fr.module)
            key = module_key(fr.module or (mod.path if mod is not None else ""))
            if mod is not None and key not in bases and not mod.image.is_exec:
                bias = bias_from_name(mod, fr.address, fr.function)
                if bias is not None:
                    bases[key] = bias + mod.image.base_vaddr
        out: list[Frame] = []
        for pos, fr in enumerate(bt.frames):
            ref = bt.symrefs[pos] if pos < len(bt.symrefs) else None
            out.extend(self._frame(bt, fr, pos, ref, bases))
        frames = tuple(msgspec.structs.replace(f, index=i) for i, f in enumerate(out))
        return msgspec.structs.replace(bt, frames=frames, symrefs=())

    def _frame(self, bt: Backtrace, fr: Frame, pos: int, ref: tuple[str, int] | None,
               bases: dict[str, int]) -> list[Frame]:
        if fr.function is not None and fr.file is not None:
            return [fr]
        mod = self._module(fr.module)
        if mod is None:
            return [fr]
        vaddr: int | None = None
        if fr.offset is not None:
            vaddr = mod.image.base_vaddr + fr.offset
        elif ref is not None:
            sym = mod.image.symbol_address(ref[0])
            if sym is not None:
                # glibc printed dladdr's nearest symbol: its value plus the printed offset is
                # the module offset a "(+0xOFF)" frame would have shown
                vaddr = sym + ref[1]
                fr = msgspec.structs.replace(fr, offset=vaddr - mod.image.base_vaddr)
        elif fr.address is not None:
            base = bases.get(module_key(fr.module or mod.path))
            if base is not None:
                vaddr = fr.address - base + mod.image.base_vaddr
            elif mod.image.is_exec:
                vaddr = fr.address
        if vaddr is None:
            return [fr]
        # the binary check's rule (a signal's trampoline, glibc's unnamed libc frame before
        # the interrupted one: it was looked up one byte back, on the line before the fault)
        found = mod.resolve(vaddr, not is_pc(bt, pos))
        if not found:
            return [fr]
        module = fr.module or mod.path
        unverified = module_key(mod.path) in self.unverified
        frames: list[Frame] = []
        for k, (func, file, line) in enumerate(found):
            function = func if func is not None else fr.function
            src = file if file is not None else fr.file
            frames.append(msgspec.structs.replace(
                fr, function=function, file=src,
                line=line if line is not None else fr.line, inlined=k < len(found) - 1,
                in_app=is_in_app(function, module, src), unverified=unverified))
        return frames


def is_main(mod: Module) -> bool:
    """An executable (or a PIE with an interpreter): frames without a module are its."""
    return mod.image.is_exec or mod.image.has_interp


def reference_machine(scan: LogScan, mods: Sequence[Module]) -> tuple[int | None, str]:
    """The machine every binary must be for, and where that comes from: the log's frames when
    they show one; else the machine of the binaries whose return addresses the log's frames
    decode as calls (code of another machine seldom does), when those agree; else the machine
    more than half of the binaries are for. None when nothing tells."""
    machine = log_machine(scan)
    if machine is not None:
        return machine, "the log comes from"
    proven: dict[int, str] = {}
    for mod in mods:
        verdict = verify(scan, mod, is_main(mod), None)
        if verdict.refusal is None and verdict.calls:
            proven.setdefault(mod.image.machine, module_key(mod.path))
    if len(proven) == 1:
        ((machine, name),) = proven.items()
        return machine, f"the log's return addresses in {name} follow calls as code for"
    counts = Counter(m.image.machine for m in mods)
    if counts:
        common, n = counts.most_common(1)[0]
        if 2 * n > len(mods) and n < len(mods):
            return common, "the log names no machine and the other binaries are for"
    return None, ""


def resymbolize(scan: LogScan, binaries: Sequence[str], debug_dir: str | None,
                use_cache: bool = True, cache_root: str | None = None,
                auto: bool = False) -> LogScan:
    """``scan`` with every crash's backtrace re-symbolized and re-fingerprinted, with the
    ``binaries`` given and (``auto``) those found at the log's module paths, each checked
    against the log first (``binaries.verify``); refusals become ``binary-mismatch`` problems,
    a binary no frame of the log is in a ``binary-unused`` one. An unreadable ``--binary`` is
    an ``InputError``; an unreadable file at a logged path only a problem."""
    dirs = [debug_dir] if debug_dir else []
    cands = candidates(scan, binaries, auto)
    if not cands:
        return scan
    problems = list(scan.problems)
    uses: list[BinaryUse] = []
    rs = Resymbolizer([], dirs, use_cache=use_cache, cache_root=cache_root)
    opened: list[tuple[Candidate, Module]] = []
    try:
        for cand in cands:
            try:
                opened.append((cand, rs.open(cand.path)))
            except InputError as exc:
                if cand.origin == "option":
                    raise
                problems.append(Problem(source=cand.path, code="binary-unreadable",
                                        message=f"not used for symbolizing: {exc}"))
        machine, machine_from = reference_machine(scan, [m for _c, m in opened])
        while opened:
            cand, mod = opened[0]
            verdict = verify(scan, mod, is_main(mod) and rs.main is None, machine, machine_from)
            opened.pop(0)
            refused: tuple[str, str] | None = None
            if verdict.refusal is not None:
                refused = ("binary-mismatch", f"binary-mismatch: {cand.path} is not the build "
                           f"the log ran: {verdict.refusal}; its frames are left as logged")
            elif verdict.frames == 0:
                refused = ("binary-unused", f"not used for symbolizing: no frame of the log is "
                           f"in {module_key(cand.path)} ({modules_named(scan)})")
            if refused is not None:
                mod.close()
                problems.append(Problem(source=cand.path, code=refused[0], message=refused[1]))
                continue
            rs.add(mod, verified=verdict.checked_by != "unchecked")
            uses.append(BinaryUse(path=cand.path, origin=cand.origin,
                                  checked_by=verdict.checked_by, evidence=verdict.evidence))
        crashes: list[Crash] = []
        for crash in scan.crashes:
            if crash.backtrace is not None and rs.modules:
                crash = msgspec.structs.replace(crash, backtrace=rs.backtrace(crash.backtrace))
                crash = msgspec.structs.replace(crash, fingerprint=fingerprint(crash))
            crashes.append(crash)
    finally:
        for _cand, mod in opened:
            mod.close()
        rs.close()
    return msgspec.structs.replace(scan, crashes=tuple(crashes), problems=tuple(problems),
                                   binaries=tuple(uses))


def modules_named(scan: LogScan) -> str:
    """The modules the log's frames name, for a message: ``frames name prog, libc.so.6``."""
    names = sorted({module_key(fr.module) for c in scan.crashes if c.backtrace is not None
                    for fr in c.backtrace.frames if fr.module})
    if not names:
        return "its frames name no module"
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"its frames name {shown}"
