"""Python faulthandler stacks (llama-cpp-python and other Python embeddings of llama.cpp).

CPython prints ``Fatal Python error: <signal>``, a blank line, then each thread's stack
(``Current thread 0x… (most recent call first):`` / ``Thread 0x…``, frames ``  File "f", line
N in func``), possibly ``Extension modules: …`` (Python/traceback.c, Modules/faulthandler.c).
These are read as the crash's Python stacks, beside any native backtrace of the same death.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from postmortem_helpers import findings_of, run_command, run_json, scan_bytes

from kvdiag.model.logrecords import Crash, LogScan
from kvdiag.postmortem import pystack
from kvdiag.tui.crashes import from_crash
from kvdiag.tui.screens.backtrace import FrameRows

BOOT = (
    "llama_model_loader: loaded meta data with 33 key-value pairs",
    "llama_context: constructing llama_context",
    "llama_context: n_ctx         = 8192",
    "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200",
)
SITE = "/home/ops/venv/lib/python3.12/site-packages"
MAIN_THREAD = "0x00007f55c1e3b740"
WORKER = "0x00007f54d37fe6c0"
PY_SEGV = (
    "Fatal Python error: Segmentation fault",
    "",
    f"Thread {WORKER} (most recent call first):",
    '  File "/usr/lib/python3.12/selectors.py", line 468 in select',
    f'  File "{SITE}/uvicorn/server.py", line 69 in serve',
    "",
    f"Current thread {MAIN_THREAD} (most recent call first):",
    "  Garbage-collecting",
    f'  File "{SITE}/llama_cpp/llama_cpp.py", line 1473 in llama_decode',
    f'  File "{SITE}/llama_cpp/_internals.py", line 312 in decode',
    "  File ???, line ??? in ???",
    '  File "/usr/lib/python3.12/threading.py", line 1010 in run',
    "",
    "Extension modules: numpy._core._multiarray_umath, yaml._yaml, _cffi_backend (total: 3)",
)


def _log(*tail: str) -> bytes:
    return ("\n".join((*BOOT, *tail)) + "\n").encode()


def _one(scan: LogScan) -> Crash:
    assert len(scan.crashes) == 1, [(c.kind, c.where.line) for c in scan.crashes]
    return scan.crashes[0]


def test_frame_lines_and_what_is_python_s_own() -> None:
    assert pystack.parse_frame(f'  File "{SITE}/llama_cpp/llama.py", line 651 in eval') == (
        f"{SITE}/llama_cpp/llama.py", 651, "eval")
    assert pystack.parse_frame("  File ???, line ??? in ???") == (None, None, None)
    assert pystack.parse_frame('  File "<stdin>", line 1 in <module>') == ("<stdin>", 1,
                                                                         "<module>")
    # an exception's traceback (a comma before "in") is not faulthandler's
    assert pystack.parse_frame('  File "/srv/app.py", line 3, in main') is None
    assert pystack.is_in_app(f"{SITE}/llama_cpp/llama.py")
    assert pystack.is_in_app("/usr/lib/python3/dist-packages/llama_cpp/llama.py")
    assert pystack.is_in_app("/srv/app/main.py") and pystack.is_in_app("<stdin>")
    assert not pystack.is_in_app("/usr/lib/python3.12/threading.py")
    assert not pystack.is_in_app("/opt/py/lib/python3.13t/asyncio/runners.py")
    assert not pystack.is_in_app("<frozen runpy>")
    assert not pystack.is_in_app(r"C:\Python311\Lib\threading.py")
    assert pystack.is_in_app(r"C:\Python311\Lib\site-packages\llama_cpp\llama.py")


def test_a_python_segfault_has_every_thread_s_stack_the_current_one_first() -> None:
    crash = _one(scan_bytes(_log(*PY_SEGV)))
    assert crash.kind == "segfault" and crash.signal is not None
    assert crash.signal.signal == "SIGSEGV" and crash.where.line == len(BOOT) + 1
    assert crash.backtrace is None
    current, other = crash.python
    assert (current.thread, current.current) == (MAIN_THREAD, True)
    assert current.where.line == len(BOOT) + 7
    assert [(f.index, f.function, f.line, f.in_app) for f in current.frames] == [
        (0, "llama_decode", 1473, True), (1, "decode", 312, True), (2, None, None, True),
        (3, "run", 1010, False)]
    assert current.frames[1].file == f"{SITE}/llama_cpp/_internals.py"
    assert all(f.module is None and f.address is None for f in current.frames)
    assert current.notes == ("the garbage collector was running",)
    assert (other.thread, other.current) == (WORKER, False)
    assert [f.function for f in other.frames] == ["select", "serve"]


def test_the_python_frames_name_the_finding_and_the_fingerprint() -> None:
    scan = scan_bytes(_log(*PY_SEGV))
    (finding,) = [f for f in findings_of(scan) if f.rule == "segfault"]
    assert finding.title == "SIGSEGV without an assert in llama_decode llama_cpp.py:1473 (Python)"
    assert any(e.text == "first in-app Python frame: llama_decode llama_cpp.py:1473"
               and e.line == len(BOOT) + 7 for e in finding.evidence)
    assert "no native backtrace" in finding.fix
    # another thread id, other line numbers: the same crash; another function: another one
    moved = [s.replace(MAIN_THREAD, "0x00007f0000000001").replace("line 1473", "line 1480")
             for s in PY_SEGV]
    other = [s.replace("in llama_decode", "in llama_batch_init") for s in PY_SEGV]
    fp = _one(scan).fingerprint
    assert _one(scan_bytes(_log(*moved))).fingerprint == fp
    assert _one(scan_bytes(_log(*other))).fingerprint != fp


GDB_ABORT = (
    "/home/ops/llama.cpp/ggml/src/ggml-cuda/fattn.cu:388: "
    "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed",
    "[New LWP 90211]",
    "#0  0x00007f55c1b0c42f in __GI___wait4 (pid=90212, stat_loc=0x0, options=0, usage=0x0) "
    "at ../sysdeps/unix/sysv/linux/wait4.c:30",
    f"#1  0x00007f54e0aa1e22 in ggml_print_backtrace () from {SITE}/llama_cpp/lib/"
    "libggml-base.so",
    f"#2  0x00007f54e0aa1f70 in ggml_abort () from {SITE}/llama_cpp/lib/libggml-base.so",
    f"#3  0x00007f54d9c44a10 in ggml_cuda_flash_attn_ext () from {SITE}/llama_cpp/lib/"
    "libggml-cuda.so",
    f"#4  0x00007f54d9c11b88 in ggml_backend_cuda_graph_compute () from {SITE}/llama_cpp/lib/"
    "libggml-cuda.so",
)
PY_ABORT = (
    "Fatal Python error: Aborted",
    "",
    f"Current thread {MAIN_THREAD} (most recent call first):",
    f'  File "{SITE}/llama_cpp/_internals.py", line 312 in decode',
    f'  File "{SITE}/llama_cpp/llama.py", line 651 in eval',
    "",
    f"Thread {WORKER} (most recent call first):",
    "  <no Python frame>",
)


def test_a_gdb_backtrace_and_faulthandler_of_one_death_are_one_crash_with_both() -> None:
    crash = _one(scan_bytes(_log(*GDB_ABORT, *PY_ABORT)))
    assert crash.kind == "assert" and crash.abort is not None
    assert crash.abort.line == 388
    assert crash.signal is not None and crash.signal.signal == "SIGABRT"
    assert crash.backtrace is not None and crash.backtrace.form == "gdb"
    assert [f.function for f in crash.backtrace.frames][3:] == [
        "ggml_cuda_flash_attn_ext", "ggml_backend_cuda_graph_compute"]
    assert [(s.thread, s.current, [f.function for f in s.frames], s.notes)
            for s in crash.python] == [
        (MAIN_THREAD, True, ["decode", "eval"], ()),
        (WORKER, False, [], ("no Python frame (the thread ran only C code)",))]
    # the finding still blames the native frame
    (finding,) = [f for f in findings_of(scan_bytes(_log(*GDB_ABORT, *PY_ABORT)))
                  if f.rule == "kvstream-fits-dispatch-abort"]
    assert any("first in-app frame: ggml_cuda_flash_attn_ext" in e.text
               for e in finding.evidence)


def test_a_native_stack_printed_after_the_python_one_joins_the_same_crash() -> None:
    """A handler that runs after faulthandler (faulthandler re-raises the signal) prints
    glibc frames below the Python stacks: still one death."""
    glibc = (
        "caught signal 11, backtrace:",
        f"{SITE}/llama_cpp/lib/libllama.so(llama_decode+0x52)[0x7f54e1b33012]",
        f"{SITE}/llama_cpp/lib/libggml-cuda.so(+0x1c4a10)[0x7f54d9c44a10]",
        "/lib/x86_64-linux-gnu/libc.so.6(+0x42520)[0x7f55c1a42520]",
    )
    crash = _one(scan_bytes(_log(*PY_SEGV[:-2], *glibc)))
    assert crash.kind == "segfault"
    assert crash.backtrace is not None and crash.backtrace.form == "glibc"
    assert [f.function for f in crash.backtrace.frames] == ["llama_decode", None, None]
    assert [s.thread for s in crash.python] == [MAIN_THREAD, WORKER]
    assert crash.python[0].frames[0].function == "llama_decode"


def test_python_3_14_c_stack_is_the_native_backtrace() -> None:
    """3.14's faulthandler adds the current thread's C stack (glibc's frames in other
    words): module, symbol and offset, ready for symbolization."""
    c_stack = (
        "",
        "Current thread's C stack trace (most recent call first):",
        '  Binary file "/usr/bin/python3.14", at _Py_DumpStack+0x31 [0x55e2f1d3a4b1]',
        '  Binary file "/lib/x86_64-linux-gnu/libc.so.6", at +0x45330 [0x7f55c1a45330]',
        f'  Binary file "{SITE}/llama_cpp/lib/libggml-cpu.so", at ggml_vec_dot_q8_0_q8_0'
        "+0x2e4 [0x7f54e0c13aa4]",
        f'  Binary file "{SITE}/llama_cpp/lib/libggml-cpu.so", at +0x5f20 [0x7f54e0c05f20]',
        "  <truncated rest of calls>",
    )
    crash = _one(scan_bytes(_log(*PY_SEGV[:-2], *c_stack, *PY_SEGV[-2:])))
    bt = crash.backtrace
    assert bt is not None and bt.form == "glibc"
    assert bt.thread == "Current thread's C stack trace (most recent call first):"
    assert [(f.function, f.offset, f.address, f.in_app) for f in bt.frames] == [
        ("_Py_DumpStack", None, 0x55E2F1D3A4B1, False), (None, 0x45330, 0x7F55C1A45330, False),
        ("ggml_vec_dot_q8_0_q8_0", None, 0x7F54E0C13AA4, True),
        (None, 0x5F20, 0x7F54E0C05F20, True)]
    assert bt.symrefs[2] == ("ggml_vec_dot_q8_0_q8_0", 0x2E4)
    assert [f.function for f in crash.python[0].frames][:2] == ["llama_decode", "decode"]


def test_one_thread_form_free_threaded_and_cut_stacks() -> None:
    frames = [f'  File "/srv/app/deep.py", line {i} in f{i}' for i in range(100)]
    log = _log(
        "Fatal Python error: Bus error", "",
        "<Cannot show all threads while the GIL is disabled>",
        "Stack (most recent call first):", *frames, "  ...")
    crash = _one(scan_bytes(log))
    assert crash.kind == "signal" and crash.signal is not None
    assert crash.signal.signal == "SIGBUS"
    (st,) = crash.python
    assert st.current and st.thread is None and len(st.frames) == 100
    assert st.frames[99].function == "f99" and st.frames[99].line == 99
    assert st.notes == ("only the current thread is shown (the GIL is disabled)",
                        "cut after 100 frames")


def test_an_unnamed_signal_and_a_watchdog_dump() -> None:
    crash = _one(scan_bytes(_log("Fatal Python error from unexpected signum: 7", "",
                                 *PY_SEGV[6:9])))
    assert crash.signal is not None and crash.signal.signal == "SIGBUS"
    assert crash.python[0].frames[0].function == "llama_decode"
    # dump_traceback_later's "Timeout" dump is no death: the server goes on after it
    watchdog = ("Timeout (0:05:00)!", *PY_SEGV[6:12],
                *(f"slot update_slots: id  0 | task {i} | n_past = {i}" for i in range(300)))
    assert scan_bytes(_log(*watchdog)).crashes == ()


def test_json_and_text_reports_show_the_python_stacks(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "llama-cpp-python.log"
    log.write_bytes(_log(*GDB_ABORT, *PY_ABORT))
    code, data = run_json([str(log), "--no-auto-binaries"], capsys)
    assert code == 1
    (crash,) = data["crashes"]
    assert len(crash["frames"]) == 5
    current, other = crash["python_stacks"]
    assert current == {
        "source": str(log), "line": len(BOOT) + len(GDB_ABORT) + 3, "thread": MAIN_THREAD,
        "name": None, "current": True, "notes": [],
        "frames": [{"index": 0, "function": "decode", "file": f"{SITE}/llama_cpp/_internals.py",
                    "line": 312, "in_app": True},
                   {"index": 1, "function": "eval", "file": f"{SITE}/llama_cpp/llama.py",
                    "line": 651, "in_app": True}]}
    assert other["thread"] == WORKER and other["frames"] == [] and not other["current"]
    code, out = run_command([str(log), "--no-auto-binaries"], capsys)
    assert f"Python stack, thread {MAIN_THREAD} (the thread the signal hit)" in out
    assert "llama_cpp/_internals.py:312" in out
    assert f"Python stack, thread {WORKER}" in out
    assert "no Python frame (the thread ran only C code)" in out


def test_python_frames_are_never_looked_up_in_a_binary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --binary applies to native frames only: the Python frames stay as printed and the
    binary is reported unused when no native frame is its."""
    log = tmp_path / "py.log"
    log.write_bytes(_log(*PY_SEGV))
    _, plain = run_json([str(log), "--no-auto-binaries"], capsys)
    _, with_binary = run_json([str(log), "--no-auto-binaries", "--binary",
                               str(Path(sys.executable).resolve()), "--no-cache"], capsys)
    assert with_binary["crashes"][0]["python_stacks"] == plain["crashes"][0]["python_stacks"]
    assert with_binary["crashes"][0]["frames"] == []
    assert [p["code"] for p in with_binary["problems"]] == ["binary-unused"]


