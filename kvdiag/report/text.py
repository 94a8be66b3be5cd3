"""Caps on how much of one input field is displayed (issue 11 #23).

A trace or log is input: one field can hold megabytes (a 10 MB string made ``trace info``
print 12 MB and take over half a minute). Everything the CLI shows from input goes through
:func:`cap`, which keeps the head and says how long the whole value is; JSON output and
exports carry values whole, since they are data, not display.
"""

from __future__ import annotations

MAX_FIELD = 2000
"""Characters of one field shown in text, Markdown, SARIF and JUnit output."""


def cap(text: str, limit: int = MAX_FIELD) -> str:
    """``text`` when it is at most ``limit`` characters, else its head and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text):,} characters, {len(text) - limit:,} not shown]"


def cap_value(value: object, limit: int = MAX_FIELD) -> str:
    """A scalar or container from input, as capped text (``repr`` for non-strings, built only
    up to what is shown: a huge list is not rendered whole to be cut afterwards)."""
    if isinstance(value, str):
        return cap(value, limit)
    if isinstance(value, list | tuple | dict) and len(value) > limit:
        return f"{type(value).__name__} of {len(value):,} items (not shown)"
    return cap(repr(value), limit)
