"""``kvdiag diff``: the first divergence of two traces of one schedule, with its cause chain.

GIVEN model traces of one scenario under two fixes (layout, dispatch), WHEN diffed, THEN the
first divergence names what differs at which step, layer and stream, and the chain ends at
the upload the stale copy came from. A trace against itself is equivalent; traces of
different schedules are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader
from tests.conftest import Capture

STEPS = ("--steps", "4", "--prompt-tokens", "300")


def diff_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["diff", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_shared_vs_per_stream_slot1_first_explains_the_stale_read(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    shared, _ = captured("slot1-first", "shared", "membership", *STEPS)
    fixed, _ = captured("slot1-first", "per-stream", "membership", *STEPS)
    code, doc = diff_json(capsys, str(shared), str(fixed))
    assert code == 1 and doc["equivalent"] is False and doc["schedule_differs"] is None
    first = doc["first"]
    # the prefill of slot 1 (stream 1, global rows 2048..2347): the shared key divides the
    # global row by 256 (pages 8-9, window 4: nothing marked), the fix keys stream 1's pages
    assert (first["kind"], first["step"], first["layer"], first["stream"]) == ("key", 0, 0, 1)
    assert first["a"]["dirty"] == []
    assert first["b"]["dirty"] == [[0, 1, 0], [0, 1, 1]]
    assert "stream 1 rows 2048-2347 marked no key in A" in first["text"]
    assert "outside every layer's resident window" in first["text"]
    effect = doc["effect"]
    assert (effect["kind"], effect["step"], effect["layer"], effect["stream"]) == (
        "provenance", 1, 0, 1)
    assert effect["a"]["class"] == "stale" and effect["b"]["class"] == "exact"
    assert effect["a"]["page"] == effect["b"]["page"] == 1  # the page both sides read
    assert effect["a"]["copy"]["uploaded_step"] == 0 and effect["a"]["lag"] == 1
    chain = doc["chain"]
    assert chain[0].startswith("rows: stream 1 rows 2348-2348 (cells 300-300) last wrote page 1 "
                               "at step 1; they marked no key in A")
    assert "(0, stream 1, page 1) in B" in chain[0]
    assert "was last uploaded at step 0" in chain[1] and chain[1].endswith("→ stale")
    assert chain[2].endswith("→ exact")
    # the text form says the same in lines
    capsys.readouterr()
    assert main(["diff", str(shared), str(fixed)]) == 1
    text = capsys.readouterr().out
    assert "first divergence (key) at step 0 layer 0 stream 1" in text
    assert "first effect (provenance) at step 1 layer 0 stream 1" in text
    assert "cause chain:" in text


def test_a_trace_is_equivalent_to_itself(captured: Capture,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = captured("slot1-first", "shared", "membership", *STEPS)
    code, doc = diff_json(capsys, str(path), str(path))
    assert code == 0 and doc["equivalent"] is True and doc["first"] is None
    assert doc["steps_compared"] == doc["steps"]["a"] == doc["steps"]["b"] > 10
    with TraceReader.open(path) as r:
        events = list(r)
    reads = sum(1 for e in events if isinstance(e, ev.Read))
    routes = sum(1 for e in events if isinstance(e, ev.Fits))
    writes = sum(1 for e in events if isinstance(e, ev.Write))
    assert doc["verdict"] == "equivalent" and writes > 0 and routes > 0
    assert doc["compared"] == {"writes": writes, "routes": routes,
                               "reads": reads, "reads_not_recorded": 0,
                               "outputs": doc["steps"]["a"], "outputs_not_recorded": 0}
    capsys.readouterr()
    assert main(["diff", str(path), str(path)]) == 0
    assert "equivalent: no divergence in" in capsys.readouterr().out


def test_membership_vs_fits_dispatch_routes_differ_at_the_first_fa_node(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, _ = captured("two-slot-concurrent", "shared", "membership", *STEPS)
    fixed, _ = captured("two-slot-concurrent", "shared", "fits", *STEPS)
    code, doc = diff_json(capsys, str(upstream), str(fixed))
    assert code == 1
    first = doc["first"]
    assert (first["kind"], first["step"], first["layer"]) == ("route", 0, 0)
    assert first["a"]["route"] == "abort" and first["b"]["route"] == "fallback"
    assert "Q.ne[3]==1" in first["a"]["failed"]
    assert "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed in A" in first["text"]
    # the upstream run ended at its abort: a prefix of the fixed run's schedule
    assert doc["steps"]["a"] == 1 and doc["steps"]["b"] > 1
    # its first effect: the abort (a crashed run is not the completed one)
    effect = doc["effect"]
    assert (effect["kind"], effect["step"], effect["b"]) == (
        "abort", 0, {"status": "completed", "abort": None})
    assert "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed" in effect["text"]


def _strip_annotation(src: Path, dst: Path) -> Path:
    """What a native writer records: no ranges, no write versions."""
    with TraceReader.open(src) as r, dst.open("wb") as out:
        out.write(msgspec.json.encode(r.header) + b"\n")
        for e in r:
            if isinstance(e, ev.Read):
                e = msgspec.structs.replace(e, ranges=())
            elif isinstance(e, ev.Write):
                e = msgspec.structs.replace(e, versions=())
            out.write(msgspec.json.encode(e) + b"\n")
    return dst


def test_diff_uses_only_raw_facts(captured: Capture, capsys: pytest.CaptureFixture[str],
                                  tmp_path: Path) -> None:
    shared, _ = captured("slot1-first", "shared", "membership", *STEPS)
    fixed, _ = captured("slot1-first", "per-stream", "membership", *STEPS)
    _, annotated = diff_json(capsys, str(shared), str(fixed))
    bare_a = _strip_annotation(shared, tmp_path / "a.kvtrace")
    bare_b = _strip_annotation(fixed, tmp_path / "b.kvtrace")
    code, bare = diff_json(capsys, str(bare_a), str(bare_b))
    assert code == 1
    for k in ("first", "effect", "chain"):
        assert json.dumps(bare[k]) == json.dumps(annotated[k])


def test_different_schedules_are_refused_unless_forced(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    single, _ = captured("single-slot", "shared", "membership", *STEPS)
    s1, _ = captured("slot1-first", "shared", "membership", *STEPS)
    capsys.readouterr()
    assert main(["diff", str(single), str(s1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different schedules" in err[0] and "--force" in err[0]
    code, doc = diff_json(capsys, str(single), str(s1), "--force")
    assert code in (0, 1) and doc["schedule_differs"].startswith("step 0: A runs prefill")


def test_bad_input_is_one_line_exit_2(tmp_path: Path, captured: Capture,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    good, _ = captured("single-slot", "shared", "membership", *STEPS)
    junk = tmp_path / "junk.kvtrace"
    junk.write_text("not a trace\n")
    for args in ([str(tmp_path / "missing.kvtrace"), str(good)], [str(good), str(junk)],
                 [str(good)]):
        capsys.readouterr()
        assert main(["diff", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kvdiag: error:")


def test_reads_without_served_pages_are_counted_not_compared(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A trace without served pages (format 1.0: the annotation only): diff says what it
    could not compare instead of calling the traces equivalent on provenance."""
    sample = Path(__file__).resolve().parent.parent / "traces" / "slot1-first-shared.kvtrace"
    bare = tmp_path / "bare.kvtrace"
    with TraceReader.open(sample) as r:
        lines = [msgspec.json.encode(r.header)]
        lines += [msgspec.json.encode(msgspec.structs.replace(e, served=())
                                      if isinstance(e, ev.Read) else e) for e in r]
    bare.write_bytes(b"\n".join(lines) + b"\n")
    code, doc = diff_json(capsys, str(bare), str(bare))
    assert code == 0
    assert doc["compared"]["reads"] == 0 and doc["compared"]["reads_not_recorded"] == 60
    capsys.readouterr()
    main(["diff", str(bare), str(bare)])
    assert "not compared: 60 read(s) without served pages" in capsys.readouterr().out
    code, doc = diff_json(capsys, str(sample), str(sample))
    assert code == 0 and doc["compared"]["reads"] == 60


