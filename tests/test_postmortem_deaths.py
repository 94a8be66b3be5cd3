"""Process deaths printed without any of the scanner's anchor words (issue: "a crash log must
never be read as no crash").

A custom signal handler's ``caught signal 11`` followed by glibc ``backtrace_symbols`` frames
of libraries that are neither ggml nor llama, gdb ``?? ()`` frames, lldb frames, the shell's
``Aborted (core dumped)`` / ``Killed``, the kernel's OOM killer in journald form and systemd's
``code=dumped`` / ``code=killed`` lines. A death is the last thing its process prints, so the
scanner reads back from the end of each log and from each restart; a backtrace with no cause
that the log goes on after is evidence, said as a problem line, not a crash.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from postmortem_helpers import findings_of, run_command, run_json, scan_bytes
from server_logs import ServerLog, Turn

from kvdiag.model.logrecords import Crash, LogLine, LogScan
from kvdiag.postmortem import crashlines, deathlines, parse
from kvdiag.postmortem.parse import LogParser

GLIBC_FOREIGN = (
    "/lib/x86_64-linux-gnu/libc.so.6(+0x42520)[0x7f3b8a242520]",
    "/opt/vendor/libfoo.so.2(foo_step+0x1c)[0x7f3b8b00121c]",
    "/opt/vendor/libfoo.so.2(+0x9a10) [0x7f3b8b009a10]",
    "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x80)[0x7f3b8a229e40]",
)
GDB_UNKNOWN = (
    "#0  0x00007f3b8a242520 in ?? ()",
    "#1  0x000055d1a0001234 in ?? ()",
    "#2  0x0000000000000000 in ?? ()",
)
LLDB_FOREIGN = (
    "* thread #1, name = 'worker', stop reason = signal SIGUSR1",
    "  * frame #0: 0x00007f3b8b00121c libfoo.so.2`foo_step + 28",
    "    frame #1: 0x00007f3b8b009a10 libfoo.so.2`foo_run + 64",
)


def _served(outer: str = "none") -> ServerLog:
    log = ServerLog(outer=outer)  # type: ignore[arg-type]
    log.boot(np=2)
    log.requests(Turn(slot=0, task=1, depth_start=4000, cached=0, decode_tokens=64,
                      decode_tps=30.0))
    return log


def _tail(log: ServerLog, *lines: str) -> tuple[bytes, int]:
    """The log with ``lines`` appended as raw stderr lines; the 1-based number of the first."""
    first = len(log.lines) + 1
    for text in lines:
        log.raw(text)
    return log.text().encode(), first


def _one(scan: LogScan) -> Crash:
    assert len(scan.crashes) == 1, scan.crashes
    return scan.crashes[0]


def test_caught_signal_with_foreign_glibc_frames_at_the_end() -> None:
    data, first = _tail(_served(), "caught signal 11", *GLIBC_FOREIGN)
    crash = _one(scan_bytes(data))
    assert crash.kind == "segfault"
    assert crash.signal is not None and crash.signal.signal == "SIGSEGV"
    assert crash.where.line == first
    bt = crash.backtrace
    assert bt is not None and bt.form == "glibc" and bt.where.line == first + 1
    assert [f.module for f in bt.frames] == [
        "/lib/x86_64-linux-gnu/libc.so.6", "/opt/vendor/libfoo.so.2", "/opt/vendor/libfoo.so.2",
        "/lib/x86_64-linux-gnu/libc.so.6"]
    assert bt.frames[1].function == "foo_step" and bt.frames[2].offset == 0x9A10
    assert crash.timeline and crash.timeline[-1].kind in ("release", "idle", "request_done")


def test_received_signal_6_is_sigabrt_and_a_llama_frame_keeps_the_signal_line() -> None:
    """The llama_ frame is an anchor hit: the crash opens there, and the signal line just
    before the frames is read back into it."""
    data, first = _tail(
        _served(), "received signal 6",
        "/lib/x86_64-linux-gnu/libc.so.6(gsignal+0x10)[0x7f0000000010]",
        "./llama-server(_ZN13llama_context6decodeER11llama_batch+0x4a1)[0x55d1a00014a1]",
        "./llama-server(main+0x99)[0x55d1a0000099]")
    crash = _one(scan_bytes(data))
    assert crash.kind == "signal" and crash.signal is not None
    assert crash.signal.signal == "SIGABRT" and crash.where.line == first
    assert crash.backtrace is not None
    assert [f.function for f in crash.backtrace.frames] == [
        "gsignal", "llama_context::decode(llama_batch&)", "main"]


@pytest.mark.parametrize("line,signal", [
    ("Fatal signal 8 (SIGFPE), code 1 (FPE_INTDIV)", "SIGFPE"),
    ("Got signal 7", "SIGBUS"),
    ("llama-server: caught signal 4, dumping stack", "SIGILL"),
    ("Illegal instruction (core dumped)", "SIGILL"),
    ("Trace/breakpoint trap (core dumped)", "SIGTRAP"),
    ("Fatal Python error: Aborted", "SIGABRT"),
    ("Fatal Python error: Segmentation fault", "SIGSEGV"),
])
def test_signal_lines_in_other_words_name_their_signal(line: str, signal: str) -> None:
    data, first = _tail(_served(), line, *GDB_UNKNOWN)
    crash = _one(scan_bytes(data))
    assert crash.signal is not None and crash.signal.signal == signal
    assert crash.where.line == first
    assert crash.backtrace is not None and len(crash.backtrace.frames) == 3


def test_gdb_frames_alone_at_the_end_are_a_death_of_unknown_cause() -> None:
    data, first = _tail(_served(), *GDB_UNKNOWN)
    scan = scan_bytes(data)
    crash = _one(scan)
    assert crash.kind == "unknown" and crash.signal is None and crash.where.line == first
    assert crash.backtrace is not None and crash.backtrace.form == "gdb"
    assert [f.address for f in crash.backtrace.frames] == [0x7F3B8A242520, 0x55D1A0001234, 0]
    assert all(f.function is None for f in crash.backtrace.frames)
    (finding,) = [f for f in findings_of(scan) if f.rule == "segfault"]
    assert finding.title.startswith("a death of unknown cause")


def test_lldb_frames_of_a_foreign_library_then_the_end() -> None:
    data, first = _tail(_served("journald"), *LLDB_FOREIGN)
    crash = _one(scan_bytes(data))
    assert crash.kind == "unknown" and crash.where.line == first + 1
    assert crash.backtrace is not None and crash.backtrace.form == "lldb"
    assert [f.function for f in crash.backtrace.frames] == ["foo_step", "foo_run"]


def test_a_backtrace_through_abort_is_an_abort_not_unknown() -> None:
    data, _ = _tail(_served(), "/lib/x86_64-linux-gnu/libc.so.6(abort+0xd3)[0x7f0000000d3]",
                    "/opt/vendor/libfoo.so.2(foo_step+0x1c)[0x7f3b8b00121c]")
    assert _one(scan_bytes(data)).kind == "abort"


@pytest.mark.parametrize("lines,signal", [
    (("Aborted (core dumped)",), "SIGABRT"),
    (("./run.sh: line 9: 23186 Aborted                 ./llama-server -np 2",), "SIGABRT"),
    (("Killed",), "SIGKILL"),
    (("./run.sh: line 9: 23186 Killed                  ./llama-server -np 2",), "SIGKILL"),
])
def test_the_shells_death_line_alone(lines: tuple[str, ...], signal: str) -> None:
    data, first = _tail(_served(), *lines)
    crash = _one(scan_bytes(data))
    assert crash.kind == "signal" and crash.backtrace is None
    assert crash.signal is not None and crash.signal.signal == signal
    assert crash.where.line == first


JOURNAL = "Mar 03 10:11:13 gpu-host "


@pytest.mark.parametrize("line,signal", [
    ("systemd[1]: llama.service: Main process exited, code=dumped, status=6/ABRT", "SIGABRT"),
    ("systemd[1]: llama.service: Main process exited, code=killed, status=9/KILL", "SIGKILL"),
    ("kernel: Out of memory: Killed process 4242 (llama-server) total-vm:81234567kB, "
     "anon-rss:61234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:160000kB "
     "oom_score_adj:0", "SIGKILL"),
    ("kernel: Memory cgroup out of memory: Killed process 4242 (llama-server) "
     "total-vm:81234567kB", "SIGKILL"),
])
def test_journald_death_lines(line: str, signal: str) -> None:
    data, first = _tail(_served("journald"), JOURNAL + line,
                        JOURNAL + "systemd[1]: llama.service: Failed with result 'signal'.")
    crash = _one(scan_bytes(data))
    assert crash.signal is not None and crash.signal.signal == signal
    assert crash.where.line == first


def test_the_oom_killer_killing_another_process_is_said_not_counted() -> None:
    data, first = _tail(_served("journald"), JOURNAL + "kernel: Out of memory: Killed process "
                        "977 (chrome) total-vm:1234kB, anon-rss:1000kB")
    scan = scan_bytes(data)
    assert scan.crashes == ()
    (p,) = [p for p in scan.problems if p.code == "oom-kill-other"]
    assert p.line == first and "977 (chrome)" in p.message


@pytest.mark.parametrize("line", [
    "systemd[1]: llama.service: Main process exited, code=killed, status=15/TERM",
    "received signal 15, terminating",
    "caught signal 2 (SIGINT), shutting down",
])
def test_a_stop_asked_for_is_not_a_crash(line: str) -> None:
    data, _ = _tail(_served("journald"), JOURNAL + line)
    assert scan_bytes(data).crashes == ()


def test_a_death_before_a_restart_belongs_to_the_first_boot() -> None:
    log = _served()
    first = len(log.lines) + 1
    log.raw("caught signal 7")
    for text in GLIBC_FOREIGN:
        log.raw(text)
    log.boot(np=2)
    log.requests(Turn(slot=1, task=1, depth_start=3000, cached=0, decode_tokens=8,
                      decode_tps=30.0))
    scan = scan_bytes(log.text().encode())
    crash = _one(scan)
    assert crash.signal is not None and crash.signal.signal == "SIGBUS"
    assert crash.where.line == first and crash.boot_index == 0 and len(scan.boots) == 2
    assert crash.backtrace is not None and len(crash.backtrace.frames) == 4


def test_a_backtrace_the_log_goes_on_after_is_a_problem_not_a_crash() -> None:
    log = _served()
    first = len(log.lines) + 1
    for text in GDB_UNKNOWN:
        log.raw(text)
    for task in range(2, 40):
        log.requests(Turn(slot=0, task=task, depth_start=4000, cached=3000, decode_tokens=8,
                          decode_tps=30.0))
    scan = scan_bytes(log.text().encode())
    assert scan.crashes == ()
    (p,) = [p for p in scan.problems if p.code == "backtrace-no-cause"]
    assert p.line == first
    assert p.message == (f"a backtrace without a known cause at line {first} (3 gdb frames); "
                         "the server's output goes on after it, so it is not counted as a crash")


def test_block_boundaries_do_not_change_what_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    data, first = _tail(_served(), "caught signal 11", *GLIBC_FOREIGN)
    whole = _one(scan_bytes(data))
    assert whole.where.line == first and whole.timeline
    for block in (97, 4096):
        monkeypatch.setattr(parse, "BLOCK", block)
        cut = _one(scan_bytes(data))
        assert cut.where == whole.where and cut.signal == whole.signal
        assert cut.backtrace == whole.backtrace and cut.timeline == whole.timeline


def test_json_text_and_exit_code_agree(tmp_path: Path, capsys: Any) -> None:
    data, first = _tail(_served(), *GDB_UNKNOWN)
    log = tmp_path / "server.log"
    log.write_bytes(data)
    code, out = run_json([str(log)], capsys)
    assert code == 1
    (crash,) = out["crashes"]
    assert crash["kind"] == "unknown" and len(crash["frames"]) == 3
    assert (crash["line"], crash["signal"]) == (first, None)
    data, first = _tail(_served(), "received signal 7", *GLIBC_FOREIGN)
    log.write_bytes(data)
    code, out = run_json([str(log)], capsys)
    (crash,) = out["crashes"]
    assert code == 1 and crash["kind"] == "signal" and crash["line"] == first
    assert crash["signal"] == {"source": str(log), "line": first, "signal": "SIGBUS",
                               "exception": None}
    assert [f["function"] for f in crash["frames"]] == [None, "foo_step", None,
                                                        "__libc_start_main"]
    data, first = _tail(_served(), *GDB_UNKNOWN)
    log.write_bytes(data)
    (f,) = [f for f in out["findings"] if f["rule"] == "segfault"]
    assert f["severity"] == "error"
    code, text = run_command([str(log)], capsys)
    assert code == 1 and "Crash 1 of 1: unknown" in text
    assert "cause not in the log: a backtrace, then the output ends" in text
    code, text = run_command([str(log), "--format", "markdown"], capsys)
    assert code == 1 and "- **crashes**: 1" in text
    assert "| a death of unknown cause (a backtrace; no signal, abort or error line) |" in text
    assert f"server.log:{first}: #0  0x00007f3b8a242520 in ?? ()" in text


def test_a_backtrace_only_as_evidence_exits_0_and_says_so(tmp_path: Path, capsys: Any) -> None:
    log = _served()
    first = len(log.lines) + 1
    for text in GLIBC_FOREIGN:
        log.raw(text)
    for task in range(2, 40):
        log.requests(Turn(slot=0, task=task, depth_start=4000, cached=3000, decode_tokens=8,
                          decode_tps=30.0))
    path = tmp_path / "server.log"
    path.write_text(log.text())
    code, out = run_json([str(path)], capsys)
    assert code == 0 and out["crashes"] == []
    (p,) = [p for p in out["problems"] if p.get("code") == "backtrace-no-cause"]
    assert p["line"] == first and "(4 glibc frames)" in p["message"]


def test_a_death_while_loading_then_a_restart_is_found_in_the_boot_window() -> None:
    """Killed during the boot (the OOM killer while the model loads), the frames of a
    handler's stack inside the boot window, then a restart that comes up."""
    log = ServerLog()
    log.boot(np=2)
    del log.lines[-2:]  # never said it was listening
    first = len(log.lines) + 1
    log.raw("caught signal 11")
    for text in GDB_UNKNOWN:
        log.raw(text)
    log.raw("Killed")
    log.boot(np=2)
    scan = scan_bytes(log.text().encode())
    crash = _one(scan)
    assert crash.where.line == first and crash.boot_index == 0
    assert crash.signal is not None and crash.signal.signal == "SIGSEGV"
    assert crash.backtrace is not None and len(crash.backtrace.frames) == 3


