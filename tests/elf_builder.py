"""Hand-made ELF64 shared objects for machines this host cannot compile for (not a test module).

Laid out as the System V gABI says ("ELF Header", "Program Header", "Section Header", "Symbol
Table") and as ld lays out a shared object: a read-only ``PT_LOAD`` at address 0 holding the
headers, a ``PF_R|PF_X`` one holding ``code`` at file offset and address 0x1000, then ``.text``, ``.symtab``, ``.strtab`` and ``.shstrtab`` with
their section headers at the end. Each symbol is a global ``STT_FUNC`` in ``.text``.
"""

from __future__ import annotations

import struct
from pathlib import Path

TEXT = 0x1000
_ET_DYN, _PT_LOAD, _PF_R, _PF_R_X = 3, 1, 4, 5
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_SHF_ALLOC_EXEC = 6


def build(path: Path, machine: int, code: bytes, symbols: list[tuple[str, int, int]],
          big_endian: bool = False) -> Path:
    """Write an ELF64 file for ``machine`` with ``code`` at 0x1000 and ``symbols`` as
    ``(name, address, size)``."""
    end = ">" if big_endian else "<"
    strtab = b"\0"
    syms = [struct.pack(end + "IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for name, addr, size in symbols:
        syms.append(struct.pack(end + "IBBHQQ", len(strtab), 0x12, 0, 1, addr, size))
        strtab += name.encode() + b"\0"
    symtab = b"".join(syms)
    names = [b"", b".text", b".symtab", b".strtab", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_at = [shstrtab.index(n + b"\0") if n else 0 for n in names]
    symtab_off = TEXT + len(code)
    strtab_off = symtab_off + len(symtab)
    shstr_off = strtab_off + len(strtab)
    shoff = (shstr_off + len(shstrtab) + 7) & ~7
    ident = b"\x7fELF" + bytes([2, 2 if big_endian else 1, 1, 0]) + bytes(8)
    header = ident + struct.pack(end + "HHIQQQIHHHHHH", _ET_DYN, machine, 1, 0, 64, shoff, 0,
                                 64, 56, 2, 64, 5, 4)
    phdr = struct.pack(end + "IIQQQQQQ", _PT_LOAD, _PF_R, 0, 0, 0, 176, 176, 0x1000) + \
        struct.pack(end + "IIQQQQQQ", _PT_LOAD, _PF_R_X, TEXT, TEXT, TEXT, len(code),
                    len(code), 0x1000)
    sections = [
        struct.pack(end + "IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        struct.pack(end + "IIQQQQIIQQ", name_at[1], _SHT_PROGBITS, _SHF_ALLOC_EXEC, TEXT, TEXT,
                    len(code), 0, 0, 16, 0),
        struct.pack(end + "IIQQQQIIQQ", name_at[2], _SHT_SYMTAB, 0, 0, symtab_off, len(symtab),
                    3, 1, 8, 24),
        struct.pack(end + "IIQQQQIIQQ", name_at[3], _SHT_STRTAB, 0, 0, strtab_off, len(strtab),
                    0, 0, 1, 0),
        struct.pack(end + "IIQQQQIIQQ", name_at[4], _SHT_STRTAB, 0, 0, shstr_off,
                    len(shstrtab), 0, 0, 1, 0),
    ]
    data = bytearray(header + phdr)
    data += bytes(TEXT - len(data))
    data += code + symtab + strtab + shstrtab
    data += bytes(shoff - len(data))
    data += b"".join(sections)
    path.write_bytes(bytes(data))
    return path
