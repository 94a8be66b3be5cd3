"""Address → function, file:line and inline chain, from DWARF, touching only what a query needs.

For an address the unit is found through ``.debug_aranges`` (DWARF 5 §6.1.2) or, without it,
the unit DIEs' ``DW_AT_low_pc``/``DW_AT_high_pc``/``DW_AT_ranges``. Inside a unit only the
top-level DIEs (and namespaces) are read — children are skipped through ``DW_AT_sibling`` —
to list the concrete functions; only the function that holds the address is descended, through
``DW_TAG_inlined_subroutine``/``DW_TAG_lexical_block`` (§3.3.8.2), recording the inline tree.
Names follow ``DW_AT_abstract_origin`` and ``DW_AT_specification``, preferring
``DW_AT_linkage_name`` (demangled). Work is bounded by a wall-clock budget and node limits.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Literal

from kvdiag.errors import InputError
from kvdiag.postmortem.cache import CuIndex, DiskCache, Node, UnitRanges
from kvdiag.postmortem.demangle import demangle
from kvdiag.postmortem.diescan import Unsupported, scan_functions
from kvdiag.postmortem.elfindex import elf_errors
from kvdiag.postmortem.lineprog import LineTable, decode

MAX_TREE_NODES = 200_000
MAX_TOP_DIES = 5_000_000
#: Bytes of DWARF sections read for one file (pyelftools holds them twice in memory); a
#: llama.cpp build's debug information is a few hundred MiB.
MAX_DWARF_BYTES = 2 << 30
_FRAME_TAGS = ("DW_TAG_inlined_subroutine", "DW_TAG_lexical_block", "DW_TAG_try_block",
               "DW_TAG_catch_block")
_CONTAINERS = ("DW_TAG_namespace", "DW_TAG_module")

#: One resolved location: (function name or None, file or None, line or None).
Location = tuple[str | None, str | None, int | None]


class DwarfIndex:
    """Lookups in one debug file (which may be separate from the code file)."""

    def __init__(self, path: str, cache: DiskCache | None, budget_s: float) -> None:
        from elftools.elf.elffile import ELFFile

        self.path = path
        self._deadline = time.monotonic() + budget_s
        self._budget = budget_s
        try:
            self._fh = open(path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            with elf_errors(path, "the ELF headers"):
                self._elf: Any = ELFFile(self._fh)
        except BaseException:
            self._fh.close()
            raise
        self._dwarf: Any = None
        self._cache = cache
        self._units: list[tuple[int, int, int]] | None = None
        self._cus: dict[int, CuIndex] = {}
        self._dirty: set[int] = set()

    def close(self) -> None:
        self.flush()
        self._fh.close()

    def _check(self) -> None:
        if time.monotonic() > self._deadline:
            raise InputError(f"{self.path}: gave up reading debug information after "
                             f"{self._budget:g} s (damaged or unusually large file)")

    @property
    def dwarf(self) -> Any:
        if self._dwarf is None:
            with elf_errors(self.path, "the DWARF sections"):
                if not self._elf.has_dwarf_info():
                    raise InputError(f"{self.path}: no DWARF debug information")
                self._check_sizes()
                self._dwarf = self._elf.get_dwarf_info(relocate_dwarf_sections=False)
        return self._dwarf

    def _check_sizes(self) -> None:
        """pyelftools reads every DWARF section whole (twice over: the bytes, then a stream
        of them), so the sizes the headers claim are checked first — decompressed sizes for
        SHF_COMPRESSED sections: a hostile header's 5 GiB ``.debug_info`` inside a sparse
        file was read to 10 GiB of memory before anything was said."""
        total = 0
        for sec in self._elf.iter_sections():
            if sec.name.startswith((".debug_", ".zdebug_")) and sec["sh_type"] != "SHT_NOBITS":
                total += sec.data_size
        if total > MAX_DWARF_BYTES:
            raise InputError(f"{self.path}: its DWARF sections claim {total:,} bytes, more "
                             f"than kvdiag reads ({MAX_DWARF_BYTES:,}): a damaged header, or "
                             "a build to symbolize with addr2line")

    # -- units ------------------------------------------------------------------------------

    def units(self) -> list[tuple[int, int, int]]:
        if self._units is not None:
            return self._units
        if self._cache is not None:
            got = self._cache.load_units()
            if got is not None:
                self._units = got.ranges
                return self._units
        out: list[tuple[int, int, int]] = []
        dwarf = self.dwarf
        with elf_errors(self.path, ".debug_aranges (the address table of the units)"):
            self._check_aranges()
            aranges = dwarf.get_aranges()
            if aranges is not None and aranges.entries:
                out = [(e.begin_addr, e.begin_addr + e.length, e.info_offset)
                       for e in aranges.entries if e.length]
        if not out:
            with elf_errors(self.path, ".debug_info (the unit headers)"):
                for cu in self.dwarf.iter_CUs():
                    self._check()
                    top = cu.get_top_DIE()
                    out.extend((lo, hi, cu.cu_offset) for lo, hi in self._ranges(top, cu, 0))
        out.sort()
        self._units = out
        if self._cache is not None:
            self._cache.save_units(UnitRanges(ranges=out))
        return out

    def _check_aranges(self) -> None:
        """The set headers of ``.debug_aranges`` (DWARF 5 §6.1.2), checked before pyelftools
        reads them: it asserts on an address size other than 4 or 8 and says nothing more."""
        sec = self._elf.get_section_by_name(".debug_aranges")
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return
        data = sec.data()
        little = self._elf.little_endian
        order: Literal["little", "big"] = "little" if little else "big"
        at = 0
        while at + 4 <= len(data):
            length = int.from_bytes(data[at:at + 4], order)
            head = 4
            if length == 0xFFFFFFFF:
                length = int.from_bytes(data[at + 4:at + 12], order)
                head = 12
            fields = at + head + 2 + (8 if head == 12 else 4)
            if length < 2 or at + head + length > len(data) or fields + 2 > len(data):
                raise InputError(f"the set at offset 0x{at:x} has length {length}, past the "
                                 f"section's {len(data)} bytes")
            version = int.from_bytes(data[at + head:at + head + 2], order)
            addr_size, seg_size = data[fields], data[fields + 1]
            if version != 2:
                raise InputError(f"the set at offset 0x{at:x} has version {version}, 2 expected")
            if addr_size not in (4, 8):
                raise InputError(f"the set at offset 0x{at:x} has address size {addr_size}, 4 or "
                                 "8 expected")
            if seg_size != 0:
                raise InputError(f"the set at offset 0x{at:x} has segment selector size "
                                 f"{seg_size}, 0 expected")
            at += head + length

    def _unit_for(self, pc: int) -> int | None:
        units = self.units()
        i = bisect.bisect_right(units, (pc, 1 << 64, 1 << 64)) - 1
        for j in range(i, max(-1, i - 64), -1):  # ranges of different units may interleave
            if units[j][0] <= pc < units[j][1]:
                return units[j][2]
        return None

    # -- ranges and names -------------------------------------------------------------------

    def _ranges(self, die: Any, cu: Any, base: int) -> list[tuple[int, int]]:
        attrs = die.attributes
        if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
            lo = attrs["DW_AT_low_pc"].value
            hi_attr = attrs["DW_AT_high_pc"]
            hi = hi_attr.value if hi_attr.form == "DW_FORM_addr" else lo + hi_attr.value
            return [(lo, hi)] if hi > lo else []
        if "DW_AT_ranges" in attrs:
            rl = self.dwarf.range_lists()
            if rl is None:
                return []
            out: list[tuple[int, int]] = []
            cur = base
            for entry in rl.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu):
                if hasattr(entry, "base_address"):
                    cur = entry.base_address
                    continue
                if entry.is_absolute:
                    lo, hi = entry.begin_offset, entry.end_offset
                else:
                    lo, hi = cur + entry.begin_offset, cur + entry.end_offset
                if hi > lo:
                    out.append((lo, hi))
                if len(out) > 100_000:
                    raise InputError(f"{self.path}: range list too long")
            return out
        return []

    def _name(self, die: Any) -> tuple[str | None, bool]:
        """``(name, is_linkage)`` through abstract origins and specifications."""
        name: str | None = None
        cur = die
        for _ in range(8):
            attrs = cur.attributes
            for key in ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name"):
                if key in attrs:
                    return demangle(_text(attrs[key].value)), True
            if name is None and "DW_AT_name" in attrs:
                name = _text(attrs["DW_AT_name"].value)
            ref = attrs.get("DW_AT_abstract_origin") or attrs.get("DW_AT_specification")
            if ref is None:
                break
            cur = cur.get_DIE_from_attribute(
                "DW_AT_abstract_origin" if "DW_AT_abstract_origin" in attrs
                else "DW_AT_specification")
        return name, False

    # -- units' content ---------------------------------------------------------------------

    def _cu_index(self, offset: int) -> CuIndex:
        idx = self._cus.get(offset)
        if idx is not None:
            return idx
        if self._cache is not None:
            idx = self._cache.load_cu(offset)
        if idx is None:
            idx = CuIndex()
            self._dirty.add(offset)
        self._cus[offset] = idx
        return idx

    def _cu(self, offset: int) -> Any:
        with elf_errors(self.path, f".debug_info, the unit at offset 0x{offset:x}"):
            return self.dwarf.get_CU_at(offset)

    def _line_table(self, offset: int, idx: CuIndex) -> LineTable | None:
        if idx.line is None:
            cu = self._cu(offset)
            with elf_errors(self.path, f".debug_line, the line table of the unit at 0x{offset:x}"):
                lp = self.dwarf.line_program_for_CU(cu)
                if lp is None:
                    return None
                top = cu.get_top_DIE()
                comp_dir = _text(top.attributes["DW_AT_comp_dir"].value) if (
                    "DW_AT_comp_dir" in top.attributes) else ""
                idx.line = decode(lp, lp.header["version"], cu["address_size"], comp_dir,
                                  self._deadline)
            self._dirty.add(offset)
        return idx.line

    def _functions(self, offset: int, idx: CuIndex) -> list[tuple[int, int, int]]:
        if idx.functions:
            return idx.functions
        cu = self._cu(offset)
        out: list[tuple[int, int, int]] = []
        with elf_errors(self.path, f".debug_info/.debug_abbrev, the functions of the unit at "
                                   f"0x{offset:x}"):
            try:
                stream = self.dwarf.debug_info_sec.stream
                stream.seek(cu.cu_offset)
                found, slow = scan_functions(cu, stream.read(cu.size), self._deadline,
                                             MAX_TOP_DIES)
            except Unsupported:
                pass
            else:
                top = cu.get_top_DIE()
                base = top.attributes["DW_AT_low_pc"].value if (
                    "DW_AT_low_pc" in top.attributes) else 0
                for die_off in slow:
                    die = cu.get_DIE_from_refaddr(die_off)
                    found.extend((lo, hi, die_off) for lo, hi in self._ranges(die, cu, base))
                found.sort()
                idx.functions = found
                self._dirty.add(offset)
                return found
            top = cu.get_top_DIE()
            base = top.attributes["DW_AT_low_pc"].value if (
                "DW_AT_low_pc" in top.attributes) else 0
            stack = [top]
            seen = 0
            while stack:
                parent = stack.pop()
                last = -1
                for die in parent.iter_children():
                    seen += 1
                    if die.offset <= last or seen > MAX_TOP_DIES:
                        raise InputError(f"{self.path}: malformed DIE tree near 0x{die.offset:x}")
                    last = die.offset
                    if not seen & 0x3FF:
                        self._check()
                    if die.tag == "DW_TAG_subprogram":
                        for lo, hi in self._ranges(die, cu, base):
                            out.append((lo, hi, die.offset))
                    elif die.tag in _CONTAINERS:
                        stack.append(die)
        out.sort()
        idx.functions = out
        self._dirty.add(offset)
        return out

    def _tree(self, cu_offset: int, idx: CuIndex, die_offset: int,
              names: list[str]) -> list[Node]:
        tree = idx.trees.get(die_offset)
        if tree is not None:
            return tree
        cu = self._cu(cu_offset)
        nodes: list[Node] = []
        with elf_errors(self.path, f".debug_info, the function entry at 0x{die_offset:x}"):
            top = cu.get_top_DIE()
            base = top.attributes["DW_AT_low_pc"].value if (
                "DW_AT_low_pc" in top.attributes) else 0
            die = cu.get_DIE_from_refaddr(die_offset)
            name, linkage = self._name(die)
            # depth-0 node: the call-line slot holds 1 when the name is a linkage name
            nodes.append((self._ranges(die, cu, base), 0, name or "??", None, int(linkage)))
            self._walk(die, cu, base, 1, nodes, names)
        idx.trees[die_offset] = nodes
        self._dirty.add(cu_offset)
        return nodes

    def _walk(self, die: Any, cu: Any, base: int, depth: int, nodes: list[Node],
              names: list[str]) -> None:
        if depth > 64:
            raise InputError(f"{self.path}: inline nesting deeper than 64")
        last = -1
        for child in die.iter_children():
            if child.offset <= last:
                raise InputError(f"{self.path}: malformed DIE tree near 0x{child.offset:x}")
            last = child.offset
            if child.tag not in _FRAME_TAGS:
                continue
            if child.tag != "DW_TAG_inlined_subroutine" and not child.has_children:
                continue
            if len(nodes) > MAX_TREE_NODES:
                raise InputError(f"{self.path}: function with more than {MAX_TREE_NODES} "
                                 "inline nodes")
            if not len(nodes) & 0xFF:
                self._check()
            if child.tag == "DW_TAG_inlined_subroutine":
                attrs = child.attributes
                name, _ = self._name(child)
                cf = attrs["DW_AT_call_file"].value if "DW_AT_call_file" in attrs else -1
                cl = attrs["DW_AT_call_line"].value if "DW_AT_call_line" in attrs else 0
                fname = names[cf] if 0 <= cf < len(names) else None
                nodes.append((self._ranges(child, cu, base), depth, name or "??", fname, cl))
                if child.has_children:
                    self._walk(child, cu, base, depth + 1, nodes, names)
            else:
                self._walk(child, cu, base, depth, nodes, names)

    # -- lookups ----------------------------------------------------------------------------

    def lookup(self, pc: int) -> tuple[list[Location], int | None, bool]:
        """Frames for ``pc``, innermost first, the low address of the concrete function and
        whether that function's name came from a linkage name. Empty when nothing covers
        ``pc``."""
        self._check()
        cu_off = self._unit_for(pc)
        if cu_off is None:
            return [], None, False
        idx = self._cu_index(cu_off)
        table = self._line_table(cu_off, idx)
        names = table.names if table is not None else []
        funcs = self._functions(cu_off, idx)
        i = bisect.bisect_right(funcs, (pc, 1 << 64, 1 << 64)) - 1
        func: tuple[int, int, int] | None = None
        while i >= 0 and funcs[i][0] <= pc:
            if pc < funcs[i][1]:
                func = funcs[i]
                break
            i -= 1
            if i >= 0 and pc - funcs[i][0] > 1 << 24:
                break
        loc = table.lookup(pc) if table is not None else None
        file, line = (loc if loc is not None else (None, None))
        if func is None:
            return [(None, file, line)], None, False
        tree = self._tree(cu_off, idx, func[2], names)
        chain: list[Node] = []
        for node in tree:
            if node[1] == 0 or any(lo <= pc < hi for lo, hi in node[0]):
                while chain and chain[-1][1] >= node[1]:
                    chain.pop()
                if node[1] == len(chain):
                    chain.append(node)
        out: list[Location] = []
        for k in range(len(chain) - 1, -1, -1):
            out.append((chain[k][2], file, line))
            if k:
                file, line = chain[k][3], chain[k][4]
        low = min((lo for lo, _ in tree[0][0]), default=func[0])
        return out, low, bool(tree[0][4])

    def flush(self) -> None:
        if self._cache is None:
            return
        for off in sorted(self._dirty):
            self._cache.save_cu(off, self._cus[off])
        self._dirty.clear()


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
