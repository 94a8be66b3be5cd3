"""Events lost from a trace (gaps in seq): said as ``events-lost``, and the pages whose slot
content the lost events may have changed are not judged (docs/trace-format.md, "Lost events").

The judgement finds the gaps (:mod:`kvdiag.analysis.judgement.gaps`); a streamed chunk marks
them by position (the C walk and the arrays), a list of events by the state between lists:
all must give the same verdicts.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvdiag import compiled
from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.gaps import SeqGaps
from kvdiag.analysis.judgement.judge import batches
from kvdiag.model import events as ev
from kvdiag.trace import make_header
from kvdiag.tui.shown import load_document, shown
from kvdiag.tui.summaries import overview
from tests.corpus import cli
from tests.native_cc import CC, KERNELS, TESTS_C
from tests.native_cc import build as build_c
from tests.native_cc import run as run_c
from tests.test_judgement_fastpath import _judged, _lists, _small_chunks, _trace


def _cut(events: list[Any], seed: int) -> tuple[list[Any], int]:
    """``events`` with some lost: single events here and there and one run of 25 (seqs kept).
    Returns the events kept and how many were lost between the first and last kept."""
    rng = random.Random(seed * 7 + 1)
    n = len(events)
    run = rng.randrange(n // 4, n // 2)
    lost = {i for i in range(1, n - 1) if rng.random() < 0.03} | set(range(run, run + 25))
    kept = [e for i, e in enumerate(events) if i not in lost]
    return kept, len(lost)


def _uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})


@pytest.mark.parametrize("seed", range(12))
def test_a_trace_with_events_lost_is_judged_alike_every_way(
        monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """GIVEN a random trace (every class, aliasing, ring cycling, evicts, invalidates) with
    events deleted: single ones and a run of 25
    WHEN it is judged page by page in lists, streamed (the C walk where built) and streamed
    by the arrays alone
    THEN every read's counts, non-exact runs, flows, the summary and the findings are equal,
    and the gaps are counted exactly."""
    events, lost = _cut(_trace(seed), seed)
    detailed = Judge(ledger=True, detail=True)
    for chunk in _lists(events):
        detailed.feed_all(chunk)
    want = _judged(detailed)
    snap = detailed.snapshot()
    assert snap.lost is not None and snap.lost["events"] == lost
    (finding,) = [f for f in snap.findings if f.rule == "events-lost"]
    assert finding.severity.name == "WARNING"
    assert f"{lost} event(s) missing from the trace" in finding.title
    _small_chunks(monkeypatch)
    assert _judged(Judge(ledger=True).feed_all(iter(events))) == want
    _uncompiled(monkeypatch)
    assert _judged(Judge(ledger=True).feed_all(iter(events))) == want


def test_the_gapped_matrix_leaves_pages_not_judged_and_judges_refilled_slots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is worth making: over the seeds, pages read after a gap from
    slots not refilled since are not judged (lost-events), and pages read from slots an
    upload refilled after the gap are judged again (exact, stale or foreign)."""
    not_judged = judged_after = 0
    for seed in range(12):
        events, _ = _cut(_trace(seed), seed)
        snap = Judge().feed_all(iter(events)).snapshot()
        res = snap.residency
        not_judged += res["not_judged"].get("lost-events", 0)
        first_gap = snap.lost["first"][0]["last_seq"] if snap.lost else 0
        later = [e for e in events if type(e) is ev.Read and e.seq > first_gap and e.served]
        judged_after += len(later)
        assert res["read_classes"]["exact"] + res["read_classes"]["foreign"] > 0
    assert not_judged > 100
    assert judged_after > 100


def _ev(cls: type, seq: int, step: int = 0, **fields: Any) -> Any:
    return cls(seq, seq * 10, step, **fields)


