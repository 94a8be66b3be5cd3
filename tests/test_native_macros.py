"""kernels/kvtrace.h from a fork developer's seat (issue 15, §6): macro arguments are never
evaluated while tracing is off, KVTRACE_ABORT records a runtime's own fatal assertion without
ggml, and the header line declares what the process records ("records", format 1.2) from the
macros compiled into the program and every shared object, dlopen()ed ones included.

The programs are kernels/native_tests/kvtrace_lazy.c, kvtrace_selftest.c (abort-at),
kvtrace_records.c with the C++ shared object kvtrace_records_dso.cpp.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from native_cc import CC, CXX, KERNELS, NVCC, STRICT_C, STRICT_CXX, TESTS_C, build, one_trace, run

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader

LAZY = TESTS_C / "kvtrace_lazy.c"
RECORDS = TESTS_C / "kvtrace_records.c"
RECORDS_DSO = TESTS_C / "kvtrace_records_dso.cpp"
INC = ["-I", str(KERNELS)]

needs_cc = pytest.mark.skipif(CC is None, reason="gcc not found")
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")


def _read(path: Path) -> tuple[TraceReader, list[Any]]:
    reader = TraceReader.open(path)
    return reader, list(reader)


def _counts(exe: Path, tmp: Path) -> tuple[str, str]:
    """(stdout off, stdout on) of kvtrace_lazy."""
    off, on = tmp / "off", tmp / "on"
    off.mkdir()
    on.mkdir()
    p_off = run(exe, off, trace=None)
    p_on = run(exe, on)
    assert p_off.returncode == 0 and p_on.returncode == 0, p_off.stderr + p_on.stderr
    assert list(off.iterdir()) == []
    _, events = _read(one_trace(on))
    # on: every macro wrote its event; the abort (last) ended the trace
    assert isinstance(events[-1], ev.End) and events[-1].status == "aborted"
    return p_off.stdout, p_on.stdout


# -- arguments are evaluated only while tracing is on -------------------------------------------


@needs_cc
def test_off_evaluates_no_argument_not_even_on_the_first_call(tmp_path: Path) -> None:
    """Every argument of every macro goes through a counting function. Off: none runs, the
    first macro of the process included (before 1.2 the first call evaluated its arguments
    once while it decided). On: each runs exactly once."""
    assert CC is not None
    exe = tmp_path / "lazy"
    build([CC, *STRICT_C, "-O2", *INC, str(LAZY), "-o", str(exe), "-pthread"])
    assert _counts(exe, tmp_path) == ("evaluated 0 of 98\n", "evaluated 98 of 98\n")


@needs_cxx
def test_off_evaluates_no_argument_in_cxx(tmp_path: Path) -> None:
    assert CXX is not None
    exe = tmp_path / "lazy"
    build([CXX, *STRICT_CXX, "-O2", "-x", "c++", *INC, str(LAZY), "-o", str(exe), "-pthread"])
    assert _counts(exe, tmp_path) == ("evaluated 0 of 98\n", "evaluated 98 of 98\n")


@needs_nvcc
@pytest.mark.slow
def test_off_evaluates_no_argument_in_cuda_host_code(tmp_path: Path) -> None:
    """Host code of a .cu file (nvcc; no GPU needed, nothing is launched)."""
    assert NVCC is not None
    exe = tmp_path / "lazy"
    build([NVCC, "-std=c++17", "-O2", "-x", "cu", "-Xcompiler", "-Wall,-Wextra,-Werror", *INC,
           str(LAZY), "-o", str(exe)])
    assert _counts(exe, tmp_path) == ("evaluated 0 of 98\n", "evaluated 98 of 98\n")


# -- KVTRACE_ABORT -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def selftest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CC is None:
        pytest.skip("gcc not found")
    exe = tmp_path_factory.mktemp("macros") / "kvtrace_selftest"
    build([CC, *STRICT_C, "-O2", *INC, str(TESTS_C / "kvtrace_selftest.c"), "-o", str(exe),
           "-pthread"])
    return exe


def test_kvtrace_abort_records_a_runtime_assert_before_the_process_dies(
        selftest: Path, tmp_path: Path) -> None:
    proc = run(selftest, tmp_path, "abort-at")
    assert proc.returncode == -signal.SIGABRT  # the program's own abort() after the macro
    path = one_trace(tmp_path)
    reader, events = _read(path)
    assert [p.kind for p in reader.problems] == []  # the end event is on disk: complete
    abort, end = events
    assert isinstance(abort, ev.Abort) and isinstance(end, ev.End)
    assert (abort.file, abort.line) == ("/src/runtime/kv_cache.c", 214)
    # ggml_abort's shape, so post-mortem and check read it like a ggml abort (the next test)
    assert abort.message == "/src/runtime/kv_cache.c:214: KV_ASSERT(page < window) failed"
    assert abort.condition == "page < window"  # any NAME(<condition>) failed
    assert (end.status, end.events) == ("aborted", 1)
    assert path.read_bytes().endswith(b"}\n")
    assert main(["check", "--json", str(path)]) == 1


def test_postmortem_of_the_exported_log_names_the_runtimes_assert(
        selftest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The abort a runtime without ggml records, exported as the log it would print: the
    post-mortem names the same assert (file, line, condition) as check, and exits 1 as check
    does (it once found no crash: only ggml's own source files were read as aborts)."""
    run(selftest, tmp_path, "abort-at")
    path = one_trace(tmp_path)
    log = tmp_path / "server.log"
    assert main(["trace", "export", str(path), "--format", "llama-log", "-o", str(log)]) == 0
    capsys.readouterr()
    assert main(["postmortem", "--json", str(log)]) == 1
    crashes = json.loads(capsys.readouterr().out)["crashes"]
    assert [(c["kind"], c["assert"]) for c in crashes] == [
        ("assert", {"file": "/src/runtime/kv_cache.c", "line": 214, "condition": "page < window"})]


