"""``kvdiag postmortem`` reads the slot lines of llama-server's 2024 ``server_log`` form
(kvdiag/postmortem/serverlog.py): JSON (``--log-format json``, the default) and text, with the
keys ``slot_id``/``task_id`` (before PR #5882, 2024-03) or ``id_slot``/``id_task``.

Before, only the text form with ``id_slot=`` was read: a JSON log or one with ``slot_id=``
showed no slot activity, no slot busy at the crash, and a restart (whose boot is known ready by
its first launched request) was not counted as a boot. The lines are printed as the server did
(tests/test_perf_log2024.py's ``server_log``).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from test_perf_log2024 import Form, request, server_log

from kvdiag.model.logrecords import LogLine, SlotEvent
from kvdiag.postmortem import grammar
from tests.postmortem_helpers import scan_bytes

KEYS = {"old": ("slot_id", "task_id"), "new": ("id_slot", "id_task")}


def boot(form: Form, key: str) -> list[str]:
    """A 2024 boot at the default verbosity: no line of it tells the server is ready that
    postmortem knows (``HTTP server listening`` is a JSON-only message of its own)."""
    return [server_log(form, "main", "build info", {"build": 3001, "commit": "9e4a4fb"}),
            "llama_new_context_with_model: n_ctx      = 32768",
            "llama_new_context_with_model: n_batch    = 2048",
            server_log(form, "init", "initializing slots", {"n_slots": 2}),
            server_log(form, "init", "new slot", {key: 0, "n_ctx_slot": 16384}),
            server_log(form, "init", "new slot", {key: 1, "n_ctx_slot": 16384}),
            server_log(form, "main", "HTTP server listening",
                       {"hostname": "0.0.0.0", "port": "8081", "n_threads_http": "7"})]


def log(form: Form, keys: tuple[str, str]) -> bytes:
    a = request(form, keys, 1, 7, cached=0, prompt=(210.0, 700), decode=(3100.0, 90),
                n_past=790)
    b = request(form, keys, 0, 8, cached=0, prompt=(30.0, 64), decode=(800.0, 20), n_past=84)
    c = request(form, keys, 0, 0, cached=0, prompt=(900.0, 5000), decode=(1.0, 1), n_past=1)
    lines = [*boot(form, keys[0]), a[0], a[1], b[0], b[1], *b[2:], *a[2:],
             # the server restarted; its first request crashed while loading the prompt
             *boot(form, keys[0]), c[0], c[1],
             "/src/llama.cpp/ggml/src/ggml-cuda.cu:2412: GGML_ASSERT(ggml_nbytes(src0) <= "
             "INT_MAX) failed"]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("form", ["json", "text"])
@pytest.mark.parametrize("keys", ["old", "new"])
def test_the_2024_slot_lines_give_slot_activity_and_boots(form: Form, keys: str) -> None:
    scan = scan_bytes(log(form, KEYS[keys]))
    assert len(scan.boots) == 2
    (crash,) = scan.crashes
    assert crash.active_slots == (0,)
    got = [(e.kind, e.slot, e.task, e.n_past) for e in scan.slot_events_tail
           if e.kind in ("launch", "cache", "release")]
    assert got == [("launch", 1, 7, None), ("cache", 1, 7, 0), ("launch", 0, 8, None),
                   ("cache", 0, 8, 0), ("release", 0, 8, 84), ("release", 1, 7, 790),
                   ("launch", 0, 0, None), ("cache", 0, 0, 0)]


@pytest.mark.parametrize(("text", "want"), [
    ('{"function":"update_slots","id_slot":1,"id_task":12,"level":"INFO","line":1790,'
     '"msg":"kv cache rm [p0, end)","p0":4096,"tid":"1","timestamp":1712000000}',
     ("cache", 1, 12, 4096, "kv cache rm [p0, end)")),
    ("INFO [            update_slots] slot released | n_cache_tokens=900 n_ctx=8192 "
     "n_past=900 n_system_tokens=0 slot_id=3 task_id=40 tid=\"1\" timestamp=1709000000 "
     "truncated=false", ("release", 3, 40, 900, "slot released")),
    # a message that is not a slot event: no event, whatever keys it has
    ('{"function":"init","id_slot":0,"level":"INFO","line":700,"msg":"new slot",'
     '"n_ctx_slot":4096,"tid":"1","timestamp":1}', None),
])
def test_one_2024_line(text: str, want: tuple[Any, ...] | None) -> None:
    recs = grammar.classify(LogLine("t.log", 1, text), text)
    if want is None:
        assert not any(isinstance(r, SlotEvent) for r in recs)
        return
    (ev,) = recs
    assert isinstance(ev, SlotEvent)
    assert (ev.kind, ev.slot, ev.task, ev.n_past, ev.message) == want


@pytest.mark.parametrize("form", ["json", "text"])
def test_a_restart_before_any_request_is_a_boot_of_its_own(form: Form) -> None:
    """2024's ``model loaded`` ends a boot: a server restarted (with another context size)
    before serving anything is two boots, and the crash is read against the second's."""
    from kvdiag.postmortem.perfread import scan_stream

    def boot_at(n_ctx: int) -> list[str]:
        return [server_log(form, "main", "HTTP server listening",
                           {"hostname": "0.0.0.0", "port": "8081", "n_threads_http": "7"}),
                f"llama_new_context_with_model: n_ctx      = {n_ctx}",
                server_log(form, "init", "initializing slots", {"n_slots": 1}),
                server_log(form, "main", "model loaded", {})]
    lines = [*boot_at(65536), *boot_at(8192),
             "/src/llama.cpp/ggml/src/ggml-cuda.cu:70: CUDA error"]
    data = ("\n".join(lines) + "\n").encode()
    scan = scan_bytes(data)
    assert [b.n_ctx for b in scan.boots] == [65536, 8192]
    assert [b.n_ctx for b in scan_stream("s.log", io.BytesIO(data)).boots] == [65536, 8192]