def test_a_slot_refilled_after_the_gap_is_judged_one_not_refilled_is_not() -> None:
    """GIVEN pages 0 and 1 uploaded to pool slots 0 and 1, then seqs 4-5 lost (they could
    have been an evict or an upload of another stream's page), then page 1 uploaded again
    WHEN page 0 and page 1 are read
    THEN page 0 is not judged (lost-events), page 1 is exact: its copy is after the gap."""
    events = [
        _ev(ev.Write, 1, layer=0, stream=0, cells=(0, 512), rows=(0, 512)),
        _ev(ev.Upload, 2, layer=0, stream=0, pages=(0, 1), slot=0, target="resident",
            bytes=1, reason="miss"),
        _ev(ev.Upload, 3, layer=0, stream=0, pages=(1, 2), slot=1, target="resident",
            bytes=1, reason="miss"),
        _ev(ev.Upload, 6, step=1, layer=0, stream=0, pages=(1, 2), slot=1, target="resident",
            bytes=1, reason="dirty"),
        _ev(ev.Read, 7, step=1, layer=0, stream=0, pool=2, ring=0, host=0,
            served=(ev.Served(0, 2, "pool", 0),)),
    ]
    for feed in ("list", "stream"):
        judge = Judge()
        if feed == "list":
            for e in events:
                judge.feed(e)
        else:
            judge.feed_all(iter(events))
        snap = judge.snapshot()
        assert snap.residency["read_classes"] == {"exact": 1, "stale": 0, "foreign": 0,
                                                  "not_judged": 1}, feed
        assert snap.residency["not_judged"] == {"lost-events": 1}
        assert snap.lost == {"events": 2, "gaps": 1, "declared_dropped": 0, "first": [
            {"first_seq": 4, "last_seq": 5, "events": 2, "step_before": 0, "step_after": 1,
             "onto_snapshot": False}]}
        (f,) = [f for f in snap.findings if f.rule == "events-lost"]
        assert f.title.startswith("2 event(s) missing from the trace: seq 4–5 (2 events) "
                                  "between step 0 and step 1;")
        assert "1 page(s) in 1 read(s)" in f.title
        assert f.evidence[0].seq == 6 and f.evidence[0].step == 1


def test_no_gap_no_finding_and_a_lost_start_is_said() -> None:
    """Seqs 1, 2, 3: nothing lost. A trace whose first event is seq 3 (not a snapshot) lost
    seqs 1-2 before it; one whose first event is a segment's snapshot lost nothing."""
    w = [_ev(ev.Write, s, layer=0, stream=0, cells=(0, 1), rows=(0, 1)) for s in (1, 2, 3)]
    snap = Judge().feed_all(iter(w)).snapshot()
    assert snap.lost is None and snap.summary()["lost_events"] == {"events": 0, "gaps": 0}
    assert not [f for f in snap.findings if f.rule == "events-lost"]
    snap = Judge().feed_all(w[2:]).snapshot()
    assert snap.lost is not None and snap.lost["first"][0]["first_seq"] == 1
    assert snap.lost["first"][0]["step_before"] is None
    (f,) = [f for f in snap.findings if f.rule == "events-lost"]
    assert "seq 1–2 (2 events) before the first event" in f.title
    snapshot = _ev(ev.Snapshot, 40, reason="rotate")
    snap = Judge().feed_all([snapshot, _ev(ev.Write, 41, layer=0, stream=0, cells=(0, 1),
                                           rows=(0, 1))]).snapshot()
    assert snap.lost is None


def test_a_lost_seq_hidden_behind_a_repeated_line_is_said() -> None:
    """GIVEN seqs 1, 2, 3, 5, 5, 6 in one block (seq 4 lost, the line of seq 5 repeated: the
    count of the block and its first and last seq are those of a whole run) WHEN judged as a
    list and as a stream THEN seq 4 is said lost (the reader's "sequence" problem names the
    repeated line; the gap is the judgement's to say)."""
    seqs = (1, 2, 3, 5, 5, 6)
    w = [_ev(ev.Write, s, layer=0, stream=0, cells=(0, 1), rows=(0, 1)) for s in seqs]
    for fed in (w, iter(w)):
        snap = Judge().feed_all(fed).snapshot()
        assert snap.lost is not None and snap.lost["events"] == 1, fed
        assert snap.lost["first"][0]["first_seq"] == snap.lost["first"][0]["last_seq"] == 4


def test_batches_start_a_list_wherever_the_judge_finds_a_gap() -> None:
    """GIVEN seqs lost, repeated and out of order at random WHEN cut into lists by
    ``batches`` (as trace export, trace pages, sql and diff feed the Judge) THEN every gap the
    Judge finds (SeqGaps.split) is before the first event of a list, never inside one: a read
    before it would be left unanswered (trace export stopped with an internal error on a
    trace with two lines swapped where lines were lost)."""
    rng = random.Random(5)
    for _ in range(400):
        seqs = list(range(1, 60))
        for _ in range(rng.randrange(4)):
            del seqs[rng.randrange(len(seqs))]
        for _ in range(rng.randrange(4)):
            i, j = rng.randrange(len(seqs)), rng.randrange(len(seqs))
            seqs[i], seqs[j] = seqs[j], seqs[i]
        for _ in range(rng.randrange(3)):
            i = rng.randrange(len(seqs))
            seqs.insert(i, seqs[i])
        events = [_ev(ev.Write, s, layer=0, stream=0, cells=(0, 1), rows=(0, 1)) for s in seqs]
        gaps = SeqGaps(None)
        for chunk in batches(events, rng.choice([3, 5, 8, 64])):
            assert all(i == 0 for _, i in gaps.split(chunk)), seqs


# -- the commands, on a native trace (kernels/kvtrace.h) and a model capture ----------------