def test_backtrace_screen_rows_for_a_python_stack() -> None:
    """The TUI's Backtrace screen shows the native frames, then the Python stack of the
    thread the signal hit, whose module column says Python."""
    crash = _one(scan_bytes(_log(*GDB_ABORT, *PY_ABORT)))
    view = from_crash(0, crash)
    assert view.python_from == 5 and view.python_thread == MAIN_THREAD
    rows = FrameRows(view)
    assert len(rows) == 7
    cells, style = rows.row(5)
    assert list(cells) == ["0", "decode", f"{SITE}/llama_cpp/_internals.py:312", "Python"]
    assert style == "inapp"
    assert rows.row(4)[0][3] == "libggml-cuda.so 0x7f54d9c11b88"
    only_py = from_crash(0, _one(scan_bytes(_log(*PY_SEGV))))
    assert only_py.python_from == 0 and len(only_py.frames) == 4
    assert "the garbage collector was running" in only_py.details


def test_backtrace_screen_shows_a_python_only_crash(tmp_path: Path) -> None:
    from kvdiag.tui.app import KvdiagApp
    from kvdiag.tui.export import wait_loaded

    log = tmp_path / "py.log"
    log.write_bytes(_log(*PY_SEGV))

    async def run() -> str:
        app = KvdiagApp([str(log)])
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_loaded(app, timeout=60)
            await pilot.press("5")
            await pilot.pause()
            return "\n".join(s.text for s in app.screen._compositor.render_strips())

    screen = asyncio.run(run())
    assert "crash group 1 of 1: segfault" in screen
    assert (f"4 frame(s), 3 in-app (highlighted); all the Python stack of thread {MAIN_THREAD}"
            in screen)
    assert "llama_decode" in screen and "llama_cpp/llama_cpp.py:1473" in screen


