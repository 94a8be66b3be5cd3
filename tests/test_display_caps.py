"""A huge string in one field is shown capped, with its length (issue 11 #23).

Inputs: 4 MiB strings in the header (device name, scenario description, an unknown header
key), in an unknown kind's name and in an abort message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_samples import NEWER_MINOR, end_line, event_line, header_line

from kvdiag.report.text import MAX_FIELD, cap, cap_value

KVDIAG = [sys.executable, "-m", "kvdiag"]
HUGE = 4 << 20


@pytest.fixture(scope="module")
def huge_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("huge") / "huge.kvtrace"
    blob = "x" * HUGE
    head = json.loads(header_line(NEWER_MINOR))
    head["device"]["name"] = "D" + blob
    head["scenario"]["description"] = "S" + blob
    head["from_a_newer_writer"] = "H" + blob
    path.write_bytes(
        json.dumps(head).encode() + b"\n"
        + event_line("step", 1, 0, phase="decode", streams=[0], tokens=1, n_kv=256)
        + event_line("k" + blob, 2, 0, note="an unknown kind with a huge name")
        + event_line("abort", 3, 0, message="GGML_ASSERT(" + blob + ") failed")
        + end_line(4, 3).replace(b'"completed"', b'"aborted"'))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVDIAG, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("cmd", [["trace", "info"], ["check"], ["check", "--format", "markdown"],
                                 ["check", "--format", "sarif"], ["check", "--format", "junit"],
                                 ["trace", "validate"]])
def test_each_huge_field_is_shown_capped_with_its_length(huge_trace: Path,
                                                         cmd: list[str]) -> None:
    proc = run_cli(*cmd, str(huge_trace))
    assert proc.returncode in (0, 1), proc.stderr
    # a handful of capped fields, not megabytes (counted without the padding of the table
    # cells, which a capped 2,000-character word widens off a terminal)
    shown = len("".join(proc.stdout.split()))
    assert shown < 20 * MAX_FIELD + 20_000, shown
    if cmd != ["trace", "validate"]:  # validate has nothing huge to show: a valid file
        assert "characters," in proc.stdout and "not shown]" in proc.stdout


def test_trace_info_names_each_length(huge_trace: Path) -> None:
    out = run_cli("trace", "info", str(huge_trace)).stdout
    assert f"[{HUGE + 1:,} characters, {HUGE + 1 - 60:,} not shown]" in out  # device/description
    json_out = run_cli("trace", "info", "--json", str(huge_trace)).stdout
    assert len(json_out) > 3 * HUGE  # JSON is data: carried whole


def test_cap_keeps_short_text_and_counts_long_text() -> None:
    assert cap("abc", 5) == "abc"
    assert cap("abcdefgh", 5) == "abcde… [8 characters, 3 not shown]"
    assert cap_value(list(range(10_000)), 100) == "list of 10,000 items (not shown)"
    assert cap_value(12345) == "12345"