def _without(src: Path, dst: Path, drop: Callable[[int, bytes], bool]) -> int:
    """``src`` with the lines ``drop(line number, line)`` says (the header is line 1, never
    dropped): how many were dropped."""
    lines = src.read_bytes().splitlines(keepends=True)
    kept = [lines[0]] + [line for i, line in enumerate(lines[1:], 2) if not drop(i, line)]
    dst.write_bytes(b"".join(kept))
    return len(lines) - len(kept)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``kvtrace_bench gen 12000`` (benchmarks/bench_native.py's workload; stream 0 reads
    foreign pages from step 256 on) through kvtrace.h."""
    if CC is None:
        pytest.skip("no C compiler here")
    root = tmp_path_factory.mktemp("native")
    exe = root / "kvtrace_bench"
    build_c([CC, "-std=c99", "-O2", "-I", str(KERNELS), str(TESTS_C / "kvtrace_bench.c"), "-o",
             str(exe)])
    proc = run_c(exe, root, "gen", "12000", trace="gen.kvtrace")
    assert proc.returncode == 0, proc.stderr
    return root / "gen.kvtrace"


def _check(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out = cli("check", "--json", str(path), *args)
    return code, json.loads(out)


def test_a_native_trace_without_its_write_lines_says_every_event_lost(
        native: Path, tmp_path: Path) -> None:
    """GIVEN a kvtrace.h trace that declares writes, with every write line deleted (the case
    that was judged exact throughout)
    WHEN it is checked
    THEN events-lost (warning) counts exactly the lines deleted, the pages read from slots not
    refilled since a gap are not judged, and none is foreign any more; the whole trace has no
    such finding and its lost_events summary is empty."""
    code, whole = _check(native)
    assert whole["summary"]["lost_events"] == {"events": 0, "gaps": 0}
    assert "events-lost" not in [f["rule"] for f in whole["findings"]]
    classes = whole["summary"]["residency"]["read_classes"]
    assert classes["foreign"] > 0 and classes["not_judged"] == 0
    cut = tmp_path / "nowrite.kvtrace"
    n = _without(native, cut, lambda _i, line: b'"kind":"write"' in line)
    assert n > 100
    code, doc = _check(cut, "--fail-on", "warning")
    assert code == 1
    (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
    assert f["severity"] == "warning"
    assert f["title"].startswith(f"{n} event(s) missing from the trace: seq 4 (1 event) in "
                                 "step 0;")
    assert f["details"]["events"] == n and f["details"]["gaps"] == n
    assert f["details"]["evidence_shown"] == 20 and f["details"]["evidence_left_out"] == n - 20
    lost = doc["summary"]["lost_events"]
    assert lost["events"] == n and lost["first"][0]["first_seq"] == 4
    res = doc["summary"]["residency"]
    assert res["read_classes"]["foreign"] == 0
    assert res["read_classes"]["not_judged"] == res["not_judged"]["lost-events"] > 0
    assert res["read_classes"]["not_judged"] + res["read_classes"]["exact"] == sum(
        classes.values())
    assert "foreign-page-read" not in [f["rule"] for f in doc["findings"]]


def test_a_run_of_lines_deleted_mid_trace_is_one_gap_on_every_surface(
        native: Path, tmp_path: Path) -> None:
    """GIVEN the native trace with lines 1001-1100 deleted (seqs 1000-1099)
    THEN check (JSON and text), trace validate, trace info, diff against the whole trace and
    the Chrome export say the same 100 events, seq 1000-1099."""
    cut = tmp_path / "cut.kvtrace"
    assert _without(native, cut, lambda i, _line: 1001 <= i <= 1100) == 100
    code, doc = _check(cut)
    (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
    assert "100 event(s) missing from the trace: seq 1000–1099 (100 events)" in f["title"]
    assert f["evidence"][0]["seq"] == 1100
    assert doc["summary"]["lost_events"]["first"] == [
        {"first_seq": 1000, "last_seq": 1099, "events": 100,
         "step_before": f["details"]["first"][0]["step_before"],
         "step_after": f["evidence"][0]["step"], "onto_snapshot": False}]
    said = ("100 event(s) lost from the trace (gaps in seq: seq 1000–1099); every verdict "
            "from seq 1000 on rests on an incomplete record")
    _, text = cli("check", str(cut))
    assert said in " ".join(text.split())
    code, out = cli("trace", "validate", str(cut))
    assert code == 1  # the End's event count: a format problem of its own
    assert f"{cut}: {said} (not a format problem" in out
    _, out = cli("trace", "info", "--json", str(cut))
    assert json.loads(out)["judgement"]["lost_events"]["events"] == 100
    # the lines lost held step events: the schedules differ there (compared with --force)
    code, out = cli("diff", "--json", "--force", str(native), str(cut))
    ends = json.loads(out)["ends"]
    assert ends["a"]["lost_events"]["events"] == 0 and ends["b"]["lost_events"]["events"] == 100
    _, out = cli("diff", "--force", str(native), str(cut))
    assert f"B: {said}" in out
    chrome = tmp_path / "cut.json"
    cli("trace", "export", str(cut), "-o", str(chrome))
    marks = [e for e in json.loads(chrome.read_text())
             if e.get("cat") == "events-lost"]
    assert [m["name"] for m in marks] == [said]
    assert marks[0]["args"]["first"][0]["first_seq"] == 1000


def test_a_valid_trace_validates_without_a_lost_line(native: Path) -> None:
    code, out = cli("trace", "validate", str(native))
    assert code == 0 and "lost" not in out


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model capture of slot1-first (shared layout: stream 1 reads foreign pages)."""
    path = tmp_path_factory.mktemp("model") / "m.kvtrace"
    code, _ = cli("capture", "--scenario", "slot1-first", "--preset", "small", "--layers", "2",
                  "--n-head", "4", "--prompt-tokens", "300", "--steps", "4", "--executor",
                  "numpy", "-o", str(path))
    assert code == 0
    return path


