"""A run that did not complete fails ``check`` and ``trace validate`` (issue 11 #9).

Inputs: real captures stopped by SIGTERM and SIGINT, and hand-written traces of the same
shapes (End status error with and without a reason, no End at all).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trace_samples import event_line, header_line, write_line

KVDIAG = [sys.executable, "-m", "kvdiag"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVDIAG, *args], capture_output=True, text=True, timeout=120)


def step_line(seq: int, step: int) -> bytes:
    return event_line("step", seq, step, phase="decode", streams=[0], tokens=1, n_kv=256)


def trace_with_end(path: Path, **end: object) -> Path:
    body = step_line(1, 0) + write_line(2, 0) + step_line(3, 1) + write_line(4, 1)
    if end:
        body += event_line("end", 5, 1, steps=2, events=4, **end)
    path.write_bytes(header_line("1.1") + body)
    return path


def check_json(path: Path, *more: str) -> tuple[int, dict[str, object]]:
    proc = run_cli("check", "--json", str(path), *more)
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def incomplete(doc: dict[str, object]) -> dict[str, object]:
    found = [f for f in doc["findings"] if f["rule"] == "trace-incomplete"]  # type: ignore[attr-defined, index]
    assert len(found) == 1
    return found[0]  # type: ignore[no-any-return]


def test_end_status_error_with_a_reason_is_an_error_finding(tmp_path: Path) -> None:
    path = trace_with_end(tmp_path / "hup.kvtrace", status="error", reason="terminated by SIGHUP")
    code, doc = check_json(path)
    assert code == 1
    f = incomplete(doc)
    assert f["severity"] == "error"
    assert f["title"] == ("the run did not complete: ended with status error at step 1 "
                          "(terminated by SIGHUP)")
    assert f["details"]["last_step"] == 1 and f["details"]["reason"] == "terminated by SIGHUP"  # type: ignore[index]
    validate = run_cli("trace", "validate", str(path))
    assert validate.returncode == 1
    assert validate.stdout.splitlines() == [
        f"{path}:6: error: the run did not complete: End status error at step 1: "
        "terminated by SIGHUP",
        f"{path}: invalid: the run ended with an error, 5 events read",
    ]


def test_end_status_error_without_a_reason_says_none_was_recorded(tmp_path: Path) -> None:
    path = trace_with_end(tmp_path / "e.kvtrace", status="error")
    code, doc = check_json(path)
    assert code == 1
    assert incomplete(doc)["title"].endswith("at step 1 (no reason recorded)")  # type: ignore[union-attr]
    assert "(no reason recorded)" in run_cli("trace", "validate", str(path)).stdout


def test_no_end_event_is_an_error_unless_allowed(tmp_path: Path) -> None:
    path = trace_with_end(tmp_path / "killed.kvtrace")
    code, doc = check_json(path)
    assert code == 1
    f = incomplete(doc)
    assert f["severity"] == "error"
    assert f["title"] == ("the run did not complete (no End event: the capture was killed or "
                          "is still running) at step 1; analysed up to event #4")
    code, doc = check_json(path, "--allow-incomplete")
    assert code == 0
    assert incomplete(doc)["severity"] == "warning"


def test_completed_and_aborted_runs_are_not_incomplete(tmp_path: Path) -> None:
    for status in ("completed", "aborted"):
        code, doc = check_json(trace_with_end(tmp_path / f"{status}.kvtrace", status=status))
        assert code == 0, doc
        # steps and writes only: what the trace lacks is said (info), nothing else is found
        assert [(f["rule"], f["details"]["what"])  # type: ignore[index]
                for f in doc["findings"]] == [  # type: ignore[attr-defined]
            ("not-recorded", "fits"), ("not-recorded", "read")]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "exit_code", "reason"), [
    (signal.SIGTERM, 128 + signal.SIGTERM, "terminated by SIGTERM"),
    (signal.SIGINT, 130, "interrupted by SIGINT"),
])
def test_a_signalled_capture_fails_check(tmp_path: Path, sig: signal.Signals, exit_code: int,
                                         reason: str) -> None:
    out = tmp_path / "stopped.kvtrace"
    proc = subprocess.Popen([*KVDIAG, "capture", "--scenario", "pool-pressure", "--steps", "12000",
                             "--executor", "numpy", "-q", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # a shell's background job starts with SIGINT ignored, and a child
                            # inherits that (Python then installs no KeyboardInterrupt): give
                            # the capture the default a user's terminal gives it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        # the trace grows in OUT.<random>.part until its End line is written
        parts = list(tmp_path.glob("stopped.kvtrace.*.part"))
        if parts and parts[0].read_bytes().count(b'"kind":"step"') >= 3:
            break
        time.sleep(0.05)
    assert not out.exists()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    finally:  # never leave it running into the next test
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == exit_code, err
    # ended by the signal with End status error, the trace is kept under its name
    assert list(tmp_path.glob("*.part")) == []
    end = json.loads(out.read_bytes().splitlines()[-1])
    assert end["kind"] == "end" and end["status"] == "error" and end["reason"] == reason
    code, doc = check_json(out)
    assert code == 1
    f = incomplete(doc)
    assert f["title"] == (f"the run did not complete: ended with status error at step "
                          f"{end['step']} ({reason})")
    assert check_json(out, "--allow-incomplete")[0] == 0
    assert run_cli("trace", "validate", str(out)).returncode == 1