def _declared_run(path: Path, ring_slot: int) -> Path:
    """A fork's run that declares what it records (kvtrace.h's header ``records``): pages 0-1
    of layer 0 uploaded into pool slot ``ring_slot`` and read from slot 0, before any write
    (a prefill's pages reloaded from the host store after a restart)."""
    from trace_samples import header

    from kvdiag.trace.writer import TraceWriter

    declared = msgspec.structs.replace(header(), records=(
        "step", "fits", "write", "upload", "read", "read.served", "output"))
    with TraceWriter.create(path, declared) as w:
        w.emit(ev.Step, 0, phase="decode", streams=(0,), tokens=1, n_kv=512)
        w.emit(ev.Upload, 0, layer=0, stream=0, pages=(0, 2), slot=ring_slot,
               target="resident", bytes=2, reason="miss")
        w.emit(ev.Read, 0, layer=0, stream=0, pool=2, ring=0, host=0,
               served=(ev.Served(0, 2, "pool", 0),))
        w.close("completed", steps=1)
    return path


def _pages(capsys: pytest.CaptureFixture[str], path: Path) -> dict[int, str]:
    capsys.readouterr()
    main(["trace", "pages", str(path), "--json"])
    return {p["page"]: p["class"] for p in map(json.loads, capsys.readouterr().out.splitlines())}


