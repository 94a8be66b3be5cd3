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
    one_line_error(proc, f"{fifo}: a FIFO (named pipe), not a trace file")


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


def _huge_trace(path: Path, line: bytes) -> None:
    from trace_samples import end_line, header_line, write_line

    path.write_bytes(header_line("1.1") + write_line(1) + line + write_line(3) + end_line(4, 3))


@pytest.mark.parametrize(("field", "value", "bits"), [
    ("bytes", 10**45, 150),  # a known kind's own field
    ("layer", -(2**63) - 1, 64),  # one below the signed range
    ("t_ns", 10**500, 1661),  # beyond what a float can hold: the original OverflowError
])
def test_out_of_range_integers_are_a_problem_on_their_line(
    tmp_path: Path, field: str, value: int, bits: int
) -> None:
    fields = {"layer": 0, "stream": 0, "pages": [0, 1], "slot": 0, "target": "ring",
              "bytes": 4096, "reason": "ring", "t_ns": 200}
    fields[field] = value
    body = ",".join(f'"{k}":{v if not isinstance(v, str) else repr(v).replace(chr(39), chr(34))}'
                    for k, v in fields.items()).replace(" ", "")
    line = b'{"kind":"upload","seq":2,"step":0,' + body.encode() + b"}\n"
    trace = tmp_path / "huge.kvtrace"
    _huge_trace(trace, line)
    validate = run_cli("trace", "validate", str(trace))
    assert validate.returncode == 1
    sign = "negative " if value < 0 else ""
    assert validate.stdout.decode().splitlines()[0] == (
        f"{trace}:3: corrupt: field {field}: {sign}integer of {bits} bits is outside the "
        "64-bit range [-2^63, 2^64-1]")
    # the rest of the file is still read, and nothing downstream meets the number
    for cmd in (["trace", "info", "--json"], ["check", "--json"]):
        proc = run_cli(*cmd, str(trace))
        assert proc.returncode == 0, proc.stderr
        assert b'"write": 2' in proc.stdout
    export = run_cli("trace", "export", str(trace), "-o", str(tmp_path / "x.json"))
    assert export.returncode == 0, export.stderr


def test_largest_64_bit_values_still_read(tmp_path: Path) -> None:
    """Pointers are unsigned 64-bit: 2^64-1 is a value, not damage."""
    trace = tmp_path / "ptr.kvtrace"
    _huge_trace(trace, b'{"kind":"learn","seq":2,"t_ns":5,"step":0,"layer":1,"k_ptr":'
                + str(2**64 - 1).encode() + b"}\n")
    proc = run_cli("trace", "validate", str(trace))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.decode().endswith("valid: format 1.1, 4 events, ended completed after 1 step\n")


def test_out_of_range_integer_in_the_header_is_one_line(tmp_path: Path) -> None:
    from trace_samples import end_line, header_line

    trace = tmp_path / "h.kvtrace"
    trace.write_bytes(header_line("1.1", plan={"pool_pages": 10**30}) + end_line(1, 0))
    one_line_error(run_cli("trace", "info", str(trace)),
                   "invalid trace header: field plan.pool_pages: integer of 100 bits")
