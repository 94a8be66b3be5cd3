"""A fast pass over one unit's DIEs that lists its concrete functions and their addresses.

pyelftools builds a full object per DIE, which makes listing the functions of a large unit
take a fraction of a second. This pass reads the unit's bytes with the abbreviation table
pyelftools parsed, skips every attribute by its form (DWARF 5 §7.5.5–§7.5.6), jumps over
subtrees through ``DW_AT_sibling`` and only decodes ``DW_AT_low_pc``/``DW_AT_high_pc`` of
``DW_TAG_subprogram`` DIEs at the top level and inside namespaces. Anything it does not handle
(a form it does not know, ranges or address-table forms it cannot resolve alone) is handed back
to the caller as a DIE offset, or the whole pass is abandoned with ``Unsupported`` so the
caller can use pyelftools instead.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from kvdiag.errors import InputError
from kvdiag.postmortem.leb128 import uleb128

_FIXED = {
    "DW_FORM_data1": 1, "DW_FORM_ref1": 1, "DW_FORM_flag": 1, "DW_FORM_strx1": 1,
    "DW_FORM_addrx1": 1, "DW_FORM_data2": 2, "DW_FORM_ref2": 2, "DW_FORM_strx2": 2,
    "DW_FORM_addrx2": 2, "DW_FORM_strx3": 3, "DW_FORM_addrx3": 3, "DW_FORM_data4": 4,
    "DW_FORM_ref4": 4, "DW_FORM_strx4": 4, "DW_FORM_addrx4": 4, "DW_FORM_ref_sup4": 4,
    "DW_FORM_data8": 8, "DW_FORM_ref8": 8, "DW_FORM_ref_sig8": 8, "DW_FORM_ref_sup8": 8,
    "DW_FORM_data16": 16, "DW_FORM_flag_present": 0, "DW_FORM_implicit_const": 0,
}
_ULEB = frozenset({"DW_FORM_udata", "DW_FORM_ref_udata", "DW_FORM_strx", "DW_FORM_addrx",
                   "DW_FORM_loclistx", "DW_FORM_rnglistx", "DW_FORM_GNU_addr_index",
                   "DW_FORM_GNU_str_index"})
_OFFSET = frozenset({"DW_FORM_strp", "DW_FORM_line_strp", "DW_FORM_sec_offset",
                     "DW_FORM_strp_sup", "DW_FORM_GNU_ref_alt", "DW_FORM_GNU_strp_alt"})
_CONTAINERS = frozenset({"DW_TAG_namespace", "DW_TAG_module"})
_REF_FORMS = frozenset({"DW_FORM_ref1", "DW_FORM_ref2", "DW_FORM_ref4", "DW_FORM_ref8",
                        "DW_FORM_ref_udata"})
_CONST_FORMS = frozenset({"DW_FORM_data1", "DW_FORM_data2", "DW_FORM_data4", "DW_FORM_data8",
                          "DW_FORM_udata", "DW_FORM_sdata", "DW_FORM_implicit_const"})

# kinds in a plan entry
_K_FIXED, _K_ULEB, _K_SLEB, _K_STRING, _K_BLOCK1, _K_BLOCK2, _K_BLOCK4, _K_BLOCKU = range(8)


class Unsupported(Exception):
    """The fast pass cannot read this unit; use the slow path."""


class _Plan:
    __slots__ = ("attrs", "children", "tag")

    def __init__(self, tag: str, children: bool,
                 attrs: list[tuple[str, str, int, int, int]]) -> None:
        self.tag = tag
        self.children = children
        #: (attribute name, form, kind, fixed size, implicit value)
        self.attrs = attrs


def _plan(decl: Any, version: int, addr_size: int, off_size: int) -> _Plan:
    attrs: list[tuple[str, str, int, int, int]] = []
    for spec in decl["attr_spec"]:
        name, form = spec.name, spec.form
        if form in _FIXED:
            implicit = spec.value if form == "DW_FORM_implicit_const" else 0
            attrs.append((name, form, _K_FIXED, _FIXED[form], implicit))
        elif form == "DW_FORM_addr":
            attrs.append((name, form, _K_FIXED, addr_size, 0))
        elif form == "DW_FORM_ref_addr":
            attrs.append((name, form, _K_FIXED, addr_size if version == 2 else off_size, 0))
        elif form in _OFFSET:
            attrs.append((name, form, _K_FIXED, off_size, 0))
        elif form in _ULEB:
            attrs.append((name, form, _K_ULEB, 0, 0))
        elif form == "DW_FORM_sdata":
            attrs.append((name, form, _K_SLEB, 0, 0))
        elif form == "DW_FORM_string":
            attrs.append((name, form, _K_STRING, 0, 0))
        elif form == "DW_FORM_block1":
            attrs.append((name, form, _K_BLOCK1, 0, 0))
        elif form == "DW_FORM_block2":
            attrs.append((name, form, _K_BLOCK2, 0, 0))
        elif form == "DW_FORM_block4":
            attrs.append((name, form, _K_BLOCK4, 0, 0))
        elif form in ("DW_FORM_block", "DW_FORM_exprloc"):
            attrs.append((name, form, _K_BLOCKU, 0, 0))
        else:  # DW_FORM_indirect and vendor forms
            raise Unsupported(form)
    return _Plan(decl["tag"], decl.has_children(), attrs)


def scan_functions(cu: Any, data: bytes, deadline: float,
                   max_dies: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """``([(low, high, die_offset)], [die offsets to read the slow way])`` for ``cu``, whose
    bytes (from its unit header on) are ``data``."""
    version = cu["version"]
    addr_size = cu["address_size"]
    off_size = 8 if cu.dwarf_format() == 64 else 4
    abbrevs = cu.get_abbrev_table()
    plans: dict[int, _Plan] = {}
    base = cu.cu_offset
    pos = cu.cu_die_offset - base
    end = len(data)
    order: Literal["little", "big"] = "little" if cu.structs.little_endian else "big"
    found: list[tuple[int, int, int]] = []
    slow: list[int] = []
    stack: list[bool] = []  # per open level: are its children interesting?
    dies = 0

    def uleb(j: int) -> tuple[int, int]:
        return uleb128(data, j, end, f"the unit at offset 0x{base:x}")

    while pos < end:
        die_at = pos
        code = data[pos]
        if code < 0x80:
            pos += 1
        else:
            code, pos = uleb(pos)
        if code == 0:
            if not stack:
                break
            stack.pop()
            if not stack:
                break
            continue
        dies += 1
        if not dies & 0x3FF and (time.monotonic() > deadline or dies > max_dies):
            raise InputError("more entries than a unit can plausibly hold, or reading took too "
                             "long")
        plan = plans.get(code)
        if plan is None:
            try:
                plan = _plan(abbrevs.get_abbrev(code), version, addr_size, off_size)
            except KeyError:
                raise InputError(f"the entry at offset 0x{base + die_at:x} uses abbreviation code "
                                 f"{code}, which .debug_abbrev does not define") from None
            plans[code] = plan
        want = (not stack) or stack[-1]
        is_sub = want and plan.tag == "DW_TAG_subprogram"
        sibling = low = high = -1
        high_is_const = False
        needs_slow = False
        for name, form, kind, size, implicit in plan.attrs:
            if kind == _K_FIXED:
                if name == "DW_AT_sibling" and form in _REF_FORMS:
                    sibling = int.from_bytes(data[pos:pos + size], order)
                elif is_sub and name == "DW_AT_low_pc":
                    if form == "DW_FORM_addr":
                        low = int.from_bytes(data[pos:pos + size], order)
                    else:
                        needs_slow = True
                elif is_sub and name == "DW_AT_high_pc":
                    if form == "DW_FORM_addr":
                        high = int.from_bytes(data[pos:pos + size], order)
                    elif form in _CONST_FORMS:
                        high = implicit if form == "DW_FORM_implicit_const" else (
                            int.from_bytes(data[pos:pos + size], order))
                        high_is_const = True
                    else:
                        needs_slow = True
                elif is_sub and name == "DW_AT_ranges":
                    needs_slow = True
                pos += size
            elif kind == _K_ULEB:
                v, pos = uleb(pos)
                if name == "DW_AT_sibling":
                    sibling = v
                elif is_sub and name in ("DW_AT_low_pc", "DW_AT_high_pc", "DW_AT_ranges"):
                    if name == "DW_AT_high_pc" and form == "DW_FORM_udata":
                        high, high_is_const = v, True
                    else:
                        needs_slow = True
            elif kind == _K_SLEB:
                start = pos
                while pos < end and data[pos] & 0x80:
                    pos += 1
                pos += 1
                if is_sub and name == "DW_AT_high_pc":
                    high = int.from_bytes(data[start:pos], "little", signed=False)
                    needs_slow = True
            elif kind == _K_STRING:
                nul = data.find(b"\0", pos)
                if nul < 0:
                    raise InputError(f"a string in the entry at offset 0x{base + die_at:x} has no "
                                     "terminating NUL")
                pos = nul + 1
            else:
                if kind == _K_BLOCK1:
                    n, pos = data[pos], pos + 1
                elif kind == _K_BLOCK2:
                    n, pos = int.from_bytes(data[pos:pos + 2], order), pos + 2
                elif kind == _K_BLOCK4:
                    n, pos = int.from_bytes(data[pos:pos + 4], order), pos + 4
                else:
                    n, pos = uleb(pos)
                pos += n
            if pos > end:
                raise InputError(f"the entry at offset 0x{base + die_at:x} runs past the end of "
                                 "its unit")
        if is_sub:
            if needs_slow:
                slow.append(base + die_at)
            elif low >= 0 and high >= 0:
                hi = low + high if high_is_const else high
                if hi > low:
                    found.append((low, hi, base + die_at))
        if plan.children:
            if not stack:
                stack.append(True)  # the unit DIE: its children are the top level
            elif want and plan.tag in _CONTAINERS:
                stack.append(True)
            elif sibling > 0:
                if sibling <= pos:
                    raise InputError(f"the entry at offset 0x{base + die_at:x} has a DW_AT_sibling "
                                     "that points backwards")
                pos = sibling
            else:
                stack.append(False)
    return found, slow
