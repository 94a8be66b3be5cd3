"""Damaged ELF input: whatever the bytes, opening and querying ends in InputError or an answer,
never another exception and never a hang (the work is bounded)."""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdiag.errors import InputError
from kvdiag.postmortem.symbolizer import Module


def _elf_header(shoff: int, shnum: int, shstrndx: int) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0x1000, 64, shoff, 0, 64, 56, 0,
                               64, shnum, shstrndx)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 4096), st.integers(0, 40), st.integers(0, 40), st.binary(max_size=3000))
def test_random_elf_bodies(tmp_path: Path, shoff: int, shnum: int, shstrndx: int,
                           body: bytes) -> None:
    p = tmp_path / "fuzz.so"
    p.write_bytes(_elf_header(shoff, shnum, shstrndx) + body)
    try:
        mod = Module(str(p), [str(tmp_path)], use_cache=False, budget_s=5)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    try:
        mod.resolve(0x1234, True)
    except InputError as exc:
        assert "\n" not in str(exc)
    finally:
        mod.close()
