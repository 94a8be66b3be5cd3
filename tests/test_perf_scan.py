"""Reading requests from llama-server logs for ``kvdiag perf`` (kvdiag/postmortem/perfscan.py)."""

from __future__ import annotations

import gzip
import io

import pytest
from server_logs import ServerLog, Turn, adapt_line, partition_line

from kvdiag import compiled
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfbytes
from kvdiag.postmortem.perfread import scan_paths, scan_stream
from kvdiag.postmortem.perfscan import PerfScanner


def scan(text: str, name: str = "server.log") -> PerfRun:
    return scan_stream(name, io.BytesIO(text.encode()))


def by_task(run: PerfRun) -> dict[int | None, object]:
    return {r.task: r for r in run.requests}


TWO = (Turn(0, 11, depth_start=9000, cached=1000, decode_tokens=300, decode_tps=25.0,
            prompt_tps=1200.0, graphs=290),
       Turn(1, 12, depth_start=4000, cached=0, decode_tokens=120, decode_tps=18.5,
            prompt_tps=900.0, truncated=True, graphs=400))


@pytest.mark.parametrize("shape", ["newer", "older"])
@pytest.mark.parametrize("outer", ["none", "router", "journald", "compose"])
def test_two_slots_interleaved_each_request_read_whole(shape: str, outer: str) -> None:
    log = ServerLog(shape=shape, outer=outer)  # type: ignore[arg-type]
    log.boot(np=2)
    log.requests(*TWO)
    run = scan(log.text())
    assert run.unfinished == 0 and run.problems == ()
    # in the order they completed: slot 1's shorter prompt finished first
    assert [(r.slot, r.task) for r in run.requests] == [(1, 12), (0, 11)]
    b, a = run.requests
    assert (a.depth_start, a.depth_end, a.cached) == (9000, 9300, 1000)
    assert (b.depth_start, b.depth_end, b.cached) == (4000, 4120, 0)
    assert (a.prompt_tokens, a.decode_tokens) == (8000, 300)
    assert a.decode_tps == pytest.approx(25.0) and b.decode_tps == pytest.approx(18.5)
    assert a.prompt_tps == pytest.approx(1200.0) and b.prompt_tps == pytest.approx(900.0)
    assert a.ms_per_token == pytest.approx(40.0) and b.ms_per_token == pytest.approx(54.05)
    assert a.decode_ms == pytest.approx(12000.0)
    assert (a.truncated, b.truncated) == (False, True)
    assert (a.n_ctx_slot, b.boot) == (65536, 0)
    # graphs reused is printed by the newer shape only
    assert (a.graphs_reused, b.graphs_reused) == ((290, 400) if shape == "newer" else (None, None))
    lines = log.text().splitlines()
    assert "eval time" in lines[a.line - 1] or "print_timing" in lines[a.line - 1]
    assert "new prompt" in lines[(a.started or 0) - 1] and "task 11" in lines[(a.started or 0) - 1]
    assert run.lines == len(lines)
    assert len(run.boots) == 1 and run.boots[0].kv_stream_pool_mib == 2048


def test_chunked_reading_gives_the_same_run() -> None:
    """An older-shape block cut between reads (its figures in the next chunk) is still read."""
    log = ServerLog(shape="older", outer="router")
    log.boot(np=2)
    for k in range(6):
        log.requests(Turn(0, 2 * k, 1000 + 500 * k, 0, 64 + k, 20.0 + k),
                     Turn(1, 2 * k + 1, 800 + 300 * k, 0, 32 + k, 30.0 - k))
    data = log.text().encode()
    whole = scan_stream("a.log", io.BytesIO(data))
    for size in (7, 61, 333, 4096):
        s = PerfScanner("a.log")
        for i in range(0, len(data), size):
            s.feed(data[i:i + size])
        run = s.finish()
        assert run.requests == whole.requests, size
        assert run.lines == whole.lines
    assert len(whole.requests) == 12
    assert [r.decode_tokens for r in whole.requests if r.slot == 0] == [64, 65, 66, 67, 68, 69]


def test_two_boots_in_one_log() -> None:
    log = ServerLog()
    log.boot(stage_mib=2048)
    log.requests(Turn(0, 0, 5000, 0, 100, 30.0))
    # the second request of the first boot never finishes: the server is restarted
    log.line("slot launch_slot_: id  0 | task 1 | processing task, is_child = 0")
    log.line("slot update_slots: id  0 | task 1 | new prompt, n_ctx_slot = 65536, n_keep = 0, "
             "task.n_tokens = 6000")
    log.boot(stage_mib=None)
    log.requests(Turn(0, 0, 7000, 0, 80, 33.0))
    run = scan(log.text())
    assert [(r.boot, r.task, r.depth_start) for r in run.requests] == [(0, 0, 5000), (1, 0, 7000)]
    assert run.unfinished == 1
    assert [b.kv_stream for b in run.boots] == [True, False]