def test_numbered_headings_and_signal_talk_at_the_end_are_not_a_death() -> None:
    """Lines a prompt or an operator may leave at the end of a log that only look like a
    frame or a signal: a gdb frame needs an address or a location, a signal number only
    counts for the signals that end a process unasked."""
    data, _ = _tail(_served(), "#1 Introduction", "#2  Setup (optional)",
                    "received signal 15, shutting down", "srv    operator(): cleaning up",
                    "main: exiting due to HTTP server error")
    scan = scan_bytes(data)
    assert scan.crashes == ()
    assert not [p for p in scan.problems if p.code == "backtrace-no-cause"]


@pytest.mark.parametrize("message", [
    "double free or corruption (out)",
    "free(): invalid pointer",
    "malloc(): corrupted top size",
    "corrupted size vs. prev_size",
    "*** stack smashing detected ***: terminated",
    "*** buffer overflow detected ***: ./llama-server terminated",
])
def test_glibcs_own_fatal_message_names_the_abort(message: str) -> None:
    data, first = _tail(_served(), message, *GLIBC_FOREIGN, "Aborted (core dumped)")
    scan = scan_bytes(data)
    crash = _one(scan)
    assert crash.kind == "abort" and crash.where.line == first
    assert crash.abort is not None and crash.abort.message == message
    assert crash.signal is not None and crash.signal.signal == "SIGABRT"
    assert crash.backtrace is not None and len(crash.backtrace.frames) == 4
    (finding,) = [f for f in findings_of(scan) if f.rule == "ggml-assert"]
    assert finding.title.startswith(f"glibc aborted: {message}")
    assert "AddressSanitizer" in finding.fix


