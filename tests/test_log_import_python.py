"""``kvdiag import`` carries a log's Python faulthandler stacks into the trace (format 1.3,
``abort.python_stacks``), and every surface that shows the abort shows them as ``kvdiag
postmortem`` does on the log: check, trace info, the TUI's Backtrace screen, trace export.

The log is a llama-cpp-python server on Python 3.14 (thread names after the ids) that dies of
the streamed kernel's assert while a second thread waits in the standard library, and a
third thread's stack was cut by faulthandler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader
from kvdiag.tui.app import KvdiagApp
from tests.test_tui_pilot import drive, show, text

SITE = r"/opt/llm/.venv/lib/python3.14/site-packages"
MAIN = "0x00007fa3d1b2c740"
POOL = "0x00007fa2b8ffe6c0"
CUT = "0x00007fa2a3fff6c0"
LOG = [
    "llama_model_loader: loaded meta data with 29 key-value pairs",
    "llama_context: constructing llama_context",
    "llama_context: n_ctx         = 16384",
    "llama_context: n_seq_max     = 2",
    "/src/llama.cpp/ggml/src/ggml-cuda/fattn.cu:412: "
    "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed",
    "Fatal Python error: Aborted",
    "",
    f"Thread {POOL} [asyncio_0] (most recent call first):",
    '  File "/usr/lib/python3.14/concurrent/futures/thread.py", line 90 in _worker',
    '  File "/usr/lib/python3.14/threading.py", line 1012 in run',
    "",
    f"Current thread {MAIN} [MainThread] (most recent call first):",
    "  Garbage-collecting",
    f'  File "{SITE}/llama_cpp/_internals.py", line 330 in decode',
    "  File ???, line ??? in ???",
    f'  File "{SITE}/llama_cpp/llama.py", line 702 in eval',
    f'  File "{SITE}/llama_cpp/server/app.py", line 455 in create_chat_completion',
    "",
    f"Thread {CUT} (most recent call first):",
    "  <no Python frame>",
    "",
    "Extension modules: numpy._core._multiarray_umath, _cffi_backend (total: 2)",
]


def _no_log_line(stacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """postmortem's stacks without the log line they began on (a trace does not keep it)."""
    return [{k: v for k, v in st.items() if k not in ("source", "line")} for st in stacks]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pyimport")
    log = root / "llama-cpp-python.log"
    log.write_text("\n".join(LOG) + "\n")
    trace = root / "llama-cpp-python.kvtrace"
    assert main(["import", str(log), "-o", str(trace)]) == 0
    return {"root": root, "log": log, "trace": trace}


def _postmortem_stacks(log: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["postmortem", str(log), "--json", "--no-auto-binaries"]) == 1
    (crash,) = json.loads(capsys.readouterr().out)["crashes"]
    stacks: list[dict[str, Any]] = crash["python_stacks"]
    return stacks


def test_the_abort_event_carries_every_thread_s_stack(files: dict[str, Any]) -> None:
    with TraceReader.open(files["trace"]) as reader:
        assert reader.version_text == "1.3"
        (abort,) = [e for e in reader if isinstance(e, ev.Abort)]
    current, pool, cut = abort.python_stacks
    assert (current.thread, current.name, current.current) == (MAIN, "MainThread", True)
    assert [(f.function, f.line, f.in_app) for f in current.frames] == [
        ("decode", 330, True), (None, None, True), ("eval", 702, True),
        ("create_chat_completion", 455, True)]
    assert current.frames[2].file == f"{SITE}/llama_cpp/llama.py"
    assert current.notes == ("the garbage collector was running",)
    assert (pool.thread, pool.name, pool.current) == (POOL, "asyncio_0", False)
    assert [(f.function, f.in_app) for f in pool.frames] == [("_worker", False), ("run", False)]
    assert (cut.thread, cut.frames, cut.notes) == (
        CUT, (), ("no Python frame (the thread ran only C code)",))
    # the native side is as before
    assert abort.line == 412 and abort.condition == "ggml_cuda_kv_stream_fattn_fits(dst)"


