"""Symbolizing addresses in given binaries: module offset or address → frames with source.

Backtrace addresses of caller frames are return addresses: the call instruction ends just
before them, so the lookup uses ``address − 1`` (as gdb does for every frame but the innermost
and signal-interrupted ones); otherwise a call that is the last instruction of a ``noreturn``
path would be attributed to the next function. Names follow binutils ``addr2line -f -i -C``:
a function without a linkage name takes the ELF symbol that starts at its first address (which
is how clones get their ``[clone .constprop.0]``), except that an *inlined* function keeps its
DWARF name (binutils 2.40 prints the enclosing symbol there, which names the wrong function).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from kvdiag.postmortem.cache import DiskCache
from kvdiag.postmortem.demangle import demangle
from kvdiag.postmortem.dwarfindex import DwarfIndex, Location
from kvdiag.postmortem.elfindex import ElfImage, find_debug_file

DEFAULT_BUDGET_S = 120.0


class Module:
    """One ``--binary``: its ELF image and, when it has any, its DWARF."""

    def __init__(self, path: str, debug_dirs: Sequence[str], use_cache: bool,
                 budget_s: float, cache_root: str | None = None) -> None:
        self.path = path
        self.image = ElfImage(path)
        self.dwarf: DwarfIndex | None = None
        try:
            self.debug_path = find_debug_file(self.image, debug_dirs)
            if self.debug_path is not None:
                cache = DiskCache(self._key(), cache_root) if use_cache else None
                self.dwarf = DwarfIndex(self.debug_path, cache, budget_s)
        except BaseException:
            self.image.close()
            raise

    def _key(self) -> str:
        if self.image.build_id:
            return self.image.build_id
        st = os.stat(self.debug_path or self.path)
        raw = f"{os.path.abspath(self.debug_path or self.path)}:{st.st_size}:{st.st_mtime_ns}"
        return "nobuildid-" + hashlib.sha1(raw.encode()).hexdigest()[:20]

    def close(self) -> None:
        if self.dwarf is not None:
            self.dwarf.close()
        self.image.close()

    def resolve(self, vaddr: int, is_return: bool) -> list[Location]:
        """Frames for ``vaddr`` (a link-time address), innermost first."""
        pc = vaddr - 1 if is_return and vaddr > 0 else vaddr
        frames: list[Location] = []
        low: int | None = None
        linkage = True
        if self.dwarf is not None:
            frames, low, linkage = self.dwarf.lookup(pc)
        if not frames or frames[0][0] is None:
            sym = self.image.symbol_at(pc)
            if sym is None:
                return frames
            file, line = (frames[0][1], frames[0][2]) if frames else (None, None)
            return [(demangle(sym[0]), file, line)]
        if len(frames) == 1 and not linkage:
            sym = self.image.symbol_at(pc)
            if sym is not None and sym[1] == low:
                frames[0] = (demangle(sym[0]), frames[0][1], frames[0][2])
        return frames


def module_key(name: str) -> str:
    """``/x/libggml-base.so.0.9.7`` and ``libggml-base.so`` both → ``libggml-base``; a
    separate debug file ``llama-server.debug`` (``objcopy --only-keep-debug``, named as gdb's
    ``.gnu_debuglink`` convention names it) → ``llama-server``, the module it describes."""
    base = os.path.basename(name.replace("\\", "/"))
    base = base.removesuffix(".debug") or base
    for ext in (".so", ".dylib", ".dll", ".exe"):
        at = base.find(ext)
        if at > 0:
            return base[:at]
    return base
