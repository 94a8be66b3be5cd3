"""Whether a return address follows a call instruction in a binary's code.

A caller frame's address in a backtrace is where the callee returns to, so the instruction that
ends just before it must be a call. Another build of the same program seldom keeps that true
for every frame, which makes this the check that still works when a log gives nothing but
module offsets (glibc's ``prog(+0x11c7)``).

Decoded per ELF machine (``e_machine``, System V gABI):

* x86-64 and x86 (Intel SDM vol. 2A §2.1 and vol. 2B "CALL"): ``E8 rel32`` and ``FF /2``
  (``FF /3``, the far call, too) with the ModRM form's SIB byte and 8- or 32-bit
  displacement, after legacy prefixes (``67`` as in ld's ``addr32 call`` relaxation of
  ``call *sym@GOTPCREL(%rip)``, ``3E`` notrack, ``F2`` bnd, segment overrides) and, on x86-64,
  a REX prefix. Instructions have no fixed length, so every start within 15 bytes before the
  address is tried: a coincidental decode can only make the check pass, never refuse.
* AArch64 (Arm ARM C6.2 "BL", "BLR", "BLRAA, BLRAAZ, BLRAB, BLRABZ"): the 32-bit word before a
  4-byte aligned address (A64 instructions are little-endian in either data endianness).
* RISC-V (unprivileged ISA §2.5 "JAL"/"JALR", §16.8 "C.JALR"): ``jal``/``jalr`` that write
  ``ra`` (4 bytes) or ``c.jalr`` (2 bytes) before a 2-byte aligned address.
* 32-bit Arm (Arm ARM A8.8.25-26 "BL, BLX (immediate)", "BLX (register)"): A32 ``BL``/``BLX``
  before a 4-byte aligned address, T32 ``BL``/``BLX`` (4 bytes) or 16-bit ``BLX Rm`` before a
  2-byte aligned one (bit 0 of a Thumb return address is the mode bit, dropped first).
* PowerPC64 (Power ISA 3.1 §2.4 "Branch Instructions"): ``bl``/``bla`` (LK=1), ``bctrl``,
  ``blrl``.
* LoongArch (LoongArch Reference Manual vol. 1 §2.2.6): ``bl`` and ``jirl`` that writes
  ``$ra``.

Other machines are not decoded: the answer is "cannot tell", and the caller must say the
check was not made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from kvdiag.postmortem.elfindex import ElfImage

X86, ARM, PPC64, X86_64, AARCH64, RISCV, LOONGARCH = 3, 40, 21, 62, 183, 243, 258

CallCheck = Literal["call", "no-call", "misaligned", "outside-code", "unknown", "no-bytes"]

_LEGACY_PREFIXES = frozenset({0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF2, 0xF3})
_MAX_X86_INSN = 15


def _modrm_extra(modrm: int, sib: int | None) -> int | None:
    """Bytes that follow a ModRM byte (SIB and displacement) in 32/64-bit addressing (Intel SDM
    vol. 2A, tables 2-2 and 2-3); None when the SIB byte is needed but absent."""
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 0
    extra = 0
    if rm == 4:
        if sib is None:
            return None
        extra = 1
        if mod == 0 and sib & 7 == 5:
            return extra + 4
    elif mod == 0 and rm == 5:
        return 4
    return extra + {0: 0, 1: 1, 2: 4}[mod]


def _x86_call_at(code: bytes, start: int, rex_ok: bool) -> bool:
    """Whether ``code[start:]`` is exactly one call instruction."""
    pos, end = start, len(code)
    prefixes = 0
    while pos < end and code[pos] in _LEGACY_PREFIXES and prefixes < 4:
        pos += 1
        prefixes += 1
    if rex_ok and pos < end and 0x40 <= code[pos] <= 0x4F:
        pos += 1
    if pos >= end:
        return False
    op = code[pos]
    if op == 0xE8:
        return end - pos == 5
    if op != 0xFF or pos + 1 >= end:
        return False
    modrm = code[pos + 1]
    if (modrm >> 3) & 7 not in (2, 3):
        return False
    sib = code[pos + 2] if pos + 2 < end else None
    extra = _modrm_extra(modrm, sib)
    return extra is not None and end - pos == 2 + extra


def _x86(image: ElfImage, vaddr: int) -> CallCheck:
    for size in range(_MAX_X86_INSN, 1, -1):
        code = image.code_bytes(vaddr - size, size)
        if code is not None:
            break
    else:
        return "outside-code"
    rex_ok = image.machine == X86_64
    return "call" if any(_x86_call_at(code, s, rex_ok) for s in range(len(code) - 1)) \
        else "no-call"


def _aarch64_call(insn: int) -> bool:
    return ((insn & 0xFC000000) == 0x94000000  # BL imm26
            or (insn & 0xFFFFFC1F) == 0xD63F0000  # BLR Xn
            or (insn & 0xFEFFF800) == 0xD63F0800)  # BLRAA/BLRAB (Z=1), BLRAAZ/BLRABZ (Z=0)


def _riscv(image: ElfImage, vaddr: int) -> CallCheck:
    if vaddr % 2:
        return "misaligned"
    insn = _word(image, vaddr, 4, image.end)
    if insn is not None and (insn & 0xFFF == 0x0EF  # jal ra, imm
                             or insn & 0x7FFF == 0x00E7):  # jalr ra, imm(rs1)
        return "call"
    half = _word(image, vaddr, 2, image.end)
    if half is None:
        return "outside-code"
    if half & 0xF07F == 0x9002 and (half >> 7) & 0x1F:  # c.jalr rs1 (rs1 != 0)
        return "call"
    return "no-call"


def _word(image: ElfImage, vaddr: int, size: int, end: str) -> int | None:
    code = image.code_bytes(vaddr - size, size)
    if code is None:
        return None
    return int.from_bytes(code, "little" if end == "<" else "big")


def _fixed4(image: ElfImage, vaddr: int, is_call: Callable[[int], bool],
            end: str | None = None) -> CallCheck:
    """A machine whose instructions are 4 bytes and 4-byte aligned."""
    if vaddr % 4:
        return "misaligned"
    insn = _word(image, vaddr, 4, end or image.end)
    if insn is None:
        return "outside-code"
    return "call" if is_call(insn) else "no-call"


def _ppc64_call(insn: int) -> bool:
    return ((insn & 0xFC000001) == 0x48000001  # bl / bla
            or insn == 0x4E800421  # bctrl
            or insn == 0x4E800021)  # blrl


def _loongarch_call(insn: int) -> bool:
    return insn >> 26 == 0x15 or (insn >> 26 == 0x13 and insn & 0x1F == 1)  # bl, jirl $ra


def _arm(image: ElfImage, vaddr: int) -> CallCheck:
    if vaddr % 4 == 0:
        insn = _word(image, vaddr, 4, image.end)
        if insn is not None and (((insn & 0x0F000000) == 0x0B000000 and insn >> 28 != 0xF)
                                 or (insn & 0xFE000000) == 0xFA000000  # BLX imm
                                 or (insn & 0x0FFFFFF0) == 0x012FFF30):  # BLX Rm
            return "call"
    pc = vaddr & ~1
    if pc % 2:
        return "misaligned"
    hw2 = _word(image, pc, 2, image.end)
    hw1 = _word(image, pc - 2, 2, image.end)
    if hw1 is not None and hw2 is not None and (hw1 & 0xF800) == 0xF000 and \
            (hw2 & 0xC000) == 0xC000:  # T32 BL (bit 12 set) / BLX (bit 12 clear)
        return "call"
    if hw2 is not None and (hw2 & 0xFF87) == 0x4780:  # BLX Rm
        return "call"
    return "outside-code" if hw2 is None else "no-call"


def check_return_address(image: ElfImage, vaddr: int) -> CallCheck:
    """What precedes return address ``vaddr`` (a link-time address) in ``image``: a call, no
    call, an address no instruction of this machine can return to, one outside the file's
    executable segments, ``no-bytes`` where the file does not hold the segment's bytes (a
    separate debug file), or ``unknown`` for a machine not decoded here."""
    machine = image.machine
    if machine not in DECODED:
        return "unknown"
    if not image.in_code((vaddr & ~1 if machine == ARM else vaddr) - 1):
        return "outside-code"
    if image.code_bytes((vaddr & ~1 if machine == ARM else vaddr) - 1, 1) is None:
        # inside an executable segment whose bytes the file does not hold: a separate debug
        # file (objcopy --only-keep-debug makes .text NOBITS, p_filesz 0) — not decodable
        return "no-bytes"
    if machine in (X86, X86_64):
        return _x86(image, vaddr)
    if machine == AARCH64:  # A64 instructions are little-endian in either data endianness
        return _fixed4(image, vaddr, _aarch64_call, "<")
    if machine == RISCV:
        return _riscv(image, vaddr)
    if machine == ARM:
        return _arm(image, vaddr)
    return _fixed4(image, vaddr, _ppc64_call if machine == PPC64 else _loongarch_call)


#: Machines whose call instructions are decoded here.
DECODED = frozenset({X86, ARM, PPC64, X86_64, AARCH64, RISCV, LOONGARCH})
