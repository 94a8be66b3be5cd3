"""Events lost where no seq shows it (issue 15 §3): lines deleted and the rest numbered again,
so no seq jumps, while the End event still counts every event written. The judgement records
the difference as lost events whose place is unknown — one fact, ``lost_events.unplaced``
(kvdiag/analysis/judgement/gaps.py, ``SeqGaps.ended``) — and every surface says it: the
``events-lost`` finding, check's text, JSON and SARIF, ``trace info``, ``trace validate``,
``diff``'s ``lost-events`` verdict, the Chrome export and the TUI (docs/trace-format.md,
"Lost events"). The page classes are kept, and said to rest possibly on missing events.
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
from textual.pilot import Pilot

from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.gaps import lost_text
from kvdiag.model import events as ev
from kvdiag.report.check import residency_table
from kvdiag.trace import make_header
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.shown import load_document, shown
from kvdiag.tui.summaries import overview
from tests.corpus import cli
from tests.test_tui_pilot import drive, show, text


def _renumbered(src: Path, dst: Path, drop: Callable[[int, dict[str, Any]], bool]) -> int:
    """``src`` without the event lines ``drop(line number, event)`` says, the rest numbered
    1..n again (the End too, so no seq jumps) and the End's ``events`` kept as written: a
    hand edit or a tool that re-sequences. Returns how many lines were dropped."""
    lines = src.read_bytes().splitlines(keepends=True)
    out, seq, dropped = [lines[0]], 0, 0
    for i, line in enumerate(lines[1:], 2):
        e = json.loads(line)
        if e["kind"] != "end" and drop(i, e):
            dropped += 1
            continue
        seq += 1
        e["seq"] = seq
        out.append(json.dumps(e, separators=(",", ":")).encode() + b"\n")
    dst.write_bytes(b"".join(out))
    return dropped


def _random(seed: int, share: float) -> Callable[[int, dict[str, Any]], bool]:
    rng = random.Random(seed)
    return lambda _i, _e: rng.random() < share


def _check(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out = cli("check", "--json", str(path), *args)
    return code, json.loads(out)


def _wide(renderable: Any) -> str:
    console = Console(width=400, file=io.StringIO())
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def _cell(out: str, label: str) -> str:
    """The value of a two-column table's row ``label`` in a text report, its wrapped lines
    joined."""
    value: list[str] | None = None
    for line in out.splitlines():
        parts = line.split("│")
        if len(parts) < 4:
            continue
        name, cell = parts[1].strip(), parts[2].strip()
        if name == label:
            value = [cell]
        elif value is not None and not name:
            value.append(cell)
        elif value is not None:
            break
    assert value is not None, f"no row {label!r} in:\n{out}"
    return " ".join(value)


def _end_count(path: Path) -> int:
    last = json.loads(path.read_bytes().splitlines()[-1])
    assert last["kind"] == "end"
    return int(last["events"])


@pytest.fixture(scope="module")
def kvrt_trace(kvrt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvrt's slot1-first run (tests/native_runtime.py): a native trace through kvtrace.h that
    declares what it records, 33 uploads among its 165 events."""
    from native_runtime import run

    result = run("slot1-first", tmp_path_factory.mktemp("kvrt"), kvrt)
    assert result.returncode == 0, result.stderr
    return result.trace


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model capture of pool-pressure: 28 pages read, 10 from the pool and 18 through the
    ring, all exact; 12 uploads among its 63 events."""
    path = tmp_path_factory.mktemp("model") / "pp.kvtrace"
    code, _ = cli("capture", "--scenario", "pool-pressure", "--preset", "small", "--layers",
                  "2", "--n-head", "4", "--prompt-tokens", "600", "--steps", "3", "--executor",
                  "numpy", "-o", str(path))
    assert code == 0
    return path


def test_a_trace_whose_end_count_matches_has_no_such_loss(kvrt_trace: Path, model: Path,
                                                           tmp_path: Path) -> None:
    """GIVEN the native trace and the model capture as written, and the native trace without
    its uploads numbered again with the End's count made to match (as the one-truth corpus
    strips a kind: tests/corpus.py ``strip``)
    THEN no events-lost finding, ``lost_events`` empty, and the completeness line says every
    judged kind without qualification."""
    for path in (kvrt_trace, model):
        _, doc = _check(path)
        assert doc["summary"]["lost_events"] == {"events": 0, "gaps": 0}
        assert "events-lost" not in [f["rule"] for f in doc["findings"]]
    fixed = tmp_path / "fixed.kvtrace"
    n = _renumbered(kvrt_trace, fixed, lambda _i, e: e["kind"] == "upload")
    lines = fixed.read_bytes().splitlines()
    end = json.loads(lines[-1])
    end["events"] = end["seq"] - 1
    fixed.write_bytes(b"\n".join([*lines[:-1], json.dumps(end).encode()]) + b"\n")
    assert n == 33 and end["events"] == 132
    _, doc = _check(fixed)
    assert doc["summary"]["lost_events"] == {"events": 0, "gaps": 0}
    assert "events-lost" not in [f["rule"] for f in doc["findings"]]
    _, out = cli("check", str(fixed))
    assert "every judged kind " in " ".join(out.split()) and "yet" not in out


def test_a_native_trace_without_its_uploads_renumbered_says_the_loss_everywhere(
        kvrt_trace: Path, tmp_path: Path) -> None:
    """GIVEN kvrt's trace with every upload line deleted and the rest numbered 1..133 (the End
    keeps its count, 165): no seq jumps
    THEN check says 33 events lost, place unknown (warning events-lost, exit 1 under
    ``--fail-on warning``), keeps the 132 foreign pages and says they may rest on the missing
    events; JSON carries ``unplaced`` with ``place: unknown``; check's text, trace info
    (text and JSON), trace validate, the Chrome export and the TUI's Overview say the same
    line; SARIF has the finding."""
    cut = tmp_path / "noupload.kvtrace"
    assert _renumbered(kvrt_trace, cut, lambda _i, e: e["kind"] == "upload") == 33
    code, doc = _check(cut, "--fail-on", "warning")
    assert code == 1
    unplaced = {"events": 33, "end_count": 165, "accounted": 132, "here": 132,
                "end_seq": 133, "end_step": 10, "place": "unknown"}
    lost = doc["summary"]["lost_events"]
    assert lost == {"events": 33, "gaps": 0, "declared_dropped": 0, "first": [],
                    "unplaced": unplaced}
    (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
    assert f["severity"] == "warning"
    assert f["title"] == (
        "33 event(s) missing from the trace: the End line counts 165, 132 are here; where "
        "they were lost is not recorded (no gap in seq shows it), so page classes after the "
        "first event may rest on missing events (the 132 page(s) judged from pool and ring "
        "slots: 0 exact, 0 stale, 132 foreign; host pages are exact whatever was lost)")
    assert f["details"]["place"] == "unknown" and f["details"]["unplaced"] == unplaced
    assert f["details"]["slot_pages_in_question"] == 132
    assert [(e["seq"], e["step"]) for e in f["evidence"]] == [(133, 10)]
    # the classes are kept (said, not withdrawn): the judgement is streamed, the End comes last
    assert doc["summary"]["residency"]["read_classes"]["foreign"] == 132
    said = lost_text(lost)
    assert said == ("33 event(s) lost from the trace where no seq shows it (the End line "
                    "counts 165, 132 are here); where they were lost is not recorded, so every "
                    "page class may rest on an incomplete record")
    _, out = cli("check", str(cut))
    assert said in " ".join(out.split())
    # check's residency table, wide enough that its completeness row is one line
    assert ("every judged kind, yet 33 event(s) written are not in the trace (where is not "
            "recorded): events of any kind may be among them") in _wide(
                residency_table(doc["summary"]))
    code, out = cli("trace", "info", "--json", str(cut))
    assert json.loads(out)["judgement"]["lost_events"] == lost
    _, out = cli("trace", "info", str(cut))
    assert _cell(out, "events lost") == said
    assert _cell(out, "recorded (declared)").startswith("every judged kind, yet 33 event(s)")
    code, out = cli("trace", "validate", str(cut))
    assert code == 1  # the End's count problem
    assert "End reports 165 events but 132 event lines precede it" in out
    assert f"{cut}: {said} (not a format problem" in out
    _, out = cli("check", "--format", "sarif", str(cut))
    results = json.loads(out)["runs"][0]["results"]
    (r,) = [r for r in results if r["ruleId"] == "events-lost"]
    assert r["level"] == "warning" and "the End line counts 165" in r["message"]["text"]
    chrome = tmp_path / "cut.json"
    assert cli("trace", "export", str(cut), "-o", str(chrome))[0] == 0
    marks = [e for e in json.loads(chrome.read_text()) if e.get("cat") == "events-lost"]
    assert [m["name"] for m in marks] == [said] and marks[0]["args"] == lost
    # followed: the loss is known at the End, and said then
    _, out = cli("check", "--follow", "--json", str(cut))
    followed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (g,) = [x for x in followed if x.get("rule") == "events-lost"]
    assert g["title"] == f["title"]
    seen = shown(str(cut), steps=[0])
    assert seen.lost_events == 33 and "events-lost" in seen.findings
    console = Console(width=200, file=io.StringIO())
    console.print(overview(load_document(str(cut))))
    screen = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert said in screen
    assert ("every judged kind is recorded (as its writer declares), yet 33 event(s) written "
            "are not in the trace") in screen


def test_diff_gives_lost_events_for_a_loss_without_a_place(kvrt_trace: Path,
                                                           tmp_path: Path) -> None:
    """GIVEN the native trace with lines of the last step deleted and renumbered (what both
    traces hold agrees)
    WHEN diffed with the whole trace, either way round, and with itself
    THEN the verdict is lost-events, exit 2, ``equivalent`` null, naming the side and the
    End's count; with the uploads deleted the provenance diverges (exit 1) and the loss,
    place unknown, may come before the divergence (``lost_before_first``)."""
    cut = tmp_path / "late.kvtrace"
    lines = kvrt_trace.read_bytes().splitlines()
    last_step = json.loads(lines[-1])["step"]
    # an output of the last step: nothing the other side compares depends on it alone
    n = _renumbered(kvrt_trace, cut, lambda _i, e: e["kind"] == "mark" and e["step"] < 3)
    assert n > 0
    for a, b, side in ((kvrt_trace, cut, "b"), (cut, kvrt_trace, "a"), (cut, cut, "a")):
        code, out = cli("diff", "--json", str(a), str(b))
        doc = json.loads(out)
        assert (code, doc["verdict"], doc["equivalent"]) == (2, "lost-events", None), (a, b)
        assert doc["ends"][side]["lost_events"]["unplaced"]["events"] == n
    code, out = cli("diff", str(kvrt_trace), str(cut))
    assert code == 2
    assert (f"not shown equivalent (events lost): no divergence in {last_step + 1} aligned "
            f"step(s) over what both traces hold, but B lost {n} event(s) where no seq shows it "
            f"(place unknown: the End line counts 165, {165 - n} are here): what they held "
            "is not compared") in out
    noup = tmp_path / "noupload.kvtrace"
    _renumbered(kvrt_trace, noup, lambda _i, e: e["kind"] == "upload")
    code, out = cli("diff", "--json", str(kvrt_trace), str(noup))
    doc = json.loads(out)
    assert (code, doc["verdict"], doc["lost_before_first"]) == (1, "divergent", ["b"])


@pytest.mark.parametrize("seed", range(3))
def test_random_lines_deleted_and_renumbered_are_counted_exactly(
        kvrt_trace: Path, model: Path, tmp_path: Path, seed: int) -> None:
    """GIVEN the native trace and the model capture, each with random event lines (a fifth)
    deleted and the rest renumbered
    THEN check's and trace info's ``lost_events`` and the TUI's count are exactly the lines
    deleted, with ``place`` unknown, and every surface agrees."""
    for src in (kvrt_trace, model):
        cut = tmp_path / f"{src.stem}-{seed}.kvtrace"
        n = _renumbered(src, cut, _random(seed, 0.2))
        assert n > 3
        _, doc = _check(cut)
        lost = doc["summary"]["lost_events"]
        assert lost["events"] == n and lost["gaps"] == 0
        assert lost["unplaced"]["place"] == "unknown"
        assert lost["unplaced"]["here"] == _end_count(src) - n
        (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
        assert f["title"].startswith(f"{n} event(s) missing from the trace: the End line "
                                     f"counts {_end_count(src)}, {_end_count(src) - n} are here")
        _, out = cli("trace", "info", "--json", str(cut))
        assert json.loads(out)["judgement"]["lost_events"] == lost
        assert shown(str(cut), steps=[0]).lost_events == n


def test_a_model_capture_without_its_uploads_renumbered(model: Path, tmp_path: Path) -> None:
    """GIVEN the model capture (it declares nothing) without its uploads, renumbered
    THEN upload is not recorded (inferred) and its 28 pages not judged, as before, and the 12
    uploads deleted are said lost, place unknown, beside it."""
    _, whole = _check(model)
    assert whole["summary"]["residency"]["read_classes"]["exact"] == 28
    cut = tmp_path / "noupload.kvtrace"
    n = _renumbered(model, cut, lambda _i, e: e["kind"] == "upload")
    assert n == 12
    _, doc = _check(cut)
    assert doc["summary"]["lost_events"]["unplaced"] == {
        "events": 12, "end_count": 63, "accounted": 51, "here": 51, "end_seq": 52,
        "end_step": doc["summary"]["lost_events"]["unplaced"]["end_step"], "place": "unknown"}
    assert doc["summary"]["residency"]["not_judged"] == {"upload": 28}
    (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
    assert f["title"].startswith("12 event(s) missing from the trace: the End line counts 63, "
                                 "51 are here;")
    assert ("not recorded: upload, yet 12 event(s) written are not in the trace"
            in _wide(residency_table(doc["summary"])))


def test_a_gap_and_a_loss_without_a_place_are_one_finding(kvrt_trace: Path,
                                                          tmp_path: Path) -> None:
    """GIVEN the uploads deleted and renumbered, then lines 41-50 deleted with their seqs kept
    THEN one events-lost finding: 43 events, the gap's 10 by seq and 33 more whose place is
    unknown; an evidence item for the gap and one at the End. ``check --follow`` says the gap
    when it reads it, and the whole finding again at the End."""
    renum = tmp_path / "renum.kvtrace"
    _renumbered(kvrt_trace, renum, lambda _i, e: e["kind"] == "upload")
    lines = renum.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "both.kvtrace"
    cut.write_bytes(b"".join(lines[:40] + lines[50:]))
    _, doc = _check(cut)
    lost = doc["summary"]["lost_events"]
    assert (lost["events"], lost["gaps"], lost["unplaced"]["events"]) == (43, 1, 33)
    assert lost["unplaced"]["accounted"] == 132 and lost["unplaced"]["here"] == 122
    (f,) = [f for f in doc["findings"] if f["rule"] == "events-lost"]
    assert f["title"].startswith("43 event(s) missing from the trace: seq 40–49 (10 events)")
    assert ("; 33 of them where no seq shows it: the End line counts 165, the seqs account for "
            "132 (122 here); where they were lost is not recorded") in f["title"]
    assert f["details"]["place"] == "seq and unknown"
    assert [e["seq"] for e in f["evidence"]] == [50, 133]
    # followed: the gap is said when it is read, and the finding again at the End, with the
    # events whose place is unknown
    _, out = cli("check", "--follow", "--json", str(cut))
    said_lost = [x["title"] for x in map(json.loads, out.splitlines())
                 if x.get("rule") == "events-lost"]
    assert [t.split(" ", 1)[0] for t in said_lost] == ["10", "43"]
    assert said_lost[-1] == f["title"]
    said = lost_text(lost)
    assert said is not None and said.startswith(
        "10 event(s) lost from the trace (gaps in seq: seq 40–49); every verdict from seq 40 "
        "on rests on an incomplete record; and 33 event(s) lost from the trace where no seq "
        "shows it (the End line counts 165, the seqs account for 132 (122 here))")


def test_an_end_counting_fewer_events_than_present_is_no_loss(kvrt_trace: Path,
                                                                 tmp_path: Path) -> None:
    """GIVEN the native trace with its End counting 100 events where 165 precede it
    THEN that is the reader's count problem (check's ``summary.problems``, validate exit 1),
    as before, and no events are said lost."""
    lines = kvrt_trace.read_bytes().splitlines()
    end = json.loads(lines[-1])
    end["events"] = 100
    small = tmp_path / "small.kvtrace"
    small.write_bytes(b"\n".join([*lines[:-1], json.dumps(end).encode()]) + b"\n")
    _, doc = _check(small)
    assert doc["summary"]["lost_events"] == {"events": 0, "gaps": 0}
    assert "events-lost" not in [f["rule"] for f in doc["findings"]]
    assert [p["message"] for p in doc["summary"]["problems"]] == [
        "End reports 100 events but 165 event lines precede it"]
    code, out = cli("trace", "validate", str(small))
    assert code == 1 and "lost" not in out


def _w(seq: int, step: int = 0) -> ev.Write:
    return ev.Write(seq, seq * 10, step, layer=0, stream=0, cells=(0, 1), rows=(0, 1))


def _end(seq: int, events: int) -> ev.End:
    return ev.End(seq, seq * 10, 0, status="completed", steps=1, events=events)


def test_what_the_seqs_account_for_is_not_counted_twice() -> None:
    """The End's count against its seq: a gap in seq before it (its events by seq, no more), a
    segment read alone from its snapshot, a rotated set's jump onto a segment's snapshot, a
    jump onto the End itself — none is a loss of unknown place; a count above the seqs is,
    also after a snapshot and beside a gap."""
    def lost(events: list[Any], header: ev.Header | None = None) -> dict[str, Any] | None:
        return Judge(header).feed_all(iter(events)).snapshot().lost

    assert lost([_w(1), _w(2), _end(3, 2)]) is None
    gap = lost([_w(1), _w(4), _end(5, 4)])
    assert gap is not None and gap["events"] == 2 and "unplaced" not in gap
    jump = lost([_w(1), _w(2), _end(9, 8)])  # seqs 3-8 lost just before the End
    assert jump is not None and jump["first"][0]["first_seq"] == 3 and "unplaced" not in jump
    snap = ev.Snapshot(40, 400, 0, reason="rotate")
    assert lost([snap, _w(41), _end(42, 41)]) is None
    rotated = make_header("native", ev.Device(name="cpu"), extra={"segment": {
        "run": "1-2", "first_seq": 1, "mode": "rotate", "index": 1}})
    assert lost([_w(1), _w(2), ev.Snapshot(9, 90, 0, reason="rotate"), _w(10), _end(11, 10)],
                rotated) is None
    after = lost([snap, _w(41), _end(42, 50)])
    assert after is not None and after["unplaced"] == {
        "events": 9, "end_count": 50, "accounted": 41, "here": 2, "end_seq": 42,
        "end_step": 0, "place": "unknown"}
    both = lost([_w(1), _w(4), _end(5, 7)])
    assert both is not None and (both["events"], both["gaps"]) == (5, 1)
    assert both["unplaced"]["events"] == 3 and both["unplaced"]["here"] == 2
    # a count below the seqs (the reader's count problem): no loss of unknown place
    assert lost([_w(1), _w(2), _end(3, 1)]) is None
    assert lost([_w(1), _w(4), _end(5, 1)]) == {
        "events": 2, "gaps": 1, "declared_dropped": 0, "first": [
            {"first_seq": 2, "last_seq": 3, "events": 2, "step_before": 0, "step_after": 0,
             "onto_snapshot": False}]}


def test_the_tui_findings_screen_shows_the_loss(kvrt_trace: Path, tmp_path: Path) -> None:
    """GIVEN the native trace without its uploads, renumbered, open in the viewer
    THEN the Overview says the events lost and the qualified completeness line; the Findings
    screen lists events-lost with the End's count."""
    cut = tmp_path / "noupload.kvtrace"
    _renumbered(kvrt_trace, cut, lambda _i, e: e["kind"] == "upload")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        screen = " ".join(text(app).split())
        assert "33 event(s) lost from the trace where no seq shows it" in screen
        assert ("every judged kind is recorded (as its writer declares), yet 33 event(s) "
                "written") in screen
        await show(pilot, "7")
        screen = " ".join(text(app).split())
        assert "events-lost" in screen
        assert "33 event(s) missing from the trace: the End line counts 165" in screen

    drive([cut], script, size=(200, 60))


def test_many_gaps_leave_room_for_the_ends_evidence() -> None:
    """GIVEN 24 gaps in seq and an End that counts 5 events more than its seq accounts for
    THEN the finding shows 19 gaps and the End's item (20 items), and counts 25, 5 left out."""
    events = [_w(s) for s in range(1, 100, 4)]  # seqs 1, 5, 9, ...: a gap of 3 before each
    end = _end(events[-1].seq + 1, events[-1].seq + 5)
    (f,) = [f for f in Judge().feed_all(iter([*events, end])).snapshot().findings
            if f.rule == "events-lost"]
    assert (f.details["gaps"], f.details["unplaced"]["events"]) == (24, 5)
    assert f.details["evidence_shown"] == 20 and f.details["evidence_total"] == 25
    assert f.details["evidence_left_out"] == 5
    assert [e.seq for e in f.evidence][-2:] == [77, end.seq]
    assert f.evidence[-1].text == ("the End counts 102 event(s) before it, the seqs account for "
                                   "97: 5 lost, place unknown")