def test_a_model_capture_that_lost_half_its_uploads_calls_no_page_foreign(
        model: Path, tmp_path: Path) -> None:
    """GIVEN a model capture (10 foreign pages) with every other upload line deleted
    THEN no page is called foreign on a lost copy's account: the pages read from slots whose
    last copy went before a gap are not judged (lost-events; a read before the first upload
    left: upload), the rest judged; events-lost counts the uploads; the TUI's Overview and
    findings say the same."""
    _, whole = _check(model)
    before = whole["summary"]["residency"]
    assert before["read_classes"]["foreign"] == 10
    assert whole["summary"]["lost_events"]["events"] == 0
    cut = tmp_path / "half.kvtrace"
    lines = model.read_bytes().splitlines()
    ups = [i for i, line in enumerate(lines, 1) if b'"kind":"upload"' in line]
    gone = set(ups[1::2])
    n = _without(model, cut, lambda i, _line: i in gone)
    assert n == len(gone) == 17
    _, doc = _check(cut)
    res = doc["summary"]["residency"]
    assert res["read_classes"] == {"exact": 13, "stale": 0, "foreign": 0, "not_judged": 47}
    assert res["not_judged"] == {"upload": 2, "lost-events": 45}
    assert doc["summary"]["lost_events"]["events"] == n
    rules = [f["rule"] for f in doc["findings"]]
    assert "events-lost" in rules and "foreign-page-read" not in rules
    seen = shown(str(cut), steps=[0])
    assert seen.lost_events == n and "events-lost" in seen.findings
    console = Console(width=200, file=io.StringIO())
    console.print(overview(load_document(str(cut))))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"{n} event(s) lost from the trace (gaps in seq: seq " in text


def test_a_flight_recorder_that_dropped_events_is_said_to_have_lost_them() -> None:
    """GIVEN a flight recorder's window whose header counts 2 events dropped (kvtrace.h's
    ``extra.segment.dropped``: the window's snapshot did not fit, and events that no longer
    fit were left out with their seqs used) and a gap of 2 in it
    THEN events-lost says the 2 events and that the writer declares them dropped; a jump onto
    a snapshot inside a rotated set is the set's gap problem, not this finding."""
    segment = {"run": "1-2", "first_seq": 1, "mode": "flight-recorder", "dropped": 2}
    header = make_header("native", ev.Device(name="cpu"), extra={"segment": segment})
    w = [_ev(ev.Write, s, layer=0, stream=0, cells=(0, 1), rows=(0, 1)) for s in (1, 2, 5)]
    snap = Judge(header).feed_all(iter(w)).snapshot()
    (f,) = [f for f in snap.findings if f.rule == "events-lost"]
    assert f.title.startswith("2 event(s) missing from the trace (the writer declares 2 "
                              "event(s) dropped: its flight recorder was full): seq 3–4")
    assert f.details["declared_dropped"] == 2
    rotated = make_header("native", ev.Device(name="cpu"), extra={"segment": {
        "run": "1-2", "first_seq": 1, "mode": "rotate", "index": 1}})
    events = [w[0], w[1], _ev(ev.Snapshot, 9, reason="rotate"),
              _ev(ev.Write, 10, layer=0, stream=0, cells=(0, 1), rows=(0, 1))]
    assert Judge(rotated).feed_all(iter(events)).snapshot().lost is None
    # in a file that is no rotated set, the same jump onto a snapshot lost 6 events
    lost = Judge(header).feed_all(iter(events)).snapshot().lost
    assert lost is not None and lost["first"][0]["onto_snapshot"] is True
