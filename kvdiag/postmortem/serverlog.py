"""The slot lines of llama-server's 2024 ``server_log`` form (text and JSON), for postmortem.

From ggml-org/llama.cpp PR #5700 (opened 2024-02-24) to PR #9418 (opened 2024-09-10)
``examples/server/utils.hpp``'s ``server_log(level, function, line, message, extra)`` printed
each ``LOG_INFO(message, {key: value, …})`` as one line (read in forks holding that file, e.g.
the copy whose ``json log = json{{"tid", …}, {"timestamp", time(nullptr)}}`` is quoted here):

- ``--log-format json`` (the default): one nlohmann ``json`` object, keys sorted: ``tid``,
  ``timestamp``, ``level``, ``function``, ``line``, ``msg`` and the call's keys;
- ``--log-format text``: ``"%4s [%24s] %s"`` (level, function, message), then `` |`` and
  `` key=value`` for ``tid``, ``timestamp`` and the call's keys, each value JSON-dumped.

The slot lines (``server.cpp``: ``launch_slot_with_task`` ``"slot is processing task"``,
``update_slots`` ``"kv cache rm [p0, end)"`` with ``p0`` and ``"slot released"`` with
``n_past``, ``print_timings``) name the slot ``slot_id``/``task_id`` until PR #5882 (opened
2024-03-05) and ``id_slot``/``id_task`` after it. ``kvdiag perf`` reads the same lines on raw
bytes (:mod:`kvdiag.postmortem.timinglines`); this module gives ``lines.clean``'s text of one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: Substrings one of which every such slot line holds (both key spellings, text and JSON).
ANCHORS: tuple[bytes, ...] = (b"id_slot", b"slot_id")

_SLOT = re.compile(r'(?:\b|")(?:id_slot|slot_id)"?[=:](\d+)\b')
_TASK = re.compile(r'(?:\b|")(?:id_task|task_id)"?[=:](-?\d+)\b')
# "%4s [%24s] %s": a lambda's __func__ is "operator()"
_TEXT_MSG = re.compile(r"^ ?[A-Z]{3,4} \[ *[^\]]+\] (.*?) \|(?= \w+=)")
_JSON_MSG = re.compile(r'"(?:msg|message)":"((?:[^"\\]|\\.)*)"')
_INT_KEY = re.compile(r'(?:\b|")(n_past|p0|n_prompt_tokens)"?[=:](\d+)\b')


class ServerLogSlot(NamedTuple):
    slot: int
    task: int | None
    message: str
    """The call's message (``slot released``), not the keys."""
    ints: dict[str, int]
    """``n_past``, ``p0``, ``n_prompt_tokens`` where the line holds them."""


def mentions(text: str) -> bool:
    """Whether ``text`` may be such a line (cheap test before :func:`parse`)."""
    return "id_slot" in text or "slot_id" in text


def message(text: str) -> str | None:
    """The message of a ``server_log`` line in either form (late 2023's JSON named it
    ``message``, 2024's ``msg``), or ``None``."""
    m = _JSON_MSG.search(text) if text.startswith("{") else _TEXT_MSG.match(text)
    return None if m is None else m.group(1)


def is_ready(text: str) -> bool:
    """2024's ``LOG_INFO("model loaded", {})``, logged in ``main`` once the model is loaded and
    the slots initialised (its ``HTTP server listening`` came before the load, so it is not
    one)."""
    return "model loaded" in text and message(text) == "model loaded"


def parse(text: str) -> ServerLogSlot | None:
    """The slot line ``text`` is in either form, or ``None``."""
    slot = _SLOT.search(text)
    if slot is None:
        return None
    msg = message(text)
    if msg is None:
        return None
    task = _TASK.search(text)
    return ServerLogSlot(int(slot.group(1)), int(task.group(1)) if task else None, msg,
                         {k: int(v) for k, v in _INT_KEY.findall(text)})
