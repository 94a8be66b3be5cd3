"""The slot lines that carry a request's depth and timing, recognised on raw bytes.

``kvdiag perf`` reads every request of logs that can hold millions, so these lines are not
decoded and cleaned one by one (``lines.clean`` costs microseconds a line): one compiled
pattern runs over whole blocks and matches inside the line, after whatever prefix it carries
(llama.cpp's timestamp and level, journald, docker, router ``[port]``), so no prefix needs
stripping. Lines it cannot see this way (ANSI colour inside the message) are not read; colour
in llama.cpp wraps the prefix fields only (domain brief §7.1).

Shapes (brief §7.3; the server's ``SLT_*`` macro prints ``slot <func>: id <%2d> | task <t> |
<message>``):

- ``new prompt, n_ctx_slot = <n>, n_keep = <n>, task.n_tokens = <n>`` (older ``n_prompt_tokens``)
- ``n_tokens = <n>, memory_seq_rm [<n>, end)`` (also ``cached n_tokens``, ``n_past``; older
  ``kv cache rm [<n>, end)``): the tokens the cache kept
- ``print_timing``, newer (one line each): ``prompt eval time = <ms> ms / <n> tokens (<ms> ms per
  token, <tps> tokens per second)``, ``       eval time = …``, ``      total time = <ms> ms /
  <n> tokens``, ``   graphs reused = <n>``
- ``print_timing``, older (one log call, so the figures follow the header on lines of their own
  without the slot prefix): ``slot print_timing: id 0 | task 5 | `` then the three lines
- ``stop processing: n_tokens = <n>, truncated = <0|1>`` (older ``n_past``)

The 2024 key=value form (``… | id_slot=0 id_task=5 t_prompt_processing=…``) is not read.
"""

from __future__ import annotations

import re
from typing import Final

_NUM = rb"(-?[\d.]+|-?nan(?:\(ind\))?|-?inf)"
_FIGURES = (rb"time = +([\d.]+) ms / +(\d+) (?:tokens|runs) *\( *" + _NUM
            + rb" ms per token, +" + _NUM + rb" tokens per second\)")

def _next(body: bytes) -> bytes:
    """The line right after, of the same slot and task (backreferences to groups 1 and 2):
    read in the same match, so that no line in between is skipped."""
    return rb"\r?\n[^\n]*?id +\1 \| task +\2 \| *" + body


_STOP = rb"stop processing: n_(?:tokens|past) = (\d+)(?:, truncated = (\d))?"

SLOT_LINES: Final = re.compile(
    rb"id +(\d+) \| task +(-?\d+) \| *(?:"
    rb"new prompt, n_ctx_slot = (\d+)[^\n]*?(?:task\.n_tokens|n_prompt_tokens) = (\d+)"
    + rb"(?:" + _next(rb"(?:(?:cached )?n_(?:tokens|past) = \d+, memory_seq_rm|kv cache rm) "
                      rb"\[(\d+),") + rb")?"
    rb"|(?:cached )?n_(?:tokens|past) = \d+, memory_seq_rm \[(\d+),|kv cache rm \[(\d+),"
    rb"|(prompt eval|eval) " + _FIGURES + rb"[^\n]*"
    + rb"(?:" + _next(rb"total time[^\n]*") + rb")?"
    + rb"(?:" + _next(rb"graphs reused = +(\d+)") + rb")?"
    + rb"(?:" + _next(_STOP) + rb")?"
    rb"|graphs reused = +(\d+)"
    rb"|" + _STOP
    + rb"|\r?\n[^\n]*?prompt eval " + _FIGURES + rb"[^\n]*\n[^\n]*?eval " + _FIGURES
    + rb"[^\n]*\n[^\n]*?total time = +[\d.]+ ms[^\n]*"
    + rb"(?:" + _next(_STOP) + rb")?"
    rb")"
)
"""One match per slot line of interest — and the line right after it when that is the same
request's next line (the cache line after ``new prompt``; ``total time``, ``graphs reused`` and
the release after ``eval time``; the release after the older block): a server with one slot
prints them so, and each match costs Python time. Groups: 1 slot, 2 task; new prompt: 3
n_ctx_slot, 4 tokens, 5 kept (next line); kept: 6 (newer) or 7 (older); one timing line: 8
``prompt eval``/``eval``, 9 ms, 10 tokens, 11 ms per token, 12 tokens per second, 13 graphs
reused, 14 released at, 15 truncated (next lines); 16 graphs reused; release: 17 tokens, 18
truncated; the older block: 19–22 prompt (ms, tokens, ms/token, tok/s), 23–26 decode, 27–28
release (next line)."""

NEW_PROMPT, CACHED, TIMING, GRAPHS, STOP, BLOCK = 3, 6, 8, 16, 17, 19
"""The first group of each alternative, 1-based as ``re`` numbers them."""

OLD_HEADER: Final = re.compile(rb"\| \r?\n")
"""The end of the older block's header line: an empty message."""

RARE_ANCHORS: tuple[bytes, ...] = (
    b"llama_",  # boot: llama_context / llama_kv_cache lines, llama_server ready (§5.1, §7.2)
    # kv_stream_adapt partition, trace, feedback and layout lines (§5.3), "KV streaming"
    # boot lines, and a fallback warning in kv-stream's words ("kv-stream", "KV stream", §3)
    b"tream",
    b"fits",  # the instrumented fits=false line (§4.5), a fallback warning naming fits() (§3)
)
"""Substrings of the other lines ``kvdiag perf`` reads (decoded and parsed with the post-mortem
grammar, :mod:`kvdiag.postmortem.grammar`): few per log, so found with a plain search. Each
search costs a pass over the log, so they are as few as cover the grammar's lines."""


def number(raw: bytes | None) -> float | None:
    """A printed figure; None for ``nan``/``inf`` (a count of 0 tokens prints them)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None