def test_googles_failure_signal_handler_lines() -> None:
    """glog/absl's handler: a headline, then the signal line, then its own frame format
    (not read as frames: ggml never prints it), then the death."""
    data, first = _tail(
        _served(), '*** Aborted at 1700000000 (unix time) try "date -d @1700000000" if you are '
        "using GNU date ***",
        "*** SIGABRT received at time=1700000000 on cpu 3 ***",
        "PC: @     0x7f3b8a29e9fc  (unknown)  pthread_kill",
        "    @     0x7f3b8a242520  (unknown)  (unknown)")
    crash = _one(scan_bytes(data))
    assert crash.kind == "signal" and crash.where.line == first + 1
    assert crash.signal is not None and crash.signal.signal == "SIGABRT"
    assert crash.backtrace is None


def test_each_logs_end_is_read_back_on_its_own() -> None:
    """Two logs in one run: the first ends in a death without anchor words, the second runs
    on; the death is the first log's, at its own line."""
    dead, first = _tail(_served(), "received signal 11", *GDB_UNKNOWN)
    alive = _served().text().encode()
    parser = LogParser()
    parser.feed("a.log", io.BytesIO(dead))
    parser.feed("b.log", io.BytesIO(alive))
    crash = _one(parser.result())
    assert (crash.where.source, crash.where.line) == ("a.log", first)
    assert crash.signal is not None and crash.signal.signal == "SIGSEGV"