def test_python_3_8_prints_no_python_frame_at_the_line_start() -> None:
    """3.8 and 3.9 wrote ``<no Python frame>`` without the two spaces later versions put
    before it (Python/traceback.c ``dump_traceback``)."""
    crash = _one(scan_bytes(_log(
        "Fatal Python error: Illegal instruction", "",
        f"Current thread {MAIN_THREAD} (most recent call first):", "<no Python frame>")))
    assert crash.signal is not None and crash.signal.signal == "SIGILL"
    (st,) = crash.python
    assert st.current and st.frames == ()
    assert st.notes == ("no Python frame (the thread ran only C code)",)


def test_the_python_stack_s_header_is_marked_and_leads_to_its_crash(tmp_path: Path) -> None:
    """The Timeline marks a Python stack's header line as a backtrace, and the Findings
    screen's evidence at that line opens its crash."""
    from kvdiag.analysis.linesource import LineSource
    from kvdiag.analysis.log_index import LOG_KINDS, build_log_index
    from kvdiag.tui.screens.findings import crash_at_line

    log = tmp_path / "py.log"
    log.write_bytes(_log(*GDB_ABORT, *PY_SEGV))
    scan = scan_bytes(log.read_bytes(), str(log))
    crash = _one(scan)
    header = crash.python[0].where.line
    index = build_log_index(LineSource.open(log), scan, str(log))
    kinds = [LOG_KINDS[k] for k in index.columns["kind"]]
    assert kinds[header - 1] == "backtrace" and kinds[crash.python[1].where.line - 1] == "backtrace"
    assert kinds[header] == "line"  # a frame line is not a mark of its own
    assert crash_at_line(scan.crashes, str(log), header) == 0
    assert crash_at_line(scan.crashes, str(log), header + 1) is None


