"""``kvdiag trace info|validate`` through kvdiag.cli.main: output content and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_samples import (
    NEWER_MINOR,
    end_line,
    event_line,
    header_line,
    write_line,
    write_steps,
)

from kvdiag import cli


@pytest.fixture(autouse=True)
def _only_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    # Register only this subcommand, so these tests do not depend on the state of the others.
    monkeypatch.setattr(cli, "COMMANDS", ("trace",))
    monkeypatch.setenv("COLUMNS", "160")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["trace", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.kvtrace"
    write_steps(path, steps=5, per_step=4)
    return path


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "bad.kvtrace"
    path.write_bytes(
        header_line()
        + write_line(1, 0)
        + b"not json at all\n"
        + write_line(2, 1)
        + write_line(3, 2)[:20]
    )
    return path


def test_validate_good_file(capsys: pytest.CaptureFixture[str], good: Path) -> None:
    code, out, err = run(capsys, "validate", str(good))
    assert code == 0 and err == ""
    assert out == f"{good}: valid: format 1.3, 21 events, ended completed after 5 steps\n"


def test_validate_damaged_file(capsys: pytest.CaptureFixture[str], damaged: Path) -> None:
    code, out, _ = run(capsys, "validate", str(damaged))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{damaged}:3: corrupt: not JSON")
    assert lines[1].startswith(f"{damaged}:5: truncated: last line is cut short (20 bytes)")
    assert (
        lines[2]
        == f"{damaged}:5: incomplete: no End event: the capture did not finish (5 lines read)"
    )
    assert lines[3] == f"{damaged}: invalid: 3 problems, 2 events read"
    assert len(lines) == 4


def test_validate_incomplete_file_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "running.kvtrace"
    write_steps(path, steps=2, close=False)
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 1
    assert out.splitlines() == [
        f"{path}:7: incomplete: no End event: the capture did not finish (7 lines read)",
        f"{path}: invalid: 1 problem, 6 events read",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "empty file, not a kvtrace trace"),
        (b"\x7fELF\x02\x01\x01\x00garbage", "not a kvtrace trace (line 1 is not JSON)"),
        (
            header_line("2.0"),
            "trace format 2.0 is newer than this kvdiag understands (1.x); upgrade kvdiag",
        ),
    ],
)
@pytest.mark.parametrize("action", ["info", "validate"])
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    action: str,
    content: bytes | None,
    message: str,
) -> None:
    path = tmp_path / "x.kvtrace"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, action, str(path))
    assert code == 2 and out == ""
    assert err == f"kvdiag: error: {path}: {message}\n"


def test_directory_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "info", str(tmp_path))
    assert code == 2 and err == f"kvdiag: error: {tmp_path}: is a directory, not a trace file\n"


def test_missing_action_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2 and "required: ACTION" in err and "Traceback" not in err


def test_info_good_file(capsys: pytest.CaptureFixture[str], good: Path) -> None:
    code, out, _ = run(capsys, "info", str(good))
    assert code == 0
    assert "kvtrace 1.3" in out
    assert "NVIDIA GeForce RTX 4090, 24.0 GiB, driver 560.35, PCIe Gen4 x16, cc 8.9" in out
    assert "2026-03-01T12:00:00+00:00" in out
    assert "scenario.model" in out and "tiny-llama" in out
    assert _row(out, "write") == ["write", "15", "71.4%"]
    assert _row(out, "step") == ["step", "5", "23.8%"]
    assert _row(out, "total") == ["total", "21"]
    assert "0 – 4 (5 step(s))" in out
    assert "completed (End: 5 steps, 20 events)" in out
    assert "no problems" in out


def test_info_spells_out_the_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from trace_samples import header

    from kvdiag.trace import TraceWriter

    path = tmp_path / "sc.kvtrace"
    scenario = {
        "name": "two-streams",
        "config": {"layout": "shared", "np": 2, "extra": {"a": 1}},
        "requests": [{"slot": i, "prompt": 512, "decode": 64} for i in range(5)],
        "seed": 7,
    }
    TraceWriter.create(path, header(**scenario)).close()
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0
    assert _row(out, "scenario.name") == ["scenario.name", "two-streams"]
    assert _row(out, "scenario.config.layout") == ["scenario.config.layout", "shared"]
    assert _row(out, "scenario.config.np") == ["scenario.config.np", "2"]
    assert _row(out, "scenario.config.extra") == ["scenario.config.extra", "{'a': 1}"]
    assert _row(out, "scenario.requests") == ["scenario.requests", "5 items"]
    assert _row(out, "scenario.seed") == ["scenario.seed", "7"]
    assert _row(out, "plan") == ["plan", "1 entry"]


def test_info_damaged_file(capsys: pytest.CaptureFixture[str], damaged: Path) -> None:
    code, out, _ = run(capsys, "info", str(damaged))
    assert code == 0
    assert _row(out, "write") == ["write", "2", "100.0%"]
    assert "no End event: the capture did not finish" in out
    assert "yes: last line 5 is cut short" in out
    assert "3 problems" in out
    assert _row(out, "3")[:2] == ["3", "corrupt"]
    assert _row(out, "5")[:2] == ["5", "truncated"]


def test_info_shows_newer_minor_unknowns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "new.kvtrace"
    path.write_bytes(
        header_line(NEWER_MINOR, gpu_uuid="GPU-77")
        + event_line("write", 1, layer=0, stream=0, cells=[0, 1], rows=[0, 1], crc="x")
        + event_line("prefetch", 2, pages=[0, 1])
        + end_line(3, events=2)
    )
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0
    assert f"kvtrace {NEWER_MINOR} (newer minor version: unknown kinds and fields kept)" in out
    assert "gpu_uuid (unknown)" in out and "GPU-77" in out
    assert _row(out, "prefetch (unknown kind)") == ["prefetch (unknown kind)", "1", "33.3%"]
    assert _row(out, "write.crc") == ["write.crc", "1"]


def test_info_json(capsys: pytest.CaptureFixture[str], damaged: Path) -> None:
    code, out, _ = run(capsys, "info", str(damaged), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["version"] == "1.0" and data["header"]["backend"] == "numpy"
    assert data["counts"] == {"write": 2}
    assert (data["first_step"], data["last_step"]) == (0, 1)
    assert data["truncated"] is True and data["complete"] is False and data["valid"] is False
    assert [(p["line"], p["kind"]) for p in data["problems"]] == [
        (3, "corrupt"),
        (5, "truncated"),
        (5, "incomplete"),
    ]
    assert data["end"] is None and data["lines"] == 5


def test_trace_modules_do_not_import_ui_or_gpu_libraries() -> None:
    code = (
        "import sys, kvdiag.trace, kvdiag.trace.summary, kvdiag.commands.trace;"
        "bad = [m for m in ('textual', 'cupy', 'pynvml', 'rich') if m in sys.modules];"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def _row(out: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first:
            return [c for c in cells if c]
    raise AssertionError(f"no row {first!r} in:\n{out}")


def test_info_json_steps_are_the_judgements(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    """A header and an End at step 7 have no steps: the span in --json is the judgement's
    (it counted the End's step and said 7..7 while the judgement said none)."""
    path = tmp_path / "nothing.kvtrace"
    path.write_bytes(header_line("1.1") + event_line("end", 1, 7, status="completed",
                                                     steps=8, events=0))
    code, out, _ = run(capsys, "info", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["counts"] == {"end": 1}
    assert (data["first_step"], data["last_step"], data["judgement"]["steps"]) == (
        None, None, 0)
    path.write_bytes(header_line("1.1") + write_line(1, 3) + write_line(2, 5)
                     + event_line("end", 3, 9, status="completed", steps=10, events=2))
    code, out, _ = run(capsys, "info", str(path), "--json")
    data = json.loads(out)
    assert (data["first_step"], data["last_step"], data["judgement"]["steps"]) == (3, 5, 3)


def test_info_shows_the_first_aborts_and_counts_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "aborts.kvtrace"
    aborts = [event_line("abort", i + 1, step=i, message=f"x.cu:{i}: GGML_ASSERT(c{i}) failed",
                         file="x.cu", line=i, condition=f"c{i}",
                         backtrace=["ggml_abort", f"kernel_{i}"]) for i in range(12)]
    path.write_bytes(header_line("1.3") + b"".join(aborts) + end_line(13, 12, steps=12))
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0
    assert "Abort at event #10, step 9" in out and "kernel_9" in out
    assert "Abort at event #11" not in out
    assert "… and 2 more abort(s): kvdiag check lists them all" in out
    code, out, _ = run(capsys, "info", str(path), "--json")
    doc = json.loads(out)
    assert [a["condition"] for a in doc["aborts"]] == [f"c{i}" for i in range(10)]
    assert doc["aborts"][3]["backtrace"] == ["ggml_abort", "kernel_3"]
    assert doc["aborts"][3]["python_stacks"] == []
