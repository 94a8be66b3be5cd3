"""Exit codes agree with the report (issue 16 item 4): a failed write to standard output or
error is an error, postmortem fails on --fail-on as check does, --debug keeps the exit code,
no parser takes abbreviations, and diff does not call traces with nothing in common
equivalent."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvdiag import cli
from kvdiag.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
LOGS = ROOT / "tests" / "fixtures" / "logs"
KVDIAG = [sys.executable, "-m", "kvdiag"]


def run(*args: str, stdout: object = subprocess.PIPE, stderr: object = subprocess.PIPE,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVDIAG, *args], stdout=stdout, stderr=stderr, text=True,  # type: ignore[call-overload]
                          timeout=300, check=False)


# -- failed writes to stdout / stderr -------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [
    ["check", str(TRACES / "single-slot.kvtrace")],
    ["check", str(TRACES / "two-slot-upstream.kvtrace"), "--format", "sarif"],
    ["trace", "validate", str(TRACES / "late-join-fits-dispatch.kvtrace")],
    ["postmortem", str(LOGS / "aliasing_no_crash.log"), "--json"],
    ["plan", "--preset", "arm117"],
    ["--version"],
])
def test_a_full_standard_output_is_exit_2_with_one_line(args: list[str]) -> None:
    with open("/dev/full", "w") as full:  # writing to /dev/full fails with ENOSPC: its purpose
        proc = run(*args, stdout=full)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("kvdiag: error: cannot write to standard output: No space left on "
                           "device\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_standard_error_is_exit_2(tmp_path: Path) -> None:
    """plan -np 2 warns on stderr; the warning cannot be written, so the run failed."""
    with open("/dev/full", "w") as full:
        proc = run("plan", "--np", "2", stderr=full)
    assert proc.returncode == 2 and "kv-stream plan" in proc.stdout
    with open("/dev/full", "w") as full:  # nothing written to stderr: nothing failed
        proc = run("plan", stderr=full)
    assert proc.returncode == 0 and "OK: the runtime would boot" in proc.stdout


def test_a_reader_that_stops_early_is_a_failed_write() -> None:
    with subprocess.Popen([*KVDIAG, "trace", "export",
                           str(TRACES / "slot1-first-shared.kvtrace"), "-o", "-"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(100).startswith(b"[")
        proc.stdout.close()  # the reader goes away mid-export (as `| head -c 100` does)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 2
    assert err.startswith("kvdiag: error: cannot write") and "Broken pipe" in err, err


# -- postmortem --fail-on -------------------------------------------------------------------


def test_postmortem_fails_on_an_error_level_result_in_every_format(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The aliasing risk (error with the multiseq opt-in) and no crash: exit 1, as check would;
    --fail-on critical lets it pass; SARIF and JUnit say the same."""
    log = str(LOGS / "aliasing_no_crash.log")
    assert main(["postmortem", log, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["crashes"] == []
    levels = {f["rule"]: f["severity"] for f in doc["findings"]}
    assert levels["kvstream-multislot-aliasing-risk"] == "error"
    assert main(["postmortem", log, "--fail-on", "critical", "--format", "sarif"]) == 0
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["runs"][0]["invocations"][0]["exitCode"] == 0
    assert main(["postmortem", log, "--format", "sarif"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["runs"][0]["invocations"][0]["exitCode"] == 1
    assert main(["postmortem", log, "--format", "junit"]) == 1
    assert 'failures="1"' in capsys.readouterr().out
    assert main(["postmortem", log, "--format", "junit", "--fail-on", "critical"]) == 0
    assert 'failures="0"' in capsys.readouterr().out
    assert main(["postmortem", log, "--fail-on", "loud"]) == 2
    assert "--fail-on: unknown severity 'loud'" in capsys.readouterr().err


def test_a_crash_counts_as_an_error_level_result(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "segfault_lldb.log")
    for fail_on, code in (("info", 1), ("warning", 1), ("error", 1), ("critical", 0)):
        assert main(["postmortem", log, "--no-auto-binaries", "--fail-on", fail_on]) == code
        capsys.readouterr()


# -- --debug ---------------------------------------------------------------------------------


@pytest.fixture
def broken_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import kvdiag.commands.check

    def boom(*_a: object, **_k: object) -> int:
        raise ZeroDivisionError("a bug in kvdiag")

    monkeypatch.setattr(kvdiag.commands.check, "check_file", boom)
    yield


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_exit_70(
        where: str, broken_check: None, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(TRACES / "single-slot.kvtrace")
    argv = ["--debug", "check", trace] if where == "before" else ["check", trace, "--debug"]
    assert main(argv) == cli.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert err.rstrip().endswith("kvdiag: internal error: ZeroDivisionError: a bug in kvdiag")
    assert main(["check", trace]) == 70
    assert capsys.readouterr().err == ("kvdiag: internal error: ZeroDivisionError: a bug in "
                                       "kvdiag (rerun with --debug)\n")


def test_debug_keeps_a_usage_error_at_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--debug", "check", "/no/such/trace.kvtrace"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("kvdiag: error: /no/such/trace.kvtrace: no such "
                                               "file\n")


# -- no abbreviations -------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_parser_takes_abbreviations() -> None:
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 14  # kvdiag, its commands and trace's actions
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_debug_after_postmortem_is_debug_not_a_short_debug_dir(
        capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "aliasing_no_crash.log")
    assert main(["postmortem", log, "--debug", "--json"]) == 1
    json.loads(capsys.readouterr().out)  # ran as asked, no --debug-dir demanded
    assert main(["postmortem", log, "--debug-d", "x"]) == 2
    assert "unrecognized arguments: --debug-d" in capsys.readouterr().err
    assert main(["capture", "--scen", "single-slot", "-o", "x"]) == 2
    assert "unrecognized arguments: --scen" in capsys.readouterr().err


def test_every_benchmark_parser_takes_no_abbreviations() -> None:
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        for start in range(len(text)):
            start = text.find("argparse.ArgumentParser(", start)
            if start < 0:
                break
            call = text[start:text.find("\n", start)]
            assert "allow_abbrev=False" in call, f"{path.name}: {call}"


# -- diff with nothing in common ------------------------------------------------------------


def test_diff_of_traces_with_nothing_in_common_is_not_equivalent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two traces whose steps run nothing both record (one only writes, the other only
    reads and has no fits) compare nothing: exit 2 and a line that says so."""
    header = (TRACES / "single-slot.kvtrace").read_bytes().split(b"\n", 1)[0]
    step = b'{"kind":"step","seq":%d,"t_ns":0,"step":%d,"phase":"decode","streams":[0],' \
           b'"tokens":1,"n_kv":256}'
    a = [header, step % (1, 0),
         b'{"kind":"write","seq":2,"t_ns":0,"step":0,"layer":0,"stream":0,"cells":[0,1],'
         b'"rows":[0,1]}',
         b'{"kind":"end","seq":3,"t_ns":0,"step":0,"status":"completed","steps":1,"events":2}']
    b = [header, step % (1, 0),
         b'{"kind":"read","seq":2,"t_ns":0,"step":0,"layer":1,"stream":0,"pool":1,"ring":0,'
         b'"host":0}',
         b'{"kind":"end","seq":3,"t_ns":0,"step":0,"status":"completed","steps":1,"events":2}']
    pa, pb = tmp_path / "a.kvtrace", tmp_path / "b.kvtrace"
    pa.write_bytes(b"\n".join(a) + b"\n")
    pb.write_bytes(b"\n".join(b) + b"\n")
    assert main(["diff", str(pa), str(pb), "--force"]) == 2
    out = capsys.readouterr().out
    assert "compared 0 write(s) of the same rows, 0 FA route(s), 0 read(s)" in out
    assert "not comparable: the traces have nothing in common in 1 aligned step(s)" in out
    assert "equivalent:" not in out
    assert main(["diff", str(pa), str(pb), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "nothing-compared" and doc["equivalent"] is None


def test_checked_streams_leave_a_captured_stdout_alone(
        capsys: pytest.CaptureFixture[str]) -> None:
    """In-process, a captured stdout is left as it is (the checked wrapper is only for the
    process's own descriptors), and nothing of the wrapper stays installed afterwards."""
    before = (sys.stdout, sys.stderr)
    assert main(["--version"]) == 0
    assert (sys.stdout, sys.stderr) == before
    assert capsys.readouterr().out.startswith("kvdiag ")
