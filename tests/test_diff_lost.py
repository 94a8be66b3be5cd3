"""``kvdiag diff`` of traces that lost events (gaps in seq; docs/trace-format.md, "Lost
events"): equivalence is not claimed over events that are not there.

Each side is judged as ``check`` judges it: what needs a lost event is not judged, and diff
compares what both traces hold. With no divergence there the verdict is ``lost-events`` (JSON
``equivalent`` null, exit 2 — neither verdict, as ``nothing-compared``), and the text says
which trace lost how many events where. A divergence in what both hold is still one (exit 1);
when a trace's lost events come before it, an earlier divergence may be among them, and diff
says so (JSON ``lost_before_first``).

GIVEN slot1-first captures (shared layout: stale reads; per-stream: none) with lines deleted
(seqs kept), WHEN diffed, THEN each case gives the verdict, exit code and lines asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag.cli import main
from tests.conftest import Capture
from tests.test_diff import STEPS, diff_json


def _cut(src: Path, dst: Path, seqs: set[int], **segment: Any) -> list[dict[str, Any]]:
    """``src`` without the events of ``seqs`` (never a ``step`` event: the schedules stay
    alike), its header's ``extra.segment`` set to ``segment`` when given; the events
    deleted."""
    lines = src.read_bytes().splitlines(keepends=True)
    head = msgspec.json.decode(lines[0])
    if segment:
        head.setdefault("extra", {})["segment"] = segment
    kept, gone = [msgspec.json.encode(head) + b"\n"], []
    for line in lines[1:]:
        e = msgspec.json.decode(line)
        if e["seq"] in seqs:
            assert e["kind"] != "step"
            gone.append(e)
        else:
            kept.append(line)
    assert len(gone) == len(seqs)
    dst.write_bytes(b"".join(kept))
    return gone


def _text(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["diff", *args])
    return code, capsys.readouterr().out.splitlines()


@pytest.fixture
def shared(captured: Capture) -> Path:
    return captured("slot1-first", "shared", "membership", *STEPS)[0]


@pytest.fixture
def fixed(captured: Capture) -> Path:
    return captured("slot1-first", "per-stream", "membership", *STEPS)[0]


def test_a_gap_in_one_trace_is_not_equivalence_whichever_side(
        shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN the shared capture and a copy that lost seqs 99-108 (evicts, uploads and reads of
    step 5)
    THEN the capture against itself is equivalent (exit 0); against the copy, in either order,
    no divergence is found in what both hold, yet the verdict is lost-events, exit 2,
    equivalent null, and the text names the side, the 10 events, their seqs and step."""
    cut = tmp_path / "cut.kvtrace"
    gone = _cut(shared, cut, set(range(99, 109)))
    assert {e["step"] for e in gone} == {5}
    code, doc = diff_json(capsys, str(shared), str(shared))
    assert (code, doc["verdict"], doc["equivalent"]) == (0, "equivalent", True)
    for a, b, side in ((shared, cut, "b"), (cut, shared, "a")):
        code, doc = diff_json(capsys, str(a), str(b))
        assert (code, doc["verdict"], doc["equivalent"], doc["first"]) == (
            2, "lost-events", None, None)
        assert doc["lost_before_first"] == []
        assert doc["steps_compared"] == 15 and doc["compared"]["reads"] > 50
        lost = doc["ends"][side]["lost_events"]
        assert lost["events"] == 10 and lost["first"][0]["first_seq"] == 99
        assert lost["first"][0]["last_seq"] == 108
        other = doc["ends"]["a" if side == "b" else "b"]["lost_events"]
        assert other == {"events": 0, "gaps": 0}
        code, lines = _text(capsys, str(a), str(b))
        assert code == 2
        assert lines[-1] == (
            "not shown equivalent (events lost): no divergence in 15 aligned step(s) over what "
            f"both traces hold, but {side.upper()} lost 10 event(s) (seq 99–108 in step 5): "
            "what they held is not compared")
        assert not [line for line in lines if line.startswith("equivalent")]


