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

The 2024 form (``server_log``, from ggml-org/llama.cpp PR #5700 of 2024-02-25, "server: logs -
unified format and --log-format option", until PR #9418 of 2024-09-15, "common : reimplement
logging", replaced it with the ``SLT_*`` lines above): ``LOG_INFO(message, {key: value, ...})``
printed as one JSON object a line (``--log-format json``, the default:
``{"function":"print_timings",...,"id_slot":0,"id_task":5,...,"msg":"prompt eval time     = …"}``)
or as text (``--log-format text``: ``INFO [           print_timings] prompt eval time     = … |
id_slot=0 id_task=5 n_prompt_tokens_processed=24 … tid="…" timestamp=…``). The keys were
``slot_id``/``task_id`` until PR #5882 of 2024-03-07 ("server : refactor") renamed them
``id_slot``/``id_task``; the JSON object's keys are sorted (nlohmann ``json``). The lines read
(``examples/server/server.cpp`` of that time, ``server_slot::print_timings`` and
``update_slots``, as held by forks of that time):

- ``prompt eval time     = …``: ``t_prompt_processing`` ms, ``n_prompt_tokens_processed``,
  ``t_token`` ms per token, ``n_tokens_second``
- ``generation eval time = … runs …``: ``t_token_generation`` ms, ``n_decoded``, ``t_token``,
  ``n_tokens_second``
- ``          total time = …``: ``t_total`` (not needed)
- ``kv cache rm [p0, end)``: ``p0``, what the cache kept
- ``slot released``: ``n_past`` (the depth at the end), ``truncated`` (``true``/``false``);
  its ``n_ctx`` is the server's whole context, not the slot's, so it is not read as one

The prompt's length (``prompt tokenized``, ``n_prompt_tokens``) was printed only with
``--verbose``, so that form gives no depth at the start: the report derives it from the end and
the decoded tokens, and says so.
"""

from __future__ import annotations

import re
from typing import Final

_NUM = rb"(-?[\d.]+|-?nan(?:\(ind\))?|-?inf)"
_FIGURES = (rb"time = +([\d.]+) ms / +(\d+) (?:tokens|runs) *\( *" + _NUM
            + rb" ms per token, +" + _NUM + rb" tokens per second\)")


def _next(body: bytes, at: bytes = b"") -> bytes:
    """The line right after, of the same slot and task (backreferences to groups 1 and 2):
    read in the same match, so that no line in between is skipped. ``at``: an empty named
    group at that line's start, to count the lines up to it."""
    return rb"\r?\n" + at + rb"[^\n]*?id +\1 \| task +\2 \| *" + body


_STOP = rb"stop processing: n_(?:tokens|past) = (\d+)(?:, truncated = (\d))?"
_CACHE = rb"(?:(?:cached )?n_(?:tokens|past) = \d+, memory_seq_rm|kv cache rm) \[(\d+),"
_OLD_BLOCK = (rb"\r?\n[^\n]*?prompt eval " + _FIGURES + rb"[^\n]*\n[^\n]*?eval " + _FIGURES
              + rb"[^\n]*\n[^\n]*?total time = +[\d.]+ ms[^\n]*")
_WHOLE = (
    # the slot's own lines between them at the server's default verbosity (§7.3)
    rb"[^\n]*(?P<whole>(?:" + _next(rb"prompt (?:processing progress|done)[^\n]*") + rb")*)"
    rb"(?:" + _next(rb"", rb"(?P<whole_block>)") + _OLD_BLOCK
    + rb"|(?:" + _next(rb"prompt eval " + _FIGURES) + rb"[^\n]*)?"
    + _next(rb"eval " + _FIGURES, rb"(?P<whole_eval>)") + rb"[^\n]*"
    + rb"(?:" + _next(rb"total time[^\n]*") + rb")?"
    + rb"(?:" + _next(rb"graphs reused = +(\d+)") + rb")?"
    + rb")" + _next(_STOP)
)


def _slot_lines(whole: bool) -> re.Pattern[bytes]:
    return re.compile(
        rb"id(?: +(\d+) \| task +(-?\d+) \| *(?:"
        rb"(?P<new_prompt>)new prompt, n_ctx_slot = (\d+)[^\n]*?(?:task\.n_tokens|n_prompt_tokens)"
        rb" = (\d+)(?:" + _next(_CACHE) + rb")?"
        # without the whole request (``whole`` False) the groups stay, never matching
        + rb"(?:" + (b"" if whole else b"(?!)") + _WHOLE + rb")?"
        rb"|(?P<cached>)(?:(?:cached )?n_(?:tokens|past) = \d+, memory_seq_rm \[(\d+),"
        rb"|kv cache rm \[(\d+),)"
        rb"|(?P<timing>prompt eval|eval) " + _FIGURES + rb"[^\n]*"
        + rb"(?:" + _next(rb"total time[^\n]*") + rb")?"
        + rb"(?:" + _next(rb"graphs reused = +(\d+)") + rb")?"
        + rb"(?:" + _next(_STOP) + rb")?"
        rb"|graphs reused = +(?P<graphs>\d+)"
        rb"|(?P<stop>)" + _STOP
        + rb"|(?P<block>)" + _OLD_BLOCK
        + rb"(?:" + _next(_STOP) + rb")?"
        rb")"
        # the 2024 key=value form: ``id_slot`` (``slot_id`` before 2024-03), text or JSON
        rb"|(?:_slot|(?<=slot_id))\"?[=:] *(?P<kv>\d+)[^\n]*"
        rb")"
    )


SLOT_LINES: Final = _slot_lines(True)
"""One match per slot line of interest — and the lines after it that belong to the same
request when it prints them in a row (a server with one slot busy does): each match costs Python
time, so a whole request (``new prompt``, the cache line, the prompt's progress, the
``print_timing`` lines and the release) is read in one when its lines follow each other; a
request whose lines interleave with others' is read line by line. The first group of each
alternative is named (:data:`GROUPS`); ``whole_block``/``whole_eval`` mark the line whose number
a request records."""

LINE_BY_LINE: Final = _slot_lines(False)
"""The same groups without the whole-request reading: for a span that must be read in order
with another line inside it (a kv-stream line logged in the middle of a request)."""

GROUPS: Final = SLOT_LINES.groupindex
NEW_PROMPT, CACHED, TIMING, GRAPHS, STOP, BLOCK, KV, WHOLE = (
    GROUPS[n] + (1 if n in ("new_prompt", "cached", "stop", "block") else 0)
    for n in ("new_prompt", "cached", "timing", "graphs", "stop", "block", "kv", "whole"))
"""The first group of each alternative after its (empty) named group, 1-based as ``re`` numbers
them. The named groups are empty markers, not wrappers: ``lastindex`` is the outermost group
that closed last, so a wrapper would hide the groups inside it."""

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
