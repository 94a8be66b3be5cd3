"""Fields of a decoded line that this version's Structs do not hold.

A newer minor version of the format may add optional fields to known kinds
(docs/trace-format.md, "Versioning"). msgspec's typed decode ignores keys a Struct does not
declare (and trailing elements of ``array_like`` Structs), so the reader also decodes such
lines as plain JSON and this module lists what the typed value lost, by path:
``"gpu_uuid"`` for a top-level key, ``"q.offset"`` inside a nested Struct,
``"ranges[0][6]"`` for a seventh element of an array-like range.
"""

from __future__ import annotations

from typing import Any

import msgspec


def extra_fields(typed: object, raw: object) -> dict[str, Any]:
    """Return ``{path: value}`` for every part of ``raw`` that ``typed`` has no field for."""
    out: dict[str, Any] = {}
    _walk(typed, raw, "", out)
    return out


def _walk(typed: object, raw: object, path: str, out: dict[str, Any]) -> None:
    if isinstance(typed, msgspec.Struct):
        cls = type(typed)
        config = cls.__struct_config__
        names = cls.__struct_encode_fields__
        if config.array_like:
            if isinstance(raw, list):
                for i, value in enumerate(raw):
                    if i < len(names):
                        _walk(getattr(typed, cls.__struct_fields__[i]), value, f"{path}[{i}]", out)
                    else:
                        out[f"{path}[{i}]"] = value
            return
        if not isinstance(raw, dict):
            return
        by_name = dict(zip(names, cls.__struct_fields__, strict=True))
        tag_field = config.tag_field
        for key, value in raw.items():
            if key == tag_field:
                continue
            sub = f"{path}.{key}" if path else key
            attr = by_name.get(key)
            if attr is None:
                out[sub] = value
            else:
                _walk(getattr(typed, attr), value, sub, out)
    elif isinstance(typed, tuple) and isinstance(raw, list):
        for i, (item, value) in enumerate(zip(typed, raw, strict=False)):
            _walk(item, value, f"{path}[{i}]", out)
    # Scalars and free-form dicts (Header.scenario, Unknown.fields) hold everything already.
