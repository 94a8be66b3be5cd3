"""No internal error on any input (issue 16 item 3): absurd values of every numeric flag are one
line naming the limit and its source; a 1.x trace whose unknown key is not UTF-8 is read with
the line reported; sizes the runtime cannot hold are refused by plan and capture alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.kvstream.limits import INT32_MAX, LLAMA_MAX_LAYERS, LLAMA_MAX_SEQ, SHAPE_LIMITS

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "single-slot.kvtrace"

HUGE = "99999999999999999999"
SHAPE_FLAGS = ["--layers", "--streamed-layers", "--ctx", "--np", "--head-dim", "--n-head",
               "--n-head-kv", "--stage-mib", "--ubatch", "--ring-slots"]
QUICK = ["--scenario", "single-slot", "--steps", "2", "--prompt-tokens", "8", "--executor",
         "numpy", "-q"]


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith(("note:", "warning:"))]
    assert len(lines) == 1 and lines[0].startswith("kvdiag: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("flag", SHAPE_FLAGS)
@pytest.mark.parametrize("command", ["plan", "capture"])
def test_shape_flags_past_the_runtime_limit_name_it(flag: str, command: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    extra = [*QUICK, "-o", str(tmp_path / "t.kvtrace")] if command == "capture" else []
    assert main([command, flag, HUGE, *extra]) == 2
    line = error_line(capsys)
    limit, why = SHAPE_LIMITS[flag[2:]]
    assert f"{flag} {HUGE} is more than the runtime can hold: at most {limit:,} ({why})" in line
    assert not (tmp_path / "t.kvtrace").exists()


@pytest.mark.parametrize("flag", SHAPE_FLAGS)
@pytest.mark.parametrize("value", ["0", "-1", "-" + HUGE])
def test_shape_flags_zero_or_negative_are_one_line(flag: str, value: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", flag, value]) == 2
    line = error_line(capsys)
    assert flag in line and ("must be positive" in line or "must be between" in line), line


def test_the_limits_are_the_runtimes() -> None:
    assert (INT32_MAX, LLAMA_MAX_SEQ, LLAMA_MAX_LAYERS) == (2147483647, 256, 512)
    assert SHAPE_LIMITS["ctx"][0] == SHAPE_LIMITS["ubatch"][0] == INT32_MAX
    assert SHAPE_LIMITS["np"][0] == 256 and SHAPE_LIMITS["layers"][0] == 512


def test_a_plan_at_the_largest_context_still_plans(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "arm117", "--ctx", str(INT32_MAX), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_ctx"] == INT32_MAX + 1  # padded to 256, as llama_context does
    assert main(["plan", "--preset", "arm117", "--ctx", str(INT32_MAX + 1)]) == 2
    assert "at most 2,147,483,647" in error_line(capsys)


def test_a_host_buffer_past_what_ggml_can_address_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--ctx", str(INT32_MAX), "--layers", "512", "--head-dim", "65536",
                 "--n-head", "65535", "--n-head-kv", "65535", "--type-k", "f16",
                 "--type-v", "f16"]) == 2
    assert "more than ggml can address" in error_line(capsys)
    assert main(["plan", "--head-dim", "4194304", "--n-head", "4096",
                 "--n-head-kv", "4096"]) == 2
    assert "n_embd_k_gqa is a uint32_t" in error_line(capsys)


@pytest.mark.parametrize(("args", "needle"), [
    (["--seed", "-1"], "--seed -1: must be between 0 and 18,446,744,073,709,551,615"),
    (["--seed", HUGE + "0"], "the trace header records it as a 64-bit integer"),
    (["--telemetry-ms", "-5"], "--telemetry-ms -5: must be 0 (off) to 86,400,000"),
    (["--telemetry-ms", HUGE], "one sample a day"),
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--prompt-tokens", "-3"], "--prompt-tokens must be positive, got -3"),
    (["--steps", HUGE], "would be more than the runtime can hold: at most 2,147,483,647)"),
    (["--ctx", "2000000000"], "of memory here, more than the"),
])
def test_capture_numeric_flags(args: list[str], needle: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.kvtrace"
    quick = [a for a in QUICK if a not in ("--steps", "2")] if "--steps" in args else QUICK
    assert main(["capture", *quick, *args, "-o", str(out)]) == 2
    assert needle in error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_valid_seed_at_the_limit_runs(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.kvtrace"
    assert main(["capture", *QUICK, "--seed", str(2**64 - 1), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", "validate", str(out)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "needle"), [
    (["--stage-mib", "1:99999999999999:1"], "the sweep has 99,999,999,999,999 points, more "
                                             "than 10,000"),
    (["--stage-mib", HUGE], f"--stage-mib {HUGE} is more than the runtime can hold"),
    (["--stage-mib", "4", "--np", "300"], "--np 300 is more than the runtime can hold"),
    (["--stage-mib", "4", "--jobs", "0"], "--jobs must be positive"),
    (["--stage-mib", "4", "--steps", "-1"], "--steps must be positive"),
    (["--stage-mib", "4", "--ctx", str(INT32_MAX)], "of memory here"),
    # was an internal error raised inside a worker once the sweep ran (found by test_io_fuzz)
    (["--stage-mib", "4:8:4", "--prompt-tokens", "70000"], "raise --ctx to"),
])
def test_sweep_numeric_flags(args: list[str], needle: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "-q", *args]) == 2
    assert needle in error_line(capsys)


@pytest.mark.parametrize(("args", "code"), [
    (["--step", "-1"], 2), (["--step", HUGE], 0), (["--step", "0"], 0),
])
def test_tui_step(args: list[str], code: int, tmp_path: Path,
                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.svg"
    assert main(["tui", str(TRACE), "--export-svg", str(out), "--screen", "pages",
                 "--size", "80x24", *args]) == code
    if code:
        assert "--step -1: steps are numbered from 0" in error_line(capsys)
    else:
        assert out.read_text().startswith("<svg")


def test_devices_index(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--profile", "--device", "-1"]) == 2
    assert "--device -1: GPU indices start at 0" in error_line(capsys)


# -- invalid UTF-8 in a newer minor version's unknown key ------------------------------------


def _newer_minor_with_bad_key(path: Path, key: bytes) -> Path:
    lines = TRACE.read_bytes().split(b"\n")
    lines[0] = re.sub(rb'"version":"[0-9.]+"', b'"version":"1.7"', lines[0])
    lines[3] = lines[3][:-1] + b',"' + key + b'":[1,2]}'
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize("key", [b"gpu\xff\xfeuuid", b"\xc3(", b"ok", b"tail\xed\xa0\x80"])
def test_an_unknown_key_that_is_not_utf8_is_a_problem_not_a_crash(
        key: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _newer_minor_with_bad_key(tmp_path / "t.kvtrace", key)
    bad = key != b"ok"
    assert main(["trace", "validate", str(path)]) == (1 if bad else 0)
    out = capsys.readouterr().out
    if bad:
        assert f"{path}:4: corrupt: fields unknown to format 1.7 not kept" in out
    assert main(["trace", "info", "--json", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    # the event itself is kept either way
    assert info["events"] == len(TRACE.read_bytes().splitlines()) - 1
    assert main(["check", "--json", str(path)]) in (0, 1)
    json.loads(capsys.readouterr().out)
    assert main(["trace", "export", str(path), "-o", str(tmp_path / "t.json")]) == 0
    json.loads((tmp_path / "t.json").read_text())
    capsys.readouterr()