def test_kv_stream_lines_belong_to_the_requests_in_flight() -> None:
    log = ServerLog()
    log.boot(np=2)
    during = (adapt_line(9100, 30, 12, samples=40, misses=8, busy=91.0, peak=12),
              partition_line(30, 29, 12, 21, 20.0, 91.0),
              adapt_line(9200, 29, 21, samples=40, misses=0, busy=60.0, peak=10),
              "ggml_cuda_kv_stream_fattn: fits() false for layer 3, falling back to ordinary "
              "flash attention over the host buffer")
    # slot 1's long prompt keeps it in flight while slot 0 decodes
    log.requests(Turn(0, 1, 9000, 0, 200, 12.0, during=during),
                 Turn(1, 2, 30000, 0, 60, 20.0))
    log.requests(Turn(0, 3, 9300, 9200, 50, 22.0))
    run = scan(log.text())
    assert [n.kind for n in run.notes] == ["repartition", "fallback"]
    rep, fb = run.notes
    assert rep.resident == (30, 29) and rep.ring == (12, 21) and rep.miss_pct == 20.0
    assert rep.depth == 9100 and fb.layer == 3
    first, second, third = run.requests
    assert (first.task, second.task, third.task) == (1, 2, 3)
    assert first.notes == (0, 1) and second.notes == (0, 1) and third.notes == ()
    (page,) = run.adapt
    assert (page.page, page.evaluations, page.resident_min, page.resident_max) == (36, 2, 29, 30)
    assert (page.below, page.samples, page.misses, page.starved) == (2, 80, 8, 1)
    assert page.busy_max == 91.0 and page.peak_max == 12


@pytest.mark.parametrize("compiled_on", ["1", "0"])
def test_kv_stream_lines_in_capitals_are_read(compiled_on: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A line the grammar reads in any case (a fallback warning in kv-stream's words, the
    port's LLAMA_KV_STREAM_ALLOW_MULTISEQ warning) that spells kv-stream only in capitals is
    found by the anchors, the C pass and the patterns' own search alike."""
    monkeypatch.setattr(compiled, "_loaded", {})
    monkeypatch.setenv("KVDIAG_COMPILED", compiled_on)
    if compiled_on == "0":
        assert perfbytes.module() is None
    log = ServerLog()
    log.boot(np=2)
    log.line("LLAMA_KV_STREAM_ALLOW_MULTISEQ=1: accepting 2 sequences without a unified "
             "KV cache", "W")
    log.requests(Turn(0, 1, 9000, 0, 200, 12.0, during=(
        "ggml_backend_cuda_graph_compute: KV_STREAM FALLS BACK on layer 11 (ne[3] = 2)",)),
                 Turn(1, 2, 3000, 0, 60, 20.0))
    run = scan(log.text())
    assert [(n.kind, n.layer) for n in run.notes] == [("fallback", 11)]
    assert {r.task: r.notes for r in run.requests}[1] == (0,)
    assert [b.multiseq_optin for b in run.boots] == [True]


def test_zero_prompt_tokens_print_nan_and_still_read() -> None:
    log = ServerLog()
    log.boot()
    log.requests(Turn(0, 4, 2000, 2000, 40, 31.0))
    (r,) = scan(log.text()).requests
    assert r.prompt_tokens == 0 and r.prompt_tps is None and r.decode_tps == pytest.approx(31.0)


def test_cut_log_and_gzip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = ServerLog()
    log.boot()
    log.requests(Turn(0, 1, 2000, 0, 40, 31.0))
    log.line("slot update_slots: id  0 | task 2 | new prompt, n_ctx_slot = 65536, n_keep = 0, "
             "task.n_tokens = 2100")
    text = log.text() + "slot print_timing: id  0 | task 2 | prompt eval"  # cut mid-line
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress(text.encode()))
    (run,) = scan_paths([str(path)])
    assert len(run.requests) == 1 and run.unfinished == 1
    assert [p.message for p in run.problems] == [
        "last line has no line end (truncated log?); not read"]


def test_a_log_without_requests() -> None:
    run = scan("hello\nworld\n")
    assert run.requests == () and run.lines == 2 and run.unfinished == 0


def test_figures_converted_at_once_are_the_figures_read_one_by_one() -> None:
    """``figure_sets`` (one JSON decode of a block's printed numbers) gives what ``figures``
    (``float()`` on each) gives, for every way the server prints them."""
    import random

    from kvdiag.postmortem.timinglines import figure_sets, figures

    rng = random.Random(17)
    odd = [b"-nan", b"nan", b"inf", b"-nan(ind)", b"-inf"]
    for _ in range(3000):
        g: list[bytes] = []
        for _ in range(2):
            n = rng.choice([0, 1, rng.randint(2, 99999)])
            ms = rng.uniform(0, 1e6)
            fmt = rng.choice(["%.2f", "%10.2f", "%r", "%.6f"])
            per = ms / n if n else float("nan")
            tps = n * 1000.0 / ms if n and ms else float("inf")
            cells = [(fmt % ms).strip().encode(), str(n).encode(),
                     (fmt % per).strip().encode(), (fmt % tps).strip().encode()]
            if rng.random() < 0.1:
                cells[rng.choice([2, 3])] = rng.choice(odd)
            g += cells
        t = tuple(g)
        # repr: a nan read either way is the same nan, and nan != nan
        assert repr(figure_sets(t, 0, 2)) == repr([figures(t, 0), figures(t, 4)]), t
        assert repr(figure_sets(t, 4, 1)) == repr([figures(t, 4)]), t
