"""Bounded traces (issue 18 §2): kernels/kvtrace.h rotates into segments (KVTRACE_MAX_MB,
KVTRACE_KEEP) or keeps a flight recorder (KVTRACE_RING_MB); every segment starts with a
snapshot, so it is judged alone; kvdiag reads a set (or zstd segments) as one trace.

The runs are kvrt's (kernels/native_tests/kvrt/, tests/native_runtime.py): a C runtime that
judges every page it reads from the bytes in the slot, so each verdict here is checked against
the bytes, not against kvdiag's own idea.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zstandard
from native_cc import CC, KERNELS, TESTS_C
from native_cc import build as build_c
from native_runtime import CONFIGS, RuntimeUnavailable, build, read_truth, run_with

from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.judge import batches
from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader

try:
    BUILT = build()
except RuntimeUnavailable as exc:  # pragma: no cover - every CI machine has cc and c++
    pytest.skip(str(exc), allow_module_level=True)

Verdict = tuple[int, int, int, int, str, int, str, int]
"""(step, layer, stream, page, source, slot, class, lag) of one judged page."""


def judged(path: Path | str) -> tuple[list[tuple[int, int, str]], list[Verdict], TraceReader,
                                      Judge]:
    """Every page the Judge judges in ``path`` (a file or a set), keyed by the read's seq too."""
    reader = TraceReader.open(path)
    judge = Judge(reader.header)
    keyed: list[tuple[int, int, str]] = []
    pages: list[Verdict] = []
    for chunk in batches(reader):
        judge.feed_all(chunk)  # then ask about the chunk's reads
        for e in chunk:
            if type(e) is ev.Read:
                for p in judge.pages(e):
                    keyed.append((p.seq, p.page, p.cls))
                    pages.append((p.step, p.layer, p.stream, p.page, p.source, p.slot, p.cls,
                                  p.lag))
    return keyed, pages, reader, judge


def truth_of(path: Path) -> dict[tuple[int, int], str]:
    return {(t.seq, t.page): t.cls for t in read_truth(path)}


def segments(folder: Path, stem: str) -> list[Path]:
    return sorted(folder.glob(f"{stem}.[0-9]*.kvtrace*"))


def args_of(name: str) -> list[str]:
    args = list(CONFIGS[name])
    return [*args, "--dso", str(BUILT.dso)] if name == "dso" else args


@pytest.mark.parametrize("name", ["ring-reuse", "slot1-first", "threads", "dso", "fixed"])
def test_each_segment_alone_is_judged_as_the_whole_trace_and_as_the_bytes(
        tmp_path: Path, name: str) -> None:
    """GIVEN one kvrt configuration run twice, once into one file and once rotated into
    segments of 16 KiB (several threads take turns in "threads"; the ring copies of "dso" come
    from a shared object with its own copy of the header, writing through the adopted state)
    WHEN each segment is judged alone, from its snapshot
    THEN every page's verdict equals the unrotated trace's, page for page in the same order,
    and equals kvrt's own verdict from the bytes."""
    whole, truth_whole = tmp_path / "whole.kvtrace", tmp_path / "whole.truth"
    rc, err = run_with(args_of(name), whole, truth_whole, {}, BUILT)
    assert rc == 0, err
    rotated, truth_rot = tmp_path / "rot.kvtrace", tmp_path / "rot.truth"
    rc, err = run_with(args_of(name), rotated, truth_rot, {"KVTRACE_MAX_MB": "0.015625"}, BUILT)
    assert rc == 0, err
    assert not rotated.exists()
    files = segments(tmp_path, "rot")
    assert len(files) >= 3, [f.name for f in files]

    _, whole_pages, _, _ = judged(whole)
    truth = truth_of(truth_rot)
    alone_pages: list[Verdict] = []
    for i, f in enumerate(files):
        keyed, pages, reader, judge = judged(f)
        with TraceReader.open(f) as r:
            first = next(iter(r))
        assert (type(first) is ev.Snapshot) == (i > 0), f.name  # segment 1 starts empty
        assert reader.header.extra["segment"]["index"] == i + 1
        assert [(s, p) for s, p, _ in keyed] and all(truth[(s, p)] == c for s, p, c in keyed)
        assert judge.snapshot_replaced == []
        alone_pages += pages
    assert alone_pages == whole_pages
    assert len(alone_pages) == len(truth) == len(read_truth(truth_whole))
    # the set read as one: the same verdicts, no problem, the snapshots only compared
    keyed, pages, reader, judge = judged(tmp_path / "rot.kvtrace")
    assert pages == whole_pages
    assert reader.problems == [] and judge.snapshot_replaced == []
    assert reader.segments is not None and reader.segments.indices == tuple(
        range(1, len(files) + 1))


