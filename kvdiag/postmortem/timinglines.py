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

The 2024 form (``server_log``): from ggml-org/llama.cpp PR #5700 ("server: logs - unified
format and --log-format option", opened 2024-02-24) until PR #9418 ("common : reimplement
logging", opened 2024-09-10) replaced it with the ``SLT_*`` lines above,
``LOG_INFO(message, {key: value, ...})`` printed one JSON object a line (``--log-format json``,
the default: ``{"function":"print_timings",...,"id_slot":0,"id_task":5,...,"msg":"prompt eval
time     = …"}``) or text (``--log-format text``: ``INFO [           print_timings] prompt eval
time     = … | id_slot=0 id_task=5 n_prompt_tokens_processed=24 … tid="…" timestamp=…``). The
keys were ``slot_id``/``task_id`` until PR #5882 ("server : refactor", opened 2024-03-05; the
new names were in the code by 2024-03-21, PR #6213) renamed them ``id_slot``/``id_task``; the
JSON object's keys are sorted (nlohmann ``json``; a log of that time in PR #5939 shows them so).
The lines read
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

The late-2023 form, before PR #5700 (``examples/server/server.cpp``'s ``llama_client_slot``
and ``llama_server_context::update_slots``; read in the copy that SJTU-IPADS/PowerInfer forked
in December 2023, commit 74c5c5895b9a, whose lines other forks of that time print alike — the
upstream repository was too large to fetch here). Everything goes through ``LOG_TEE``, so the
lines carry no slot prefix:

- ``slot <s> is processing [task id: <t>]`` (``launch_slot_with_data``)
- ``slot <s> : in cache: <n_past> tokens | to process: <n> tokens`` (``update_slots``, only
  with ``cache_prompt``), then always ``slot <s> : kv cache rm - [<system + n_past>, end)``
- ``slot <s>: context shift - n_keep = …`` (``update_slots``): the slot's context was cut
- ``print_timings()``: ``"\n"``, then ``print_timings: prompt eval time = <ms> ms / <n> tokens
  (…)``, ``print_timings:        eval time = <ms> ms / <n> runs   (…)``, ``print_timings:
  total time = <ms> ms`` — no slot, task or depth