def test_only_other_programs_lines_after_a_stack_do_not_make_the_server_go_on() -> None:
    """A host journal: the server's stack, then 250 lines of the kernel and other services
    (no restart, nothing of the server's own): the server's output ended with the stack."""
    log = _served("journald")
    first = len(log.lines) + 1
    for text in GLIBC_FOREIGN:
        log.raw(text)
    for i in range(250):
        log.lines.append(f"Mar 03 10:12:{i % 60:02d} gpu-host kernel: usb 1-{i}: new device")
    scan = scan_bytes(log.text().encode())
    crash = _one(scan)
    assert crash.kind == "unknown" and crash.where.line == first
    assert not [p for p in scan.problems if p.code == "backtrace-no-cause"]


DEATH_LINES = (
    "caught signal 11", "received signal 6", "Got signal 7", "Fatal signal 8 (SIGFPE), code 1",
    "llama-server: caught signal 4, dumping stack", "Segmentation fault", "Bus error",
    "Illegal instruction (core dumped)", "Floating point exception",
    "Trace/breakpoint trap (core dumped)", "Bad system call", "Aborted (core dumped)",
    "Aborted", "zsh: abort      ./llama-server", "Abort trap: 6", "exit code 134",
    "Killed", "./run.sh: line 9: 23186 Killed                  ./llama-server",
    "Fatal Python error: Aborted", "Fatal Python error: Segmentation fault",
    "llama.service: Main process exited, code=dumped, status=6/ABRT",
    "llama.service: Main process exited, code=killed, status=9/KILL",
    "Out of memory: Killed process 4242 (llama-server) total-vm:1kB",
    "*** SIGABRT received at time=1700000000 on cpu 3 ***",
    "terminate called after throwing an instance of 'std::bad_alloc'",
    "double free or corruption (out)", "free(): invalid pointer",
    "*** stack smashing detected ***: terminated", "corrupted size vs. prev_size",
    *GLIBC_FOREIGN, *GDB_UNKNOWN, *LLDB_FOREIGN[1:],
    "#0  ggml_vec_dot (n=4) at ggml.c:12", "./llama-server[0x4a1f00]",
    "3   libggml.dylib   0x0000000102a4f000 ggml_abort + 20",
    "#0  0x00007f3b8a242520 ggml_abort (libggml-base.so + 0x1f520)",
)


