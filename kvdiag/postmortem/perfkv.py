"""The 2024 form's slot lines for ``kvdiag perf`` (``server_log``: one JSON object a line, or
text with ``key=value`` pairs after the message; :mod:`kvdiag.postmortem.timinglines` says
where from): a line's pairs, by name, and the figures and numbers read from them."""

from __future__ import annotations

import re

from kvdiag.postmortem.timinglines import number

_PAIR = re.compile(rb'"?([a-z_0-9]+)"?[=:] ?("(?:[^"\\]|\\.)*"|[^ ,}\r\n]+)')
"""One ``key=value`` (text) or ``"key":value`` (JSON) pair of the 2024 form."""


def pairs(text: bytes, at: int) -> dict[bytes, bytes]:
    """The pairs of the line ``text`` after its message's `` | `` (text; the last one before
    ``at``, where its slot is) or all of them (JSON)."""
    sep = text.rfind(b" | ", 0, at)
    return dict(_PAIR.findall(text[sep + 3:] if sep >= 0 else text))


def task(found: dict[bytes, bytes]) -> int:
    """The line's task (``id_task``, ``task_id`` before 2024-03); -1 where it has none."""
    try:
        return int(found.get(b"id_task", found.get(b"task_id", b"-1")))
    except ValueError:
        return -1


def integer(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def figures(pairs: dict[bytes, bytes], ms: bytes,
            n: bytes) -> tuple[float | None, int, float | None, float | None]:
    """(ms, tokens, ms per token, tokens per second) of a 2024 line: ``t_token`` and
    ``n_tokens_second`` are the last two (a count of 0 prints them as ``null``, nlohmann's NaN)."""
    tokens = integer(pairs[n]) or 0
    if not tokens:
        return number(pairs[ms]), 0, None, None
    return (number(pairs[ms]), tokens, number(pairs.get(b"t_token")),
            number(pairs.get(b"n_tokens_second")))
