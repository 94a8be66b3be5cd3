"""CPython's faulthandler on Windows: ``Windows fatal exception: <what>`` instead of the
signal's line, then the same stacks (Modules/faulthandler.c's vectored exception handler:
seven names, else ``code 0x`` and the NTSTATUS in 8 hex digits, decimal before 3.7), CRLF line
ends. Read as the death's signal (its POSIX equivalent) with the exception kept beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from postmortem_helpers import findings_of, run_command, run_json, scan_bytes

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.model.logrecords import Crash
from kvdiag.postmortem.deathlines import parse_windows_exception
from kvdiag.trace.reader import TraceReader
from kvdiag.tui.crashes import from_abort

APP = r"C:\Users\svc-llm\srv\.venv\Lib\site-packages"
BOOT = [
    "llama_model_loader: loaded meta data with 31 key-value pairs and 291 tensors",
    "llama_context: constructing llama_context",
    "llama_context: n_ctx         = 4096",
    "srv  log_server_r: request: POST /completion 127.0.0.1 200",
]


def dump(head: str, *, version: str = "3.12") -> list[str]:
    stdlib = rf"C:\Users\svc-llm\AppData\Local\Programs\Python\Python{version.replace('.', '')}"
    return [
        head,
        "",
        "Thread 0x000031c4 (most recent call first):",
        rf'  File "{stdlib}\Lib\threading.py", line 359 in wait',
        rf'  File "{stdlib}\Lib\queue.py", line 180 in get',
        "",
        "Current thread 0x00004e80 (most recent call first):",
        rf'  File "{APP}\llama_cpp\llama_cpp.py", line 1522 in llama_decode',
        rf'  File "{APP}\llama_cpp\_internals.py", line 318 in decode',
        r'  File "C:\Users\svc-llm\srv\serve.py", line 41 in <module>',
        "",
    ]


def crlf(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n").encode()


def one(data: bytes) -> Crash:
    scan = scan_bytes(data, "server-win.log")
    assert len(scan.crashes) == 1, [(c.kind, c.where.line) for c in scan.crashes]
    return scan.crashes[0]


@pytest.mark.parametrize(("what", "signal"), [
    ("access violation", "SIGSEGV"), ("stack overflow", "SIGSEGV"), ("page error", "SIGBUS"),
    ("int divide by zero", "SIGFPE"), ("float divide by zero", "SIGFPE"),
    ("float overflow", "SIGFPE"), ("integer overflow", "SIGFPE"),
    ("illegal instruction", "SIGILL"),
    ("code 0xc000001d", "SIGILL"), ("code 0xC0000005", "SIGSEGV"),
    ("code 0xc0000409", "exception 0xc0000409"), ("code 3221225477", "SIGSEGV"),
])
def test_every_exception_is_the_death_s_signal_with_its_stacks(what: str, signal: str) -> None:
    crash = one(crlf([*BOOT, *dump(f"Windows fatal exception: {what}")]))
    assert crash.signal is not None
    assert (crash.signal.signal, crash.signal.exception) == (signal, what)
    assert crash.kind == ("segfault" if signal == "SIGSEGV" else "signal")
    assert crash.where.line == len(BOOT) + 1
    current, other = crash.python
    assert (current.thread, current.current) == ("0x00004e80", True)
    assert [(f.function, f.line, f.in_app) for f in current.frames] == [
        ("llama_decode", 1522, True), ("decode", 318, True), ("<module>", 41, True)]
    assert current.frames[0].file == rf"{APP}\llama_cpp\llama_cpp.py"
    # the installer's standard library is the runtime, not the app
    assert [(f.function, f.in_app) for f in other.frames] == [("wait", False), ("get", False)]


def test_lines_that_are_not_the_handler_s() -> None:
    assert parse_windows_exception("Windows fatal exception: access violation\r") == (
        "SIGSEGV", "access violation")
    for text in ("Windows fatal exception: code 0xZZ", "Windows fatal exception: ",
                 "Windows fatal exception: something new", "windows fatal exception: page error",
                 "a Windows fatal exception: access violation was logged"):
        assert parse_windows_exception(text) is None, text


def test_a_second_dump_of_the_same_death_adds_no_stack() -> None:
    """For an arithmetic fault the exception handler dumps, then the C runtime raises SIGFPE
    and the signal handler dumps the same threads again: one crash, each stack once."""
    first = dump("Windows fatal exception: int divide by zero")
    again = dump("Fatal Python error: Floating point exception")
    crash = one(crlf([*BOOT, *first, *again]))
    assert crash.signal is not None and crash.signal.signal == "SIGFPE"
    assert crash.signal.exception == "int divide by zero"
    assert [(s.thread, s.current) for s in crash.python] == [
        ("0x00004e80", True), ("0x000031c4", False)]


@pytest.mark.parametrize("version", ["3.8", "3.14"])
def test_the_versions_pystack_reads(version: str) -> None:
    lines = dump("Windows fatal exception: access violation", version=version)
    if version == "3.8":  # <no Python frame> at the line's start
        lines[2:6] = ["Thread 0x000031c4 (most recent call first):", "<no Python frame>"]
    else:  # thread names after the ids
        lines = [ln.replace("0x00004e80 (", "0x00004e80 [MainThread] (") for ln in lines]
    crash = one(crlf([*BOOT, *lines]))
    current, other = crash.python
    assert current.frames[0].function == "llama_decode"
    if version == "3.8":
        assert other.frames == () and other.notes == (
            "no Python frame (the thread ran only C code)",)
    else:
        assert current.name == "MainThread"


def test_found_before_a_restart_and_reported(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """No anchor word is on the line: the death is found by reading back from where the
    server's output ends, here a restart of the service."""
    restart = ["llama_model_loader: loaded meta data with 31 key-value pairs and 291 tensors",
               "llama_context: constructing llama_context", "llama_context: n_ctx = 4096",
               "main: server is listening on http://0.0.0.0:8080 - starting the main loop"]
    log = tmp_path / "server-win.log"
    log.write_bytes(crlf([*BOOT, *dump("Windows fatal exception: stack overflow"), *restart]))
    code, data = run_json([str(log), "--no-auto-binaries"], capsys)
    assert code == 1
    (crash,) = data["crashes"]
    assert crash["signal"] == {"source": str(log), "line": len(BOOT) + 1, "signal": "SIGSEGV",
                               "exception": "stack overflow"}
    assert [s["thread"] for s in crash["python_stacks"]] == ["0x00004e80", "0x000031c4"]
    code, out = run_command([str(log), "--no-auto-binaries"], capsys)
    assert f"signal: SIGSEGV (line {len(BOOT) + 1}, Windows fatal exception: stack overflow)" in out
    (finding,) = [f for f in findings_of(scan_bytes(log.read_bytes()))
                  if f.rule == "segfault"]
    assert finding.title == ("SIGSEGV (Windows fatal exception: stack overflow) without an "
                             "assert in llama_decode llama_cpp.py:1522 (Python)")
    assert "WinDbg" in finding.fix and "coredumpctl" not in finding.fix