@pytest.mark.parametrize("line", DEATH_LINES)
def test_every_death_line_holds_a_substring_the_read_back_looks_for(line: str) -> None:
    """Reading back parses only the lines that hold one of MAY_SHOW_DEATH: each shape that
    can open a crash must hold one (and does open one)."""
    where = LogLine("t.log", 1, line)
    assert (crashlines.parse_signal(where, line) is not None or deathlines.opens_with_frame(line)
            or crashlines.parse_terminate(line) is not None
            or crashlines.parse_abort(where, line) != [])
    assert any(n.decode() in line for n in deathlines.MAY_SHOW_DEATH)


def test_a_followed_log_finds_the_death_at_the_restart() -> None:
    """A log read as it grows (begin/feed_lines, what --follow and the TUI use): a death with
    no anchor word is not seen while the log is quiet, and is found when the server restarts,
    at its own line and boot."""
    log = _served()
    first = len(log.lines) + 1
    log.raw("caught signal 7")
    for text in GLIBC_FOREIGN:
        log.raw(text)
    dead = log.text().encode()
    parser = LogParser()
    parser.begin("f.log")
    parser.feed_lines(dead)
    assert parser.crashes == [] and parser.open_crash_line is None
    log.boot(np=2)
    parser.feed_lines(log.text().encode()[len(dead):])
    (crash,) = parser.crashes
    assert crash.where.line == first and crash.boot_index == 0
    assert crash.signal is not None and crash.signal.signal == "SIGBUS"


