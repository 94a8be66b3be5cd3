"""kernels/kvtrace.h: it builds as C99, C++17 and from a .cu file, and what it writes is a valid
kvtrace 1.2 file with the values it was given (read back with kvdiag's TraceReader).

The C programs live in kernels/native_tests/. The real-ggml side (KVTRACE_FITS on ggml tensors,
the abort hook inside ggml_abort) is proved by tests/test_native_ggml.py against a real ggml;
here the abort event's text parser is fed ggml_abort's message directly.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from native_cc import CC, CXX, KERNELS, NVCC, STRICT_C, STRICT_CXX, TESTS_C
from native_cc import build as _build
from native_cc import one_trace as _one_trace
from native_cc import run as _run

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader

ROOT = KERNELS.parent
SELFTEST = TESTS_C / "kvtrace_selftest.c"

needs_cc = pytest.mark.skipif(CC is None, reason="gcc not found")
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")


@pytest.fixture(scope="module")
def selftest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CC is None:
        pytest.skip("gcc not found")
    exe = tmp_path_factory.mktemp("kvtrace") / "kvtrace_selftest"
    _build([CC, *STRICT_C, "-O2", "-I", str(KERNELS), str(SELFTEST), "-o", str(exe), "-pthread"])
    return exe


def _assert_no_line_crosses_a_page(data: bytes) -> None:
    """Each event goes to disk as one write of "\\n<event>", padded (blanks at the end of the
    previous line) so that it never crosses a 4 KiB file page: Linux can stop a write() between
    two pages on SIGKILL, and within one page it cannot (kvtrace.h, KVTRACE_PAGE_)."""
    start = data.index(b"\n")  # the header's newline is written with the first event
    checked = 0
    while start < len(data):
        end = data.find(b"\n", start + 1)
        end = len(data) if end < 0 else end
        record = data[start:end].rstrip(b" ")  # "\n{...}" without a later event's pad
        if len(record) <= 4096 and record.strip():
            assert start // 4096 == (start + len(record) - 1) // 4096, f"record at {start}"
            checked += 1
        start = end
    assert checked > 0


def _read(path: Path) -> tuple[TraceReader, list[Any]]:
    reader = TraceReader.open(path)
    events = list(reader)
    return reader, events


# -- builds --------------------------------------------------------------------------------


@needs_cc
def test_builds_as_strict_c99_in_every_mode(tmp_path: Path) -> None:
    # weak one-per-process state (default), per-TU state, and compiled away
    for flags in ([], ["-DKVTRACE_STATIC"], ["-DKVTRACE_DISABLE"]):
        _build([CC, *STRICT_C, *flags, "-I", str(KERNELS), "-c", str(SELFTEST),
                "-o", str(tmp_path / "x.o")])


@needs_cc
def test_builds_warning_free_in_gnu_dialects_at_every_optimisation(tmp_path: Path) -> None:
    """A fork's build is often -std=gnu11 at -O1/-Os/-O3 with -Werror: GCC 12 at -O1 used to
    warn (-Wstringop-overread) on the header's strnlen of the "(null)" literal."""
    warnings = [f for f in STRICT_C if f.startswith("-W")]
    for std, opt in (("gnu99", "-O1"), ("gnu11", "-O1"), ("gnu11", "-Os"), ("gnu17", "-O3"),
                     ("gnu11", "-Og")):
        _build([CC, f"-std={std}", opt, *warnings, "-I", str(KERNELS), "-c", str(SELFTEST),
                "-o", str(tmp_path / "x.o")])


@needs_cxx
def test_builds_as_strict_cxx17(tmp_path: Path) -> None:
    _build([CXX, *STRICT_CXX, "-x", "c++", "-I", str(KERNELS), "-c", str(SELFTEST),
            "-o", str(tmp_path / "x.o")])


@needs_nvcc
@pytest.mark.slow
def test_cuda_demo_compiles_with_nvcc(tmp_path: Path) -> None:
    assert NVCC is not None
    obj = tmp_path / "demo.o"
    _build([NVCC, "-std=c++17", "-O2", "-Xcompiler", "-Wall,-Wextra,-Werror", "-I",
            str(KERNELS), "-c", str(TESTS_C / "kvtrace_cuda_demo.cu"), "-o", str(obj)])
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    # the kernel and the writer's weak functions are both in the object
    assert "add_one" in symbols
    assert " W kvtrace_12_commit" in symbols


