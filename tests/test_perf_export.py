"""``kvdiag trace export --format llama-log`` prints an imported trace's ``timing`` events as
``print_timing`` lines that ``kvdiag perf`` reads back to the same requests
(kvdiag/export/llama_log.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_logs import ServerLog, Turn, partition_line, session
from test_perf_log2024 import request

from kvdiag.cli import main
from kvdiag.model.perf import PerfRun, RequestTiming
from kvdiag.postmortem.perfread import scan_paths

FIELDS = ("boot", "slot", "task", "prompt_tokens", "prompt_ms", "prompt_tps", "decode_tokens",
          "decode_ms", "decode_tps", "ms_per_token", "depth_start", "depth_end", "cached",
          "n_ctx_slot", "truncated", "graphs_reused")


def numbers(run: PerfRun) -> dict[tuple[int, int | None, int | None], tuple[object, ...]]:
    def key(r: RequestTiming) -> tuple[int, int | None, int | None]:
        return r.boot, r.slot, r.task
    out = {key(r): tuple(getattr(r, f) for f in FIELDS) for r in run.requests}
    assert len(out) == len(run.requests)
    return out


def round_trip(tmp_path: Path, text: str) -> tuple[PerfRun, PerfRun, str]:
    log = tmp_path / "server.log"
    log.write_text(text)
    trace, back = tmp_path / "server.kvtrace", tmp_path / "export.log"
    assert main(["import", str(log), "-o", str(trace)]) == 0
    assert main(["trace", "export", str(trace), "--format", "llama-log", "-o", str(back)]) == 0
    (before,) = scan_paths([str(log)])
    (after,) = scan_paths([str(back)])
    return before, after, back.read_text()


@pytest.mark.parametrize("shape", ["newer", "older"])
def test_export_then_perf_gives_the_same_requests(tmp_path: Path, shape: str) -> None:
    log = ServerLog(shape=shape)  # type: ignore[arg-type]
    log.boot(np=2)
    turns = session(5, 9000, 300, [31.5, 27.25, 22.0, 18.75, 12.5], graphs_per_token=0.97,
                    during={2: (partition_line(80, 60, 8, 28, 12.0, 90.0),)})
    for t in turns[:3]:
        log.requests(t)
    # two slots at once, one of them capped by its context
    log.requests(turns[3], Turn(1, 40, 4000, 0, 120, 18.5, truncated=True, graphs=700))
    log.boot(np=2)  # the server started again
    log.requests(turns[4], Turn(1, 41, 3000, 1000, 0, 1.0))  # nothing decoded: nan figures
    before, after, text = round_trip(tmp_path, log.text())
    assert len(before.requests) == 7 and before.unfinished == 0
    assert numbers(after) == numbers(before)
    assert after.unfinished == 0 and after.problems == ()
    assert text.count("print_timing") >= 3 * 7 and "stop processing: n_tokens = 4120, " \
        "truncated = 1" in text
    assert {r.boot for r in after.requests} == {0, 1}


def test_the_2024_form_exports_to_the_newer_shape(tmp_path: Path) -> None:
    lines = request("json", ("id_slot", "id_task"), 0, 7, cached=512, prompt=(812.5, 3488),
                    decode=(9375.0, 250), n_past=4250)
    before, after, text = round_trip(tmp_path, "\n".join(lines) + "\n")
    assert numbers(after) == numbers(before)
    (r,) = after.requests
    assert (r.depth_start, r.depth_end, r.decode_tokens) == (None, 4250, 250)
    assert "eval time =    9375.00 ms /   250 tokens" in text
