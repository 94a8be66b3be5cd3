"""``kvdiag trace pages``, ``trace info`` and ``import``'s summary render the judgement: their
page classes, steps and conditions are the ones ``kvdiag check`` reports.

GIVEN model captures, a hand-written native trace and an imported log, WHEN each surface runs,
THEN every page ``trace pages`` lists is counted by ``check``, and the steps, layers and failed
conditions of an imported log are the same everywhere.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvdiag.cli import main
from kvdiag.judged.trace import analyse_file
from kvdiag.model import events as ev
from tests.judged_captures import capture
from tests.test_check_derived import write_trace
from tests.test_log_import import BOOT, fits_line, run_import, stamped, write

SAMPLES = Path(__file__).resolve().parent.parent / "traces"


def pages_json(capsys: pytest.CaptureFixture[str], path: Path) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["trace", "pages", str(path), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("case", [
    ("slot1-first", "shared", "membership", False, {}),
    ("late-join", "shared", "fits", False, {}),
    ("pool-pressure", "per-stream", "fits", False, {"stage_mib": 3, "ring_slots": 1}),
], ids=["slot1-first", "late-join", "ring-cycling"])
def test_every_listed_page_is_counted_by_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               case: tuple[Any, ...]) -> None:
    name, layout, dispatch, unified, extra = case
    events = capture(name, layout, dispatch, unified, **extra)
    path = write_trace(tmp_path / "t.kvtrace", events)
    listed = pages_json(capsys, path)
    by_class = Counter(p["class"] for p in listed)
    rc = analyse_file(path).summary["residency"]["read_classes"]
    assert {"exact": by_class["exact"], "stale": by_class["stale"],
            "foreign": by_class["foreign"], "not_judged": by_class["not judged"]} == rc
    # one line per page of every read's served runs, with the page's own read
    reads = {e.seq: e for e in events if isinstance(e, ev.Read)}
    assert len(listed) == sum(e.pool + e.ring + e.host for e in reads.values())
    for p in listed[:200]:
        read = reads[p["seq"]]
        assert (p["layer"], p["stream"], p["step"]) == (read.layer, read.stream, read.step)
        assert any(s.begin <= p["page"] < s.end and s.source == p["source"]
                   for s in read.served)


def test_stale_and_foreign_pages_say_whose_bytes_the_slot_held(
        capsys: pytest.CaptureFixture[str]) -> None:
    listed = pages_json(capsys, SAMPLES / "slot1-first-shared.kvtrace")
    stale = next(p for p in listed if p["class"] == "stale")
    assert stale["lag"] == stale["version"] - stale["holder"]["version"] > 0
    assert (stale["holder"]["stream"], stale["holder"]["page"]) == (stale["stream"],
                                                                    stale["page"])
    foreign = next(p for p in listed if p["class"] == "foreign")
    assert foreign["holder"]["stream"] != foreign["stream"]
    capsys.readouterr()
    assert main(["trace", "pages", str(SAMPLES / "slot1-first-shared.kvtrace")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert len(text) == len(listed)
    assert any(f"page {stale['page']}: pool slot {stale['slot']}: stale, {stale['lag']} "
               f"write(s) old" in line for line in text)


def test_a_read_without_served_pages_is_one_line_not_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import msgspec

    events = capture("single-slot", "shared", "membership", False)
    path = write_trace(tmp_path / "bare.kvtrace", events, lambda e: msgspec.structs.replace(
        e, served=()) if isinstance(e, ev.Read) else e)
    listed = pages_json(capsys, path)
    reads = [e for e in events if isinstance(e, ev.Read)]
    assert len(listed) == len(reads)
    assert {(p["page"], p["class"]) for p in listed} == {(None, "not judged")}
    assert sum(p["pages"] for p in listed) == sum(e.pool for e in reads)


def test_trace_info_says_the_judgements_steps_and_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = SAMPLES / "slot1-first-shared.kvtrace"
    capsys.readouterr()
    assert main(["trace", "info", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    check = analyse_file(path).summary
    assert doc["judgement"]["steps"] == check["steps"] == 15
    assert doc["judgement"]["residency"]["read_classes"] == check["residency"]["read_classes"]
    assert doc["judgement"]["findings"]["error"] == 3
    assert main(["trace", "info", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 – 14 (15 step(s))" in out
    assert "exact 64, stale 16, foreign 40, not judged 0" in out


def test_an_imported_log_has_one_step_count_unknown_layers_and_evaluated_conditions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: check said "0 step(s)" where import, trace info and the TUI said 3; evidence said
    "layer -1"; check said "failed conditions not recorded" where the TUI worked out dst
    ne[3]=2."""
    lines = stamped([
        *BOOT,
        fits_line("0x1100", "256,24,3,2", "0x2100", "0x9000", "0x9000"),
        "W kv_stream_adapt: active 10496, resident 39, ring 17, samples 120, misses 4, copy "
        "busy 38.5%, peak 12",
        fits_line("0x1200", "256,24,3,2", "0x2200", "0x9000", "0x9000"),
        "W kv_stream_adapt: active 10752, resident 39, ring 17, samples 130, misses 0, copy "
        "busy 12.0%, peak 9",
        fits_line("0x1300", "256,24,3,2", "0x2300", "0x9000", "0x9000"),
    ])
    out = tmp_path / "t.kvtrace"
    capsys.readouterr()
    assert run_import(write(tmp_path / "np2.log", lines), out) == 0
    said = capsys.readouterr().out
    result = analyse_file(out)
    steps = result.summary["steps"]
    assert steps == 3 and f", {steps} step(s), numbered by the writer" in said
    assert main(["trace", "info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["judgement"]["steps"] == steps
    (fallback,) = [f for f in result.findings if f.rule == "fallback"]
    assert fallback.details["conditions_from"] == "kvdiag"
    assert fallback.details["failed"] == ["Q.ne[3]==1"]
    assert "Q.ne[3]=2 from dst.ne[3]" in fallback.title
    assert all(e.layer is None for e in fallback.evidence)
    assert main(["check", str(out)]) == 0
    text = capsys.readouterr().out
    assert "layer -1" not in text and "3 step(s)" in text