MIXED = {
    "a.cpp": '#include "kvtrace.h"\nextern "C" void a_emit();\n'
             'extern "C" void a_emit() { KVTRACE_WARN("a", "from C++"); }\n',
    "b.cu": '#include "kvtrace.h"\n__global__ void k(int *x) { *x = 1; }\nextern "C" void b_emit();\n'
            'extern "C" void b_emit() { KVTRACE_WARN("b", "from CUDA"); }\n',
    "m.c": '#include "kvtrace.h"\nvoid a_emit(void);\nvoid b_emit(void);\n'
           'int main(void) { KVTRACE_WARN("m", "from C"); a_emit(); b_emit(); return 0; }\n',
}


@needs_nvcc
@needs_cc
@needs_cxx
@pytest.mark.slow
def test_c_cxx_and_cuda_translation_units_share_one_writer(tmp_path: Path) -> None:
    """No GPU needed: the kernel is compiled and linked, never launched."""
    assert NVCC is not None and CC is not None and CXX is not None
    for name, text in MIXED.items():
        (tmp_path / name).write_text(text)
    inc = ["-I", str(KERNELS)]
    _build([CXX, "-std=c++17", "-O2", *inc, "-c", str(tmp_path / "a.cpp"), "-o",
            str(tmp_path / "a.o")])
    _build([NVCC, "-std=c++17", "-O2", *inc, "-c", str(tmp_path / "b.cu"), "-o",
            str(tmp_path / "b.o")])
    _build([CC, "-std=c99", "-O2", *inc, "-c", str(tmp_path / "m.c"), "-o",
            str(tmp_path / "m.o")])
    exe = tmp_path / "prog"
    _build([NVCC, *(str(tmp_path / o) for o in ("a.o", "b.o", "m.o")), "-o", str(exe)])
    out = tmp_path / "out"
    out.mkdir()
    assert _run(exe, out).returncode == 0
    reader, events = _read(_one_trace(out))
    assert reader.problems == []
    assert [(e.seq, e.code) for e in events if isinstance(e, ev.Warn)] == [
        (1, "m"), (2, "a"), (3, "b")]
    assert isinstance(events[-1], ev.End) and events[-1].events == 3


@needs_cc
@pytest.mark.slow
def test_one_writer_across_shared_objects(tmp_path: Path) -> None:
    """Two shared objects built with -fvisibility=hidden and the program each include the
    header: one header line and one seq sequence (the weak default-visibility symbols bind to
    one definition)."""
    src = str(TESTS_C / "kvtrace_dso.c")
    for part, lib in (("1", "libkvt_a.so"), ("2", "libkvt_b.so")):
        _build([CC, "-std=c99", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                f"-DKVT_PART={part}", "-I", str(KERNELS), src, "-o", str(tmp_path / lib),
                "-pthread"])
    exe = tmp_path / "prog"
    _build([CC, "-std=c99", "-O2", "-I", str(KERNELS), src, "-o", str(exe), f"-L{tmp_path}",
            "-lkvt_a", "-lkvt_b", "-Wl,-rpath," + str(tmp_path), "-pthread"])
    out = tmp_path / "out"
    out.mkdir()
    assert _run(exe, out, "50").returncode == 0
    path = _one_trace(out)
    lines = path.read_text().splitlines()
    assert sum('"format":"kvtrace"' in line for line in lines) == 1
    reader, events = _read(path)
    assert reader.problems == []
    assert [e.seq for e in events] == list(range(1, 152 + 1))
    codes = [e.code for e in events if isinstance(e, ev.Warn)]
    assert codes[:4] == ["main", "part-a", "part-b", "main"]
    assert codes.count("part-a") == codes.count("part-b") == 50


# -- content -------------------------------------------------------------------------------


