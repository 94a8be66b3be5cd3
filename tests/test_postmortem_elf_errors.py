"""Damaged binaries are described in the file's terms (issue 11 #20): which section and unit
was being read and what in it is wrong, never the parser's internals (``AssertionError``,
``'Container' object has no attribute …``). Each case damages one field of a real library built
here with DWARF 5."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kvdiag.errors import InputError
from kvdiag.postmortem.elfindex import ElfImage
from kvdiag.postmortem.symbolizer import Module
from tests import native_ggml
from tests.postmortem_helpers import run_json

pytestmark = pytest.mark.skipif(native_ggml.GCC is None, reason="needs gcc to build a library")
INTERNALS = re.compile(r"Error\b|Container|object has no attribute|Traceback|\(\d+\)$")


def _uleb(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _format_offset(line: bytes, which: str) -> int:
    """Offset of the first (content type, form) pair of the directory (``which`` "dir") or
    file-name entry format in a 32-bit DWARF 5 line program header (DWARF 5 §6.2.4)."""
    assert int.from_bytes(line[4:6], "little") == 5
    opcode_base = line[4 + 2 + 1 + 1 + 4 + 5]
    i = 4 + 2 + 1 + 1 + 4 + 6 + (opcode_base - 1)
    if which == "dir":
        return i + 1
    nfmt = line[i]
    i += 1
    forms = []
    for _ in range(nfmt):
        _ctype, i = _uleb(line, i)
        form, i = _uleb(line, i)
        forms.append(form)
    ndirs, i = _uleb(line, i)
    for _ in range(ndirs):
        for form in forms:
            if form == 0x1F or form == 0x0E:  # DW_FORM_line_strp / DW_FORM_strp: 4 bytes
                i += 4
            elif form == 0x08:  # DW_FORM_string
                i = line.index(b"\0", i) + 1
            else:
                pytest.skip(f"directory entry form 0x{form:x} not handled by this test")
    return i + 1  # past file_name_entry_format_count


def _damaged(tmp_path: Path, section: str, at: int | str, value: int) -> tuple[Path, bytes]:
    """The library with one byte of ``section`` changed, and the backtrace the undamaged one
    printed when it ran, as if from the damaged file (only its DWARF differs)."""
    built = native_ggml.build(tmp_path / "b", extra=("-gdwarf-5", "-Wl,--build-id=none"))
    img = ElfImage(str(built.lib))
    try:
        start = img.sections[section][1]
        data = bytearray(built.lib.read_bytes())
        if isinstance(at, str):
            at = _format_offset(bytes(data[start:start + 4096]), at)
    finally:
        img.close()
    data[start + at] = value
    out = tmp_path / "libggml-base.so"
    out.write_bytes(bytes(data))
    ran = native_ggml.run(built, "abort", backtrace=True)
    return out, ran.replace(str(built.lib).encode(), str(out).encode())


@pytest.mark.parametrize(("section", "at", "value", "where", "what"), [
    # DW_LNCT_path (1) turned into DW_LNCT_timestamp (3): entries lose their path
    (".debug_line", "dir", 3, ".debug_line, the line table of the unit at 0x0",
     "a line-table file entry has no path (DW_LNCT_path missing)"),
    (".debug_line", "file", 3, ".debug_line, the line table of the unit at 0x0",
     "file entry 0 of the line table has no path (DW_LNCT_path missing"),
    # the address_size byte of the first .debug_aranges set (after length, version, offset)
    (".debug_aranges", 10, 0, ".debug_aranges (the address table of the units)",
     "the set at offset 0x0 has address size 0, 4 or 8 expected"),
    # the first DIE's abbreviation code (after the 12-byte DWARF 5 unit header)
    (".debug_info", 12, 0x7E, "the unit at 0x0",
     "abbreviation code 126"),
])
def test_damaged_debug_info_is_named_by_section_offset_and_expectation(
        tmp_path: Path, capsys: Any, section: str, at: int | str, value: int, where: str,
        what: str) -> None:
    lib, ran = _damaged(tmp_path, section, at, value)
    with pytest.raises(InputError) as info:
        mod = Module(str(lib), [], use_cache=False, budget_s=10)
        try:
            for off in range(0x1100, 0x1400, 0x10):
                mod.resolve(off, True)
        finally:
            mod.close()
    msg = str(info.value)
    assert msg.startswith(f"{lib}: damaged ")
    assert where in msg and what in msg, msg
    assert "\n" not in msg and not INTERNALS.search(msg), msg
    # through the command: one line, exit 2 (a --binary that cannot be read is bad input)
    log = tmp_path / "crash.log"
    log.write_bytes(ran)
    with pytest.raises(InputError) as info2:
        run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
    assert info2.value.exit_code == 2 and not INTERNALS.search(str(info2.value))


def _claiming(tmp_path: Path, section: str, size: int,
              build_id: str = "none") -> tuple[Path, bytes]:
    """The library with ``section``'s sh_size set to ``size`` and the file extended (sparse)
    so that the claim fits inside it, and the backtrace the undamaged library printed."""
    import os
    import struct

    built = native_ggml.build(tmp_path / "b", extra=("-gdwarf-5", f"-Wl,--build-id={build_id}"))
    data = bytearray(built.lib.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    names = struct.unpack_from("<Q", data, shoff + shstrndx * 64 + 24)[0]
    for i in range(shnum):
        at = shoff + i * 64
        name_off = names + struct.unpack_from("<I", data, at)[0]
        if data[name_off:data.index(b"\0", name_off)].decode() == section:
            struct.pack_into("<Q", data, at + 32, size)
    out = tmp_path / "libggml-base.so"
    out.write_bytes(bytes(data))
    os.truncate(out, len(data) + size)  # a hole: costs no disk
    ran = native_ggml.run(built, "abort", backtrace=True)
    return out, ran.replace(str(built.lib).encode(), str(out).encode())


@pytest.mark.parametrize(("section", "limit", "words"), [
    (".symtab", "kvdiag.postmortem.elfindex.MAX_SYMBOLS", "more than 1000 symbols"),
    (".strtab", "kvdiag.postmortem.elfindex.MAX_STRTAB", "a symbol string table of"),
    (".debug_info", "kvdiag.postmortem.dwarfindex.MAX_DWARF_BYTES", "its DWARF sections claim"),
    (".debug_line", "kvdiag.postmortem.dwarfindex.MAX_DWARF_BYTES", "its DWARF sections claim"),
])
def test_sizes_a_header_claims_are_refused_before_they_are_read(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, section: str,
        limit: str, words: str) -> None:
    """GIVEN a binary whose header claims a section far larger than its contents (the file made
    that long with a hole), WHEN it is given as --binary, THEN one line, exit 2, and the claimed
    bytes are never read (a 5 GiB .debug_info was read into 10 GiB of memory, then used; a
    5 GiB .symtab read whole, then refused). The limits are lowered so that the test reads
    megabytes, not gigabytes, were it to fail."""
    import tracemalloc

    monkeypatch.setattr(limit, 1000 if "SYMBOLS" in limit else 1 << 20)
    claimed = 64 << 20
    lib, ran = _claiming(tmp_path, section, claimed)
    log = tmp_path / "crash.log"
    log.write_bytes(ran)
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as info:
            run_json([str(log), "--no-cache", "--binary", str(lib)], capsys)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.exit_code == 2 and words in str(info.value), info.value
    assert "\n" not in str(info.value) and not INTERNALS.search(str(info.value))
    assert peak < claimed // 4  # the claimed bytes were not read


def test_a_note_section_claiming_gigabytes_is_read_only_as_far_as_a_note_goes(
        tmp_path: Path, capsys: Any) -> None:
    """GIVEN a library whose note section claims 64 MiB (the file made that long with a hole),
    WHEN it symbolizes a log, THEN it is used as before and the claim is not read (every note
    section was read whole looking for the build-id: 3 GiB of memory for a 3 GiB claim)."""
    import tracemalloc

    claimed = 64 << 20
    lib, ran = _claiming(tmp_path, ".note.gnu.build-id", claimed, build_id="sha1")
    log = tmp_path / "crash.log"
    log.write_bytes(ran)
    tracemalloc.start()
    try:
        code, data = run_json([str(log), "--no-cache", "--no-auto-binaries", "--binary",
                               str(lib)], capsys)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 1 and [b["path"] for b in data["binaries"]] == [str(lib)]
    assert peak < claimed // 4