def test_import_carries_the_exception_and_the_stacks(tmp_path: Path) -> None:
    log = tmp_path / "server-win.log"
    log.write_bytes(crlf([*BOOT, *dump("Windows fatal exception: code 0xc0000409")]))
    out = tmp_path / "server-win.kvtrace"
    assert main(["import", str(log), "-o", str(out)]) == 0
    with TraceReader.open(out) as reader:
        (abort,) = [e for e in reader if isinstance(e, ev.Abort)]
    assert abort.message == ("exception 0xc0000409 (Windows fatal exception: code "
                             "0xc0000409)")
    assert [st.thread for st in abort.python_stacks] == ["0x00004e80", "0x000031c4"]
    assert abort.python_stacks[0].frames[2].file == r"C:\Users\svc-llm\srv\serve.py"
    view = from_abort(0, abort)
    assert view.kind == "abort" and view.python_from == 0 and view.python_thread == "0x00004e80"
    assert [f.function for f in view.frames] == ["llama_decode", "decode", "<module>"]


def test_an_imported_windows_death_exports_as_the_log_printed_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The llama-log export prints faulthandler's own line for the death, not the abort's
    message as well (a second signal line, which the reader took), and makes up no stack."""
    log = tmp_path / "server-win.log"
    log.write_bytes(crlf([*BOOT, *dump("Windows fatal exception: access violation")]))
    trace, again = tmp_path / "t.kvtrace", tmp_path / "again.log"
    assert main(["import", str(log), "-o", str(trace)]) == 0
    assert main(["trace", "export", str(trace), "--format", "llama-log", "-o", str(again)]) == 0
    text = again.read_text()
    assert "SIGSEGV" not in text and "wait4" not in text
    capsys.readouterr()
    seen = []
    for path in (log, again):
        _, data = run_json([str(path), "--no-auto-binaries"], capsys)
        (crash,) = data["crashes"]
        seen.append((crash["kind"], crash["signal"]["signal"], crash["signal"]["exception"],
                     crash["frames"], [(s["thread"], [f["function"] for f in s["frames"]])
                                       for s in crash["python_stacks"]]))
    assert seen[0] == seen[1] == (
        "segfault", "SIGSEGV", "access violation", [],
        [("0x00004e80", ["llama_decode", "decode", "<module>"]), ("0x000031c4", ["wait", "get"])])


def test_sql_has_the_exception_beside_the_signal(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import json

    log = tmp_path / "server-win.log"
    log.write_bytes(crlf([*BOOT, *dump("Windows fatal exception: page error")]))
    capsys.readouterr()
    assert main(["sql", "SELECT kind, signal, windows_exception, line FROM crashes", str(log),
                 "--format", "json"]) == 0
    (row,) = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert row == {"kind": "signal", "signal": "SIGBUS", "windows_exception": "page error",
                   "line": len(BOOT) + 1}


def test_an_exception_the_process_survived_is_a_problem_not_a_crash() -> None:
    """faulthandler prints an error exception before the process's own handlers see it (a COM
    call refused, 0x8001010d, is caught and the process goes on): when the server's output goes
    on after it, it is no death. The same lines where the output ends are one."""
    ready = "main: server is listening on http://0.0.0.0:8080 - starting the main loop"
    went_on = [f"slot update_slots: id  0 | task {i} | n_past = {i}" for i in range(300)]
    head = dump("Windows fatal exception: code 0x8001010d")
    scan = scan_bytes(crlf([*BOOT, ready, *head, *went_on]))
    assert scan.crashes == ()
    (problem,) = scan.problems
    assert (problem.code, problem.line) == ("windows-exception-survived", len(BOOT) + 2)
    assert problem.message.startswith(
        f"a Windows exception at line {len(BOOT) + 2} (code 0x8001010d) that the process "
        "survived")
    (crash,) = scan_bytes(crlf([*BOOT, ready, *went_on, *head])).crashes
    assert crash.signal is not None and crash.signal.signal == "exception 0x8001010d"
