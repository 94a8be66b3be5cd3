"""A request read in one match gives what reading its lines one by one gives
(kvdiag/postmortem/timinglines.py ``SLOT_LINES`` against ``LINE_BY_LINE``)."""

from __future__ import annotations

import random

import pytest
from server_logs import ServerLog, Turn, adapt_line, partition_line, session

from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfscan, timinglines
from kvdiag.postmortem.perfscan import PerfScanner


def read(text: str, block: int) -> PerfRun:
    scanner = PerfScanner("server.log")
    data = text.encode()
    for i in range(0, len(data), block):
        scanner.feed(data[i:i + block])
    return scanner.finish()


def both(text: str, monkeypatch: pytest.MonkeyPatch, block: int = 1 << 20) -> PerfRun:
    fast = read(text, block)
    with monkeypatch.context() as m:
        m.setattr(perfscan, "SLOT_LINES", timinglines.LINE_BY_LINE)
        slow = read(text, block)
    assert fast == slow
    return fast


def varied_log(seed: int, shape: str, outer: str) -> str:
    rng = random.Random(seed)
    log = ServerLog(shape=shape, outer=outer)  # type: ignore[arg-type]
    task = 0
    for _boot in range(rng.randint(1, 2)):
        log.boot(np=2)
        for _ in range(rng.randint(3, 8)):
            during = tuple(rng.choice([adapt_line(rng.randint(100, 9000), 10, 4, 64, 3, 40.0, 9),
                                       partition_line(12, 10, 4, 6, 31.5, 72.0)])
                           for _ in range(rng.choice([0, 0, 1, 2])))
            turns = [Turn(0, task, depth_start=rng.randint(600, 60000), cached=rng.choice(
                [0, 512]), decode_tokens=rng.randint(0, 900), decode_tps=rng.uniform(8, 40),
                truncated=rng.random() < 0.2, graphs=rng.choice([None, rng.randint(0, 999)]),
                during=during)]
            task += 1
            if rng.random() < 0.4:  # a second slot at the same time: the lines interleave
                turns.append(Turn(1, task, depth_start=rng.randint(600, 9000), cached=0,
                                  decode_tokens=rng.randint(1, 300), decode_tps=20.0))
                task += 1
            log.requests(*turns)
            if rng.random() < 0.3:
                log.line("kv_stream_adapt: " + adapt_line(rng.randint(100, 9000), 8, 6)[17:],
                         "W")
    return log.text()


@pytest.mark.parametrize("shape", ["newer", "older"])
@pytest.mark.parametrize("outer", ["none", "router", "journald"])
@pytest.mark.parametrize("seed", range(4))
def test_whole_requests_read_as_line_by_line(shape: str, outer: str, seed: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    text = varied_log(seed, shape, outer)
    run = both(text, monkeypatch)
    assert run.requests and run.problems == ()
    # read in small blocks too: a request cut between blocks is read line by line
    assert both(text, monkeypatch, block=997) == run


def test_a_session_is_read_one_match_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server with one slot busy prints each request's lines in a row: one match each."""
    turns = session(12, 8000, 750, [24.0] * 12)
    log = ServerLog(shape="newer")
    log.boot()
    for t in turns:
        log.requests(t)
    text = log.text()
    run = both(text, monkeypatch)
    assert len(run.requests) == 12
    matches = list(timinglines.SLOT_LINES.finditer(text.encode()))
    assert len(matches) == 12
    assert all(m.group("whole") is not None for m in matches)
    # a kv-stream line in the middle of a request: that request is read line by line, and
    # the line is one of its notes
    log = ServerLog(shape="older")
    log.boot()
    log.requests(*turns[:2])
    log.requests(Turn(0, 99, 20000, 0, 40, 9.5,
                      during=(partition_line(80, 60, 8, 28, 12.0, 90.0),)))
    run = both(log.text(), monkeypatch)
    assert [len(r.notes) for r in run.requests] == [0, 0, 1]
    assert run.notes[0].kind == "repartition"


def test_a_log_of_every_form_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Newer and older shapes in one log (a server upgraded between boots)."""
    parts = [varied_log(9, "older", "none"), varied_log(10, "newer", "none")]
    run = both("".join(parts), monkeypatch)
    assert len({r.boot for r in run.requests}) >= 2