def test_kvtrace_abort_with_free_text_has_no_condition(selftest: Path, tmp_path: Path) -> None:
    proc = run(selftest, tmp_path, "abort-at", "CUDA error: out of memory (failed)")
    assert proc.returncode == -signal.SIGABRT
    _, events = _read(one_trace(tmp_path))
    abort = events[0]
    assert isinstance(abort, ev.Abort)
    assert abort.message == "/src/runtime/kv_cache.c:214: CUDA error: out of memory (failed)"
    assert abort.condition == "" and abort.line == 214


def test_check_reports_the_runtime_abort(selftest: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run(selftest, tmp_path, "abort-at", "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed")
    capsys.readouterr()
    assert main(["check", "--json", str(one_trace(tmp_path))]) == 1
    found = json.loads(capsys.readouterr().out)["findings"]
    abort = next(f for f in found if f["rule"] == "abort")
    assert "ggml_cuda_kv_stream_fattn_fits(dst)" in abort["title"]


# -- records: what the process can write ----------------------------------------------------------

BASE = ("step", "write", "invalidate", "read", "warn", "end")
DSO_KINDS = ("learn", "mark", "upload", "mark.outside")
WITH_DSO = ("step", "learn", "write", "mark", "upload", "invalidate", "read", "warn", "end",
            "mark.outside")


@pytest.fixture(scope="module")
def records_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ shared object (hidden visibility, and a -Bsymbolic twin) and the program in
    four builds: plain, -rdynamic, linked against the object, without sections."""
    if CC is None or CXX is None:
        pytest.skip("gcc/g++ not found")
    out = tmp_path_factory.mktemp("records")
    dso = [CXX, *STRICT_CXX, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", *INC,
           str(RECORDS_DSO), "-pthread"]
    build([*dso, "-o", str(out / "libkvrec.so")])
    (out / "symbolic").mkdir()
    build([*dso, "-Wl,-Bsymbolic", "-o", str(out / "symbolic" / "libkvrec.so")])
    prog = [CC, *STRICT_C, "-O2", *INC, str(RECORDS), "-pthread", "-ldl"]
    build([*prog, "-o", str(out / "plain")])
    build([*prog, "-rdynamic", "-o", str(out / "exported")])
    build([*prog, "-DKVTRACE_NO_SECTIONS", "-o", str(out / "nosections")])
    for name, folder in (("linked", out), ("linked-symbolic", out / "symbolic")):
        build([*prog, "-DKVREC_LINKED", "-o", str(out / name), f"-L{folder}", "-lkvrec",
               f"-Wl,-rpath,{folder}"])
    return out


def _records_run(exe: Path, tmp: Path, *args: str) -> tuple[ev.Header, list[Any]]:
    proc = run(exe, tmp, *args)
    assert proc.returncode == 0, proc.stderr
    reader, events = _read(one_trace(tmp))
    assert reader.problems == []
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # one writer
    return reader.header, events


def test_records_are_the_macros_compiled_in(records_build: Path, tmp_path: Path) -> None:
    """The invalidate that never runs is declared: "can write", not "wrote"."""
    header, events = _records_run(records_build / "plain", tmp_path, "never")
    assert header.records == BASE
    assert not any(isinstance(e, ev.Invalidate | ev.Records) for e in events)


def test_a_linked_cxx_shared_object_adds_its_kinds_to_the_header(records_build: Path,
                                                                  tmp_path: Path) -> None:
    header, events = _records_run(records_build / "linked", tmp_path)
    assert header.records == WITH_DSO
    assert [type(e).__name__ for e in events] == [
        "Step", "Write", "Read", "Learn", "Mark", "Upload", "End"]


@pytest.mark.parametrize("program", ["exported", "plain"])
def test_a_dlopened_shared_object_adds_a_records_event(records_build: Path, tmp_path: Path,
                                                        program: str) -> None:
    """Loaded after the header line: a `records` event with the kinds not declared yet, before
    its first event. "exported" (-rdynamic): the object's references bind to the program's
    state. "plain": they cannot (nothing exports it), so the object adopts the state that
    opened the trace instead of opening -- and truncating -- the file a second time."""
    header, events = _records_run(records_build / program, tmp_path, "dlopen",
                                  str(records_build / "libkvrec.so"))
    assert header.records == BASE
    assert [type(e).__name__ for e in events] == [
        "Step", "Write", "Read", "Records", "Learn", "Mark", "Upload", "End"]
    assert events[3].kinds == DSO_KINDS


def test_a_bsymbolic_shared_object_shares_the_trace(records_build: Path, tmp_path: Path) -> None:
    """-Bsymbolic binds the object to its own copy of the state; it adopts the one that opened
    the trace at its first macro and declares its kinds then."""
    header, events = _records_run(records_build / "linked-symbolic", tmp_path)
    assert header.records == BASE
    assert [type(e).__name__ for e in events] == [
        "Step", "Write", "Read", "Records", "Learn", "Mark", "Upload", "End"]
    assert events[3].kinds == DSO_KINDS


def test_without_sections_only_declared_kinds_are_records(records_build: Path,
                                                          tmp_path: Path) -> None:
    header, _ = _records_run(records_build / "nosections", tmp_path)
    assert header.records == ("step", "write", "read", "warn", "end")


def test_without_sections_and_declarations_records_is_absent(records_build: Path,
                                                             tmp_path: Path) -> None:
    header, _ = _records_run(records_build / "nosections", tmp_path, "undeclared")
    assert header.records is None
    assert '"records":' not in one_trace(tmp_path).read_text()


def test_a_late_declaration_is_an_event_and_a_bad_name_a_warning(records_build: Path,
                                                                 tmp_path: Path) -> None:
    header, events = _records_run(records_build / "nosections", tmp_path, "late")
    assert header.records == ("step", "write", "read", "warn", "end")
    warn, records = events[3], events[4]
    assert isinstance(warn, ev.Warn) and warn.code == "kvtrace-bad-arg"
    assert warn.message == "KVTRACE_DECLARE: invalid kind 'nonsense'; event not written"
    assert isinstance(records, ev.Records) and records.kinds == ("adapt",)


def test_an_exec_with_a_stale_state_entry_opens_its_own_trace(records_build: Path,
                                                              tmp_path: Path) -> None:
    """KVTRACE_STATE_12 names the state that opened the trace; a process whose entry is not
    its own (another pid, or a descriptor that is not open) ignores it."""
    env_entry = "1:4096:3:1:1"  # pid 1, not us
    proc = subprocess.run([str(records_build / "plain")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60,
                          env={"KVTRACE_FILE": "t.kvtrace", "KVTRACE_STATE_12": env_entry})
    assert proc.returncode == 0, proc.stderr
    reader, events = _read(tmp_path / "t.kvtrace")
    assert reader.problems == [] and reader.header.records == BASE
    assert [type(e).__name__ for e in events] == ["Step", "Write", "Read", "End"]
