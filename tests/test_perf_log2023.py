"""``kvdiag perf`` reads the late-2023 form of llama-server's timings (kvdiag/postmortem/perflate.py).

Before ggml-org/llama.cpp PR #5700 (2024-02-24) ``examples/server/server.cpp`` printed through
``LOG_TEE`` (read in SJTU-IPADS/PowerInfer's December 2023 copy, commit 74c5c5895b9a):
``launch_slot_with_data`` ``"slot %i is processing [task id: %i]\\n"``; ``update_slots`` ``"slot
%d : in cache: %i tokens | to process: %i tokens\\n"`` (with ``cache_prompt``) and ``"slot %d :
kv cache rm - [%d, end)\\n"``, ``"slot %d: context shift - n_keep = %d, n_left = %d, n_discard =
%d\\n"``, and at the start of each pass ``"slot %d released (%d tokens in cache)\\n"`` for every
slot released since, in slot order; ``llama_client_slot::print_timings`` ``"\\n"``, ``"%s: prompt
eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\\n"``, ``"%s:
eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\\n"`` (eight
spaces before ``eval``), ``"%s:       total time = %10.2f ms\\n"`` with ``__func__``. The HTTP
thread logged JSON lines (``server_log``) in between. The fixtures below print those calls so.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from server_logs import ServerLog, Turn

from kvdiag.analysis.perf import rows
from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfsplit
from kvdiag.postmortem.perfread import scan_stream
from kvdiag.postmortem.perfscan import PerfScanner
from kvdiag.trace.reader import TraceReader

HTTP = ('{"timestamp":1702000000,"level":"INFO","function":"log_server_request","line":2603,'
        '"message":"request","remote_addr":"127.0.0.1","remote_port":51234,"status":200,'
        '"method":"POST","path":"/completion","params":{}}')


def processing(slot: int, task: int) -> str:
    return f"slot {slot} is processing [task id: {task}]"


def load(slot: int, n_past: int, to_process: int, *, cache_prompt: bool = True) -> list[str]:
    """The lines of a prompt's loading (``update_slots``); without ``cache_prompt`` nothing is
    kept and only the kv cache rm line is printed."""
    out = [f"slot {slot} : in cache: {n_past} tokens | to process: {to_process} tokens"] \
        if cache_prompt else []
    return [*out, f"slot {slot} : kv cache rm - [{n_past if cache_prompt else 0}, end)"]


def block(prompt: tuple[float, int], decode: tuple[float, int]) -> list[str]:
    p_ms, p_n = prompt
    d_ms, d_n = decode

    def rate(ms: float, n: int) -> str:
        if n == 0:
            return f"({'-nan':>8} ms per token, {'inf':>8} tokens per second)"
        return f"({ms / n:8.2f} ms per token, {1e3 / ms * n:8.2f} tokens per second)"

    return ["",
            f"print_timings: prompt eval time = {p_ms:10.2f} ms / {p_n:5d} tokens {rate(p_ms, p_n)}",
            f"print_timings:        eval time = {d_ms:10.2f} ms / {d_n:5d} runs   {rate(d_ms, d_n)}",
            f"print_timings:       total time = {p_ms + d_ms:10.2f} ms"]


def released(slot: int, tokens: int) -> str:
    return f"slot {slot} released ({tokens} tokens in cache)"


BOOT = ["llama_new_context_with_model: n_ctx      = 8192", "Available slots:",
        " -> Slot 0 - max context: 4096", " -> Slot 1 - max context: 4096"]


def scan(lines: list[str]) -> PerfRun:
    return scan_stream("server.log", io.BytesIO(("\n".join(lines) + "\n").encode()))


def one_slot() -> list[str]:
    return [*BOOT,
            processing(0, 0), *load(0, 0, 3488), *block((812.5, 3488), (9375.0, 250)), HTTP,
            released(0, 3739),
            processing(0, 1), *load(0, 3739, 120), *block((40.0, 120), (1000.0, 30)), HTTP,
            released(0, 3890)]


def test_one_slot_each_block_gets_its_release() -> None:
    lines = one_slot()
    run = scan(lines)
    assert run.unfinished == 0 and run.problems == ()
    a, b = run.requests
    assert [(r.slot, r.task) for r in run.requests] == [(0, 0), (0, 1)]
    assert (a.prompt_tokens, a.decode_tokens, a.depth_start, a.depth_end, a.cached) == (
        3488, 250, 3488, 3739, 0)
    assert (b.prompt_tokens, b.decode_tokens, b.depth_start, b.depth_end, b.cached) == (
        120, 30, 3859, 3890, 3739)
    assert a.decode_ms == pytest.approx(9375.0) and a.decode_tps == pytest.approx(26.67)
    assert b.prompt_tps == pytest.approx(3000.0) and a.truncated is None
    assert "        eval time" in lines[a.line - 1] and "is processing [task id: 0]" in lines[
        (a.started or 0) - 1]
    assert [row.depth_derived for row in rows(run)] == [False, False]


def test_two_slots_finishing_in_one_pass_are_paired_in_slot_order() -> None:
    lines = [*BOOT, processing(0, 4), processing(1, 5), *load(0, 100, 900), *load(1, 0, 2000),
             # one pass: both finish, blocks in slot order; the next pass releases both
             *block((300.0, 900), (2000.0, 40)), *block((700.0, 2000), (3000.0, 90)),
             released(0, 1041), released(1, 2091), processing(0, 6), *load(0, 1041, 10),
             *block((5.0, 10), (500.0, 20)), released(0, 1072)]
    run = scan(lines)
    assert run.unfinished == 0 and run.problems == ()
    got = [(r.slot, r.task, r.decode_tokens, r.depth_start, r.depth_end) for r in run.requests]
    assert got == [(0, 4, 40, 1000, 1041), (1, 5, 90, 2000, 2091), (0, 6, 20, 1051, 1072)]


def test_without_cache_prompt_the_prompt_is_the_depth_at_start() -> None:
    lines = [processing(1, 3), *load(1, 0, 0, cache_prompt=False),
             *block((100.0, 640), (800.0, 16)), released(1, 657)]
    (r,) = scan(lines).requests
    assert (r.slot, r.task, r.cached, r.depth_start, r.depth_end) == (1, 3, 0, 640, 657)


def test_a_context_shift_marks_the_request_truncated() -> None:
    lines = [processing(0, 1), *load(0, 0, 4000),
             "slot 0: context shift - n_keep = 0, n_left = 4094, n_discard = 2047",
             *block((900.0, 4000), (6000.0, 200)), released(0, 2154),
             processing(0, 2), *load(0, 0, 50), *block((10.0, 50), (100.0, 5)), released(0, 56)]
    a, b = scan(lines).requests
    assert (a.truncated, b.truncated) == (True, None)


def test_what_cannot_be_paired_is_said_not_guessed() -> None:
    lines = [processing(0, 1), processing(1, 2), *load(0, 0, 100), *load(1, 0, 200),
             # slot 0's task was cancelled (released without a block), slot 1 finished: a run
             # of two releases for one block
             *block((20.0, 200), (400.0, 10)), released(0, 101), released(1, 211),
             # two blocks, one of which decoded nothing: printed in an order not known
             processing(0, 3), processing(1, 4), *load(0, 0, 30), *load(1, 0, 40),
             *block((5.0, 30), (50.0, 0)), *block((6.0, 40), (60.0, 3)),
             released(0, 31), released(1, 44),
             # a block whose release the log does not hold, then a block cut after one line
             processing(0, 5), *load(0, 0, 7), *block((1.0, 7), (10.0, 2)),
             processing(1, 6), *load(1, 0, 8), *block((1.0, 8), (10.0, 2))[:2]]
    run = scan(lines)
    assert [(r.slot, r.task, r.depth_end, r.decode_tokens) for r in run.requests] == [
        (None, None, None, 10), (None, None, None, 0), (None, None, None, 3),
        (None, None, None, 2)]
    # the cancelled request (one run's extra release) and the cut block; task 5 ended with
    # the block read without its slot, so is not counted again
    assert run.unfinished == 2
    (problem,) = run.problems
    assert problem.message.startswith("4 late-2023 print_timings block(s) could not be paired")
    assert all(row.depth_start is None for row in rows(run))


def test_a_boot_between_a_block_and_its_release_ends_it() -> None:
    lines = ["llama_context: constructing llama_context",
             processing(0, 1), *load(0, 0, 10), *block((2.0, 10), (20.0, 4)),
             "llama_context: constructing llama_context", released(0, 15),
             processing(0, 0), *load(0, 0, 10), *block((2.0, 10), (30.0, 5)), released(0, 16)]
    run = scan(lines)
    assert [(r.boot, r.slot, r.task, r.decode_tokens) for r in run.requests] == [
        (0, None, None, 4), (1, 0, 0, 5)]
    assert run.unfinished == 0 and len(run.problems) == 1


def test_an_upgrade_in_one_log_reads_both_forms() -> None:
    newer = ServerLog()
    newer.boot(stage_mib=None)
    newer.requests(Turn(0, 0, 5000, 0, 32, 40.0))
    run = scan([*one_slot(), *newer.text().splitlines(), *one_slot()[len(BOOT):]])
    assert [(r.slot, r.task, r.depth_start) for r in run.requests] == [
        (0, 0, 3488), (0, 1, 3859), (0, 0, 5000), (0, 0, 3488), (0, 1, 3859)]


def test_chunked_and_split_reading_give_the_same_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [*BOOT]
    for k in range(40):
        lines += [processing(k % 2, k), *load(k % 2, 10 * k, 100 + k),
                  *block((10.0 + k, 100 + k), (200.0 + k, 10 + k)), released(k % 2, 211 + 12 * k)]
    text = ("\n".join(lines) + "\n").encode()
    whole = scan_stream("server.log", io.BytesIO(text))
    assert len(whole.requests) == 40 and whole.unfinished == 0 and whole.problems == ()
    for size in (1, 7, 64):
        s = PerfScanner("server.log")
        for i in range(0, len(text), size):
            s.feed(text[i:i + size])
        assert s.finish() == whole, size
    # a second half holding the form is read again by the first process, not joined
    path = tmp_path / "server.log"
    path.write_bytes(text)
    for cut in [i + 1 for i, ch in enumerate(text) if ch == 10][5:-1:7]:
        first = PerfScanner("server.log")
        perfsplit.read_range(first, str(path), 0, cut)
        half = perfsplit._second_half(str(path), cut, len(text), "server.log")
        assert half.late
    assert perfsplit.split_point(str(path), len(text)) == 0
    monkeypatch.setattr(perfsplit, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(perfsplit, "spare_core", lambda: True)
    monkeypatch.setattr(perfsplit, "split_point", lambda path, size: len(text) // 2 + 1 + text[
        len(text) // 2:].index(b"\n"))
    with open(path, "rb") as fh:
        assert scan_stream("server.log", fh) == whole


def test_perf_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "server.log"
    path.write_text("\n".join(one_slot()) + "\n")
    assert main(["perf", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 requests" in out and "3488→3739" in out and "3859→3890" in out
    assert main(["perf", str(path), "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)["runs"]
    got = [(r["slot"], r["task"], r["depth_start"], r["depth_end"], r["depth_derived"],
            r["decode_tokens"]) for r in data["requests"]]
    assert got == [(0, 0, 3488, 3739, False, 250), (0, 1, 3859, 3890, False, 30)]


def test_import_carries_the_late_timings(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join(one_slot()) + "\n")
    out = tmp_path / "server.kvtrace"
    assert main(["import", str(log), "-o", str(out)]) == 0
    with TraceReader.open(out) as reader:
        timings = [e for e in reader if isinstance(e, ev.Timing)]
    assert [(t.slot, t.task, t.depth_start, t.depth_end, t.decode_tokens) for t in timings] == [
        (0, 0, 3488, 3739, 250), (0, 1, 3859, 3890, 30)]


def test_two_boots_of_that_time_are_two_boots_for_perf_and_postmortem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A late-2023 server restarted in one log: its ready lines ("llama server listening at",
    the JSON "HTTP server listening") are none the readers know, so the boot that launched a
    request was taken as never ready and the second start folded into the first. A launched
    request makes a boot ready: perf places each request in its own boot, postmortem counts
    two boots."""
    start = ["llama_model_loader: loaded meta data with 19 key-value pairs and 291 tensors "
             "from /m/llama-2-7b.Q4_K_M.gguf (version GGUF V3 (latest))", *BOOT,
             "llama server listening at http://127.0.0.1:8080", "",
             '{"timestamp":1702000001,"level":"INFO","function":"main","line":3040,'
             '"message":"HTTP server listening","hostname":"127.0.0.1","port":8080}',
             "all slots are idle and system prompt is empty, clear the KV cache"]
    turn = [processing(0, 0), *load(0, 0, 300), *block((100.0, 300), (2000.0, 50)), HTTP,
            released(0, 350)]
    run = scan([*start, *turn, *start, *turn])
    assert [(r.boot, r.depth_end) for r in run.requests] == [(0, 350), (1, 350)]
    assert len(run.boots) == 2
    log = tmp_path / "server.log"
    log.write_text("\n".join([*start, *turn, *start, *turn]) + "\n")
    main(["postmortem", str(log)])
    assert "2 boot(s)" in capsys.readouterr().out.splitlines()[0]
