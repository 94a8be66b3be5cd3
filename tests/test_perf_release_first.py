"""``kvdiag perf`` reads a request whose release line comes before its timing block.

The servers of late 2024 (after ggml-org/llama.cpp PR #9418 brought the ``SLT_*`` lines) ended a
request with ``slot.release(); slot.print_timings(); send_final_response(slot);`` in
``update_slots`` (``examples/server/server.cpp`` as forks of that time hold it, with
``release()`` printing ``stop processing: n_past = %d, truncated = %d`` and setting
``t_token_generation``, which ``print_timings`` then prints), so ``stop processing`` precedes the
``print_timing`` block; later servers print the timings first. Before, the release line closed
the request without figures (counted unfinished) and the block opened another without depth:
every request of such a log lost its depth and ``truncated``.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from server_logs import ServerLog, Turn

from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfsplit
from kvdiag.postmortem.perfread import scan_stream
from kvdiag.postmortem.perfscan import PerfScanner


def late_2024_log() -> bytes:
    log = ServerLog(shape="older", outer="journald", release_first=True)
    log.boot(stage_mib=None, ctx=32768, np=2)
    log.requests(Turn(0, 11, 3000, 0, 120, 41.5, n_ctx_slot=16384),
                 Turn(1, 12, 900, 0, 40, 52.0, n_ctx_slot=16384, truncated=True))
    log.requests(Turn(1, 13, 1300, 940, 64, 50.0, n_ctx_slot=16384))
    log.boot(stage_mib=None, ctx=32768, np=2)
    log.requests(Turn(0, 0, 700, 0, 16, 60.0, n_ctx_slot=16384))
    # a request cancelled mid-decode: released, no timing; then the slot's next request
    log.line("slot update_slots: id  1 | task 1 | new prompt, n_ctx_slot = 16384, n_keep = 0, "
             "n_prompt_tokens = 500")
    log.line("slot      release: id  1 | task 1 | stop processing: n_past = 530, truncated = 0")
    log.requests(Turn(1, 2, 520, 0, 8, 55.0, n_ctx_slot=16384))
    return log.text().encode()


def got(run: PerfRun) -> list[tuple[object, ...]]:
    return [(r.boot, r.slot, r.task, r.depth_start, r.depth_end, r.cached, r.truncated,
             r.decode_tokens) for r in run.requests]


WANT = [(0, 1, 12, 900, 940, 0, True, 40), (0, 0, 11, 3000, 3120, 0, False, 120),
        (0, 1, 13, 1300, 1364, 940, False, 64), (1, 0, 0, 700, 716, 0, False, 16),
        (1, 1, 2, 520, 528, 0, False, 8)]


def test_a_release_before_its_timing_keeps_the_depth() -> None:
    run = scan_stream("server.log", io.BytesIO(late_2024_log()))
    assert sorted(got(run)) == sorted(WANT)
    assert run.unfinished == 1  # the cancelled request only
    assert len(run.boots) == 2


@pytest.mark.parametrize("size", [1, 13, 200])
def test_chunked_reading_gives_the_same_run(size: int) -> None:
    data = late_2024_log()
    whole = scan_stream("server.log", io.BytesIO(data))
    s = PerfScanner("server.log")
    for i in range(0, len(data), size):
        s.feed(data[i:i + size])
    assert s.finish() == whole


def test_a_split_between_release_and_timing_is_joined(tmp_path: Path) -> None:
    data = late_2024_log()
    path = tmp_path / "server.log"
    path.write_bytes(data)
    whole = scan_stream(str(path), io.BytesIO(data))
    # every cut perfsplit.split_point may choose (none inside an older-shape block), those
    # between a release and its timing block among them
    lines = data.splitlines(keepends=True)
    cuts = [sum(map(len, lines[:k])) for k in range(1, len(lines))
            if not any(b"print_timing" in line for line in lines[max(0, k - 3):k])]
    assert sum(b"stop processing" in data[:cut].splitlines()[-1] for cut in cuts) == 6
    for cut in cuts:
        first = PerfScanner(str(path))
        perfsplit.read_range(first, str(path), 0, cut)
        half = perfsplit._second_half(str(path), cut, len(data), str(path))
        perfsplit.join(first, half)
        run = first.finish()
        assert sorted(got(run)) == sorted(WANT), cut
        assert run.unfinished == whole.unfinished, cut