def test_every_kind_round_trips_with_its_values(selftest: Path, tmp_path: Path) -> None:
    proc = _run(selftest, tmp_path, "all")
    assert proc.returncode == 0, proc.stderr
    path = _one_trace(tmp_path)
    reader, events = _read(path)
    assert reader.problems == []
    assert reader.complete and not reader.truncated
    h = reader.header
    assert (h.format, h.version, h.kvdiag_version, h.backend) == (
        "kvtrace", "1.2", "kvtrace.h 1.2", "native")
    assert h.device.name == "no GPU"
    assert h.created.endswith("+00:00") and h.created[4] == "-" and h.created[10] == "T"
    assert h.scenario == {
        "name": "selftest all", "source": "native", "pid": int(path.stem.split("_")[1]),
        "build": 'selftest-build "1"',
        "config": {"np": 2, "kv_unified": False, "layout": "shared", "dispatch": "fits"},
    }
    assert h.plan == {
        "page_bytes": 73728, "v_offset": 34816, "pool_pages": 96,
        "resident_pages_per_layer": 8, "ring_slots": 32, "stage_bytes": 73728,
        "streamed_layers": 8, "layers": 8, "kv_size": 4096, "n_stream": 2, "head_dim": 256,
        "n_head": 24, "n_head_kv": 4, "pages_per_stream": 16, "type_k": "q8_0",
        "type_v": "q5_1",
    }
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    t = [e.t_ns for e in events]
    assert t == sorted(t) and t[0] > 0
    kinds = [type(e).__name__.lower() for e in events]
    assert kinds == [
        "step", "learn", "fits", "fits", "mark", "mark", "write", "upload", "upload", "step",
        "read", "invalidate", "invalidate", "repartition", "repartition", "adapt", "adapt",
        "output", "output", "warn", "end",
    ]
    by = dict(enumerate(events))
    assert by[0] == ev.Step(seq=1, t_ns=t[0], step=0, phase="prefill", streams=(0, 1),
                            tokens=512, n_kv=1024)
    assert by[1] == ev.Learn(seq=2, t_ns=t[1], step=0, layer=3, k_ptr=0x7F0000100000)
    fits = by[2]
    assert isinstance(fits, ev.Fits)
    assert (fits.node, fits.layer, fits.result, fits.route, fits.membership, fits.evaluated) == (
        "__fattn__-3", 3, False, "fallback", True, True)
    # the writer's own spelling is in the file; a reader sees the canonical names
    assert fits.failed == ("Q.ne[3]==1", "K.ne[3]==1")
    assert '"failed":["Q->ne[3] == 1","K->ne[3] == 1"]' in path.read_text()
    assert fits.stage_bytes == 73728
    assert fits.k.name == "k-3 (view)" and fits.k.type == "q8_0"
    assert fits.k.ne == (256, 512, 4, 2) and fits.k.nb == (34, 1088, 272, 4456448)
    assert fits.k.data == 0x7F0000100000 and fits.k.base == 0x7F0000100000 - 4096
    assert fits.k.view_offs == 4096 and fits.k.runtime == 0x55550000AAAA
    assert fits.k.buffer == "CUDA_KV_Stream_Host" and fits.k.buffer_name == "CUDA0_buffer"
    assert fits.q.runtime is None and fits.q.buffer == "CUDA0" and not fits.q.contiguous
    assert fits.mask is not None and fits.mask.contiguous and fits.mask.ne[3] == 1
    raw_fits = by[3]
    assert isinstance(raw_fits, ev.Fits)
    assert (raw_fits.layer, raw_fits.evaluated, raw_fits.failed, raw_fits.mask) == (
        -1, False, (), None)
    assert by[4] == ev.Mark(seq=5, t_ns=t[4], step=0, rows=((0, 4), (4096, 4098)),
                            keys=((0, None, 0), (1, None, 16)), outside=((None, 16),))
    assert by[5] == ev.Mark(seq=6, t_ns=t[5], step=0, rows=(), keys=(), all=True)
    assert by[6] == ev.Write(seq=7, t_ns=t[6], step=0, layer=3, stream=1, cells=(0, 4),
                             rows=(4096, 4100), dirty=((3, 1, 2),))
    assert by[7] == ev.Upload(seq=8, t_ns=t[7], step=0, layer=3, stream=1, pages=(0, 4), slot=7,
                              target="resident", bytes=4 * 73728, reason="miss", key_stream=1)
    assert by[8] == ev.Upload(seq=9, t_ns=t[8], step=0, layer=3, stream=0, pages=(8, 10), slot=0,
                              target="ring", bytes=2 * 73728, reason="ring", key_stream=None)
    assert isinstance(by[9], ev.Step) and by[9].step == 1 and by[9].phase == "decode"
    read = by[10]
    assert isinstance(read, ev.Read) and read.step == 1
    assert (read.layer, read.stream, read.pool, read.ring, read.host) == (3, 1, 5, 2, 2)
    assert read.served == (ev.Served(0, 4, "pool", 7), ev.Served(4, 5, "pool", 20),
                           ev.Served(5, 7, "ring", 0), ev.Served(7, 9, "host", -1))
    assert by[11] == ev.Invalidate(seq=12, t_ns=t[11], step=1, reason="buffer-clear",
                                   generation=5)
    assert by[12] == ev.Invalidate(seq=13, t_ns=t[12], step=1, reason="resize", generation=None)
    assert by[13] == ev.Repartition(seq=14, t_ns=t[13], step=1, resident=(8, 7), ring=(32, 40),
                                    miss_pct=2.5, busy_pct=61.25, reason="starved")
    assert by[14] == ev.Repartition(seq=15, t_ns=t[14], step=1, resident=(7, 8), ring=(40, 32))
    assert by[15] == ev.Adapt(seq=16, t_ns=t[15], step=1, active=1025, resident=8, ring=32,
                              samples=100, misses=3, busy_pct=45.5, peak=12)
    assert by[16] == ev.Adapt(seq=17, t_ns=t[16], step=1, active=1025, resident=8, ring=32,
                              layout=2, skipped=5, resident_attended=9)
    assert by[17] == ev.Output(seq=18, t_ns=t[17], step=1, stream=0, checksum="deadbeef",
                               ref_checksum="deadbeef", max_abs_delta=0.0, tolerance=0.001)
    out1 = by[18]
    assert isinstance(out1, ev.Output)
    assert (out1.checksum, out1.ref_checksum, out1.diverged) == ("0000abcd", "", None)
    assert by[19] == ev.Warn(seq=20, t_ns=t[19], step=1, code="kv-stream-fallback", layer=3,
                             message="layer 3: fits() false, ordinary flash attention")
    # the read builder knows the seq of the read event it wrote
    assert proc.stdout == f"read seq {read.seq}\n" and read.seq == 11
    # every kind the program compiled in, in the format's vocabulary: abort too (its abort-at
    # mode has KVTRACE_ABORT; "can write", not "did write"); warn and end always
    assert h.records == ("step", "learn", "fits", "write", "mark", "upload", "invalidate", "read",
                         "abort", "warn", "output", "repartition", "adapt", "end",
                         "mark.outside")
    # END: steps = last step + 1, events = lines before it; nothing is written after it
    assert by[20] == ev.End(seq=21, t_ns=t[20], step=1, status="completed", steps=2, events=20)
    assert "after the end" not in path.read_text()


