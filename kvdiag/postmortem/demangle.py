"""C++ (Itanium ABI) demangling through the C++ runtime's ``__cxa_demangle`` (via ``cxxfilt``).

That is the demangler binutils' ``addr2line -C`` and gdb agree with, so symbolized frames read
the same as theirs. When the runtime library is missing, names stay mangled.
"""

from __future__ import annotations

import functools
import re

_MAX_NAME = 4096
# GCC/LLVM local-symbol suffixes that are not part of the mangled grammar.
_SUFFIX = re.compile(r"^(_Z[^.]*)((?:\.(?:cold|part|isra|constprop|lto_priv|llvm|localalias)"
                     r"(?:\.\d+)?)+)$")


@functools.cache
def _demangler() -> object | None:
    try:
        import cxxfilt  # type: ignore[import-untyped]
    except Exception:  # library not found, ctypes unavailable: keep names mangled
        return None
    mod: object = cxxfilt
    return mod


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """The readable form of ``name``; non-mangled names are returned unchanged."""
    if not name.startswith("_Z") or len(name) > _MAX_NAME:
        return name
    mod = _demangler()
    if mod is None:
        return name
    suffix = ""
    m = _SUFFIX.match(name)
    base = name
    if m is not None:
        base, suffix = m.group(1), m.group(2)
    try:
        out: str = mod.demangle(base)  # type: ignore[attr-defined]
    except Exception:
        return name
    if suffix:
        clones = " ".join(f"[clone {part}]" for part in _split_suffix(suffix))
        out = f"{out} {clones}"
    return out


def _split_suffix(suffix: str) -> list[str]:
    parts: list[str] = []
    for piece in suffix.split("."):
        if not piece:
            continue
        if piece.isdigit() and parts:
            parts[-1] = f"{parts[-1]}.{piece}"
        else:
            parts.append(f".{piece}")
    return parts
