"""Every query of docs/sql.md, run over a small fleet (tests/sql_corpus.py), answers what
kvdiag check, kvdiag postmortem and kvdiag perf say of the same files."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sql_corpus import build

from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.signatures import evaluate
from kvdiag.files.logs import open_log
from kvdiag.judged.trace import CheckResult, analyse_file
from kvdiag.model import events as ev
from kvdiag.postmortem.parse import scan
from kvdiag.postmortem.perfread import scan_paths
from kvdiag.sql import run
from kvdiag.trace.reader import TraceReader

DOC = Path(__file__).resolve().parent.parent / "docs" / "sql.md"
QUERIES: dict[str, str] = dict(re.findall(r"```sql\n-- q: (\S+)\n(.*?)```", DOC.read_text(),
                                          re.S))
TRACES = ("s1r", "two", "lj", "pp")
LOGS = ("stream", "crash", "pycrash")


class Fleet:
    def __init__(self, root: Path) -> None:
        self.files = build(root)
        self.paths = [str(self.files[n]) for n in (*TRACES, *LOGS)]
        self.check: dict[str, CheckResult] = {str(self.files[n]): analyse_file(self.files[n])
                                              for n in TRACES}
        # converted once; each query reads the folder (test_sql.py compares the two paths)
        self.folder = str(root / "all")
        run.parquet(self.folder, self.paths)

    def rows(self, name: str) -> list[dict[str, Any]]:
        result = run.query(QUERIES[name], [self.folder])
        return [dict(zip(result.columns, r, strict=True)) for r in result.rows]

    def findings(self, rule: str) -> list[tuple[str, Any]]:
        return [(path, f) for path, c in self.check.items() for f in c.findings
                if f.rule == rule]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return Fleet(tmp_path_factory.mktemp("fleet"))


def check_classes(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    got = {(r["file"], r["class"].replace(" ", "_")): r["pages"] for r in rows}
    want = {(path, cls): n for path, c in fleet.check.items()
            for cls, n in c.summary["residency"]["read_classes"].items() if n}
    assert got == want
    assert got[(str(fleet.files["s1r"]), "stale")] == 16


def check_stale_after_repartition(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    # the judgement's own page verdicts (what kvdiag trace pages prints), after the first
    # repartition event
    with TraceReader.open(fleet.files["s1r"]) as reader:
        judge = Judge(reader.header)
        after: int | None = None
        stale: Counter[int] = Counter()
        for e in reader:
            judge.feed(e)
            if isinstance(e, ev.Repartition) and after is None:
                after = e.seq
            if isinstance(e, ev.Read) and after is not None:
                stale.update(p.layer for p in judge.pages(e) if p.cls == "stale")
    assert stale and {(r["file"], r["layer"]): r["stale_pages"] for r in rows} == {
        (str(fleet.files["s1r"]), layer): n for layer, n in stale.items()}


def check_first_bad_read(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    want = {(path, f.details["stream"], f.rule.split("-")[0]):
            (f.details["first_step"], f.details["reads"], f.details["pages"])
            for rule in ("stale-page-read", "foreign-page-read")
            for path, f in fleet.findings(rule)}
    got = {(r["file"], r["stream"], r["class"]): (r["first_step"], r["reads"], r["pages"])
           for r in rows}
    assert got == want and len(got) == 2


def check_divergence_onset(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    want = {(path, f.details["stream"]): (f.details["first_step"], f.details["count"],
                                          f.details["max_abs_delta"])
            for path, f in fleet.findings("stream-divergence")}
    got = {(r["file"], r["stream"]): (r["onset"], r["outputs"], r["worst"]) for r in rows}
    assert got == want and want


def check_failed_conditions(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    decisions: Counter[str] = Counter()
    traces: dict[str, set[str]] = {}
    for rule in ("fits-dispatch-mismatch", "fallback"):
        for path, f in fleet.findings(rule):
            for name in f.details["failed"]:
                decisions[name] += f.details["count"]
                traces.setdefault(name, set()).add(path)
    assert {r["name"]: (r["decisions"], r["traces"]) for r in rows} == {
        n: (k, len(traces[n])) for n, k in decisions.items()}
    assert rows[0]["value"].endswith("=2")  # the logged ne[3] it tested


def check_upload_bytes_per_token(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    want = {(path, target): n for path, c in fleet.check.items()
            for target, n in c.summary["residency"]["upload_bytes"].items()}
    assert {(r["file"], r["target"]): r["bytes"] for r in rows} == want
    for r in rows:
        with TraceReader.open(r["file"]) as reader:
            tokens = sum(e.tokens * len(e.streams) for e in reader if isinstance(e, ev.Step))
        assert r["tokens"] == tokens and r["bytes_per_token"] == round(r["bytes"] / tokens)


def _log_findings(fleet: Fleet) -> list[Any]:
    out = []
    for n in LOGS:
        with open_log(str(fleet.files[n])) as log:
            out += evaluate(scan([(log.name, log.stream)]))
    return out


def check_findings_by_rule(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    every = [f for c in fleet.check.values() for f in c.findings] + _log_findings(fleet)
    assert {(r["rule"], r["severity"]): r["findings"] for r in rows} == dict(
        Counter((f.rule, f.severity.label) for f in every))
    assert rows[0]["severity"] == "critical"


def check_routes(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    got: dict[str, Counter[str]] = {}
    for r in rows:
        got.setdefault(r["file"], Counter())[r["route"]] += r["decisions"]
    assert got == {path: Counter(c.summary["residency"]["routes"])
                   for path, c in fleet.check.items() if c.summary["residency"]["routes"]}
    mismatch = [r for r in rows if r["outcome"] == "mismatch"]
    assert [(r["file"], r["decisions"], r["first_step"]) for r in mismatch] == [
        (path, f.details["count"], f.details["first_step"])
        for path, f in fleet.findings("fits-dispatch-mismatch")]


def check_repartitions(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    assert {r["file"]: r["repartitions"] for r in rows} == {
        path: c.summary["counts"]["repartition"] for path, c in fleet.check.items()
        if c.summary["counts"].get("repartition")}
    s1r = next(r for r in rows if r["file"] == str(fleet.files["s1r"]))
    assert s1r["first_step"] == 4 and s1r["resident"] == [[8, 6]]


def check_ring_starved(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    want = {path: f.details["evaluations"] for path, f in fleet.findings("ring-starved")}
    assert want and {r["file"]: r["longest_streak"] for r in rows
                     if r["longest_streak"] >= 8} == want


def check_timings(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    (perf,) = scan_paths([str(fleet.files["stream"])])
    assert [(r["task"], r["depth_start"], r["decode_tps"], r["truncated"]) for r in rows] == [
        (q.task, q.depth_start, q.decode_tps, q.truncated) for q in perf.requests]
    assert len(rows) == 12 and rows[0]["decode_tps"] == 31.52


def check_crashes(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    log = next(r for r in rows if r["file"] == str(fleet.files["crash"]))
    with open_log(str(fleet.files["crash"])) as opened:
        (crash,) = scan([(opened.name, opened.stream)]).crashes
    assert crash.abort is not None and crash.backtrace is not None
    assert (log["condition"], log["frames"]) == (crash.abort.condition,
                                                 len(crash.backtrace.frames))
    assert log["top_frame"] == next(f.function for f in crash.backtrace.frames if f.in_app
                                    and f.function)
    traces = {r["file"]: r["condition"] for r in rows if r["kind"] == "abort"}
    assert traces == {path: f.details["condition"] for path, f in fleet.findings("abort")}


def check_python_threads(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    want = []
    for path in sorted(str(fleet.files[n]) for n in LOGS):
        with open_log(path) as opened:
            crashes = scan([(opened.name, opened.stream)]).crashes
        for i, crash in enumerate(crashes):
            want += [(path, i, s, st.thread, st.name, st.current, len(st.frames),
                      next((f.function for f in st.frames if f.in_app), None))
                     for s, st in enumerate(crash.python) if st.frames]
    got = [(r["file"], r["crash"], r["stack"], r["thread"], r["thread_name"], r["signalled"],
            r["frames"], r["top_app_frame"]) for r in rows]
    assert got == want
    py = str(fleet.files["pycrash"])
    assert got == [(py, 0, 0, "0x00007fd1c3a4e740", "MainThread", True, 4, "decode"),
                   (py, 0, 1, "0x00007fd1a9ffb6c0", "uvicorn-worker", False, 2, "run")]


def check_incomplete(fleet: Fleet, rows: list[dict[str, Any]]) -> None:
    assert {r["file"]: r["status"] for r in rows} == {
        path: c.summary["status"] for path, c in fleet.check.items()
        if c.summary["status"] != "completed"}
    assert {r["status"] for r in rows} == {"aborted"}


CHECKS: dict[str, Callable[[Fleet, list[dict[str, Any]]], None]] = {
    "classes": check_classes, "stale-after-repartition": check_stale_after_repartition,
    "first-bad-read": check_first_bad_read, "divergence-onset": check_divergence_onset,
    "failed-conditions": check_failed_conditions,
    "upload-bytes-per-token": check_upload_bytes_per_token,
    "findings-by-rule": check_findings_by_rule, "routes": check_routes,
    "repartitions": check_repartitions, "ring-starved": check_ring_starved,
    "timings": check_timings, "crashes": check_crashes, "incomplete": check_incomplete,
    "python_threads": check_python_threads,
}


def test_every_query_of_the_doc_has_a_check() -> None:
    assert set(QUERIES) == {*CHECKS, "fleet"}
    assert len(CHECKS) >= 12


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_doc_query_agrees_with_the_reports(fleet: Fleet, name: str) -> None:
    rows = fleet.rows(name)
    assert rows, f"{name}: no rows over the fleet"
    CHECKS[name](fleet, rows)


def test_the_fleet_query_over_parquet_folders(fleet: Fleet, tmp_path: Path) -> None:
    import duckdb

    run.parquet(str(tmp_path / "fleet" / "a"), [str(fleet.files["two"])])
    run.parquet(str(tmp_path / "fleet" / "b"), [str(fleet.files["lj"]), str(fleet.files["pp"])])
    sql = QUERIES["fleet"].replace("'fleet/", f"'{tmp_path}/fleet/")
    got = duckdb.sql(sql).fetchall()
    # the same answer as the per-trace findings: every ne[3] condition, 11 decisions, 2 runs
    decisions: Counter[str] = Counter()
    for rule in ("fits-dispatch-mismatch", "fallback"):
        for path, f in fleet.findings(rule):
            if path in (str(fleet.files["two"]), str(fleet.files["lj"])):
                for name in f.details["failed"]:
                    decisions[name] += f.details["count"]
    assert {name: (n, runs) for name, n, runs in got} == {n: (k, 2) for n, k in
                                                          decisions.items()}
    # and kvdiag sql over the folders gives it too
    via = run.query(QUERIES["failed-conditions"], [str(tmp_path / "fleet" / "a"),
                                                   str(tmp_path / "fleet" / "b")])
    assert {r[0]: r[1] for r in via.rows} == dict(decisions)


def test_upload_bytes_query_leaves_unknown_bytes_out_as_check_does(tmp_path: Path) -> None:
    """GIVEN a fork's trace with uploads of known bytes, -1 (its "unknown") and null, WHEN the
    documented upload-bytes query runs, THEN its bytes are check's ``upload_bytes`` (the -1
    was summed in: 24575 where check says 24576)."""
    from tests.trace_samples import end_line, event_line, header_line

    def up(seq: int, pages: list[int], nbytes: int | None, target: str = "ring") -> bytes:
        return event_line("upload", seq, 0, layer=0, stream=0, pages=pages, slot=pages[0],
                          target=target, bytes=nbytes, reason=target if target == "ring"
                          else "miss")

    path = tmp_path / "fork.kvtrace"
    path.write_bytes(b"".join([
        header_line("1.1"),
        event_line("step", 1, 0, phase="decode", streams=[0], tokens=3, n_kv=768),
        up(2, [0, 1], 8192), up(3, [1, 2], 16384), up(4, [2, 3], -1), up(5, [0, 1], None,
                                                                          "resident"),
        up(6, [1, 2], 4096, "resident"), end_line(7, 6)]))
    want = analyse_file(path).summary["residency"]["upload_bytes"]
    assert want == {"ring": 24576, "resident": 4096}
    res = run.query(QUERIES["upload-bytes-per-token"], [str(path)])
    rows = [dict(zip(res.columns, r, strict=True)) for r in res.rows]
    assert {r["target"]: r["bytes"] for r in rows} == want