def test_strings_are_escaped_and_valid_utf8(selftest: Path, tmp_path: Path) -> None:
    assert _run(selftest, tmp_path, "strings").returncode == 0
    path = _one_trace(tmp_path)
    reader, events = _read(path)
    assert reader.problems == []
    assert reader.header.scenario["name"] == (
        'quote " backslash \\ newline \n tab \t bell \a del \x7f end')
    warn, bad, inval, end = events
    assert warn.code == 'code"\\'
    assert warn.message == 'a "quoted" \\path\\ \r\n\x01\x1f café € \U0001F600'
    # invalid UTF-8 (a lone byte, a cut sequence, an encoded surrogate) becomes U+FFFD
    assert bad.message == ("lone \ufffd byte, cut \ufffd\ufffd seq, surrogate "
                           "\ufffd\ufffd\ufffd x")
    assert inval.reason == 'reason with "quotes"'
    assert (end.status, end.reason) == ("error", 'interrupted by "SIGINT"\n')
    # one line per record: the newlines in strings were escaped
    assert len(path.read_bytes().splitlines()) == 5


def test_overlong_arrays_are_cut_and_said_so(selftest: Path, tmp_path: Path) -> None:
    assert _run(selftest, tmp_path, "overflow").returncode == 0
    path = _one_trace(tmp_path)
    reader, events = _read(path)
    assert reader.problems == []
    assert max(len(line) for line in path.read_bytes().splitlines()) <= 16384
    mark, w1, w2, write, w3, *reads, end = events
    assert isinstance(mark, ev.Mark) and isinstance(write, ev.Write)
    assert 0 < len(mark.rows) < 20000 and mark.rows[:2] == ((0, 1), (2, 3))
    assert mark.keys == () or mark.keys[0] == (0, None, 0)
    kept_rows, kept_keys = len(mark.rows), len(mark.keys)
    assert w1.code == w2.code == w3.code == "kvtrace-truncated"
    assert w1.message.startswith(f"mark rows: {20000 - kept_rows} of 20000 elements")
    assert w2.message.startswith(f"mark keys: {20000 - kept_keys} of 20000 elements")
    assert 0 < len(write.dirty) < 20000
    assert w3.message.startswith(f"write dirty: {20000 - len(write.dirty)} of 20000")
    # a read of 300 runs goes out as 128 + 128 + 44 runs, counts split with them
    assert [len(r.served) for r in reads] == [128, 128, 44]
    served = [s for r in reads for s in r.served]
    assert served == [ev.Served(i, i + 1, "host" if i % 2 else "pool", -1 if i % 2 else 1000 + i)
                      for i in range(300)]
    assert [(r.pool, r.host, r.layer, r.stream) for r in reads] == [
        (64, 64, 2, 1), (64, 64, 2, 1), (22, 22, 2, 1)]
    assert end.events == 8


