"""What the trace commands do with inputs that are not plain files: FIFOs, devices, stdin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_samples import write_steps

KVDIAG = [sys.executable, "-m", "kvdiag"]


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # timeout: a command that waits on a FIFO would otherwise hang the suite
    return subprocess.run([*KVDIAG, *args], capture_output=True, timeout=60,
                          input=stdin if stdin is not None else b"")


def one_line_error(proc: subprocess.CompletedProcess[bytes], text: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("kvdiag: error:") and text in err, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("cmd", [["check"], ["trace", "info"], ["trace", "validate"],
                                 ["trace", "export", "-o", "OUT"]])
def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path, cmd: list[str]) -> None:
    fifo = tmp_path / "capture.kvtrace"
    os.mkfifo(fifo)
    cmd = [str(tmp_path / "out.json") if c == "OUT" else c for c in cmd]
    proc = run_cli(*cmd[:2], str(fifo), *cmd[2:]) if cmd[0] == "trace" else run_cli(
        *cmd, str(fifo))
    one_line_error(proc, f"{fifo}: a FIFO, not a regular file")


def test_a_character_device_is_refused(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    one_line_error(run_cli("trace", "info", "/dev/zero"), "a character device")


def test_dash_reads_standard_input(tmp_path: Path) -> None:
    trace = tmp_path / "t.kvtrace"
    write_steps(trace, steps=3, per_step=2)
    info = run_cli("trace", "info", "--json", "-", stdin=trace.read_bytes())
    assert info.returncode == 0, info.stderr
    assert b'"name": "<stdin>"' in info.stdout and b'"events": 7' in info.stdout
    check = run_cli("check", "--json", "-", stdin=trace.read_bytes())
    assert check.returncode == 0, check.stderr
    assert b'"events": 7' in check.stdout


def test_dash_with_nothing_on_standard_input_says_so(tmp_path: Path) -> None:
    one_line_error(run_cli("trace", "info", "-", stdin=b""), "<stdin>: empty file")
