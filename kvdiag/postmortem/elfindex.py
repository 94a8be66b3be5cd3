"""What the symbolizer needs from an ELF file: build-id, debug link, load base, symbols, and where
its DWARF lives.

Debug information is looked for (GDB manual, "Separate Debug Files") in the file itself, then
under ``<debug dir>/.build-id/<xx>/<rest>.debug`` by the GNU build-id note, then through
``.gnu_debuglink`` next to the file, in its ``.debug/`` subdirectory and under the debug dirs
(the CRC-32 in the link must match). Every pyelftools failure on a damaged or hostile file
becomes one ``InputError`` line.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import BinaryIO

from kvdiag.errors import InputError
from kvdiag.files.inputs import require_regular

MAX_SYMBOLS = 2_000_000
#: Bytes of a symbol string table: names of MAX_SYMBOLS symbols at ~500 bytes each.
MAX_STRTAB = 1 << 30


@contextmanager
def elf_errors(path: str, where: str = "") -> Iterator[None]:
    """Turn any parser failure on ``path`` into a one-line ``InputError`` that names the part
    being read (``where``: a section, a unit's offset) and what was wrong in the file's terms,
    not the parser's (``explain``)."""
    at = f" in {where}" if where else ""
    try:
        yield
    except InputError as exc:
        text = str(exc)
        if text.startswith(path) or text.startswith("cannot open"):
            raise
        raise InputError(f"{path}: damaged debug information{at}: {text}") from None
    except RecursionError:
        raise InputError(f"{path}: debug information nests too deeply{at}") from None
    except MemoryError:
        raise InputError(f"{path}: debug information too large to read{at}") from None
    except Exception as exc:  # pyelftools raises many kinds on bad input
        raise InputError(f"{path}: damaged ELF/DWARF data{at}: {explain(exc)}") from None


_MAPPING = re.compile(r"no decoding mapping for (\S+) \[(\w+)\]")
_EXPECTED = re.compile(r"expected (\S+), found (\S+)")
_NO_ATTR = re.compile(r"has no attribute '(\w+)'")


def explain(exc: BaseException) -> str:
    """What a parser exception says about the file, in words a user can act on (pyelftools and
    its construct layer report internal names: ``MappingError``, ``Container``, bare keys)."""
    text = str(exc)
    m = _MAPPING.search(text)
    if m is not None:
        value, field = m.group(1), m.group(2)
        if field == "children_flag":
            return f"an abbreviation's has-children flag is {value} (0 or 1 expected)"
        if field == "content_type":
            return f"a line-table file entry has the unknown content type {value}"
        return f"the field {field} holds the unknown value {value}"
    m = _EXPECTED.search(text)
    if m is not None:
        return f"a header field holds {m.group(2)} where {m.group(1)} was expected"
    if "unexpected end of stream" in text or isinstance(exc, EOFError):
        return "it ends in the middle of a record (the data is cut short)"
    if "Segmentation not implemented" in text:
        return "it uses segmented addresses (a non-zero segment selector size)"
    m = _NO_ATTR.search(text)
    if m is not None:
        name = m.group(1)
        if name == "DW_LNCT_path":
            return "a line-table file entry has no path (DW_LNCT_path missing)"
        return f"a record lacks its {name} field"
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else "?"
        if isinstance(key, int):
            return f"an entry uses abbreviation code {key}, which .debug_abbrev does not define"
        if str(key).startswith("DW_FORM"):
            return f"an abbreviation gives an attribute the form {key}, which holds no value"
        return f"it refers to {key}, which is not defined"
    if isinstance(exc, AssertionError):
        return "a length, offset or count in it is inconsistent with the data around it"
    if isinstance(exc, IndexError | ValueError | OverflowError | struct.error):
        return f"a length, offset or count in it points outside the data ({text.splitlines()[0]})" \
            if text else "a length, offset or count in it points outside the data"
    first = text.splitlines()[0][:160] if text else ""
    return first or "its contents do not follow the ELF/DWARF layout"


_SHT_SYMTAB, _SHT_NOTE, _SHT_NOBITS, _SHT_DYNSYM = 2, 7, 8, 11
_PT_LOAD, _PT_INTERP = 1, 3
_PF_X = 1
MAX_SECTIONS = 100_000
#: Bytes read of a note section (for the build-id) or of ``.gnu_debuglink``.
_NOTE_PREFIX = 1 << 16


class ElfImage:
    """One opened ELF file, read with ``struct`` from its headers (ELF gABI layouts): opening
    a large library this way costs microseconds, where building every section object (hash
    tables included) would cost tenths of a second. ``close()`` releases it."""

    def __init__(self, path: str) -> None:
        self.path = path
        require_regular(path, what="a regular binary file")
        try:
            self._fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            with elf_errors(path):
                self._size = os.fstat(self._fh.fileno()).st_size
                self._read_headers()
                self.build_id = self._build_id()
                self.debuglink = self._debuglink()
                info = self.sections.get(".debug_info") or self.sections.get(".zdebug_info")
                self.has_dwarf = info is not None and info[0] != _SHT_NOBITS
        except BaseException:
            self._fh.close()
            raise
        self._symbols: list[tuple[int, int, str]] | None = None
        self._by_name: dict[str, int] | None = None
        self._by_base: dict[str, list[tuple[int, int]]] | None = None

    def close(self) -> None:
        self._fh.close()

    def _read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self._size:
            raise InputError(f"{self.path}: truncated ELF file (needs bytes "
                             f"{offset}..{offset + size}, has {self._size})")
        self._fh.seek(offset)
        return self._fh.read(size)

    def _read_headers(self) -> None:
        ident = self._read(0, 16)
        if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise InputError(f"{self.path}: not an ELF file")
        self.elfclass = 64 if ident[4] == 2 else 32
        self.end = "<" if ident[5] == 1 else ">"
        wide = self.elfclass == 64
        hdr = self._read(16, 48 if wide else 36)
        (e_type, machine, _ver, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
         shentsize, shnum, shstrndx) = struct.unpack(
            self.end + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"), hdr)
        self.is_exec = e_type == 2
        self.machine: int = machine
        sh_fmt = self.end + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        ph_fmt = self.end + ("IIQQQQQQ" if wide else "IIIIIIII")
        if shoff and shnum == 0:  # extended numbering: the count is in section 0's sh_size
            shnum = struct.unpack(sh_fmt, self._read(shoff, struct.calcsize(sh_fmt)))[5]
        if shnum > MAX_SECTIONS or (shnum and shentsize < struct.calcsize(sh_fmt)):
            raise InputError(f"{self.path}: implausible section header table")
        raw = [struct.unpack(sh_fmt, self._read(shoff + i * shentsize, struct.calcsize(sh_fmt)))
               for i in range(shnum)] if shoff else []
        names = b""
        if 0 <= shstrndx < len(raw):
            names = self._read(raw[shstrndx][4], raw[shstrndx][5])
        #: name → (type, offset, size, link)
        self.sections: dict[str, tuple[int, int, int, int]] = {}
        self._by_index: list[tuple[int, int, int, int]] = []
        for sh in raw:
            name_off, sh_type, sh_offset, sh_size, sh_link = sh[0], sh[1], sh[4], sh[5], sh[6]
            stop = names.find(b"\0", name_off)
            name = names[name_off:stop if stop >= 0 else len(names)].decode("utf-8", "replace")
            entry = (sh_type, sh_offset, sh_size, sh_link)
            self._by_index.append(entry)
            self.sections.setdefault(name, entry)
        loads: list[int] = []
        #: PT_LOAD segments as (p_vaddr, p_offset, p_filesz)
        self.segments: list[tuple[int, int, int]] = []
        #: PT_LOAD segments with PF_X, as (p_vaddr, p_vaddr + p_memsz)
        self.code: list[tuple[int, int]] = []
        self.has_interp = False
        if phoff and phentsize >= struct.calcsize(ph_fmt) and phnum <= MAX_SECTIONS:
            for i in range(phnum):
                ph = struct.unpack(ph_fmt, self._read(phoff + i * phentsize,
                                                      struct.calcsize(ph_fmt)))
                p_type = ph[0]
                vaddr, align = (ph[3], ph[7]) if wide else (ph[2], ph[7])
                if p_type == _PT_LOAD:
                    loads.append(vaddr & ~(max(align, 1) - 1))
                    p_offset, p_filesz = (ph[2], ph[5]) if wide else (ph[1], ph[4])
                    p_memsz, p_flags = (ph[6], ph[1]) if wide else (ph[5], ph[6])
                    self.segments.append((vaddr, p_offset, p_filesz))
                    if p_flags & _PF_X:
                        self.code.append((vaddr, vaddr + p_memsz))
                elif p_type == _PT_INTERP:
                    self.has_interp = True
        self.base_vaddr = min(loads) if loads else 0

    def code_bytes(self, vaddr: int, size: int) -> bytes | None:
        """``size`` bytes of the file image at link-time address ``vaddr`` (None outside the
        loaded segments' file contents)."""
        for seg_vaddr, seg_off, seg_size in self.segments:
            if seg_vaddr <= vaddr and vaddr + size <= seg_vaddr + seg_size:
                return self._read(seg_off + vaddr - seg_vaddr, size)
        return None

    def in_code(self, vaddr: int) -> bool:
        """Whether link-time address ``vaddr`` lies in an executable (``PF_X``) segment."""
        return any(lo <= vaddr < hi for lo, hi in self.code)

    def section_data(self, name: str, limit: int | None = None) -> bytes | None:
        """A section's bytes (at most ``limit`` of them: a hostile header may claim
        gigabytes for a section whose real content is a few bytes)."""
        sec = self.sections.get(name)
        if sec is None or sec[0] == _SHT_NOBITS:
            return None
        return self._read(sec[1], sec[2] if limit is None else min(sec[2], limit))

    def _build_id(self) -> str | None:
        for _name, (sh_type, offset, size, _link) in self.sections.items():
            if sh_type != _SHT_NOTE:
                continue
            # a build-id note is 36 bytes; a note section's first 64 KiB hold it when any do
            data = self._read(offset, min(size, _NOTE_PREFIX))
            pos = 0
            while pos + 12 <= len(data):
                namesz, descsz, n_type = struct.unpack_from(self.end + "III", data, pos)
                pos += 12
                name = data[pos:pos + namesz]
                pos += (namesz + 3) & ~3
                desc = data[pos:pos + descsz]
                pos += (descsz + 3) & ~3
                if n_type == 3 and name.rstrip(b"\0") == b"GNU" and desc:  # NT_GNU_BUILD_ID
                    return desc.hex()
        return None

    def _debuglink(self) -> tuple[str, int] | None:
        data = self.section_data(".gnu_debuglink", _NOTE_PREFIX)  # a file name and a CRC
        if not data:
            return None
        end = data.find(b"\0")
        if end <= 0:
            return None
        name = data[:end].decode("utf-8", "replace")
        crc_at = (end + 4) & ~3
        crc = int.from_bytes(data[crc_at:crc_at + 4], "little") if len(data) >= crc_at + 4 else 0
        return os.path.basename(name), crc

    # -- symbols ----------------------------------------------------------------------------

    def _load_symbols(self) -> list[tuple[int, int, str]]:
        """Function symbols of ``.symtab`` (else ``.dynsym``), sorted by address."""
        if self._symbols is not None:
            return self._symbols
        out: list[tuple[int, int, str]] = []
        wide = self.elfclass == 64
        fmt = self.end + ("IBBHQQ" if wide else "IIIBBH")
        size = struct.calcsize(fmt)
        with elf_errors(self.path):
            for name, kind in ((".symtab", _SHT_SYMTAB), (".dynsym", _SHT_DYNSYM)):
                sec = self.sections.get(name)
                if sec is None or sec[0] != kind:
                    continue
                # the counts are checked before anything is read: a hostile header's table
                # of gigabytes (inside a sparse file) was read whole, then refused
                if sec[2] // size > MAX_SYMBOLS:
                    raise InputError(f"{self.path}: more than {MAX_SYMBOLS} symbols")
                if not 0 <= sec[3] < len(self._by_index):
                    continue
                link = self._by_index[sec[3]]
                if link[2] > MAX_STRTAB:
                    raise InputError(f"{self.path}: a symbol string table of {link[2]} bytes "
                                     f"(more than {MAX_STRTAB})")
                data = self._read(sec[1], sec[2])
                strtab = self._read(link[1], link[2])
                usable = len(data) - len(data) % size
                for fields in struct.iter_unpack(fmt, data[:usable]):
                    if wide:
                        st_name, info, _other, _shndx, value, sz = fields
                    else:
                        st_name, value, sz, info, _other, _shndx = fields
                    if info & 0xF not in (2, 10) or not value:  # STT_FUNC, STT_GNU_IFUNC
                        continue
                    stop = strtab.find(b"\0", st_name)
                    sym = strtab[st_name:stop if stop >= 0 else len(strtab)]
                    out.append((value, sz, sym.decode("utf-8", "replace")))
                if out:
                    break
        out.sort()
        self._symbols = out
        return out

    def symbol_address(self, name: str) -> int | None:
        """The value of function symbol ``name`` (for ``module(name+0xOFF)`` frames)."""
        if self._by_name is None:
            self._by_name = {}
            for addr, _size, sym in self._load_symbols():
                self._by_name.setdefault(sym, addr)
        return self._by_name.get(name)

    def symbols_named(self, base: str) -> list[tuple[int, int]]:
        """``(address, size)`` of the function symbols whose demangled name without parameters
        is ``base`` (built on first use)."""
        if self._by_base is None:
            from kvdiag.postmortem.backtrace import base_name
            from kvdiag.postmortem.demangle import demangle

            self._by_base = {}
            for addr, size, sym in self._load_symbols():
                self._by_base.setdefault(base_name(demangle(sym)), []).append((addr, size))
        return self._by_base.get(base, [])

    def symbol_at(self, vaddr: int) -> tuple[str, int] | None:
        """``(symbol, start)`` of the function symbol that covers ``vaddr``."""
        syms = self._load_symbols()
        i = bisect.bisect_right(syms, (vaddr, 1 << 64, "")) - 1
        while i >= 0:
            addr, size, name = syms[i]
            if addr <= vaddr < addr + max(size, 1):
                return name, addr
            if size and vaddr >= addr + size:
                return None
            i -= 1
        return None


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def find_debug_file(image: ElfImage, debug_dirs: Sequence[str]) -> str | None:
    """Path of the file that holds ``image``'s DWARF, or None when there is none."""
    if image.has_dwarf:
        return image.path
    if image.build_id and len(image.build_id) > 2:
        bid = image.build_id
        for d in debug_dirs:
            cand = os.path.join(d, ".build-id", bid[:2], bid[2:] + ".debug")
            if os.path.isfile(cand):
                return cand
    if image.debuglink is not None:
        name, crc = image.debuglink
        here = os.path.dirname(os.path.abspath(image.path))
        cands = [os.path.join(here, name), os.path.join(here, ".debug", name)]
        for d in debug_dirs:
            cands += [os.path.join(d, name), os.path.join(d, here.lstrip("/"), name)]
        for cand in cands:
            if os.path.isfile(cand) and os.path.abspath(cand) != os.path.abspath(image.path) and (
                crc == 0 or _crc32(cand) == crc
            ):
                return cand
    return None
