"""A compact DWARF line table for one compilation unit.

pyelftools parses the line-program *header* (DWARF 4 and 5 file/directory tables); the opcodes
themselves are decoded here into flat lists, because building one Python object per row is
what makes a full pyelftools decode slow. Opcode semantics: DWARF 5 §6.2.5 (standard,
extended and special opcodes; DWARF 4 §6.2.5 is the same for what is used here). File names
are joined the way binutils does: an absolute name stands alone, otherwise it is put under its
directory entry, and a relative directory under the unit's ``DW_AT_comp_dir``.
"""

from __future__ import annotations

import array
import bisect
import posixpath
from typing import Any

import msgspec

from kvdiag.errors import InputError
from kvdiag.postmortem.leb128 import sleb128, uleb128

MAX_ROWS = 4_000_000


class LineTable(msgspec.Struct, array_like=True, dict=True):
    """Rows sorted by address, packed as machine arrays (``Q`` addresses, ``i`` lines and file
    indices) so that a cached table loads as a few byte copies; ``line == -1`` marks the end of
    a sequence."""

    addrs: bytes
    lines: bytes
    files: bytes
    names: list[str]

    def __post_init__(self) -> None:
        self._a: array.array[int] | None = None

    def _arrays(self) -> tuple[array.array[int], array.array[int], array.array[int]]:
        if self._a is None:
            self._a = array.array("Q", self.addrs)
            self._l = array.array("i", self.lines)
            self._f = array.array("i", self.files)
        return self._a, self._l, self._f

    def lookup(self, pc: int) -> tuple[str | None, int] | None:
        addrs, lines, files = self._arrays()
        i = bisect.bisect_right(addrs, pc) - 1
        if i < 0 or lines[i] < 0:
            return None
        f = files[i]
        name = self.names[f] if 0 <= f < len(self.names) else None
        return name, lines[i]


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
    for k, entry in enumerate(entries):
        if entry.get("name") is None:
            raise InputError(f"file entry {k} of the line table has no path (DW_LNCT_path "
                             "missing from its entry format)")
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
    n = len(data)
    # Per sequence: parallel lists of address, line (-1 ends the sequence) and file. Rows of
    # one sequence are in address order by definition (DWARF 5 §6.2.2), so sorting sequences
    # by their first address sorts the table.
    seqs: list[tuple[list[int], list[int], list[int]]] = []
    addrs: list[int] = []
    lines: list[int] = []
    files: list[int] = []
    addr, file, line = 0, 1, 1
    step_addr = [0] * 256
    step_line = [0] * 256
    for op in range(opcode_base, 256):
        adj = op - opcode_base
        step_addr[op] = (adj // line_range) * min_inst
        step_line[op] = line_base + adj % line_range
    const_add = ((255 - opcode_base) // line_range) * min_inst
    total = 0
    i = 0

    def uleb(j: int) -> tuple[int, int]:
        return uleb128(data, j, n, "the line program")

    def sleb(j: int) -> tuple[int, int]:
        return sleb128(data, j, n, "the line program")

    while i < n:
        op = data[i]
        i += 1
        if op >= opcode_base:
            addr += step_addr[op]
            line += step_line[op]
            addrs.append(addr)
            lines.append(line)
            files.append(file)
            continue
        if op == 0:
            length, i = uleb(i)
            if length == 0 or i + length > n:
                raise InputError(f"an extended opcode at byte {i} of the line program has "
                                 f"length {length}, past the program's end")
            sub = data[i]
            if sub == 1:  # DW_LNE_end_sequence
                addrs.append(addr)
                lines.append(-1)
                files.append(file)
                seqs.append((addrs, lines, files))
                total += len(addrs)
                if total > MAX_ROWS:
                    raise InputError(f"the line program has more than {MAX_ROWS} rows")
                if time.monotonic() > deadline:
                    raise InputError("reading the line program took too long")
                addrs, lines, files = [], [], []
                addr, file, line = 0, 1, 1
            elif sub == 2:  # DW_LNE_set_address
                addr = int.from_bytes(data[i + 1:i + length], "little")
            i += length
        elif op == 1:  # DW_LNS_copy
            addrs.append(addr)
            lines.append(line)
            files.append(file)
        elif op == 2:  # DW_LNS_advance_pc
            v, i = uleb(i)
            addr += v * min_inst
        elif op == 3:  # DW_LNS_advance_line
            v, i = sleb(i)
            line += v
        elif op == 4:  # DW_LNS_set_file
            file, i = uleb(i)
        elif op == 8:  # DW_LNS_const_add_pc
            addr += const_add
        elif op == 9:  # DW_LNS_fixed_advance_pc
            addr += int.from_bytes(data[i:i + 2], "little")
            i += 2
        else:  # opcodes with only ULEB operands: set_column, set_isa, vendor extensions
            for _ in range(std_lengths[op - 1] if op - 1 < len(std_lengths) else 0):
                _v, i = uleb(i)
        if len(addrs) > MAX_ROWS:
            raise InputError(f"the line program has more than {MAX_ROWS} rows")
    seqs.append((addrs, lines, files))  # rows after the last end_sequence, if any
    seqs = [sq for sq in seqs if sq[0]]
    seqs.sort(key=lambda sq: (sq[0][0], sq[0][-1]))
    all_a: list[int] = []
    all_l: list[int] = []
    all_f: list[int] = []
    for a, ln, f in seqs:
        if all_a and a[0] < all_a[-1]:
            return _sorted_table(seqs, hdr, version, comp_dir)  # overlapping sequences
        all_a.extend(a)
        all_l.extend(ln)
        all_f.extend(f)
    return _pack(all_a, all_l, all_f, _file_names(hdr, version, comp_dir))


def _pack(addrs: list[int], lines: list[int], files: list[int], names: list[str]) -> LineTable:
    return LineTable(
        addrs=array.array("Q", [a & 0xFFFFFFFFFFFFFFFF for a in addrs]).tobytes(),
        lines=array.array("i", [max(-1, min(x, 0x7FFFFFFF)) for x in lines]).tobytes(),
        files=array.array("i", [max(0, min(x, 0x7FFFFFFF)) for x in files]).tobytes(),
        names=names)


def _sorted_table(seqs: list[tuple[list[int], list[int], list[int]]], hdr: Any, version: int,
                  comp_dir: str) -> LineTable:
    """Slow path for sequences that overlap (invalid, but seen): sort every row; an end row
    sorts before a row that starts at the same address."""
    rows = [(a, ln, f, k) for k, sq in enumerate(seqs) for a, ln, f in zip(*sq, strict=True)]
    rows.sort(key=lambda r: (r[0], r[1] >= 0, r[3]))
    return _pack([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                 _file_names(hdr, version, comp_dir))