PY_FATAL = (
    "Fatal Python error: PyThreadState_Get: the function must be called with the GIL held, "
    "but the GIL is released (the current Python thread state is NULL)",
    "Python runtime state: initialized",
    "",
    f"Thread {WORKER} [llama-decode] (most recent call first):",
    f'  File "{SITE}/llama_cpp/_internals.py", line 312 in decode',
    '  File "/usr/lib/python3.14/threading.py", line 1024 in run',
    "",
    f"Current thread {MAIN_THREAD} [MainThread] (most recent call first):",
    f'  File "{SITE}/uvicorn/server.py", line 69 in serve',
    "",
    "Extension modules: numpy._core._multiarray_umath (total: 1)",
)


@pytest.mark.parametrize("shell", [(), ("Aborted (core dumped)",)])
def test_a_python_fatal_error_is_an_abort_with_the_threads_stacks(shell: tuple[str, ...]) -> None:
    """Py_FatalError (an extension calling the C API without the GIL): its message line is
    the abort, the stacks after it are the crash's, with 3.14's thread names; the shell's
    line after it is the same death's signal."""
    scan = scan_bytes(_log(*PY_FATAL, *shell))
    crash = _one(scan)
    assert crash.kind == "abort" and crash.abort is not None
    assert crash.abort.form == "python" and crash.abort.file is None
    assert crash.abort.message.startswith("PyThreadState_Get: the function must be called")
    assert (crash.signal.signal if crash.signal is not None else None) == (
        "SIGABRT" if shell else None)
    assert [(s.thread, s.name, s.current) for s in crash.python] == [
        (MAIN_THREAD, "MainThread", True), (WORKER, "llama-decode", False)]
    (finding,) = findings_of(scan)
    assert finding.rule == "ggml-assert"
    assert finding.title.startswith("Fatal Python error: PyThreadState_Get: ")
    assert finding.title.endswith("(in serve server.py:69 (Python))")
    assert "Py_FatalError" in finding.fix
    # faulthandler's own line for a signal is a signal, never this abort
    assert _one(scan_bytes(_log(*PY_SEGV))).abort is None


def test_stacks_interleaved_line_by_line_stay_two_whole_stacks_of_one_crash() -> None:
    """Two writers on one stderr (the debugger ggml started, faulthandler) can mix their
    lines: each stack still comes out whole, and the death is one crash."""
    gdb = GDB_ABORT[2:]
    python = PY_ABORT[2:5]
    mixed = [line for pair in zip(gdb, python, strict=False) for line in pair]
    mixed += [*gdb[len(python):]]
    crash = _one(scan_bytes(_log(GDB_ABORT[0], PY_ABORT[0], *mixed)))
    assert crash.kind == "assert"
    assert crash.backtrace is not None
    assert [f.index for f in crash.backtrace.frames] == [0, 1, 2, 3, 4]
    assert [f.function for f in crash.python[0].frames] == ["decode", "eval"]