@pytest.mark.parametrize("second", [
    ("Fatal Python error: Bus error", "SIGBUS", None),
    ("Windows fatal exception: stack overflow", "SIGSEGV", "stack overflow"),
    ("caught signal 11", "SIGSEGV", None),
])
def test_a_death_after_a_restart_takes_none_of_the_earlier_death_s_lines(
        second: tuple[str, str, str | None]) -> None:
    """Looking back from a death for a stack printed just before it stopped at nothing: after
    a restart it took the previous death's signal line (the crash was then placed at it) or
    its gdb frames."""
    line, signal, exception = second
    first = [
        "llama_context: constructing llama_context",
        "/src/ggml/src/ggml-cuda/fattn.cu:388: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) "
        "failed",
        "#0  0x00007f3208ef0c17 in __GI___wait4 () from /lib/x86_64-linux-gnu/libc.so.6",
        "#1  0x00007f3209a1c6f0 in ggml_abort () from /opt/lib/libggml-base.so",
        "Fatal Python error: Aborted", "",
        "Current thread 0x00007f00000000aa (most recent call first):",
        '  File "/srv/app.py", line 3 in first', "",
    ]
    restart = ["llama_context: constructing llama_context",
               "main: server is listening on http://0.0.0.0:8080 - starting the main loop"]
    death = [line, "", "Current thread 0x00007f00000000bb (most recent call first):",
             '  File "/srv/app.py", line 9 in second', ""]
    scan = scan_bytes(("\n".join([*first, *restart, *death]) + "\n").encode())
    one, two = scan.crashes
    assert one.kind == "assert" and one.where.line == 2
    assert [s.thread for s in one.python] == ["0x00007f00000000aa"]
    at = len(first) + len(restart) + 1
    assert two.signal is not None
    assert (two.where.line, two.signal.where.line, two.signal.signal, two.signal.exception) == (
        at, at, signal, exception)
    assert two.backtrace is None
    assert [(s.thread, s.frames[0].function) for s in two.python] == [
        ("0x00007f00000000bb", "second")]
