"""Reading a log in two halves at once gives the run reading it whole gives
(kvdiag/postmortem/perfsplit.py)."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from server_logs import ServerLog, Turn, adapt_line, partition_line

from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfread, perfsplit
from kvdiag.postmortem.perfread import scan_stream
from kvdiag.postmortem.perfscan import PerfScanner
from kvdiag.postmortem.timinglines import OLD_HEADER


def busy_log(shape: str) -> str:
    """Two boots, two slots interleaved, kv-stream lines in flight, a request that never ends."""
    log = ServerLog(shape=shape)  # type: ignore[arg-type]
    log.boot(np=2, stage_mib=1024)
    for k in range(4):
        during = (adapt_line(9000 + 800 * k, 30 - k, 12 + k, samples=50, misses=k, busy=40.0,
                             peak=5), partition_line(30 - k, 29 - k, 12 + k, 13 + k, 2.0, 40.0))
        log.requests(Turn(0, 2 * k, 9000 + 800 * k, 8000 if k else 0, 40 + k, 20.0 + k,
                          graphs=100 * k, during=during),
                     Turn(1, 2 * k + 1, 3000 + 100 * k, 0, 30, 25.0 - k, graphs=100 * k + 50,
                          truncated=k == 3))
    log.line("slot update_slots: id  1 | task 99 | new prompt, n_ctx_slot = 65536, n_keep = 0, "
             "task.n_tokens = 500")
    log.boot(np=1, stage_mib=None)
    for k in range(3):
        log.requests(Turn(0, k, 2000 + 500 * k, 0, 20, 30.0 + k))
    return log.text()


def normal(run: PerfRun) -> PerfRun:
    """Requests in the order they began (two halves may close them in another order)."""
    return msgspec.structs.replace(run, requests=tuple(sorted(
        run.requests, key=lambda r: (r.boot, r.started or 0, r.line))))


@pytest.mark.parametrize("shape", ["newer", "older"])
def test_every_cut_gives_the_whole_run(tmp_path: Path, shape: str) -> None:
    text = busy_log(shape)
    path = tmp_path / "busy.log"
    path.write_bytes(text.encode())
    whole = normal(scan_stream(str(path), io.BytesIO(text.encode())))
    assert len(whole.requests) == 11 and whole.unfinished == 1 and len(whole.boots) == 2
    data = text.encode()
    starts = [i + 1 for i, b in enumerate(data) if b == 10][:-1]
    cuts = 0
    for cut in starts:
        before = data[:cut]
        tail_start = cut
        for _ in range(3):
            tail_start = before.rfind(b"\n", 0, tail_start - 1) + 1
        if OLD_HEADER.search(before, tail_start):
            continue  # split_point never cuts there
        first = PerfScanner(str(path))
        perfsplit.read_range(first, str(path), 0, cut)
        half = perfsplit._second_half(str(path), cut, len(data), str(path))
        perfsplit.join(first, half)
        run = normal(first.finish())
        assert run == whole, cut
        cuts += 1
    assert cuts > 100


def test_the_second_process_reads_the_second_half(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text = busy_log("older")
    path = tmp_path / "busy.log"
    path.write_bytes(text.encode())
    whole = normal(scan_stream(str(path), io.BytesIO(text.encode())))
    monkeypatch.setattr(perfsplit, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(perfsplit, "spare_core", lambda: True)
    calls: list[int] = []
    real = perfsplit._collect

    def collect(proc):  # type: ignore[no-untyped-def]
        half = real(proc)
        calls.append(0 if half is None else 1)
        return half

    monkeypatch.setattr(perfsplit, "_collect", collect)
    with open(path, "rb") as fh:
        run = perfread.scan_stream(str(path), fh)
    assert calls == [1]  # the child process answered
    assert normal(run) == whole


def test_a_half_whose_columns_disagree_is_read_again(tmp_path: Path) -> None:
    """The second process's requests come as one list per field; lists of different lengths
    (a broken answer) are refused, so the first process reads that half itself."""
    path = tmp_path / "busy.log"
    path.write_bytes(busy_log("older").encode())
    size = path.stat().st_size
    cut = perfsplit.split_point(str(path), size)
    half = perfsplit._second_half(str(path), cut, size, str(path))
    assert len(half.requests[0]) > 1

    class Answer:
        returncode = 0

        def __init__(self, half: perfsplit.Half) -> None:
            self.out = msgspec.msgpack.encode(half)

        def communicate(self) -> tuple[bytes, None]:
            return self.out, None

    good = perfsplit._collect(Answer(half))  # type: ignore[arg-type]
    assert good is not None and good.requests[1] == half.requests[1]
    short = msgspec.structs.replace(half, requests=(half.requests[0][:-1], *half.requests[1:]))
    assert perfsplit._collect(Answer(short)) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["text", "json"])
def test_every_cut_of_a_2024_log_gives_the_whole_run(tmp_path: Path, form: str) -> None:
    """The 2024 form has no ``new prompt``: a task's first line opens its request, in either
    half (tests/test_perf_log2024.py)."""
    from test_perf_log2024 import request

    keys = ("id_slot", "id_task")
    a = request(form, keys, 0, 7, cached=512, prompt=(812.5, 3488), decode=(9375.0, 250),
                n_past=4250)
    b = request(form, keys, 1, 8, cached=0, prompt=(95.0, 190), decode=(3000.0, 60),
                n_past=250, truncated=True)
    c = request(form, keys, 0, 9, cached=4250, prompt=(40.0, 100), decode=(900.0, 30),
                n_past=4380)
    lines = [x for pair in zip(a, b, strict=True) for x in pair] + c
    lines.insert(5, "kv_stream_adapt: " + partition_line(30, 29, 12, 13, 2.0, 40.0)[17:])
    text = "\n".join(lines) + "\n"
    path = tmp_path / "old.log"
    path.write_bytes(text.encode())
    whole = normal(scan_stream(str(path), io.BytesIO(text.encode())))
    assert [r.task for r in whole.requests] == [7, 8, 9] and whole.unfinished == 0
    data = text.encode()
    for cut in [i + 1 for i, ch in enumerate(data) if ch == 10][:-1]:
        first = PerfScanner(str(path))
        perfsplit.read_range(first, str(path), 0, cut)
        half = perfsplit._second_half(str(path), cut, len(data), str(path))
        perfsplit.join(first, half)
        assert normal(first.finish()) == whole, cut