def test_diff_judges_each_trace_with_its_header_as_check_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN two declaring traces of one schedule whose only read comes before any write: the
    declaration says writes are recorded, so check judges A's pages exact (its slot holds
    them, no write since) and B's foreign (its slot was never filled)
    WHEN diffed
    THEN diff says the same (diff once built its Judge without the header: A's pages were
    then "not judged", left out, and the traces called equivalent)."""
    a = _declared_run(tmp_path / "a.kvtrace", 0)
    b = _declared_run(tmp_path / "b.kvtrace", 4)
    assert _pages(capsys, a) == {0: "exact", 1: "exact"}
    assert _pages(capsys, b) == {0: "foreign", 1: "foreign"}
    code, doc = diff_json(capsys, str(a), str(b))
    assert code == 1 and doc["verdict"] == "divergent"
    first = doc["first"]
    assert (first["kind"], first["step"], first["layer"], first["stream"]) == (
        "provenance", 0, 0, 0)
    assert (first["a"]["page"], first["a"]["class"], first["b"]["class"]) == (
        0, "exact", "foreign")
    assert first["text"] == ("stream 0 layer 0 page 0 was read exact from pool slot 0 in A, "
                             "foreign from pool slot 0 (never loaded) in B")


def test_the_cause_chain_names_the_last_write_of_the_read_page_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN two traces where stream 1's page 0 was written at step 0, and at step 1 stream 0
    writes its own page 0 of the same layer just before stream 1 reads page 0 — from the slot
    holding it in A, from the slot holding stream 0's page in B
    WHEN diffed
    THEN the chain's rows are stream 1's write at step 0 (the page read), not stream 0's write
    just before the read."""
    from trace_samples import header

    from kvdiag.trace.writer import TraceWriter

    declared = msgspec.structs.replace(header(), records=(
        "step", "write", "upload", "read", "read.served"))
    paths = []
    for name, slot in (("a", 0), ("b", 1)):
        path = tmp_path / f"{name}.kvtrace"
        with TraceWriter.create(path, declared) as w:
            w.emit(ev.Step, 0, phase="prefill", streams=(1,), tokens=10, n_kv=256)
            w.emit(ev.Write, 0, layer=0, stream=1, cells=(0, 10), rows=(2048, 2058), dirty=())
            w.emit(ev.Upload, 0, layer=0, stream=1, pages=(0, 1), slot=0, target="resident",
                   bytes=1, reason="miss")
            w.emit(ev.Step, 1, phase="prefill", streams=(0, 1), tokens=10, n_kv=256)
            w.emit(ev.Write, 1, layer=0, stream=0, cells=(0, 10), rows=(0, 10), dirty=())
            w.emit(ev.Upload, 1, layer=0, stream=0, pages=(0, 1), slot=1, target="resident",
                   bytes=1, reason="miss")
            w.emit(ev.Read, 1, layer=0, stream=1, pool=1, ring=0, host=0,
                   served=(ev.Served(0, 1, "pool", slot),))
            w.close("completed", steps=2)
        paths.append(path)
    code, doc = diff_json(capsys, *map(str, paths))
    assert code == 1
    first = doc["first"]
    assert (first["kind"], first["step"], first["stream"], first["a"]["class"],
            first["b"]["class"]) == ("provenance", 1, 1, "exact", "foreign")
    assert doc["chain"][0] == ("rows: stream 1 rows 2048-2057 (cells 0-9) last wrote page 0 at "
                               "step 0; they marked no key in A, no key in B")