def watch_size(folder: Path, stop: threading.Event, seen: list[int]) -> None:
    while not stop.is_set():
        total = 0
        for f in folder.iterdir():
            with contextlib.suppress(FileNotFoundError):  # deleted by KVTRACE_KEEP meanwhile
                total += f.stat().st_size
        seen.append(total)
        time.sleep(0.001)


def test_a_long_run_stays_within_its_disk_budget_and_every_segment_is_judged_right(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a long kvrt run (300 requests with restarts, invalidations, two streams' aliasing:
    some 90,000 events), rotated at 0.25 MB and keeping 4 segments
    WHEN the folder's size is watched while it runs
    THEN it never holds more than 4 segments' worth (4 × (0.25 MB + one step + snapshot));
    the 4 kept segments are the newest, read as one set with the dropped ones said, and every
    page they judge equals kvrt's verdict from the bytes. A second run that keeps every segment
    has each of its segments judged right alone."""
    out = tmp_path / "keep4"
    out.mkdir()
    stop, seen = threading.Event(), [0]
    watcher = threading.Thread(target=watch_size, args=(out, stop, seen))
    watcher.start()
    try:
        rc, err = run_with(["--layout", "shared", "--dispatch", "fits", "--forever", "--rounds",
                            "300", "--prompt", "900"], out / "rig.kvtrace", tmp_path / "rig.truth",
                           {"KVTRACE_MAX_MB": "0.25", "KVTRACE_KEEP": "4"}, BUILT)
    finally:
        stop.set()
        watcher.join()
    assert rc == 0, err
    files = segments(out, "rig")
    assert len(files) == 4
    last = int(files[-1].name.split(".")[1])
    assert last > 40  # the run made many segments; all but 4 were deleted
    biggest = max(f.stat().st_size for f in files)
    budget = 4 * (0.25 * 2**20 + 8192 + 4096)  # a step's events and a snapshot beyond 0.25 MB
    assert biggest < 0.25 * 2**20 + 8192 + 4096
    assert max(seen) <= budget, (max(seen), budget)
    truth = truth_of(tmp_path / "rig.truth")
    keyed, _, reader, _judge = judged(out)  # the folder names the set
    assert reader.problems == [] and reader.complete
    assert reader.segments is not None and reader.segments.dropped_before == last - 4
    assert f"{last - 4} before them deleted" in reader.segments.text()
    assert main(["trace", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["segments"]["indices"] == list(range(last - 3, last + 1))
    assert info["segments"]["text"].endswith(
        f"(4 read; {last - 4} before them deleted by the writer's KVTRACE_KEEP=4 rotation)")
    assert len(keyed) > 2000 and all(truth[(s, p)] == c for s, p, c in keyed)

    every = tmp_path / "all"
    every.mkdir()
    args = ["--layout", "shared", "--dispatch", "fits", "--forever", "--rounds", "60",
            "--prompt", "700"]
    rc, err = run_with(args, every / "rig.kvtrace", every / "rig.truth",
                       {"KVTRACE_MAX_MB": "0.25"}, BUILT)
    assert rc == 0, err
    rc, err = run_with(args, every / "one.kvtrace", every / "one.truth", {}, BUILT)
    assert rc == 0, err
    truth = truth_of(every / "rig.truth")
    files = segments(every, "rig")
    assert len(files) > 10
    covered: set[tuple[int, int]] = set()
    alone: list[Verdict] = []
    for f in files:
        keyed, pages, _, _ = judged(f)
        assert all(truth[(s, p)] == c for s, p, c in keyed), f.name
        covered |= {(s, p) for s, p, _ in keyed}
        alone += pages
    assert covered == set(truth)
    assert alone == judged(every / "one.kvtrace")[1]


def compress(path: Path, cut: float | None = None) -> Path:
    data = zstandard.ZstdCompressor().compress(path.read_bytes())
    out = path.with_name(path.name + ".zst")
    out.write_bytes(data if cut is None else data[:int(len(data) * cut)])
    path.unlink()
    return out


def rotated_run(tmp_path: Path, name: str = "slot1-first") -> tuple[list[Path], Path]:
    rc, err = run_with(args_of(name), tmp_path / "s.kvtrace", tmp_path / "s.truth",
                       {"KVTRACE_MAX_MB": "0.015625"}, BUILT)
    assert rc == 0, err
    return segments(tmp_path, "s"), tmp_path / "s.truth"


def test_zstd_segments_are_read_by_every_reader(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a rotated run whose closed segments are compressed (.kvtrace.zst), the last one
    still plain WHEN check, trace validate/pages/export and the TUI's loader read the set, and
    one compressed segment alone THEN they read what the uncompressed set gives."""
    files, truth_path = rotated_run(tmp_path)
    assert main(["trace", "pages", str(tmp_path / "s.kvtrace"), "--json"]) == 0
    plain_pages = capsys.readouterr().out
    for f in files[:-1]:
        compress(f)
    assert len(list(tmp_path.glob("s.*.kvtrace.zst"))) == len(files) - 1
    assert main(["trace", "validate", str(tmp_path / "s.kvtrace")]) == 0
    assert "valid: format 1.2" in capsys.readouterr().out
    assert main(["trace", "pages", str(tmp_path / "s.kvtrace"), "--json"]) == 0
    assert capsys.readouterr().out == plain_pages
    assert main(["trace", "pages", f"{tmp_path}/s.*.kvtrace*", "--json"]) == 0  # a glob
    assert capsys.readouterr().out == plain_pages
    # one compressed segment alone, judged from its snapshot against the bytes
    second = tmp_path / files[1].with_suffix(".kvtrace.zst").name
    keyed, _, reader, _ = judged(second)
    truth = truth_of(truth_path)
    assert keyed and all(truth[(s, p)] == c for s, p, c in keyed)
    assert [p.kind for p in reader.problems] == ["incomplete"]
    assert "continued in the next one" in reader.problems[0].message
    rc = main(["check", str(tmp_path / "s.kvtrace"), "--json"])
    report = json.loads(capsys.readouterr().out)
    counts = report["summary"]["residency"]["read_classes"]
    assert rc == 1 and {k: counts[k] for k in ("exact", "stale", "foreign")} == {
        k: sum(1 for c in truth.values() if c == k) for k in ("exact", "stale", "foreign")}
    out = tmp_path / "s.json"
    assert main(["trace", "export", str(tmp_path / "s.kvtrace"), "-o", str(out)]) == 0
    exported = json.loads(out.read_text())
    events = exported["traceEvents"] if isinstance(exported, dict) else exported
    names = [e.get("name", "") for e in events]
    assert sum(n.startswith("segment starts (rotate)") for n in names) == len(files) - 1

    from kvdiag.tui.loading import load

    docs: list[object] = []
    load(str(tmp_path / "s.kvtrace"), docs.append)
    doc = docs[-1]
    assert type(doc).__name__ == "TraceDoc", doc
    assert doc.digest.summary["residency"]["read_classes"] == counts  # type: ignore[attr-defined]


def test_sql_reads_a_set_by_its_name_folder_and_glob(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN kvrt's ring-reuse run rotated into segments, one of them deleted (a gap) and one
    compressed WHEN ``kvdiag sql`` is given the KVTRACE_FILE path, the folder, a glob and the
    compressed segment alone THEN it reads what check reads (it said "no such file", and took
    a .kvtrace.zst for a log)."""
    pytest.importorskip("duckdb")
    files, _ = rotated_run(tmp_path, "ring-reuse")
    assert len(files) >= 4
    files[2].unlink()
    zst = compress(files[1])
    rc = main(["check", str(tmp_path / "s.kvtrace"), "--json"])
    want = json.loads(capsys.readouterr().out)["summary"]["residency"]["read_classes"]
    assert rc == 1 and want["foreign"] > 0
    query = ("SELECT (SELECT sum(pages) FROM pages WHERE class = 'exact') AS exact, "
             "(SELECT sum(pages) FROM pages WHERE class = 'foreign') AS foreign_, "
             "(SELECT string_agg(kind, ',') FROM problems) AS problems")
    for named in (tmp_path / "s.kvtrace", tmp_path, f"{tmp_path}/s.*.kvtrace*"):
        assert main(["sql", "--format", "json", query, str(named)]) == 0, named
        row = json.loads(capsys.readouterr().out)
        assert (row["exact"], row["foreign_"]) == (want["exact"], want["foreign"]), named
        assert row["problems"] == "gap"
    assert main(["sql", "--format", "json", "SELECT count(*) AS n FROM pages", str(zst)]) == 0
    assert json.loads(capsys.readouterr().out)["n"] > 0


def test_a_cut_zstd_segment_is_read_up_to_its_break(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a segment of 260 KB whose .zst was cut at 60 % (a compressor stopped) WHEN it is
    validated THEN the events before the break are kept and the break is reported; cut before
    its first line it is one line of error, exit 2."""
    rc, err = run_with(["--layout", "shared", "--dispatch", "fits", "--forever", "--rounds",
                        "12", "--prompt", "900"], tmp_path / "c.kvtrace", tmp_path / "c.truth",
                       {"KVTRACE_MAX_MB": "0.25"}, BUILT)
    assert rc == 0, err
    first = segments(tmp_path, "c")[0]
    lines = first.read_bytes().count(b"\n")
    cut = compress(first, cut=0.6)
    reader = TraceReader.open(cut)
    events = list(reader)
    assert 0 < len(events) < lines - 1
    assert any(p.kind == "truncated" and "ends inside a zstd frame" in p.message
               for p in reader.problems)
    assert main(["trace", "validate", str(cut)]) == 1
    head = tmp_path / "head.kvtrace.zst"
    head.write_bytes(cut.read_bytes()[:40])
    assert main(["trace", "validate", str(head)]) == 2
    assert "ends inside a zstd frame (cut short)" in capsys.readouterr().err


def test_a_gap_between_segments_is_reported_not_joined(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """GIVEN a rotated set with its second segment deleted WHEN it is read as one THEN a gap
    problem names the missing segment and the seqs lost, validate fails, the End count allows
    for them, and the pages after the gap are judged from the next snapshot (equal to the
    bytes), with the state replacement counted."""
    files, truth_path = rotated_run(tmp_path)
    assert len(files) >= 3
    files[1].unlink()
    keyed, _, reader, judge = judged(tmp_path / "s.kvtrace")
    gaps = [p for p in reader.problems if p.kind == "gap"]
    assert [p.kind for p in reader.problems] == ["gap"]
    assert "segment 000002 missing between s.000001.kvtrace and s.000003.kvtrace: seq " in \
        gaps[0].message
    truth = truth_of(truth_path)
    assert keyed and all(truth[(s, p)] == c for s, p, c in keyed)
    assert len(judge.snapshot_replaced) == 1
    # the set's gap problem says the seqs lost; the judgement does not say them twice
    assert judge.snapshot().lost is None
    assert main(["trace", "validate", str(tmp_path / "s.kvtrace")]) == 1
    out = capsys.readouterr().out
    assert ": gap: segment 000002 missing" in out and "event(s) lost" not in out
    assert main(["check", str(tmp_path / "s.kvtrace")]) == 1
    out = capsys.readouterr().out
    assert "segment 000002 missing" in out
    flat = " ".join(out.split())  # the line may wrap at the terminal's width
    assert f"({len(files) - 1} read, 1 missing between)" in flat

    from kvdiag.tui.loading import load_trace

    for in_process in (False, True):  # the viewer's judging pass, here and in a child
        docs: list[object] = []
        load_trace(str(tmp_path / "s.kvtrace"), docs.append, judge_in_process=in_process)
        digest = docs[-1].digest  # type: ignore[attr-defined]
        assert [p.kind for p in digest.problems] == ["gap"]
        assert digest.summary["residency"]["cross_check"]["snapshot_replaced"] == 1


def test_segments_of_an_earlier_run_are_left_out(tmp_path: Path) -> None:
    """GIVEN an earlier, longer run's segments under the same name and a newer, shorter run
    (which rewrote the first segments) WHEN the name is read THEN the newer run's segments are
    the set, and each older one left over is said to be left out."""
    rc, err = run_with(args_of("slot1-first"), tmp_path / "s.kvtrace", tmp_path / "a.truth",
                       {"KVTRACE_MAX_MB": "0.015625"}, BUILT)
    assert rc == 0, err
    old = len(segments(tmp_path, "s"))
    time.sleep(0.02)  # the newer run's files are newer
    rc, err = run_with(["--layout", "per-stream", "--dispatch", "fits", "--steps", "1",
                        "--prompt", "300"], tmp_path / "s.kvtrace", tmp_path / "b.truth",
                       {"KVTRACE_MAX_MB": "0.015625"}, BUILT)
    assert rc == 0, err
    keyed, _, reader, _ = judged(tmp_path / "s.kvtrace")
    assert reader.segments is not None
    new = len(reader.segments.indices)
    assert 0 < new < old
    left = [p for p in reader.problems if p.kind == "segment"]
    assert len(left) == old - new and all("from another run" in p.message for p in left)
    assert reader.complete
    assert {(s, p) for s, p, _ in keyed} == set(truth_of(tmp_path / "b.truth"))


FLIGHT = ["--layout", "shared", "--dispatch", "fits", "--forever", "--rounds", "40",
          "--prompt", "900"]


@pytest.mark.parametrize(("how", "args", "signal_name"), [
    ("segv", [*FLIGHT, "--crash", "segv", "--crash-at", "400"], "SIGSEGV"),
    ("sigabrt", [*FLIGHT, "--crash", "abort", "--crash-at", "400"], "SIGABRT"),
    ("exit", FLIGHT, None),
    ("kvtrace-abort", list(CONFIGS["abort"]), None),
])
def test_the_flight_recorder_writes_its_window(tmp_path: Path, how: str, args: list[str],
                                               signal_name: str | None) -> None:
    """GIVEN a run with KVTRACE_RING_MB=0.125 (a 64 KiB half) WHEN it dies of SIGSEGV or
    SIGABRT, aborts through KVTRACE_ABORT, or exits THEN the file holds the header, the
    window's snapshot and its last events with an end event (status and reason), it is a valid
    trace, and every page it judges equals kvrt's verdict from the bytes."""
    trace, truth_path = tmp_path / "f.kvtrace", tmp_path / "f.truth"
    rc, _err = run_with(args, trace, truth_path, {"KVTRACE_RING_MB": "0.125"}, BUILT)
    keyed, _, reader, judge = judged(trace)
    assert reader.problems == [], reader.problems
    assert judge.snapshot().lost is None  # a window from its snapshot on loses nothing
    end = reader.end
    assert end is not None
    if signal_name:
        assert rc < 0 and end.status == "aborted" and end.reason == f"signal {signal_name}"
    elif how == "exit":
        assert rc == 0 and end.status == "completed"
    else:
        assert rc < 0 and end.status == "aborted"
        assert any(type(e) is ev.Abort for e in list(TraceReader.open(trace)))
    events = list(TraceReader.open(trace))
    assert events[-1].seq == end.seq and end.events == end.seq - 1
    seg = reader.header.extra["segment"]
    assert seg["mode"] == "flight-recorder"
    if how != "kvtrace-abort":  # a long run: the window is its end, starting at a snapshot
        assert seg["first_seq"] > 1 and type(events[0]) is ev.Snapshot
        assert trace.stat().st_size < 0.125 * 2**20 + 4096
    truth = truth_of(truth_path)
    assert keyed and all(truth[(s, p)] == c for s, p, c in keyed)


def test_rotation_and_ring_settings_that_are_not_numbers_are_refused(tmp_path: Path) -> None:
    """GIVEN KVTRACE_MAX_MB=lots WHEN the runtime starts THEN tracing goes on into one file and
    stderr says why rotation is off."""
    rc, err = run_with(args_of("fixed"), tmp_path / "x.kvtrace", tmp_path / "x.truth",
                       {"KVTRACE_MAX_MB": "lots", "KVTRACE_KEEP": "2"}, BUILT)
    assert rc == 0
    assert "KVTRACE_MAX_MB is not a positive number" in err
    assert (tmp_path / "x.kvtrace").is_file() and not segments(tmp_path, "x")


def test_eight_threads_rotating_lose_nothing_and_every_snapshot_matches(tmp_path: Path) -> None:
    """GIVEN 8 threads writing 120,000 upload events with no step events, rotated at 0.125 MB
    (so every rotation is the forced one at 2 × 0.125 MB, in the middle of the threads' stream)
    WHEN the set is read as one THEN seq runs 1..N without a hole or a repeat across all
    segments, every segment but the first starts with a snapshot, and each snapshot equals the
    state the judgement derived from the events before it (none replaced a state)."""
    if CC is None:  # pragma: no cover - every CI machine has gcc
        pytest.skip("no gcc")
    exe = tmp_path / "kvtrace_bench"
    build_c([CC, "-std=c99", "-O2", "-I", str(KERNELS), str(TESTS_C / "kvtrace_bench.c"), "-o",
             str(exe), "-pthread"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    env.update(KVTRACE_FILE=str(tmp_path / "mt.kvtrace"), KVTRACE_MAX_MB="0.125")
    proc = subprocess.run([str(exe), "on", "120000", "8"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    files = segments(tmp_path, "mt")
    assert len(files) > 20
    reader = TraceReader.open(tmp_path / "mt.kvtrace")
    judge = Judge(reader.header)
    seqs: list[int] = []
    snapshots = 0
    for chunk in batches(reader):
        judge.feed_all(chunk)
        seqs += [e.seq for e in chunk]
        snapshots += sum(type(e) is ev.Snapshot for e in chunk)
    assert reader.problems == [] and reader.complete
    assert seqs == list(range(1, len(seqs) + 1))
    assert snapshots == len(files) - 1
    assert len(seqs) == 120000 + snapshots + 1  # the uploads, the snapshots, the end
    assert judge.snapshot_replaced == []


def test_a_file_whose_name_looks_like_a_glob_is_read_as_the_file(tmp_path: Path) -> None:
    """GIVEN a trace file named with glob characters ('run[1].kvtrace') WHEN it is read THEN
    it is that file, not a pattern."""
    src = tmp_path / "plain.kvtrace"
    rc, err = run_with(args_of("fixed"), src, tmp_path / "p.truth", {}, BUILT)
    assert rc == 0, err
    odd = tmp_path / "run[1].kvtrace"
    src.rename(odd)
    with TraceReader.open(odd) as reader:
        assert sum(1 for _ in reader) > 10 and reader.problems == [] and reader.segments is None
