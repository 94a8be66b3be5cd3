"""``kvdiag check`` on what a trace records: derived provenance (1.1), the annotation (1.0),
neither ("not recorded"), fits conditions kvdiag evaluates itself, outputs without reference.

GIVEN the slot1-first (shared layout) capture rewritten to keep only some facts, WHEN it is
checked, THEN the stale/foreign findings come from whatever the trace records, and what it
does not record is said, not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag.check import analyse_file
from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.model.events import Device
from kvdiag.trace.writer import TraceWriter, make_header
from tests.judged_captures import capture


def write_trace(path: Path, events: Any, edit: Callable[[Any], Any] = lambda e: e) -> Path:
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
        w.close("completed", steps=1 + max(x.step for x in events))
    return path


ALIASING = ("slot1-first", "shared", "membership", False)


def findings_by_rule(path: Path) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in analyse_file(path).findings:
        out.setdefault(f.rule, []).append(f)
    return out


def test_served_alone_gives_the_same_findings_as_the_annotation(tmp_path: Path) -> None:
    events = capture(*ALIASING)
    native = write_trace(tmp_path / "native.kvtrace", events,
                         lambda e: msgspec.structs.replace(e, ranges=())
                         if isinstance(e, ev.Read) else e)
    old = write_trace(tmp_path / "old.kvtrace", events,
                      lambda e: msgspec.structs.replace(e, served=())
                      if isinstance(e, ev.Read) else e)
    a, b = analyse_file(native), analyse_file(old)
    assert [f.rule for f in a.findings] == [f.rule for f in b.findings]
    assert {"stale-page-read", "foreign-page-read"} <= {f.rule for f in a.findings}
    ra, rb = a.summary["residency"], b.summary["residency"]
    assert ra["read_classes"] == rb["read_classes"]
    assert ra["provenance"]["derived_reads"] == rb["provenance"]["annotated_reads"] > 0
    stale = next(f for f in a.findings if f.rule == "stale-page-read")
    assert "(derived from served pages)" in stale.title
    assert "(from the model's annotation)" in next(
        f for f in b.findings if f.rule == "stale-page-read").title
    # the title counts pages and reads; both agree with the residency table and evidence
    assert f"read {ra['read_classes']['stale']} stale resident page(s) in " \
           f"{stale.details['reads']} read(s)" in stale.title
    assert stale.details["evidence_total"] == stale.details["reads"]
    assert len(stale.evidence) == min(20, stale.details["reads"])


def test_the_model_trace_carries_both_and_they_agree(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "both.kvtrace", capture(*ALIASING))
    prov = analyse_file(path).summary["residency"]["provenance"]
    assert prov["derived_reads"] > 0 and prov["annotation_disagrees"] == 0


def test_reads_without_provenance_are_not_recorded_not_clean(
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
    assert nr.severity.label == "info" and nr.details["what"] == "read provenance"
    assert nr.details["count"] == reads and f"{reads} read(s)" in nr.title
    # the default gate (error) passes on missing facts; --fail-on info fails it
    assert main(["check", str(bare), "--json"]) == 1  # the divergence is still recorded
    capsys.readouterr()
    summary = analyse_file(bare).summary["residency"]
    assert summary["read_classes"]["not_recorded"] == summary["pages_read"]["pool"]


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
                          "evidence_shown": min(20, outputs), "evidence_total": outputs}
    assert main(["check", str(path)]) == 0
    assert main(["check", str(path), "--fail-on", "info"]) == 1


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


def test_fits_evaluation_notes_a_writer_that_disagrees(tmp_path: Path) -> None:
    events = capture("two-slot-concurrent", "shared", "membership", False)
    path = write_trace(tmp_path / "liar.kvtrace", events,
                       lambda e: msgspec.structs.replace(e, failed=(), evaluated=False,
                                                         result=True, route="fallback")
                       if isinstance(e, ev.Fits) else e)
    (fb,) = findings_by_rule(path)["fallback"]
    assert ("the writer's predicate returned true, the model's false"
            in fb.evidence[0].text)


def test_the_text_report_labels_its_units_and_says_how_much_evidence_it_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "model.kvtrace", capture(*ALIASING))
    capsys.readouterr()
    assert main(["check", str(path)]) == 1
    out = " ".join(capsys.readouterr().out.split())  # rich wraps table cells
    assert "read classes (pages)" in out and "provenance (reads)" in out
    stale = next(f for f in analyse_file(path).findings if f.rule == "stale-page-read")
    reads = stale.details["reads"]
    assert reads > 3 and f"first 3 of {reads}" in out
