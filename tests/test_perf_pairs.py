"""The usual request read in bulk (kvdiag/postmortem/perfpairs.py) gives the records the
per-match path gives, on generated logs that mix it with every other shape."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_logs import ServerLog, Turn, adapt_line, partition_line

from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfpairs
from kvdiag.postmortem.perfscan import Orphan, PerfScanner

# what a log holds next: most are the usual request, the rest every shape the reader knows
ACTIONS = ("usual",) * 6 + ("newer",) * 4 + (
    "two", "two_newer", "during", "during", "between", "open", "no_release", "nan", "zero",
    "no_graphs", "eval_twice",
    "release_first", "boot", "no_truncated", "no_new_prompt", "task_minus", "other_task",
    "no_cache_line", "late2023", "kv2024")


def _turn(draw: st.DrawFn, slot: int, task: int) -> Turn:
    start = draw(st.integers(1, 70_000))
    cached = draw(st.integers(0, start - 1))
    return Turn(slot, task, depth_start=start, cached=cached,
                decode_tokens=draw(st.integers(1, 900)),
                decode_tps=draw(st.floats(1.0, 200.0)), prompt_tps=draw(st.floats(10.0, 5e3)),
                truncated=draw(st.booleans()), n_ctx_slot=draw(st.sampled_from([8192, 65536])),
                graphs=draw(st.none() | st.integers(0, 10**6)))


def _edit(log: ServerLog, since: int, pattern: str, repl: str) -> None:
    log.lines[since:] = [re.sub(pattern, repl, x) for x in log.lines[since:]]


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    log = ServerLog(shape="older", outer=draw(st.sampled_from(["none", "router", "journald"])))
    log.boot(np=3)
    task = 0
    for action in draw(st.lists(st.sampled_from(ACTIONS), min_size=8, max_size=30)):
        slot = draw(st.integers(0, 2))
        task += 1
        since = len(log.lines)
        newer = action in ("newer", "two_newer", "no_graphs", "eval_twice") or (
            action not in ("usual", "release_first") and draw(st.booleans()))
        log.shape = "newer" if newer else "older"
        log.release_first = action == "release_first"
        if action in ("two", "two_newer"):  # two slots at once: their lines interleave
            task += 1
            log.requests(_turn(draw, slot, task - 1), _turn(draw, (slot + 1) % 3, task))
        elif action == "during":  # a kv-stream line while it decodes: its note
            t = _turn(draw, slot, task)
            log.requests(Turn(**{**t.__dict__, "during": (adapt_line(t.depth_start // 256 + 1,
                                                                     64, 8),)}))
        elif action == "between":
            log.line(partition_line(40, 32, 8, 16, 2.5, 80.0), "W")
        elif action == "open":  # a prompt that never completes: closed by the slot's next
            log.line(f"slot update_slots: id {slot:2d} | task {task} | new prompt, n_ctx_slot = "
                     f"8192, n_keep = 0, task.n_tokens = 77")
        elif action == "nan":  # nothing to process: the prompt's figures print -nan
            t = _turn(draw, slot, task)
            log.requests(Turn(**{**t.__dict__, "cached": t.depth_start}))
        elif action == "boot":
            log.boot(np=3)
        elif action == "late2023":
            log.raw(f"slot {slot} released ({draw(st.integers(1, 9000))} tokens in cache)")
        elif action == "kv2024":
            log.raw(f'{{"function":"update_slots","id_slot":{slot},"id_task":{task},'
                    f'"level":"INFO","msg":"kv cache rm [p0, end)","p0":12}}')
        else:
            log.requests(_turn(draw, slot, task))
            if action == "no_truncated":
                _edit(log, since, r", truncated = \d", "")
            elif action == "no_new_prompt":
                log.lines[since:] = [x for x in log.lines[since:] if "new prompt" not in x]
            elif action == "task_minus":
                _edit(log, since, r"\| task \d+ \| \n?$", "| task -1 | ")
                _edit(log, since, r"(print_timing: id +\d+) \| task \d+", r"\1 | task -1")
            elif action == "other_task":  # the block names another task of the slot
                _edit(log, since, r"(print_timing: id +\d+) \| task \d+", rf"\1 | task {task + 1}")
            elif action == "eval_twice":  # a decode line where the prompt's is printed
                _edit(log, since, r"\| prompt eval time", "|        eval time")
            elif action == "no_graphs":
                log.lines[since:] = [x for x in log.lines[since:] if "graphs reused" not in x]
            elif action == "no_cache_line":
                log.lines[since:] = [x for x in log.lines[since:]
                                     if "kv cache rm" not in x and "memory_seq_rm" not in x]
            elif action == "no_release":  # closed by the slot's next new prompt, if any
                log.lines[since:] = [x for x in log.lines[since:] if "stop processing" not in x]
            elif action == "zero":  # a count of 0 printed with figures that are numbers
                which = draw(st.sampled_from(["prompt eval", "(?<=  )eval"]))
                _edit(log, since, which + r" time = .*", which.removeprefix("(?<=  )")
                      + " time =       0.00 ms /     0 tokens (    0.00 ms per token,     0.00 "
                      "tokens per second)")
    return log.text().encode()


def read(data: bytes, size: int, pairs: bool, continuation: bool, compiled: bool = True
         ) -> tuple[PerfRun, list[Orphan]]:
    """The run read in blocks of ``size`` (``compiled``: where the patterns can match found in
    C, tests/test_perf_bytes.py; ``pairs``: the usual request read in bulk)."""
    s = PerfScanner("a.log", continuation=continuation)
    s.pairs = pairs
    s.compiled = compiled
    for i in range(0, len(data), size):
        s.feed(data[i:i + size])
    return s.finish(), s.orphans


@contextmanager
def chunks(chunk: int, min_run: int) -> Iterator[None]:
    """Chunks of a few matches cut runs of pairs."""
    was = perfpairs.CHUNK, perfpairs.MIN_RUN
    perfpairs.CHUNK, perfpairs.MIN_RUN = chunk, min_run
    try:
        yield
    finally:
        perfpairs.CHUNK, perfpairs.MIN_RUN = was


@settings(max_examples=150, deadline=None)
@given(data=logs(), size=st.sampled_from([97, 1000, 1 << 20]), continuation=st.booleans(),
       chunk=st.sampled_from([2, 5, 64]), min_run=st.sampled_from([1, 2]))
def test_bulk_reading_gives_the_records_of_reading_match_by_match(
        data: bytes, size: int, continuation: bool, chunk: int, min_run: int) -> None:
    slow, slow_orphans = read(data, size, False, continuation)
    with chunks(chunk, min_run):
        fast, fast_orphans = read(data, size, True, continuation)
    assert fast == slow
    assert fast_orphans == slow_orphans


@pytest.mark.parametrize("shape", ["older", "newer"])
def test_the_usual_requests_are_read_in_bulk(monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    """Runs of the usual request go the bulk way (not the per-match path), with their lines."""
    log = ServerLog(shape=shape)  # type: ignore[arg-type]
    log.boot(np=2)
    for k in range(40):
        log.requests(Turn(k % 2, k, 1000 + 37 * k, 10 * k, 64 + k, 20.0 + k,
                          graphs=None if k % 3 else 5 * k))
    data = log.text().encode()
    seen: list[int] = []
    walk = PerfScanner._walk

    def counting(self, buf, matches, *args):  # type: ignore[no-untyped-def]
        ms = list(matches)
        seen.append(len(ms))
        return walk(self, buf, ms, *args)

    monkeypatch.setattr(PerfScanner, "_walk", counting)
    run, _ = read(data, 1 << 20, True, False)
    assert sum(seen) == 0  # every match read in bulk
    assert len(run.requests) == 40 and run.unfinished == 0
    lines = log.text().splitlines()
    for k, r in enumerate(run.requests):
        assert (r.slot, r.task, r.depth_start, r.depth_end) == (k % 2, k, 1000 + 37 * k,
                                                                1000 + 37 * k + 64 + k)
        assert r.cached == 10 * k and r.truncated is False and r.notes == ()
        assert f"task {k} | new prompt" in lines[(r.started or 0) - 1]
        if shape == "older":
            assert lines[r.line - 1].endswith(f"print_timing: id {k % 2:2d} | task {k} | ")
            assert r.graphs_reused is None
        else:
            assert f"print_timing: id {k % 2:2d} | task {k} |        eval time" in lines[r.line - 1]
            assert r.graphs_reused == (None if k % 3 else 5 * k)
        assert r.decode_tps == pytest.approx(20.0 + k, abs=0.01)