def test_integers_at_every_digit_count(selftest: Path, tmp_path: Path) -> None:
    assert _run(selftest, tmp_path, "numbers").returncode == 0
    reader, events = _read(_one_trace(tmp_path))
    assert reader.problems == []
    learned = [e.k_ptr for e in events if isinstance(e, ev.Learn)]
    expected = [0]
    for i in range(20):
        expected += [10**i - 1, 10**i]
    assert learned == [*expected, 2**64 - 1]
    # a negative byte count is "unknown", written null as the header's other unknown counts
    assert [e.bytes for e in events if isinstance(e, ev.Upload)] == [None, 0]
    assert b'"bytes":null' in _one_trace(tmp_path).read_bytes()
    write = events[-2]
    assert isinstance(write, ev.Write)
    assert (write.layer, write.stream, write.cells, write.rows) == (
        -(2**31), -1, (-(2**63), 2**63 - 1), (-9, -10))


def test_bad_arguments_become_warnings_not_broken_events(selftest: Path, tmp_path: Path) -> None:
    assert _run(selftest, tmp_path, "bad-args").returncode == 0
    reader, events = _read(_one_trace(tmp_path))
    assert reader.problems == []
    # the first event came before BOOT: a minimal header, and BOOT's plan is refused loudly
    assert reader.header.plan == {} and reader.header.scenario["name"] == ""
    assert all(isinstance(e, ev.Warn) for e in events[:7])
    assert [(e.code, e.step) for e in events[:7]] == [
        ("first", 0), ("kvtrace-late-boot", 0), ("kvtrace-bad-arg", 0), ("kvtrace-bad-arg", 0),
        ("kvtrace-bad-arg", 0), ("kvtrace-bad-arg", 0), ("kvtrace-bad-arg", 0)]
    assert "invalid phase" in events[2].message
    assert events[3].message == "KVTRACE_UPLOAD: invalid target 'pool'; event not written"
    assert events[4].message == "KVTRACE_UPLOAD: invalid reason 'because'; event not written"
    assert events[5].message == "KVTRACE_FITS: invalid route 'maybe'; event not written"
    assert "NULL q/k/v/dst" in events[6].message
    # the bad STEP still advanced the step counter
    step, end = events[7:]
    assert isinstance(step, ev.Step) and step.step == 1
    assert (end.status, end.steps, end.events) == ("error", 2, 8)


def test_abort_text_becomes_an_abort_and_an_aborted_end(selftest: Path, tmp_path: Path) -> None:
    """The parser behind the ggml abort hook, fed ggml_abort's text (docs: kv-stream-domain
    §6.1); the hook inside a real ggml_abort is tests/test_native_ggml.py's."""
    assert _run(selftest, tmp_path, "abort-text").returncode == 0
    reader, events = _read(_one_trace(tmp_path))
    assert reader.problems == []
    abort, end = events
    assert isinstance(abort, ev.Abort)
    assert abort.file == "/src/ggml/ggml-cuda.cu" and abort.line == 1898
    assert abort.condition == "ggml_cuda_kv_stream_fattn_fits(dst)"
    assert abort.message == ("/src/ggml/ggml-cuda.cu:1898: "
                             "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed")
    assert (end.status, end.steps, end.events) == ("aborted", 0, 1)


