"""``kvdiag perf`` reads the 2024 form of llama-server's timings (kvdiag/postmortem/timinglines.py).

From ggml-org/llama.cpp PR #5700 (opened 2024-02-24) to PR #9418 (opened 2024-09-10) the server
logged through ``server_log(level, function, line, message, extra)`` in
``examples/server/utils.hpp``: with
``--log-format json`` (the default) one JSON object a line, with ``--log-format text``
``"%4s [%24s] %s"`` (level, function, message) then `` |`` and `` key=value`` for each key, the
value JSON-dumped. The object is nlohmann's ``json`` (keys sorted) holding ``tid`` and
``timestamp``, ``level``/``function``/``line``/``msg`` (JSON only) and the call's keys.
``print_timings`` made three calls (prompt, generation, total); ``update_slots`` logged ``kv
cache rm [p0, end)`` and ``slot released``. Keys were ``slot_id``/``task_id`` until PR #5882
(opened 2024-03-05) renamed them ``id_slot``/``id_task``. The fixtures below print those calls so.
"""

from __future__ import annotations

import io
import json
from typing import Any, Literal

import pytest
from server_logs import adapt_line

from kvdiag.analysis.perf import rows
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem.perfread import scan_stream

Form = Literal["text", "json"]


def server_log(form: Form, function: str, message: str, extra: dict[str, Any],
               line: int = 1000) -> str:
    """One ``server_log`` call as the 2024 server printed it."""
    log: dict[str, Any] = {"tid": "140245372188672", "timestamp": 1711234567}
    if form == "json":
        log.update(level="INFO", function=function, line=line, msg=message)
        log.update(extra)
        return json.dumps(dict(sorted(log.items())), separators=(",", ":"))
    log.update(extra)
    pairs = "".join(f" {k}={json.dumps(v, separators=(',', ':'))}"
                    for k, v in sorted(log.items()))
    return f"INFO [{function:>24}] {message} |{pairs}"


def request(form: Form, keys: tuple[str, str], slot: int, task: int, *, cached: int,
            prompt: tuple[float, int], decode: tuple[float, int], n_past: int,
            truncated: bool = False) -> list[str]:
    """The lines one request logs at the default verbosity, in order."""
    ks, kt = keys
    ids = {ks: slot, kt: task}
    p_ms, p_n = prompt
    d_ms, d_n = decode
    p_tok, p_tps = p_ms / p_n, 1e3 / p_ms * p_n
    d_tok, d_tps = d_ms / d_n, 1e3 / d_ms * d_n
    return [
        server_log(form, "launch_slot_with_task", "slot is processing task", ids),
        server_log(form, "update_slots", "kv cache rm [p0, end)", {**ids, "p0": cached}),
        server_log(form, "print_timings",
                   f"prompt eval time     = {p_ms:10.2f} ms / {p_n:5d} tokens ({p_tok:8.2f} ms "
                   f"per token, {p_tps:8.2f} tokens per second)",
                   {**ids, "t_prompt_processing": p_ms, "n_prompt_tokens_processed": p_n,
                    "t_token": p_tok, "n_tokens_second": p_tps}),
        server_log(form, "print_timings",
                   f"generation eval time = {d_ms:10.2f} ms / {d_n:5d} runs   ({d_tok:8.2f} ms "
                   f"per token, {d_tps:8.2f} tokens per second)",
                   {**ids, "t_token_generation": d_ms, "n_decoded": d_n, "t_token": d_tok,
                    "n_tokens_second": d_tps}),
        server_log(form, "print_timings", f"          total time = {p_ms + d_ms:10.2f} ms",
                   {**ids, "t_prompt_processing": p_ms, "t_token_generation": d_ms,
                    "t_total": p_ms + d_ms}),
        server_log(form, "update_slots", "slot released",
                   {**ids, "n_ctx": 16384, "n_past": n_past, "n_system_tokens": 0,
                    "n_cache_tokens": n_past, "truncated": truncated}),
    ]


def scan(text: str) -> PerfRun:
    return scan_stream("server.log", io.BytesIO(text.encode()))


@pytest.mark.parametrize("form", ["text", "json"])
@pytest.mark.parametrize("keys", [("id_slot", "id_task"), ("slot_id", "task_id")])
def test_the_2024_form_gives_each_request(form: Form, keys: tuple[str, str]) -> None:
    a = request(form, keys, 0, 7, cached=512, prompt=(812.5, 3488), decode=(9375.0, 250),
                n_past=4250)
    b = request(form, keys, 1, 8, cached=0, prompt=(95.0, 190), decode=(3000.0, 60),
                n_past=250, truncated=True)
    # two slots at once: their lines interleave, each request is still read whole
    lines = [server_log(form, "main", "model loaded", {})]
    for x, y in zip(a, b, strict=True):
        lines += [x, y]
    lines.append(server_log(form, "update_slots", "all slots are idle", {}))
    run = scan("\n".join(lines) + "\n")
    assert run.unfinished == 0 and run.problems == ()
    assert [(r.slot, r.task) for r in run.requests] == [(0, 7), (1, 8)]
    ra, rb = run.requests
    assert (ra.prompt_tokens, ra.decode_tokens, ra.cached) == (3488, 250, 512)
    assert ra.prompt_ms == pytest.approx(812.5) and ra.decode_ms == pytest.approx(9375.0)
    assert ra.decode_tps == pytest.approx(26.6667, abs=1e-3)
    assert ra.ms_per_token == pytest.approx(37.5)
    assert ra.prompt_tps == pytest.approx(3488 / 0.8125)
    assert (ra.depth_end, ra.truncated, rb.depth_end, rb.truncated) == (4250, False, 250, True)
    # the line of the generation figures; the request began at its first line
    assert "generation eval time" in lines[ra.line - 1] and "slot is processing" in lines[
        (ra.started or 0) - 1]
    # the prompt's length was printed only with --verbose: no depth at the start (the rows
    # derive one from the end and say so), and the slot's size is not the server's n_ctx
    assert ra.depth_start is None and ra.n_ctx_slot is None
    row = rows(run)[0]
    assert (row.depth_start, row.depth_derived) == (4000, True)


def test_a_kv_stream_line_inside_a_2024_request_belongs_to_it() -> None:
    keys = ("id_slot", "id_task")
    lines = request("text", keys, 0, 3, cached=0, prompt=(100.0, 1000), decode=(2000.0, 40),
                    n_past=1040)
    lines.insert(3, "kv_stream_adapt: " + adapt_line(900, 10, 4, 64, 9, 55.0, 12)[17:])
    run = scan("\n".join(lines) + "\n")
    (r,) = run.requests
    assert r.decode_tokens == 40 and len(run.adapt) == 1


def test_a_zero_count_prints_null_figures_and_reads_as_none() -> None:
    """nlohmann dumps a NaN as ``null``: a request of no decoded token has no rate."""
    line = server_log("json", "print_timings", "generation eval time = ...",
                      {"id_slot": 0, "id_task": 2, "t_token_generation": 0.0, "n_decoded": 0,
                       "t_token": None, "n_tokens_second": None})
    release = server_log("json", "update_slots", "slot released",
                         {"id_slot": 0, "id_task": 2, "n_past": 12, "truncated": False})
    run = scan(line + "\n" + release + "\n")
    (r,) = run.requests
    assert (r.decode_tokens, r.decode_tps, r.ms_per_token, r.depth_end) == (0, None, None, 12)