def _crashed_at(src: Path, dst: Path, step: int, message: str) -> Path:
    """``src`` as a run that died at ``step``'s first read: what it wrote before, then a CUDA
    error's abort and an aborted end (as kvtrace.h's abort hook leaves it)."""
    with TraceReader.open(src) as r, dst.open("wb") as out:
        out.write(msgspec.json.encode(r.header) + b"\n")
        seq = 0
        for e in r:
            if isinstance(e, ev.End) or (e.step == step and isinstance(e, ev.Read)):
                break
            out.write(msgspec.json.encode(e) + b"\n")
            seq = e.seq
        out.write(msgspec.json.encode(ev.Abort(
            seq + 1, 0, step, message=message, file="ggml-cuda.cu", line=88,
            cuda_error="an illegal memory access was encountered")) + b"\n")
        out.write(msgspec.json.encode(ev.End(seq + 2, 0, step, status="aborted",
                                             steps=step + 1, events=seq + 1)) + b"\n")
    return dst


def test_a_run_that_crashed_is_not_equivalent_to_one_that_completed(
        captured: Capture, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """GIVEN the same schedule run to completion and run until a CUDA error at step 2, WHEN
    diffed either way round, THEN the abort is the divergence (its step and text), exit 1, in
    text and JSON; the same crash on both sides is equivalent."""
    done, _ = captured("single-slot", "per-stream", "fits", *STEPS)
    cuda = "CUDA error: an illegal memory access was encountered"
    crashed = _crashed_at(done, tmp_path / "crashed.kvtrace", 2, cuda)
    code, doc = diff_json(capsys, str(done), str(crashed))
    assert (code, doc["verdict"], doc["equivalent"]) == (1, "divergent", False)
    first = doc["first"]
    assert (first["kind"], first["step"]) == ("abort", 2)
    assert first["text"].startswith("B aborted at step 2 (#")
    assert cuda in first["text"] and "A did not abort there (completed, last step" in first["text"]
    assert first["a"]["abort"] is None and first["b"]["abort"]["step"] == 2
    assert doc["ends"]["b"]["status"] == "aborted"
    assert main(["diff", str(crashed), str(done)]) == 1
    out = capsys.readouterr().out
    assert "first divergence (abort) at step 2: A aborted at step 2" in out
    assert "equivalent" not in out
    again = _crashed_at(done, tmp_path / "again.kvtrace", 2, cuda)
    assert main(["diff", str(crashed), str(again)]) == 0
    assert "equivalent: no divergence" in capsys.readouterr().out
    # a run cut before step 2 without an end says nothing of what it would have done there
    cut = tmp_path / "cut.kvtrace"
    with TraceReader.open(done) as r, cut.open("wb") as out:
        out.write(msgspec.json.encode(r.header) + b"\n")
        out.writelines(msgspec.json.encode(e) + b"\n" for e in r if e.step < 2
                       and not isinstance(e, ev.End))
    code, doc = diff_json(capsys, str(crashed), str(cut))
    assert (code, doc["first"], doc["ends"]["b"]["status"]) == (0, None, "incomplete")
    other = _crashed_at(done, tmp_path / "other.kvtrace", 2, "GGML_ASSERT(n_kv > 0) failed")
    code, doc = diff_json(capsys, str(crashed), str(other))
    assert code == 1 and doc["first"]["kind"] == "abort"
    assert "B aborted at step 2" in doc["first"]["text"] or "A aborted" in doc["first"]["text"]


def _cut_at(src: Path, dst: Path, step: int, end: ev.End | None = None) -> Path:
    """``src`` as a run that stopped at ``step``: its events before that step, then ``end``
    (None: no End event, a killed run) numbered and counting as its writer would (the next
    seq and the events before it: a jump, or a count above it, would be events lost)."""
    with TraceReader.open(src) as r, dst.open("wb") as out:
        out.write(msgspec.json.encode(r.header) + b"\n")
        kept = [e for e in r if e.step < step and not isinstance(e, ev.End)]
        out.writelines(msgspec.json.encode(e) + b"\n" for e in kept)
        if end is not None:
            seq = kept[-1].seq + 1 if kept else 1
            end = msgspec.structs.replace(end, seq=seq, events=seq - 1)
            out.write(msgspec.json.encode(end) + b"\n")
    return dst


def test_a_run_that_stopped_early_is_not_equivalent_to_one_that_completed(
        captured: Capture, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """GIVEN the same schedule run to completion, and killed mid-run (no End event; every
    step it holds agrees) WHEN diffed either way round THEN the verdict is divergent, exit 1,
    the divergence ``end`` at the first step the killed run lacks, in text and JSON; a run
    interrupted with an End of status error says its reason; two killed runs say nothing."""
    done, _ = captured("single-slot", "per-stream", "fits", *STEPS)
    with TraceReader.open(done) as r:
        last = max(e.step for e in r)
    killed = _cut_at(done, tmp_path / "killed.kvtrace", last)
    code, doc = diff_json(capsys, str(done), str(killed))
    assert (code, doc["verdict"], doc["equivalent"]) == (1, "divergent", False)
    first = doc["first"]
    assert (first["kind"], first["step"]) == ("end", last)
    assert first["text"] == (f"B stopped after step {last - 1} without completing (no End "
                             f"event: killed, or still running); A completed (last step "
                             f"{last}): a run that stops early is not equivalent to one that "
                             "completes")
    assert first["a"] == {"status": "completed", "last_step": last}
    assert first["b"] == {"status": "incomplete", "last_step": last - 1}
    assert doc["ends"]["b"]["status"] == "incomplete" and doc["ends"]["b"]["last_step"] == last - 1
    assert main(["diff", str(killed), str(done)]) == 1
    out = capsys.readouterr().out
    assert f"first divergence (end) at step {last}: A stopped after step {last - 1}" in out
    assert "equivalent: no divergence" not in out
    # interrupted: an End with status error and the reason the writer knew
    stopped = _cut_at(done, tmp_path / "stopped.kvtrace", 2, ev.End(
        10_000, 0, 1, status="error", steps=2, events=9_999, reason="interrupted by SIGINT"))
    code, doc = diff_json(capsys, str(done), str(stopped), "--force")
    assert code == 1 and doc["first"]["kind"] == "end" and doc["first"]["step"] == 2
    assert "(End status error: interrupted by SIGINT)" in doc["first"]["text"]
    # neither completed: what one would have done where the other stopped is not recorded
    code, doc = diff_json(capsys, str(killed), str(stopped), "--force")
    assert (code, doc["first"]) == (0, None)
    assert main(["diff", str(done), str(done)]) == 0
