"""A compact DWARF line table for one compilation unit.

pyelftools parses the line-program *header* (DWARF 4 and 5 file/directory tables); the opcodes
themselves are decoded here into flat lists, because building one Python object per row is
what makes a full pyelftools decode slow. Opcode semantics: DWARF 5 §6.2.5 (standard,
extended and special opcodes; DWARF 4 §6.2.5 is the same for what is used here). File names
are joined the way binutils does: an absolute name stands alone, otherwise it is put under its
directory entry, and a relative directory under the unit's ``DW_AT_comp_dir``.
"""

from __future__ import annotations

import bisect
import posixpath
from typing import Any

import msgspec

from kvdiag.errors import InputError

MAX_ROWS = 4_000_000


class LineTable(msgspec.Struct, array_like=True):
    """Rows sorted by address; ``lines[i] == -1`` marks the end of a sequence."""

    addrs: list[int]
    lines: list[int]
    files: list[int]
    names: list[str]

    def lookup(self, pc: int) -> tuple[str | None, int] | None:
        i = bisect.bisect_right(self.addrs, pc) - 1
        if i < 0 or self.lines[i] < 0:
            return None
        f = self.files[i]
        name = self.names[f] if 0 <= f < len(self.names) else None
        return name, self.lines[i]


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _file_names(header: Any, version: int, comp_dir: str) -> list[str]:
    dirs = [_text(d) for d in header["include_directory"]]
    entries = header["file_entry"]
    if version < 5:
        dirs = [comp_dir, *dirs]
    out: list[str] = []
    if version < 5:
        out.append("")  # file register values are 1-based before DWARF 5
    for entry in entries:
        name = _text(entry["name"])
        d = entry.get("dir_index", 0)
        if posixpath.isabs(name) or (len(name) > 2 and name[1] == ":"):
            out.append(name)
            continue
        base = dirs[d] if 0 <= d < len(dirs) else ""
        if base and not posixpath.isabs(base) and comp_dir:
            base = posixpath.join(comp_dir, base)
        out.append(posixpath.join(base, name) if base else name)
    return out


def decode(lineprog: Any, version: int, address_size: int, comp_dir: str,
           deadline: float) -> LineTable:
    """Decode ``lineprog`` (a pyelftools ``LineProgram``) into a ``LineTable``."""
    import time

    hdr = lineprog.header
    min_inst = hdr["minimum_instruction_length"]
    line_base = hdr["line_base"]
    line_range = hdr["line_range"] or 1
    opcode_base = hdr["opcode_base"]
    std_lengths = list(hdr["standard_opcode_lengths"])
    stream = lineprog.stream
    stream.seek(lineprog.program_start_offset)
    data = stream.read(lineprog.program_end_offset - lineprog.program_start_offset)
    rows: list[tuple[int, int, int, int]] = []
    n = len(data)
    i = 0
    seq = 0

    def reset() -> tuple[int, int, int]:
        return 0, 1, 1

    addr, file, line = reset()

    def uleb(j: int) -> tuple[int, int]:
        result = shift = 0
        while j < n:
            b = data[j]
            j += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return result, j
            if shift > 70:
                break
        raise InputError("line program: bad LEB128 number")

    def sleb(j: int) -> tuple[int, int]:
        result = shift = 0
        b = 0x80
        while j < n and b & 0x80:
            b = data[j]
            j += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if shift > 70:
                raise InputError("line program: bad LEB128 number")
        if b & 0x40:
            result -= 1 << shift
        return result, j

    while i < n:
        op = data[i]
        i += 1
        if op >= opcode_base:
            adj = op - opcode_base
            addr += (adj // line_range) * min_inst
            line += line_base + adj % line_range
            rows.append((addr, line, file, seq))
        elif op == 0:
            length, i = uleb(i)
            if length == 0 or i + length > n:
                raise InputError("line program: truncated extended opcode")
            sub = data[i]
            if sub == 1:  # DW_LNE_end_sequence
                rows.append((addr, -1, file, seq))
                seq += 1
                addr, file, line = reset()
            elif sub == 2:  # DW_LNE_set_address
                addr = int.from_bytes(data[i + 1:i + length], "little")
            i += length
        elif op == 1:  # DW_LNS_copy
            rows.append((addr, line, file, seq))
        elif op == 2:  # DW_LNS_advance_pc
            v, i = uleb(i)
            addr += v * min_inst
        elif op == 3:  # DW_LNS_advance_line
            v, i = sleb(i)
            line += v
        elif op == 4:  # DW_LNS_set_file
            file, i = uleb(i)
        elif op == 8:  # DW_LNS_const_add_pc
            addr += ((255 - opcode_base) // line_range) * min_inst
        elif op == 9:  # DW_LNS_fixed_advance_pc
            addr += int.from_bytes(data[i:i + 2], "little")
            i += 2
        else:  # opcodes with only ULEB operands: set_column, set_isa, vendor extensions
            for _ in range(std_lengths[op - 1] if op - 1 < len(std_lengths) else 0):
                _v, i = uleb(i)
        if len(rows) > MAX_ROWS:
            raise InputError(f"line program: more than {MAX_ROWS} rows")
        if not (len(rows) & 0xFFFF) and time.monotonic() > deadline:
            raise InputError("line program: time budget exceeded")
    # sequence ends sort before rows that start at the same address
    rows.sort(key=lambda r: (r[0], r[1] >= 0, r[3]))
    names = _file_names(hdr, version, comp_dir)
    return LineTable(addrs=[r[0] for r in rows], lines=[r[1] for r in rows],
                     files=[r[2] for r in rows], names=names)
