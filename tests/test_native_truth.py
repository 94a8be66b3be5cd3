"""kvrt, a C kv-stream runtime written for the tests, judges every page it reads from the bytes
in the slot (its truth file); ``kvdiag check`` judges the same reads from the trace alone. For
each run the two must count the same exact, stale and foreign pages (issue 15).

The ring-reuse run is the case check got wrong before the judgement (issue 15): a ring slot
reused by another layer within one step holds that layer's bytes (foreign), while check's old
rule -- the last ring copy of the page in the same step -- called the read exact or stale
(147/51/0 exact/stale/foreign where the bytes say 93/17/88). The judgement follows what each
slot holds; tests/test_corpus.py compares every page, and every surface, with this truth.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from native_runtime import (
    CONFIGS,
    Built,
    RuntimeRun,
    counts,
    prefix_through,
    run,
)

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    main(["check", "--json", str(path)])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _classes(doc: dict[str, Any]) -> dict[str, int]:
    rc = doc["summary"]["residency"]["read_classes"]
    return {k: rc[k] for k in ("exact", "stale", "foreign")}


def _events(path: Path) -> tuple[TraceReader, list[Any]]:
    reader = TraceReader.open(path)
    return reader, list(reader)


def _judged(result: RuntimeRun, tmp_path: Path) -> Path:
    """The trace check must judge to match the truth: all of it, or for a killed run the part
    the truth covers."""
    if result.name != "kill":
        return result.trace
    last = max(t.seq for t in result.truth)
    return prefix_through(result.trace, last, tmp_path / "covered.kvtrace")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_check_counts_the_pages_the_runtime_read(name: str, kvrt: Built, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    result = run(name, tmp_path, kvrt)
    assert result.truth, result.stderr
    reads_in_truth = {t.seq for t in result.truth}
    _, events = _events(result.trace)
    trace_reads = {e.seq for e in events if isinstance(e, ev.Read)}
    assert reads_in_truth <= trace_reads  # every judged read is in the trace, by its seq
    assert _classes(_check(_judged(result, tmp_path), capsys)) == result.counts()


# -- what each run is: the truth is not trivial, and the trace says what happened --------------


def test_ring_reuse_reads_other_layers_bytes(kvrt: Built, tmp_path: Path) -> None:
    result = run("ring-reuse", tmp_path, kvrt)
    ring = [t for t in result.truth if t.source == "ring"]
    foreign = [t for t in ring if t.cls == "foreign"]
    assert foreign and all(t.holder is not None and t.holder[1] != t.layer for t in foreign)
    assert all(t.holder is not None and t.holder[0] == t.stream for t in foreign)
    # the case: the page was also written after its ring copy, so a rule that judges
    # the copy instead of the slot calls it stale
    assert any(t.cls == "stale" for t in ring)
    assert all(t.cls == "exact" for t in result.truth if t.source == "pool")


def test_a_read_with_more_ring_pages_than_slots(kvrt: Built, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Six ring pages through four ring slots. Prefetched before the FA node is dispatched
    (ring-overrun), a view's pages 6-7 replace its pages 2-3: the read finds the view's own
    later pages (foreign) — found rotating a --forever run, where check called them exact.
    Copied while the attention runs (ring-cycle), each slot is reused once its page is
    consumed: every page exact, in check as in the bytes."""
    overrun = run("ring-overrun", tmp_path / "overrun", kvrt)
    own = [t for t in overrun.truth if t.cls == "foreign" and t.holder is not None
           and t.holder[:2] == (t.stream, t.layer)]
    assert own and all(t.source == "ring" and t.holder is not None and t.holder[2] == t.page + 4
                       for t in own)
    assert _classes(_check(overrun.trace, capsys)) == overrun.counts()
    cycle = run("ring-cycle", tmp_path / "cycle", kvrt)
    per_read = Counter(t.seq for t in cycle.truth if t.source == "ring")
    assert max(per_read.values()) == 6  # more ring pages than the 4 ring slots
    assert cycle.counts() == {"exact": len(cycle.truth), "stale": 0, "foreign": 0}
    assert _classes(_check(cycle.trace, capsys)) == cycle.counts()


def test_slot1_first_reads_the_other_streams_bytes(kvrt: Built, tmp_path: Path) -> None:
    result = run("slot1-first", tmp_path, kvrt)
    c = result.counts()
    assert c["stale"] > 0 and c["foreign"] > 0
    for t in result.truth:
        if t.cls == "foreign":  # the shared (layer, page) slot holds the other stream's page
            assert t.holder == (1 - t.stream, t.layer, t.page)
        if t.cls == "stale":
            assert t.holder == (t.stream, t.layer, t.page) and t.writes_old > 0


