"""``kvdiag postmortem``: JSON schema, exit codes, stdin/gzip input, and what it imports."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from postmortem_helpers import FIXTURES, run_command, run_json

from kvdiag.errors import InputError

CRASH_KEYS = {"kind", "source", "line", "signal", "assert", "error", "frames", "python_stacks",
              "fingerprint"}
FRAME_KEYS = {"index", "module", "offset", "address", "function", "file", "line", "inlined",
              "in_app", "unverified"}


def test_json_schema_and_exit_code_for_a_crash(capsys: Any) -> None:
    code, data = run_json([str(FIXTURES / "cuda_oom_journald_glibc.log")], capsys)
    assert code == 1
    assert set(data) == {"crashes", "config", "slots", "findings", "problems", "binaries",
                         "replaced"}
    assert data["replaced"] == []
    (crash,) = data["crashes"]
    assert set(crash) == CRASH_KEYS
    assert crash["kind"] == "cuda_error"
    assert crash["assert"] == {"file": "/opt/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
                               "line": 104, "condition": "CUDA error"}
    assert crash["error"] == {
        "message": "out of memory", "function": "ggml_cuda_pool_vmm::alloc",
        "location": "/opt/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:529",
        "statement": "cuMemCreate(&handle, reserve_size, &prop, 0)"}
    assert all(set(f) == FRAME_KEYS for f in crash["frames"])
    f0 = crash["frames"][0]
    assert (f0["offset"], f0["address"], f0["in_app"]) == ("0x1b2c8", "0x7f6a1015b2c8", True)
    assert len(crash["fingerprint"]) == 12
    assert data["config"]["n_ctx"] == 65536 and data["config"]["kv_buffers"] == {"CUDA0": 8192.0}
    assert [s["event"] for s in data["slots"]] == ["launch", "new_prompt"]
    assert [f["rule"] for f in data["findings"]] == ["cuda-oom"]
    assert data["findings"][0]["severity"] == "error"


def test_an_error_level_risk_without_crash_fails_as_check_would(capsys: Any) -> None:
    """No crash, but the aliasing risk is an error (the multiseq opt-in is on): exit 1 at
    the default --fail-on error, as ``check`` does (issue 16), 0 at --fail-on critical."""
    code, out = run_command([str(FIXTURES / "aliasing_no_crash.log")], capsys)
    assert code == 1
    assert "kvstream-multislot-aliasing-risk" in out and "Configuration" in out
    assert "CUDA_KV_Stream_Host" in out
    code, out = run_command([str(FIXTURES / "aliasing_no_crash.log"), "--fail-on",
                             "critical"], capsys)
    assert code == 0 and "kvstream-multislot-aliasing-risk" in out


def test_report_shows_crash_backtrace_and_findings(
    capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    code, out = run_command([str(FIXTURES / "kvstream_np2_gdb.log")], capsys)
    assert code == 1
    for needle in ("GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed",
                   "busy at the crash: 0, 1", "ggml_cuda_graph_evaluate_and_capture",
                   "kvstream-fits-dispatch-abort", "(inlined) ggml_cuda_kv_stream_fattn"):
        assert needle in out


def test_missing_file_is_an_input_error(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(InputError) as info:
        run_command([str(tmp_path / "nope.log")], capsys)
    assert info.value.exit_code == 2


def test_broken_gzip_reads_up_to_the_break_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    whole = gzip.compress((FIXTURES / "msvc_windows.log").read_bytes() * 50)
    broken = tmp_path / "cut.log.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    code, data = run_json([str(broken)], capsys)
    assert code == 2
    assert any(p["message"].startswith("input breaks") for p in data["problems"])
    assert data["config"]["n_ctx"] == 4096


def _run_cli(args: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    code = (
        "import sys\n"
        "from kvdiag.cli import main\n"
        "rc = main(['postmortem', *sys.argv[1:]])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'cupy', 'pynvml'))\n"
        "print('HEAVY=' + ','.join(bad), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin,
                          capture_output=True, check=False, timeout=120)


def test_stdin_gzip_and_no_heavy_imports() -> None:
    data = gzip.compress((FIXTURES / "segfault_lldb.log").read_bytes())
    proc = _run_cli(["-", "--json"], stdin=data)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["crashes"][0]["kind"] == "segfault"
    assert out["crashes"][0]["frames"][0]["function"] == "ggml_compute_forward_get_rows_f32"
    assert b"HEAVY=\n" in proc.stderr  # neither textual nor cupy nor pynvml was imported
    proc = _run_cli([str(FIXTURES / "kvstream_np2_gdb.log")])  # the rich report path too
    assert proc.returncode == 1 and b"HEAVY=\n" in proc.stderr


def test_a_segfault_without_a_backtrace_is_not_told_to_symbolize_one(tmp_path: Path,
                                                                       capsys: Any) -> None:
    """GIVEN a server that died of SIGSEGV with only the shell's line in its log, WHEN read,
    THEN the fix says how to get a backtrace, not "symbolize the backtrace" (there is none);
    with gdb's frames it still says to symbolize them."""
    log = tmp_path / "server.log"
    log.write_text("main: build = 4242 (abcdef0)\nsrv  llama_server: model loaded\n"
                   "./run.sh: line 9: 23186 Segmentation fault      ./llama-server -np 2\n")
    code, data = run_json([str(log)], capsys)
    (f,) = [f for f in data["findings"] if f["rule"] == "segfault"]
    assert code == 1 and data["crashes"][0]["frames"] == []
    assert f["fix"].startswith("the log holds no backtrace: get one (the core dump: "
                               "coredumpctl gdb")
    log.write_text(log.read_text() + "#0  0x00005555555551b6 in kv_read (p=0x0) at kv.c:6\n"
                   "#1  0x0000555555555084 in main () at kv.c:17\n")
    code, data = run_json([str(log)], capsys)
    (f,) = [f for f in data["findings"] if f["rule"] == "segfault"]
    assert f["fix"].startswith("symbolize the backtrace (--binary)")


def test_a_trace_given_as_a_log_is_refused_in_one_line(tmp_path: Path) -> None:
    """A kvtrace trace (plain, gzip or on standard input) is not a server log: its JSON lines
    half-matched the grammar and its abort event became a crash without a backtrace."""
    header = ('{"format":"kvtrace","version":"1.2","kvdiag_version":"t","created":"t",'
              '"backend":"native","device":{"name":"cpu"},"scenario":{}}\n')
    abort = ('{"kind":"abort","seq":1,"t_ns":1,"step":0,"message":"/s/ggml/src/ggml-cuda.cu:1:'
             ' GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed"}\n')
    trace = tmp_path / "run.kvtrace"
    trace.write_text(header + abort)
    gz = tmp_path / "run.kvtrace.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    for args, stdin in (([str(trace)], None), ([str(gz)], None), (["-"], trace.read_bytes())):
        proc = subprocess.run([sys.executable, "-m", "kvdiag", "postmortem", *args],
                              input=stdin, capture_output=True, check=False)
        err = proc.stderr.decode().strip()
        assert proc.returncode == 2 and proc.stdout == b"", err
        assert len(err.splitlines()) == 1 and "this is a kvtrace trace, not a server log" in err