- ``slot <s> released (<n> tokens in cache)``: ``cache_tokens``, the prompt's tokens and the
  generated ones (the system prompt's are not counted)

``update_slots`` calls ``slot.release()`` then ``slot.print_timings()`` for a finished slot;
the release line is printed at the start of the next ``update_slots`` pass, in the loop over all
slots (slot order), for every slot released since. So each pass prints, in order: the
``is processing`` lines of the tasks it takes, the release lines (one run), the cache lines of
the prompts it loads, then the timing blocks of the slots that finished — and the blocks of one
pass are released by the run of the next. The reader pairs a run with the blocks printed since
the run before: when they are as many and the server printed both in slot order, in order.
Where that is not certain it does not pair: a run of a different length (a release without a
block: a cancelled task, an embedding, a new system prompt; or a block whose release is not in
the log), or several blocks one of which decoded nothing (a request ending on its first token
whose prompt spans two ``n_batch`` chunks is printed after slots of a lower id). Those blocks
become requests without slot or depth, counted in a problem line; a block still waiting at a
new boot or at the end of the log likewise. The known case it cannot see: an empty prompt is
released and printed in the pass's first loop, with the figures of the slot's previous request
(``print_timings`` does not reset them). The depth at the end is the release's tokens in cache;
the depth at the start is the ``in cache`` line's two figures added, or, where the ``kv cache
rm`` line came without one (no ``cache_prompt``, so nothing was kept), the block's prompt
tokens; ``cached`` is the ``kv cache rm`` position. ``truncated`` is true after a ``context
shift`` line of the request and unknown otherwise (a prompt cut to fit was logged only with
``--verbose``). The form is searched (:func:`late_in`) only in the part of each block
before the first and after the last slot line of the later forms, and in all of every block
once a line of it was read: a log of a later form pays a few short searches a block for it.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from kvdiag.postmortem import grammar

# Repeats are possessive (``++``, ``*+``, ``?+``) wherever what follows cannot start with what
# they repeat, so giving back could never help a match: the same matches, without sre's
# backtracking steps (-16 % of the pattern's instructions on bench_perf's log, callgrind).
_NUM = rb"(-?+[\d.]++|-?+nan(?:\(ind\))?|-?+inf)"
_FIGURES = (rb"time = ++([\d.]++) ms / ++(\d++) (?:tokens|runs) *+\( *+" + _NUM
            + rb" ms per token, ++" + _NUM + rb" tokens per second\)")


def _next(body: bytes) -> bytes:
    """The line right after, of the same slot and task (backreferences to groups 1 and 2):
    read in the same match, so that no line in between is skipped. Its ``id`` is found by a
    greedy scan to the line's end and back (sre's fast path for a literal after a greedy
    repeat; a lazy scan from the start tries each position in turn): a line holds it once."""
    return rb"\r?\n[^\n]*id ++\1 \| task ++\2 \| *+" + body


_STOP = rb"stop processing: n_(?:tokens|past) = (\d++)(?:, truncated = (\d))?"
_CACHE = rb"(?:(?:cached )?n_(?:tokens|past) = \d++, memory_seq_rm|kv cache rm) \[(\d++),"
_OLD_BLOCK = (rb"[\r\n](?:(?<=\r)\n|(?<=\n))(?:|[^\n]*)prompt eval " + _FIGURES + rb"[^\n]*+\n(?: *+|[^\n]*)eval "
              + _FIGURES + rb"[^\n]*+\n(?: *+|[^\n]*)total time = ++[\d.]++ ms[^\n]*+")
"""The older block's three lines after its header. Each line's text is found by sre's fast
paths (measured): at the line's start or after spaces first, as the server prints it, else after
a prefix (router, journald) by a greedy scan to the line's end and back to the literal — the
same match as a lazy scan where the text is once on its line, at a fraction of its cost."""

def _named(pattern: bytes, group: bytes, name: bytes) -> bytes:
    """``pattern`` with its first ``group`` named ``name``."""
    assert group in pattern
    return pattern.replace(group, b"(?P<" + name + b">" + group[1:], 1)


SLOT_LINES: Final = re.compile(
    rb"id(?: ++(\d++) \| task ++(-?+\d++) \| *+(?:"
    rb"new prompt, n_ctx_slot = (?P<new_prompt>\d++)(?:, n_keep = -?+\d++, |[^\n]*?)"
    rb"(?:task\.n_tokens|n_prompt_tokens)"
    rb" = (\d++)(?:" + _next(_CACHE) + rb")?"
    rb"|[cn](?:(?<=c)ached n|)_(?:tokens|past) = \d++, memory_seq_rm \[(?P<cached>\d++),"
    rb"|kv cache rm \[(\d++),"
    rb"|[pe](?P<timing>(?<=p)rompt eval|(?<=e)val) " + _FIGURES + rb"[^\n]*+"
    + rb"(?:" + _next(rb"total time[^\n]*+") + rb")?"
    + rb"(?:" + _next(rb"graphs reused = ++(\d++)") + rb")?"
    + rb"(?:" + _next(_STOP) + rb")?"
    rb"|graphs reused = ++(?P<graphs>\d++)"
    rb"|" + _named(_STOP, rb"(\d++)", b"stop")
    + rb"|" + _named(_OLD_BLOCK, rb"([\d.]++)", b"block")
    + rb"(?:" + _next(_STOP) + rb")?"
    rb")"
    # the 2024 form: ``id_slot`` (``slot_id`` before 2024-03), text or JSON
    rb"|[_\"=:](?:(?<=_)slot\"?[=:]|(?<=slot_id\")[=:]|(?<=slot_id[=:])) *+(?P<kv>\d++)[^\n]*+"
    rb")"
)
"""One match per slot line of interest — and the line right after it when that is the same
request's next line (the cache line after ``new prompt``; ``total time``, ``graphs reused`` and
the release after ``eval time``; the release after the older block): each match costs Python
time. A line of the 2024 form is one match from its ``id_slot``/``slot_id`` to its end. The
first capturing group of each alternative is named (:data:`GROUPS`). Alternatives begin with a
literal or a class of characters where they can (``[pe]`` for ``prompt eval``/``eval``, whose
group then holds ``rompt eval``/``val``; ``[cn]`` for ``cached n_``/``n_``; ``[\r\n]`` for the
older block's line end; ``[_"=:]`` after the 2024 form's ``id``): sre rules those out by their
first character before trying them, which the slot lines of no interest, most of a log, cost
(-5 % of the pattern's instructions, callgrind)."""

GROUPS: Final = SLOT_LINES.groupindex
NEW_PROMPT, CACHED, TIMING, GRAPHS, STOP, BLOCK, KV = (
    GROUPS[n] for n in ("new_prompt", "cached", "timing", "graphs", "stop", "block", "kv"))
"""The first group of each alternative, 1-based as ``re`` numbers them (an empty named group at
the start of each alternative instead made the whole scan about 10 % slower: measured)."""

LATE_ANCHOR: Final = b"print_timings: "
"""The late-2023 form's timing lines (the later forms' ``print_timing`` has no ``s`` and no
colon right after it: ``slot print_timing:``, ``[           print_timings]``); the other
lines of the form start ``slot <n>`` (:func:`late_in`)."""

LATE_LINES: Final = re.compile(
    rb"print_timings: +(?P<late_timing>prompt eval|eval) " + _FIGURES
    + rb"|slot (?P<late_slot>\d+)(?: (?:released \((?P<released>\d+) tokens in cache\)"
    rb"|is processing \[task id: (?P<processing>-?\d+)\]"
    rb"|: in cache: (?P<in_cache>\d+) tokens \| to process: (\d+) tokens"
    rb"|: kv cache rm - \[(?P<kv_rm>\d+), end\))"
    rb"|(?P<shift>: context shift) - n_keep)"
)
"""One match per line of the late-2023 form (the module's docstring)."""


def late_in(buf: bytes, start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` holds a line of the late-2023 form: a block line
    (:data:`LATE_ANCHOR`) or a ``slot <n>`` line; two plain searches, and a match at each
    ``slot `` found (few outside the later forms' slot lines, which the caller leaves out)."""
    if buf.find(LATE_ANCHOR, start, end) >= 0:
        return True
    i = buf.find(b"slot ", start, end)
    while i >= 0:
        m = LATE_LINES.match(buf, i, end)
        if m is not None:
            return True
        i = buf.find(b"slot ", i + 5, end)
    return False

OLD_HEADER: Final = re.compile(rb"\| \r?\n")
"""The end of the older block's header line: an empty message."""

RARE_ANCHORS: tuple[bytes, ...] = (
    b"llama_",  # boot: llama_context / llama_kv_cache lines, llama_server ready (§5.1, §7.2)
    # kv_stream_adapt partition, trace, feedback and layout lines (§5.3), "KV streaming"
    # boot lines, a fallback warning in kv-stream's words in any case (§3), the port's
    # LLAMA_KV_STREAM_ALLOW_MULTISEQ warning (grammar._MULTISEQ), the fits=false line (§4.5)
    *grammar.KV_STREAM_WORDS,
    # the ready lines of 2023 ("llama server listening at") and 2024 ("model loaded",
    # server_log): a restart before any request is a boot of its own
    b"listening at",
    b"model loaded",
)
"""Substrings of the other lines ``kvdiag perf`` reads (decoded and parsed with the post-mortem
grammar, :mod:`kvdiag.postmortem.grammar`): few per log, so found with a plain search. Each
search costs a pass over the log, so they are as few as cover the grammar's lines."""


Figures = tuple[float | None, int, float | None, float | None]


def figures(g: tuple[bytes | None, ...], i: int) -> Figures:
    """(ms, tokens, ms per token, tokens per second) from groups ``i`` … ``i + 3`` (0-based);
    a count of 0 prints ``nan``/``inf`` figures, which are None."""
    n = int(g[i + 1] or 0)
    if not n:
        return number(g[i]), 0, None, None
    try:
        return float(g[i] or 0), n, float(g[i + 2] or 0), float(g[i + 3] or 0)
    except ValueError:
        return number(g[i]), n, number(g[i + 2]), number(g[i + 3])


_SET = msgspec.json.Decoder(tuple[float, int, float, float])
_TWO_SETS = msgspec.json.Decoder(tuple[float, int, float, float, float, int, float, float])
two_sets: Final = _TWO_SETS.decode
"""Two sets of figures at once (prompt, decode): what :func:`figure_sets` decodes for ``k=2``."""


def figure_sets(g: tuple[bytes | None, ...], i: int, k: int) -> list[Figures]:
    """``k`` (1 or 2) sets of :func:`figures` from groups ``i`` … ``i + 4k - 1``, the same
    values converted at once: the printed numbers are valid JSON numbers, and one decode of them
    all into a typed tuple (msgspec, in C) costs a fraction of ``4k`` ``float()`` calls on
    bytes, which were a large part of reading a request. A set holding ``nan``/``inf`` (not
    JSON) is read by :func:`figures`."""
    try:
        raw = b"[" + b",".join(g[i:i + 4 * k]) + b"]"  # type: ignore[arg-type]
        if k == 2:
            a, n, c, d, e, m, f, h = _TWO_SETS.decode(raw)
            return [(a, n, c, d) if n else (a, 0, None, None),
                    (e, m, f, h) if m else (e, 0, None, None)]
        a, n, c, d = _SET.decode(raw)
        return [(a, n, c, d) if n else (a, 0, None, None)]
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return [figures(g, i + 4 * j) for j in range(k)]


def number(raw: bytes | None) -> float | None:
    """A printed figure; None for ``nan``/``inf`` (a count of 0 tokens prints them)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None