@pytest.fixture(scope="module")
def ggml_hook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvtrace_ggml_hook.c built against the real ggml-base of tests/native_build.py."""
    from tests import native_build as nb

    try:
        ggml = nb.ensure_ggml()
    except nb.NativeUnavailable as exc:
        pytest.skip(f"no real ggml: {exc}")
    if CC is None:
        pytest.skip("gcc not found")
    exe = tmp_path_factory.mktemp("hook") / "kvtrace_ggml_hook"
    # C11 and ggml's own warning set: ggml.h is C11
    _build([CC, "-std=c11", "-D_GNU_SOURCE", *STRICT_C[1:], "-I",
            str(ggml.source / "include"), "-I", str(KERNELS),
            str(TESTS_C / "kvtrace_ggml_hook.c"), "-o", str(exe), str(ggml.library), "-lm",
            "-pthread", "-lstdc++"])
    return exe


def _hook_run(exe: Path, cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                         list[Any]]:
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_FILE"}
    env.update(KVTRACE_FILE="hook.kvtrace", GGML_NO_BACKTRACE="1")
    proc = subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    reader, events = _read(cwd / "hook.kvtrace")
    assert reader.problems == []
    return proc, events


HOOK_ASSERT = 'GGML_ASSERT(ggml_nelements(k) == 1 && "kvtrace hook test") failed'


@pytest.mark.slow
def test_ggml_fits_logs_the_real_tensors(ggml_hook: Path, tmp_path: Path) -> None:
    proc, events = _hook_run(ggml_hook, tmp_path)
    cache, k_data, v_data = (int(x.split("=")[1]) for x in proc.stdout.split())
    fits, raw, _abort, _end = events
    assert isinstance(fits, ev.Fits) and isinstance(raw, ev.Fits)
    assert (fits.node, fits.layer, fits.result, fits.route, fits.failed) == (
        "__fattn__-0", 0, False, "abort", ("Q.ne[3]==1", "K.ne[3]==1"))
    assert fits.membership and fits.evaluated and fits.mask is None
    k, v, q = fits.k, fits.v, fits.q
    # ggml's own numbers: a q8_0 row of 1024 values is 32 blocks of 34 bytes
    assert (k.type, k.ne, k.nb) == ("q8_0", (256, 512, 4, 1), (34, 1088, 272, 1088 * 512))
    assert (k.data, k.base, k.view_offs) == (k_data, cache, 1088 * 512)
    assert (v.data, v.base, v.view_offs) == (v_data, cache, 0)
    assert k.name == "cache_k_l0 (view)" and not k.contiguous and k.runtime == 0x5000
    assert (q.name, q.type, q.ne, q.runtime, q.contiguous) == (
        "Qcur-0", "f32", (256, 1, 24, 1), None, True)
    assert q.base == q.data and q.view_offs == 0
    # every tensor, views included, sits in one real buffer of ggml-base's CPU buffer type
    for t in (q, k, v, fits.dst):
        assert (t.buffer, t.buffer_name) == ("CPU", "CPU")
    assert fits.dst.name == "__fattn__-0" and fits.dst.ne == (256, 24, 1, 1)
    # failed == NULL: the conditions were not evaluated; K's runtime alone makes membership
    assert (raw.evaluated, raw.failed, raw.membership, raw.v.runtime) == (False, (), True, None)


@pytest.mark.slow
def test_ggml_abort_hook_chains_the_prior_callback(ggml_hook: Path, tmp_path: Path) -> None:
    proc, events = _hook_run(ggml_hook, tmp_path, "prior")
    assert proc.returncode == -signal.SIGABRT
    abort, end = events[2:]
    assert isinstance(abort, ev.Abort) and isinstance(end, ev.End)
    assert abort.file == str(TESTS_C / "kvtrace_ggml_hook.c") and abort.line > 0
    assert abort.message == f"{abort.file}:{abort.line}: {HOOK_ASSERT}"
    assert abort.condition == 'ggml_nelements(k) == 1 && "kvtrace hook test"'
    assert (end.status, end.events) == ("aborted", 3)
    # the callback installed before the hook ran once, with ggml's text (installed twice, the
    # hook did not become its own prior)
    assert proc.stderr.splitlines() == [f"prior callback 1: {abort.message}"]


@pytest.mark.slow
def test_ggml_abort_hook_without_prior_keeps_ggmls_own_message(ggml_hook: Path,
                                                               tmp_path: Path) -> None:
    proc, events = _hook_run(ggml_hook, tmp_path)
    assert proc.returncode == -signal.SIGABRT
    abort = events[2]
    assert isinstance(abort, ev.Abort) and isinstance(events[3], ev.End)
    # re-raised through ggml_abort with no callback: ggml prints the line itself, as without
    # kvtrace (GGML_NO_BACKTRACE=1 leaves out the gdb backtrace)
    assert proc.stderr.splitlines() == [abort.message]


# -- concurrency, crashes, switches ------------------------------------------------------------


def test_eight_threads_keep_lines_whole_and_seq_in_file_order(selftest: Path,
                                                              tmp_path: Path) -> None:
    per = 10000
    assert _run(selftest, tmp_path, "threads", "8", str(per)).returncode == 0
    path = _one_trace(tmp_path)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a newline
    for line in lines[1:-1]:
        json.loads(line)  # every line whole
    _assert_no_line_crosses_a_page(path.read_bytes())
    reader, events = _read(path)
    assert reader.problems == []
    assert [e.seq for e in events] == list(range(1, 8 * per + 2))
    uploads = [e for e in events if isinstance(e, ev.Upload)]
    assert len(uploads) == 8 * per
    for thread in range(8):  # each thread's own events stay in its program order
        pages = [u.pages[0] for u in uploads if u.layer == thread]
        assert pages == list(range(per))
    end = events[-1]
    assert isinstance(end, ev.End)  # written by the atexit handler
    assert (end.status, end.events) == ("completed", 8 * per)


def test_end_while_threads_emit_is_the_last_line(selftest: Path, tmp_path: Path) -> None:
    assert _run(selftest, tmp_path, "end-race").returncode == 0
    path = _one_trace(tmp_path)
    reader, events = _read(path)
    assert reader.problems == []  # no event after the end, the count matches
    end = events[-1]
    assert isinstance(end, ev.End) and end.reason == "ended while threads emit"
    assert 0 < end.events == len(events) - 1 < 4 * 200000
    assert path.read_bytes().endswith(b"}\n")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_leaves_only_complete_lines(selftest: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_FILE"}
    env["KVTRACE_FILE"] = str(tmp_path / "killed.kvtrace")
    path = tmp_path / "killed.kvtrace"
    with subprocess.Popen([str(selftest), "forever"], env=env, stdout=subprocess.PIPE,
                          text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            deadline = time.monotonic() + 30
            while path.stat().st_size < 2_000_000 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)  # mid-stream: it writes without pause
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            child.kill()
    data = path.read_bytes()
    for line in data.split(b"\n"):  # the last one too: no partial line
        json.loads(line)
    _assert_no_line_crosses_a_page(data)
    reader, events = _read(path)
    # only the missing End (the process never exited); no cut or corrupt line
    assert [p.kind for p in reader.problems] == ["incomplete"]
    assert not reader.truncated and not reader.complete
    assert len(events) > 5000
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(data.split(b"\n")) == len(events) + 1


def test_unset_or_empty_kvtrace_file_writes_nothing(selftest: Path, tmp_path: Path) -> None:
    for value in (None, ""):
        proc = _run(selftest, tmp_path, "off", trace=value)
        assert proc.returncode == 0
        assert proc.stdout == "enabled=0\n"  # decided off, by the first macro
        assert proc.stderr == ""
        assert list(tmp_path.iterdir()) == []


def test_percent_p_is_the_pid_and_percent_percent_a_percent(selftest: Path,
                                                            tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_FILE"}
    env["KVTRACE_FILE"] = str(tmp_path / "run-%p-100%%.kvtrace")
    child = subprocess.Popen([str(selftest), "all"], env=env)
    assert child.wait(timeout=60) == 0
    path = tmp_path / f"run-{child.pid}-100%.kvtrace"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    with TraceReader.open(path) as reader:
        assert reader.header.scenario["pid"] == child.pid


def test_unwritable_path_turns_tracing_off_with_one_line(selftest: Path, tmp_path: Path) -> None:
    proc = _run(selftest, tmp_path, "all", trace=str(tmp_path / "no" / "such" / "dir.kvtrace"))
    assert proc.returncode == 0
    assert proc.stderr.startswith("kvtrace: cannot open ")
    assert proc.stderr.endswith("; tracing off\n") and proc.stderr.count("\n") == 1


# -- the command -------------------------------------------------------------------------------


def test_native_include_dir_holds_the_header(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["native", "--include-dir"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert (folder / "kvtrace.h").is_file()
    assert '#define KVTRACE_H_VERSION "1.2"' in (folder / "kvtrace.h").read_text()


def test_native_with_the_header_missing_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    from kvdiag.executors import cuda_kernels

    monkeypatch.setattr(cuda_kernels, "kernel_dir", lambda: tmp_path)
    for action in ("--include-dir", "--example"):
        assert main(["native", action]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"kvdiag: error: {tmp_path / 'kvtrace.h'} is missing from this "
                                "kvdiag installation\n")


def test_native_without_an_action_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvdiag", "native"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("one of the arguments --include-dir --example is required")


@needs_cxx
def test_native_example_compiles_and_runs_as_printed(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    """What `kvdiag native --example` prints is built with the build line it prints (the
    command substituted, as a shell would) and run both ways its run lines say. The program
    counts the pages it read right from its own page stamps; check derives the same counts
    from the trace alone."""
    assert CXX is not None
    assert main(["native", "--include-dir"]) == 0
    include = capsys.readouterr().out.strip()
    assert main(["native", "--example"]) == 0
    text = capsys.readouterr().out
    source = tmp_path / "kvtrace_example.cpp"
    source.write_text(text)
    build_line = next(line[2:].strip() for line in text.splitlines()
                      if line.startswith("//   c++ "))
    words = shlex.split(build_line.replace('"$(kvdiag native --include-dir)"', shlex.quote(include)))
    assert words[:2] == ["c++", "-std=c++17"] and words[-1] == "-pthread"
    proc = subprocess.run([CXX, *words[1:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    exe = tmp_path / "kvtrace_example"
    assert exe.is_file()
    # and it adds no warning under the flags a fork's build uses
    _build([CXX, *STRICT_CXX, "-c", str(source), "-I", include, "-o", str(tmp_path / "x.o")])

    results = {}
    for name, args in (("upstream", ()), ("fixed", ("--fixed",))):
        out = tmp_path / name
        out.mkdir()
        proc = _run(exe, out, *args, trace=f"{name}.kvtrace")
        trace = out / f"{name}.kvtrace"
        own = [int(x.strip(",")) for x in proc.stdout.split()[3::2]]
        capsys.readouterr()
        code = main(["check", "--json", str(trace)])
        doc = json.loads(capsys.readouterr().out)
        classes = doc["summary"]["residency"]["read_classes"]
        assert [classes["exact"], classes["stale"], classes["foreign"]] == own
        results[name] = (proc.returncode, code, own, {f["rule"] for f in doc["findings"]})
        if name == "upstream":
            # what it printed (the log postmortem reads) is the assert the trace records
            aborts = [f["title"] for f in doc["findings"] if f["rule"] == "abort"]
            assert len(aborts) == 1 and aborts[0] in proc.stderr
            log = out / "stderr.log"
            log.write_text(proc.stderr)
            main(["postmortem", "--json", str(log)])
            crash = json.loads(capsys.readouterr().out)["crashes"][0]
            assert crash["assert"]["condition"] == "ggml_cuda_kv_stream_fattn_fits(dst)"
            assert aborts[0].startswith(f"{crash['assert']['file']}:{crash['assert']['line']}: ")
    # upstream: the aliasing reads, then the membership dispatch aborts on the two-stream ubatch
    assert results["upstream"] == (-signal.SIGABRT, 1, [42, 6, 12], {
        "fits-dispatch-mismatch", "abort", "stale-page-read", "foreign-page-read",
        "stream-divergence"})
    # fixed: every page exact; the two-stream ubatches fall back (a warning)
    assert results["fixed"] == (0, 0, [84, 0, 0], {"fallback"})
    assert main(["trace", "validate", str(tmp_path / "fixed" / "fixed.kvtrace")]) == 0
