"""Caps on text taken from an input before the viewer shows it (no textual import).

A field of a trace or a line of a log may be megabytes long (a damaged or hostile file, a
runaway log line). Laying such a string out in a widget takes seconds to minutes per frame and
makes a screen thousands of lines tall, so every string from an input is cut to
:data:`MAX_FIELD` characters, and the cut says how long the whole was.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import msgspec

from kvdiag.files.text import decode_line

MAX_FIELD = 1000
"""Characters of one field shown (a full backtrace frame or a log line fits easily)."""

T = TypeVar("T")


def clip(text: str, limit: int = MAX_FIELD) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text):,} characters, first {limit:,} shown]"


def clip_bytes(line: bytes, limit: int = MAX_FIELD) -> str:
    """A raw line as text (NULs dropped, invalid UTF-8 replaced: kvdiag.files.text), cut
    before decoding (decoding megabytes to show a screenful would be the slow part)."""
    if len(line) <= limit * 4:
        return clip(decode_line(line), limit)
    head = decode_line(line[: limit * 4])[:limit]
    return f"{head}… [{len(line):,} bytes, first {len(head):,} characters shown]"


def clip_deep(value: T, limit: int = MAX_FIELD) -> T:
    """``value`` with every string in it clipped: msgspec Structs, dataclasses, tuples, lists
    and dict values are rebuilt only where something changed (the common case returns the same
    object)."""
    return _clip(value, limit)  # type: ignore[no-any-return]


def _clip(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, msgspec.Struct):
        changes = {}
        for name in value.__struct_fields__:
            old = getattr(value, name)
            new = _clip(old, limit)
            if new is not old:
                changes[name] = new
        return msgspec.structs.replace(value, **changes) if changes else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            old = getattr(value, f.name)
            new = _clip(old, limit)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple | list):
        items = [_clip(v, limit) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, dict):
        out = {(clip(k, limit) if isinstance(k, str) else k): _clip(v, limit)
               for k, v in value.items()}
        same = len(out) == len(value) and all(
            k in value and out[k] is value[k] for k in out)
        return value if same else out
    return value
