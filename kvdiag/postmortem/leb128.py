"""LEB128 numbers (DWARF 5, §7.6): the variable-length integers of DIEs and line programs.

Both readers stop at ``end`` and after 70 bits, so a hostile file ends in an error, not a hang.
"""

from __future__ import annotations

from kvdiag.errors import InputError


def uleb128(data: bytes | memoryview, j: int, end: int, what: str) -> tuple[int, int]:
    """Unsigned LEB128 at ``j``: (value, offset after it)."""
    result = shift = 0
    while j < end:
        b = data[j]
        j += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, j
        if shift > 70:
            break
    raise InputError(f"{what}: the variable-length number at byte {j} is cut off or longer "
                     "than 70 bits")


def sleb128(data: bytes | memoryview, j: int, end: int, what: str) -> tuple[int, int]:
    """Signed LEB128 at ``j``: (value, offset after it)."""
    result = shift = 0
    b = 0x80
    while j < end and b & 0x80:
        b = data[j]
        j += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise InputError(f"{what}: the variable-length number at byte {j} is longer "
                             "than 70 bits")
    if b & 0x40:
        result -= 1 << shift
    return result, j