def test_gaps_in_both_traces_are_both_said(
        shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN A without seqs 120-123 and 150 (two gaps), B without seqs 99-108
    THEN lost-events, exit 2, and the verdict line names A's 5 events (the first gap's seqs,
    one more gap) and B's 10."""
    a, b = tmp_path / "a.kvtrace", tmp_path / "b.kvtrace"
    _cut(shared, a, {120, 121, 122, 123, 150})
    _cut(shared, b, set(range(99, 109)))
    code, doc = diff_json(capsys, str(a), str(b))
    assert (code, doc["verdict"], doc["equivalent"]) == (2, "lost-events", None)
    assert doc["ends"]["a"]["lost_events"]["gaps"] == 2
    assert doc["ends"]["a"]["lost_events"]["events"] == 5
    code, lines = _text(capsys, str(a), str(b))
    assert code == 2
    assert lines[-1].endswith(
        "but A lost 5 event(s) (seq 120–123 in step 6, and 1 more gap(s)); B lost 10 event(s) "
        "(seq 99–108 in step 5): what they held is not compared")


def test_a_real_divergence_stays_one_and_lost_events_before_it_are_said(
        shared: Path, fixed: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN shared vs per-stream (first divergence: the key of stream 1's prefill at step 0,
    seq 4), with events lost in A after it (seqs 200-204, step 10), or in B before it (seq 1,
    the first event)
    THEN both are divergent, exit 1, with the divergence the whole traces give; only the
    second says the lost events come before it (an earlier divergence may be among them)."""
    _, whole = diff_json(capsys, str(shared), str(fixed))
    assert whole["first"]["kind"] == "key" and whole["lost_before_first"] == []
    late, early = tmp_path / "late.kvtrace", tmp_path / "early.kvtrace"
    _cut(shared, late, set(range(200, 205)))
    (warn,) = _cut(fixed, early, {1})
    assert warn["kind"] == "warn"
    for a, b, before in ((late, fixed, []), (shared, early, ["b"])):
        code, doc = diff_json(capsys, str(a), str(b))
        assert (code, doc["verdict"], doc["equivalent"]) == (1, "divergent", False)
        assert doc["first"] == whole["first"] and doc["effect"] == whole["effect"]
        assert doc["lost_before_first"] == before
        code, lines = _text(capsys, str(a), str(b))
        assert code == 1
        said = [line for line in lines if line.startswith("events lost in")]
        assert said == ([] if not before else [
            "events lost in B come before it (above): an earlier divergence may be among "
            "them"])
        at = lines.index(next(x for x in lines if x.startswith("first divergence (key)")))
        assert lines[at + 1:at + 1 + len(said)] == said  # right below the divergence
        assert lines[at + 1 + len(said)].startswith("first effect (provenance)")


def test_a_flight_recorder_that_declares_drops_is_not_equivalent(
        shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN the shared capture as a flight recorder's window whose header declares 3 events
    dropped (kvtrace.h's ``extra.segment.dropped``) and seqs 150-152 missing
    THEN lost-events, exit 2; the JSON carries the declared count, the verdict line says the
    writer declares them dropped."""
    window = tmp_path / "window.kvtrace"
    _cut(shared, window, {150, 151, 152}, run="1-2", first_seq=1, mode="flight-recorder",
         ring_kb=64, dropped=3)
    code, doc = diff_json(capsys, str(shared), str(window))
    assert (code, doc["verdict"], doc["equivalent"]) == (2, "lost-events", None)
    lost = doc["ends"]["b"]["lost_events"]
    assert (lost["events"], lost["declared_dropped"]) == (3, 3)
    code, lines = _text(capsys, str(shared), str(window))
    assert code == 2
    assert lines[-1].endswith(
        "but B lost 3 event(s) (seq 150–152 in step 7; its writer declares 3 event(s) "
        "dropped): what they held is not compared")


def test_a_trace_that_lost_events_is_not_shown_equivalent_to_itself(
        shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same file on both sides agrees in everything it holds; what it lost is still not
    there: lost-events, exit 2, both sides' losses said."""
    cut = tmp_path / "cut.kvtrace"
    _cut(shared, cut, {60})
    code, doc = diff_json(capsys, str(cut), str(cut))
    assert (code, doc["verdict"], doc["equivalent"]) == (2, "lost-events", None)
    assert [doc["ends"][s]["lost_events"]["events"] for s in "ab"] == [1, 1]