def test_check_shows_the_stacks_postmortem_shows(files: dict[str, Any],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    expected = _no_log_line(_postmortem_stacks(files["log"], capsys))
    assert main(["check", str(files["trace"]), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in doc["findings"] if f["rule"] == "abort"]
    assert finding["details"]["python_stacks"] == expected
    texts = [e["text"] for e in finding["evidence"]]
    assert texts[1] == (
        f"Python stack, thread {MAIN} [MainThread] (the thread the signal hit): decode "
        "_internals.py:330, ??? ???:???, eval llama.py:702, create_chat_completion app.py:455; "
        "the garbage collector was running")
    assert texts[2] == (f"Python stack, thread {POOL} [asyncio_0]: _worker thread.py:90 "
                        "(+1 more; 2 frame(s))")
    assert texts[3] == (f"Python stack, thread {CUT}; no Python frame (the thread ran only C "
                        "code)")
    assert main(["check", str(files["trace"])]) == 1
    out = capsys.readouterr().out  # a table: the evidence wraps inside its cell
    assert "create_chat_completion" in out and "app.py:455" in out


def test_trace_info_shows_them_too(files: dict[str, Any],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    expected = _no_log_line(_postmortem_stacks(files["log"], capsys))
    assert main(["trace", "info", str(files["trace"]), "--json"]) == 0
    (abort,) = json.loads(capsys.readouterr().out)["aborts"]
    assert abort["python_stacks"] == expected
    assert abort["backtrace"] == [] and abort["line"] == 412
    assert main(["trace", "info", str(files["trace"])]) == 0
    out = capsys.readouterr().out
    assert f"Python stack, thread {MAIN} [MainThread] (the thread the signal hit)" in out
    assert f"{SITE}/llama_cpp/server/app.py:455" in out  # not a terminal: whole paths
    assert f"Python stack, thread {POOL} [asyncio_0]: _worker" in out
    assert "no native backtrace in the trace" in out


def test_the_backtrace_screen_on_the_trace_shows_the_log_s_frames(
        files: dict[str, Any]) -> None:
    screens: list[str] = []

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "5")
        screens.append(text(app))

    for path in (files["log"], files["trace"]):
        drive([path], script)
    assert len(screens) == 2
    assert "crash group 1 of 1: assert" in screens[1]
    for screen in screens:
        assert f"all the Python stack of thread {MAIN}" in screen
        for frame in ("decode", "eval", "create_chat_completion", "llama_cpp/llama.py:702",
                      "Python"):
            assert frame in screen, screen
        assert "the garbage collector was running" in screen


def test_llama_log_export_prints_them_back_as_faulthandler(
        files: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    exported = files["root"] / "exported.log"
    assert main(["trace", "export", str(files["trace"]), "--format", "llama-log",
                 "-o", str(exported)]) == 0
    lines = exported.read_text().splitlines()
    start = lines.index("Fatal Python error: Aborted")
    assert lines[start + 2] == f"Current thread {MAIN} [MainThread] (most recent call first):"
    assert lines[start + 3] == "  Garbage-collecting"
    assert lines[start + 5] == "  File ???, line ??? in ???"
    assert (_no_log_line(_postmortem_stacks(exported, capsys))
            == _no_log_line(_postmortem_stacks(files["log"], capsys)))


def test_chrome_export_keeps_them_in_the_abort_s_args(files: dict[str, Any]) -> None:
    out = files["root"] / "trace.json"
    assert main(["trace", "export", str(files["trace"]), "-o", str(out)]) == 0
    (abort,) = [e for e in json.loads(out.read_text()) if e.get("cat") == "abort"]
    stacks = abort["args"]["python_stacks"]
    assert [st["thread"] for st in stacks] == [MAIN, POOL, CUT]
    assert stacks[0]["frames"][3] == {"function": "create_chat_completion",
                                      "file": f"{SITE}/llama_cpp/server/app.py", "line": 455}


def test_a_newer_minor_s_field_inside_a_stack_is_kept(tmp_path: Path) -> None:
    """A later minor may add to the stacks (a column, say): this reader keeps it by path."""
    from trace_samples import NEWER_MINOR, end_line, event_line, header_line

    frame = {"function": "decode", "file": "/srv/a.py", "line": 3, "column": 17}
    path = tmp_path / "newer.kvtrace"
    path.write_bytes(header_line(NEWER_MINOR) + event_line(
        "abort", 1, message="SIGSEGV", python_stacks=[
            {"thread": "0x1", "current": True, "frames": [frame]}]) + end_line(2, 1))
    with TraceReader.open(path) as reader:
        (abort,) = [e for e in reader if isinstance(e, ev.Abort)]
        assert reader.extras[1] == {"python_stacks[0].frames[0].column": 17}
    assert abort.python_stacks[0].frames[0].function == "decode"


def test_sql_gives_the_trace_the_log_s_python_frames(files: dict[str, Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    query = ("SELECT stack, thread, thread_name, signalled, frame, function, source_file, "
             "source_line, in_app FROM python_frames WHERE file = '{}' ORDER BY stack, frame")
    rows = []
    for path in (files["log"], files["trace"]):
        capsys.readouterr()
        assert main(["sql", query.format(path), str(path), "--format", "json"]) == 0
        rows.append([json.loads(ln) for ln in capsys.readouterr().out.splitlines()])
    assert rows[0] == rows[1]
    assert [(r["thread_name"], r["function"], r["source_line"], r["in_app"]) for r in rows[1]] == [
        ("MainThread", "decode", 330, True), ("MainThread", None, None, True),
        ("MainThread", "eval", 702, True), ("MainThread", "create_chat_completion", 455, True),
        ("asyncio_0", "_worker", 90, False), ("asyncio_0", "run", 1012, False)]
