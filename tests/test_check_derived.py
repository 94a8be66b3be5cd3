"""``kvdiag check`` on what a trace records: pages judged from raw events (1.1), the model's
annotation only as a cross-check, each missing kind said — never a verdict built on it.

GIVEN model captures rewritten to keep only some facts, WHEN they are checked, THEN the
stale/foreign findings come from the raw events the trace records, and what it does not
record is an ``info`` finding ``not-recorded`` naming the kind and what it hides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag.cli import main
from kvdiag.judged.trace import analyse_file
from kvdiag.model import events as ev
from kvdiag.model.events import Device
from kvdiag.trace.writer import TraceWriter, make_header
from tests.judged_captures import capture


def write_trace(path: Path, events: Any, edit: Callable[[Any], Any] = lambda e: e,
                status: str = "completed") -> Path:
    header = make_header("numpy", Device("test"), scenario={"name": "slot1-first"})
    with TraceWriter.create(path, header) as w:
        for e in events:
            e = edit(e)
            if e is None:
                continue
            fields = msgspec.structs.asdict(e)
            for f in ("seq", "t_ns", "step"):
                fields.pop(f)
            w.emit(type(e), e.step, **fields)
        w.close(status, steps=1 + max((x.step for x in events), default=-1))  # type: ignore[arg-type]
    return path


ALIASING = ("slot1-first", "shared", "membership", False)


def findings_by_rule(path: Path) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in analyse_file(path).findings:
        out.setdefault(f.rule, []).append(f)
    return out


def not_recorded(path: Path) -> dict[str, Any]:
    return {f.details["what"]: f for f in analyse_file(path).findings
            if f.rule == "not-recorded"}


def test_served_pages_are_judged_and_the_annotation_alone_is_not(tmp_path: Path) -> None:
    """A native trace (served, no annotation) is judged; a 1.0 trace (annotation, no served)
    is not: its pages are not judged and the finding reports what the annotation says as a
    cross-check — which equals the judgement of the same run."""
    events = capture(*ALIASING)
    native = write_trace(tmp_path / "native.kvtrace", events,
                         lambda e: msgspec.structs.replace(e, ranges=())
                         if isinstance(e, ev.Read) else e)
    old = write_trace(tmp_path / "old.kvtrace", events,
                      lambda e: msgspec.structs.replace(e, served=())
                      if isinstance(e, ev.Read) else e)
    a, b = analyse_file(native), analyse_file(old)
    assert {"stale-page-read", "foreign-page-read"} <= {f.rule for f in a.findings}
    assert not {"stale-page-read", "foreign-page-read"} & {f.rule for f in b.findings}
    ra, rb = a.summary["residency"], b.summary["residency"]
    judged = {k: v for k, v in ra["read_classes"].items() if v and k != "not_judged"}
    (nr,) = [f for f in b.findings if f.rule == "not-recorded"
             and f.details["what"] == "read.served"]
    assert nr.details["annotation_says"] == judged
    assert rb["read_classes"]["not_judged"] == sum(judged.values())
    stale = next(f for f in a.findings if f.rule == "stale-page-read")
    # the title counts pages and reads; both agree with the residency table and evidence
    assert f"read {ra['read_classes']['stale']} stale resident page(s) in " \
           f"{stale.details['reads']} read(s)" in stale.title
    assert stale.details["evidence_total"] == stale.details["reads"]
    assert len(stale.evidence) == min(20, stale.details["reads"])


def test_the_model_trace_carries_both_and_they_agree(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "both.kvtrace", capture(*ALIASING))
    res = analyse_file(path).summary["residency"]
    assert res["reads"]["judged"] > 0
    assert res["cross_check"] == {"annotation_disagrees": 0, "versions_disagree": 0,
                                  "snapshot_replaced": 0}


def test_an_annotation_that_disagrees_is_reported_not_used(tmp_path: Path) -> None:
    """Mark every annotated range exact: the judgement still finds the stale and foreign
    pages, and an info finding says the annotation disagrees."""
    events = capture(*ALIASING)
    liar = write_trace(tmp_path / "liar.kvtrace", events, lambda e: msgspec.structs.replace(
        e, ranges=tuple(msgspec.structs.replace(r, cls="exact", version_lag=0)
                        for r in e.ranges)) if isinstance(e, ev.Read) else e)
    found = findings_by_rule(liar)
    assert {"stale-page-read", "foreign-page-read"} <= set(found)
    (mismatch,) = found["annotation-mismatch"]
    assert mismatch.severity.label == "info" and mismatch.details["what"] == "read.ranges"
    assert mismatch.details["count"] == sum(
        1 for e in events if isinstance(e, ev.Read) and any(r.cls != "exact" for r in e.ranges))


def test_reads_without_served_are_not_recorded_not_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = capture(*ALIASING)
    bare = write_trace(tmp_path / "bare.kvtrace", events,
                       lambda e: msgspec.structs.replace(e, served=(), ranges=())
                       if isinstance(e, ev.Read) else e)
    found = findings_by_rule(bare)
    assert "stale-page-read" not in found and "foreign-page-read" not in found
    (nr,) = found["not-recorded"]
    reads = sum(1 for e in events if isinstance(e, ev.Read))
    assert nr.severity.label == "info" and nr.details["what"] == "read.served"
    assert nr.details["count"] == reads and f"{reads} read(s)" in nr.title
    # the default gate (error) passes on missing facts; the divergence is still recorded
    assert main(["check", str(bare), "--json"]) == 1
    capsys.readouterr()
    summary = analyse_file(bare).summary["residency"]
    assert summary["read_classes"]["not_judged"] == summary["pages_read"]["pool"]


def test_outputs_without_reference_say_divergence_not_recorded(tmp_path: Path) -> None:
    events = capture("single-slot", "shared", "membership", False)
    path = write_trace(tmp_path / "noref.kvtrace", events,
                       lambda e: ev.Output(e.seq, e.t_ns, e.step, stream=e.stream,
                                           checksum=e.checksum)
                       if isinstance(e, ev.Output) else e)
    found = findings_by_rule(path)
    assert list(found) == ["not-recorded"]
    (nr,) = found["not-recorded"]
    outputs = sum(1 for e in events if isinstance(e, ev.Output))
    assert nr.details == {"what": "stream divergence", "count": outputs,
                          "evidence_shown": min(20, outputs), "evidence_total": outputs,
                          "evidence_left_out": max(0, outputs - 20)}
    assert main(["check", str(path)]) == 0
    assert main(["check", str(path), "--fail-on", "info"]) == 1


# -- one kind removed from a capture --------------------------------------------------------

def without(kind: type[Any]) -> Callable[[Any], Any]:
    return lambda e: None if isinstance(e, kind) else e


def test_without_uploads_no_page_read_from_a_slot_is_judged(tmp_path: Path) -> None:
    """Before: 15 stale pages became foreign. Now every pool page is not judged."""
    path = write_trace(tmp_path / "t.kvtrace", capture(*ALIASING), without(ev.Upload))
    result = analyse_file(path)
    rules = {f.rule for f in result.findings}
    assert not rules & {"stale-page-read", "foreign-page-read"}
    res = result.summary["residency"]
    assert res["read_classes"]["not_judged"] == res["pages_read"]["pool"] > 0
    assert res["read_classes"]["stale"] == res["read_classes"]["foreign"] == 0
    nr = not_recorded(path)["upload"]
    assert nr.details["pages"] == res["pages_read"]["pool"]
    assert "slot contents" in nr.title and "inferred" in nr.title
    assert result.summary["completeness"]["kinds"]["upload"]["recorded"] is False


def test_without_writes_foreign_is_judged_and_stale_is_not_invented(tmp_path: Path) -> None:
    """Before: stale pages silently became exact. Now they are not judged; foreign pages
    (another stream's bytes) are still foreign, from the slots' identity alone."""
    events = capture(*ALIASING)
    full = analyse_file(write_trace(tmp_path / "full.kvtrace", events))
    path = write_trace(tmp_path / "t.kvtrace", events, without(ev.Write))
    result = analyse_file(path)
    rc, fc = result.summary["residency"]["read_classes"], full.summary["residency"][
        "read_classes"]
    assert rc["stale"] == 0 and rc["exact"] == 0
    assert rc["foreign"] == fc["foreign"] > 0
    assert rc["not_judged"] == fc["exact"] + fc["stale"]
    assert "stale-page-read" not in {f.rule for f in result.findings}
    assert not_recorded(path)["write"].details["pages"] == rc["not_judged"]


def test_without_fits_dispatch_is_not_judged_and_said_so(tmp_path: Path) -> None:
    events = capture("two-slot-concurrent", "shared", "fits", False)
    full = findings_by_rule(write_trace(tmp_path / "full.kvtrace", events))
    assert "fallback" in full
    path = write_trace(tmp_path / "t.kvtrace", events, without(ev.Fits))
    found = findings_by_rule(path)
    assert "fallback" not in found
    assert "fallback" in not_recorded(path)["fits"].title


def test_without_step_events_steps_are_the_writers_numbering(tmp_path: Path) -> None:
    events = capture(*ALIASING)
    path = write_trace(tmp_path / "t.kvtrace", events, without(ev.Step))
    result = analyse_file(path)
    assert result.summary["steps"] == 1 + max(e.step for e in events)
    assert result.summary["step_span"]["step_events"] == 0
    assert "ubatch boundaries" in not_recorded(path)["step"].title


def test_without_outputs_divergence_is_not_judged(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.kvtrace", capture(*ALIASING), without(ev.Output))
    assert "stream-divergence" not in findings_by_rule(path)
    assert "stream divergence" in not_recorded(path)["output"].title


def test_without_reads_no_page_is_judged(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.kvtrace", capture(*ALIASING), without(ev.Read))
    found = findings_by_rule(path)
    assert not {"stale-page-read", "foreign-page-read"} & set(found)
    assert "no stale or foreign page read is judged" in not_recorded(path)["read"].title


def test_a_header_and_an_end_judge_nothing_and_fail_on_info(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "empty.kvtrace", [])
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "OK — no findings" not in out and "nothing was judged" in out
    assert main(["check", str(path), "--fail-on", "info"]) == 1


# -- fits conditions ---------------------------------------------------------------------

def test_fits_conditions_not_recorded_are_evaluated_by_kvdiag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fork that logs only the bool (evaluated: false, failed empty): check names the
    failed conditions from the logged geometry and says it evaluated them."""
    events = capture("two-slot-concurrent", "shared", "membership", False)
    path = write_trace(tmp_path / "bool-only.kvtrace", events,
                       lambda e: msgspec.structs.replace(e, failed=(), evaluated=False)
                       if isinstance(e, ev.Fits) else e)
    capsys.readouterr()
    assert main(["check", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    mismatch = doc["findings"][0]
    assert mismatch["rule"] == "fits-dispatch-mismatch"
    assert mismatch["details"]["conditions_from"] == "kvdiag"
    assert {"Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"} <= set(mismatch["details"]["failed"])
    assert "evaluated by kvdiag from the logged geometry" in mismatch["title"]
    assert "evaluated by kvdiag" in mismatch["evidence"][0]["text"]
    # the same conditions the model named when it wrote them itself
    original = next(e for e in events if isinstance(e, ev.Fits))
    assert tuple(mismatch["details"]["failed"]) == original.failed
    assert mismatch["details"]["not_evaluable"] == ["sinks==NULL"]


def test_fits_evaluation_notes_a_writer_that_disagrees(tmp_path: Path) -> None:
    events = capture("two-slot-concurrent", "shared", "membership", False)
    path = write_trace(tmp_path / "liar.kvtrace", events,
                       lambda e: msgspec.structs.replace(e, failed=(), evaluated=False,
                                                         result=True, route="fallback")
                       if isinstance(e, ev.Fits) else e)
    (fb,) = findings_by_rule(path)["fallback"]
    assert ("the writer's predicate returned true, the model's false"
            in (fb.evidence[0].text or ""))


def test_the_text_report_labels_its_units_and_says_how_much_evidence_it_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "model.kvtrace", capture(*ALIASING))
    capsys.readouterr()
    assert main(["check", str(path)]) == 1
    out = " ".join(capsys.readouterr().out.split())  # rich wraps table cells
    assert "read classes (pages)" in out and "judged from served pages" in out
    stale = next(f for f in analyse_file(path).findings if f.rule == "stale-page-read")
    reads = stale.details["reads"]
    assert reads > 3 and f"first 3 of {reads}" in out


def test_json_evidence_caps_say_how_many_were_left_out_and_how_to_list_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """30 foreign reads: the JSON keeps 20 evidence items, says that 10 were left out and
    names the command that lists every judged page."""
    events: list[Any] = [
        ev.Write(1, 0, 0, layer=0, stream=0, cells=(0, 10), rows=(0, 10)),
        ev.Write(2, 0, 0, layer=0, stream=1, cells=(0, 10), rows=(4096, 4106)),
        ev.Upload(3, 0, 0, layer=0, stream=1, pages=(0, 1), slot=0, target="resident",
                  bytes=1, reason="miss")]
    events += [ev.Read(4 + i, 0, i, layer=0, stream=0, pool=1, ring=0, host=0,
                       served=(ev.Served(0, 1, "pool", 0),)) for i in range(30)]
    path = write_trace(tmp_path / "many.kvtrace", events)
    capsys.readouterr()
    assert main(["check", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (foreign,) = [f for f in doc["findings"] if f["rule"] == "foreign-page-read"]
    d = foreign["details"]
    assert (d["evidence_shown"], d["evidence_total"], d["evidence_left_out"]) == (20, 30, 10)
    assert len(foreign["evidence"]) == 20
    assert d["evidence_command"] == f"kvdiag trace pages {path} --json"


def test_impossible_uploads_and_unknown_bytes_do_not_move_the_residency(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a fork's trace whose uploads include impossible ones (a page past every believable
    page, a negative page, a negative slot) and ones of unknown bytes (-1, and null as
    kvtrace.h writes it), WHEN it is checked, THEN the impossible uploads fill nothing and
    lower no hit (they are only counted as out of range), and unknown bytes are said, not
    summed into the bytes uploaded."""
    from tests.trace_samples import end_line, event_line, header_line

    def up(seq: int, pages: list[int], slot: int, nbytes: int | None) -> bytes:
        return event_line("upload", seq, 0, layer=0, stream=0, pages=pages, slot=slot,
                          target="resident", bytes=nbytes, reason="miss")

    def read(seq: int, step: int) -> bytes:
        return event_line("read", seq, step, layer=0, stream=0, pool=4, ring=0, host=0,
                          served=[[0, 4, "pool", 0]])

    lines = [header_line("1.1"),
             event_line("write", 1, 0, layer=0, stream=0, cells=[0, 1024], rows=[0, 1024]),
             up(2, [0, 2], 0, 4096), up(3, [2, 3], 2, -1), up(4, [3, 4], 3, None),
             up(5, [1 << 21, (1 << 21) + 3], 10, 6144), up(6, [-4, -1], 10, 6144),
             up(7, [0, 2], -8, 4096),
             read(8, 1), read(9, 2), read(10, 3), end_line(11, 10, steps=4)]
    path = tmp_path / "fork.kvtrace"
    path.write_bytes(b"".join(lines))
    assert main(["check", str(path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["summary"]["residency"]
    assert r["out_of_range"] == 3
    assert r["uploads"] == {"resident": 3} and r["upload_pages"] == {"resident": 4}
    assert r["upload_bytes"] == {"resident": 4096}
    assert r["upload_bytes_unknown"] == {"resident": 2}
    assert (r["resident_hits"], r["resident_hit_rate"]) == (8, pytest.approx(8 / 12))
    assert main(["check", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "resident hits 8 (67%)" in text
    assert "resident 4 pages (0.0 MiB; bytes unknown in 2 upload(s))" in text