def test_two_threads_write_one_trace(kvrt: Built, tmp_path: Path) -> None:
    result = run("threads", tmp_path, kvrt)
    assert result.returncode == 0
    reader, events = _events(result.trace)
    assert reader.problems == []
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    steps = [e.streams for e in events if isinstance(e, ev.Step)]
    assert steps[:4] == [(1,), (0,), (1,), (0,)]  # the two threads' ubatches interleave
    assert counts(result.truth)["foreign"] > 0


def test_a_cxx_shared_object_writes_into_the_same_trace(kvrt: Built, tmp_path: Path) -> None:
    result = run("dso", tmp_path, kvrt)
    reader, events = _events(result.trace)
    assert reader.problems == []
    assert reader.header.records is not None and "learn" not in reader.header.records
    [records] = [e for e in events if isinstance(e, ev.Records)]
    assert records.kinds == ("learn",)  # declared when the object was loaded
    learns = [e for e in events if isinstance(e, ev.Learn)]
    assert sorted(e.layer for e in learns) == [0, 1, 2]
    assert records.seq < learns[0].seq
    assert any(isinstance(e, ev.Upload) and e.target == "ring" for e in events)


def test_abort_is_on_disk_before_the_process_dies(kvrt: Built, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = run("abort", tmp_path, kvrt)
    assert result.returncode == -signal.SIGABRT
    reader, events = _events(result.trace)
    assert reader.problems == []  # the end event is there: no trace-incomplete
    fits, abort, end = events[-3:]
    assert isinstance(fits, ev.Fits) and fits.route == "abort" and not fits.result
    assert fits.failed == ("Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1")  # kvrt spells Q->ne[3] == 1
    assert isinstance(abort, ev.Abort)
    assert abort.condition == "ggml_cuda_kv_stream_fattn_fits(dst)"
    assert isinstance(end, ev.End) and end.status == "aborted"
    rules = {f["rule"] for f in _check(result.trace, capsys)["findings"]}
    assert {"abort", "fits-dispatch-mismatch"} <= rules


def test_sigkill_leaves_a_readable_trace(kvrt: Built, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    result = run("kill", tmp_path, kvrt)
    assert result.returncode == -signal.SIGKILL
    reader, events = _events(result.trace)
    assert [p.kind for p in reader.problems] == ["incomplete"]
    assert len(result.truth) >= 3000
    assert max(t.seq for t in result.truth) <= events[-1].seq
    doc = _check(result.trace, capsys)
    assert "trace-incomplete" in {f["rule"] for f in doc["findings"]}
    judged = sum(_classes(doc).values())
    assert judged >= len(result.truth)  # all the truth saw, maybe one read more


def test_the_fixed_runtime_is_clean(kvrt: Built, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    result = run("fixed", tmp_path, kvrt)
    assert result.returncode == 0
    assert result.counts()["stale"] == result.counts()["foreign"] == 0
    assert any(t.source == "host" for t in result.truth)  # the fallback read the host store
    _, events = _events(result.trace)
    warns = [e for e in events if isinstance(e, ev.Warn)]
    assert warns and {(w.code, w.layer) for w in warns} == {
        ("kv-stream-fallback", 0), ("kv-stream-fallback", 1), ("kv-stream-fallback", 2)}
    doc = _check(result.trace, capsys)
    assert {f["rule"] for f in doc["findings"]} == {"fallback"}
    assert not doc["failing"]


def test_unevaluated_fits_are_evaluated_from_the_geometry(kvrt: Built, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """kvrt logs real f16 views (strides, runtimes, mask) and no failed names: kvdiag's
    predicate finds exactly the stream-count conditions kvrt's own predicate tests."""
    result = run("unevaluated", tmp_path, kvrt)
    _, events = _events(result.trace)
    fits = [e for e in events if isinstance(e, ev.Fits)]
    assert fits and all(not f.evaluated and f.failed == () for f in fits)
    [finding] = [f for f in _check(result.trace, capsys)["findings"] if f["rule"] == "fallback"]
    assert finding["title"].endswith(
        "failed: Q.ne[3]==1 (Q.ne[3]=2), K.ne[3]==1 (K.ne[3]=2), V.ne[3]==1 (V.ne[3]=2); "
        "evaluated by kvdiag from the logged geometry (1 condition(s) not evaluable: fields "
        "not recorded)")
    # a trace never records attention sinks (the judgement's fits docstring)
    assert finding["details"]["not_evaluable"] == ["sinks==NULL"]
