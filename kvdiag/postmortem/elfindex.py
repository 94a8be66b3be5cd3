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
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

from kvdiag.errors import InputError

MAX_SYMBOLS = 2_000_000


@contextmanager
def elf_errors(path: str) -> Iterator[None]:
    """Turn any parser failure on ``path`` into a one-line ``InputError``."""
    try:
        yield
    except InputError:
        raise
    except RecursionError:
        raise InputError(f"{path}: debug information nests too deeply") from None
    except MemoryError:
        raise InputError(f"{path}: debug information too large to read") from None
    except Exception as exc:  # pyelftools raises many kinds on bad input
        msg = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable ELF/DWARF file ({msg})") from None


class ElfImage:
    """One opened ELF file. ``close()`` releases it."""

    def __init__(self, path: str) -> None:
        from elftools.elf.elffile import ELFFile

        self.path = path
        try:
            self._fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            with elf_errors(path):
                self.elf: Any = ELFFile(self._fh)
                self.is_exec = self.elf["e_type"] == "ET_EXEC"
                self.base_vaddr = self._first_load_vaddr()
                self.build_id = self._build_id()
                self.debuglink = self._debuglink()
                self.has_dwarf = self.elf.get_section_by_name(".debug_info") is not None
        except BaseException:
            self._fh.close()
            raise
        self._symbols: list[tuple[int, int, str]] | None = None
        self._by_name: dict[str, int] | None = None
        self._by_base: dict[str, list[tuple[int, int]]] | None = None

    def close(self) -> None:
        self._fh.close()

    def _first_load_vaddr(self) -> int:
        loads = [s["p_vaddr"] & ~(max(s["p_align"], 1) - 1)
                 for s in self.elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        return min(loads) if loads else 0

    def _build_id(self) -> str | None:
        for sec in self.elf.iter_sections():
            if sec["sh_type"] != "SHT_NOTE":
                continue
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    desc = note["n_desc"]
                    return desc if isinstance(desc, str) else bytes(desc).hex()
        return None

    def _debuglink(self) -> tuple[str, int] | None:
        sec = self.elf.get_section_by_name(".gnu_debuglink")
        if sec is None:
            return None
        data = sec.data()
        end = data.find(b"\0")
        if end <= 0:
            return None
        name = data[:end].decode("utf-8", "replace")
        crc_at = (end + 4) & ~3
        crc = int.from_bytes(data[crc_at:crc_at + 4], "little") if len(data) >= crc_at + 4 else 0
        return os.path.basename(name), crc

    # -- symbols ----------------------------------------------------------------------------

    def _load_symbols(self) -> list[tuple[int, int, str]]:
        if self._symbols is not None:
            return self._symbols
        out: list[tuple[int, int, str]] = []
        with elf_errors(self.path):
            for name in (".symtab", ".dynsym"):
                sec = self.elf.get_section_by_name(name)
                if sec is None or not hasattr(sec, "iter_symbols"):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and sym["st_value"]:
                        out.append((sym["st_value"], sym["st_size"], sym.name))
                        if len(out) > MAX_SYMBOLS:
                            raise InputError(f"{self.path}: more than {MAX_SYMBOLS} symbols")
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
