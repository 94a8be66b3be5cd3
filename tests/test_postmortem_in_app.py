"""Which frames are the app's (issue 11 #2, #7): decided by a module's FILE NAME and known
runtime folders, never by other path components; libc/libstdc++ frames are not the app's even
when gdb prints a source file for them. One crash gets one fingerprint whether its log has gdb
frames, glibc frames or no backtrace."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdiag.postmortem.backtrace import is_in_app
from tests import native_ggml
from tests.postmortem_helpers import findings_of, scan_bytes

VENV_LIB = "/srv/venv/lib/python3.12/site-packages/llama_cpp/lib"


@pytest.mark.parametrize(("function", "module", "in_app"), [
    ("ggml_graph_compute", f"{VENV_LIB}/libggml-base.so", True),
    ("llama_decode", f"{VENV_LIB}/libllama.so", True),
    ("ggml_cuda_op_mul_mat", r"C:\Python311\Lib\site-packages\llama_cpp\lib\ggml-cuda.dll", True),
    ("ggml_graph_compute", "/opt/python3/ggml/libggml-cpu.so", True),
    (None, "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so", False),
    ("_PyEval_EvalFrameDefault", "/usr/bin/python3.12", False),
    ("PyObject_Call", "/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0", False),
    ("PyObject_Call", r"C:\Python311\python311.dll", False),
    ("ffi_call", f"{VENV_LIB}/../../../../libffi.so.8", False),
    (None, "/lib/x86_64-linux-gnu/libc.so.6", False),
])
def test_in_app_is_decided_by_the_module_file_name(function: str | None, module: str,
                                                    in_app: bool) -> None:
    assert is_in_app(function, module) is in_app


def _glibc_log() -> bytes:
    lib = f"{VENV_LIB}/libggml-base.so"
    return "\n".join([
        "/srv/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:7120: GGML_ASSERT(ne00 % 32 == 0) failed",
        f"{lib}(ggml_print_backtrace+0x21)[0x7f51c3e2a1d1]",
        f"{lib}(ggml_abort+0x152)[0x7f51c3e2a382]",
        f"{VENV_LIB}/libggml-cpu.so(+0x3f2a1)[0x7f51c31f22a1]",
        f"{VENV_LIB}/libggml-cpu.so(ggml_compute_forward_rope+0x90)[0x7f51c31f9a10]",
        f"{VENV_LIB}/libggml-cpu.so(ggml_graph_compute_thread+0x2c4)[0x7f51c3201c34]",
        "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so(+0x9b12)"
        "[0x7f51c4419b12]",
        "/usr/bin/python3.12(_PyEval_EvalFrameDefault+0x6a2)[0x55d0a1b2c3d2]",
        "",
    ]).encode()


def _gdb_log() -> bytes:
    return "\n".join([
        "/srv/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:7120: GGML_ASSERT(ne00 % 32 == 0) failed",
        "#0  0x00007f51c46ea42f in __GI___wait4 (pid=90211) at ../sysdeps/unix/wait4.c:30",
        f"#1  0x00007f51c3e2a1d1 in ggml_print_backtrace () from {VENV_LIB}/libggml-base.so",
        f"#2  0x00007f51c3e2a382 in ggml_abort () from {VENV_LIB}/libggml-base.so",
        f"#3  0x00007f51c31f9a10 in ggml_compute_forward_rope () from {VENV_LIB}/libggml-cpu.so",
        "#4  0x00007f51c3201c34 in ggml_graph_compute_thread () from "
        f"{VENV_LIB}/libggml-cpu.so",
        "#5  0x00007f51c4419b12 in ?? () from "
        "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so",
        "",
    ]).encode()


def test_one_crash_three_ways_has_one_fingerprint_and_app_frames() -> None:
    bare = b"/srv/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:7120: GGML_ASSERT(ne00 % 32 == 0) " \
           b"failed\nAborted (core dumped)\n"
    scans = [scan_bytes(log) for log in (_glibc_log(), _gdb_log(), bare)]
    prints = {c.fingerprint for s in scans for c in s.crashes}
    assert len(prints) == 1, prints
    for s in scans[:2]:
        (crash,) = s.crashes
        assert crash.backtrace is not None
        app = [f.function for f in crash.backtrace.frames if f.in_app and f.function]
        assert app[:2] == ["ggml_compute_forward_rope", "ggml_graph_compute_thread"]
        (finding,) = [f for f in findings_of(s) if f.rule == "ggml-assert"]
        assert "(in ggml_compute_forward_rope)" in finding.title


@pytest.mark.skipif(native_ggml.GCC is None or native_ggml.GDB is None,
                    reason="needs gcc and gdb for the real three captures")
def test_real_crash_captured_three_ways_groups_into_one_fingerprint(tmp_path: Path) -> None:
    built = native_ggml.build(tmp_path)
    logs = {
        "glibc": native_ggml.run(built, "abort", backtrace=True),
        "gdb": native_ggml.run_gdb(built, "abort"),
        "none": native_ggml.run(built, "abort") + b"\nAborted (core dumped)\n",
    }
    crashes = {k: scan_bytes(v).crashes for k, v in logs.items()}
    assert {k: len(v) for k, v in crashes.items()} == {"glibc": 1, "gdb": 1, "none": 1}
    assert len({v[0].fingerprint for v in crashes.values()}) == 1
    glibc_bt = crashes["glibc"][0].backtrace
    assert glibc_bt is not None and glibc_bt.form == "glibc"
    lib_frames = [f for f in glibc_bt.frames if f.module == str(built.lib)]
    assert [f.function for f in lib_frames if f.in_app] == [
        "ggml_compute_forward_dup", "ggml_graph_compute_step"]


# -- #7 libc frames with a source file -----------------------------------------------------

SEGV_GDB = b"""\
Thread 7 "llama-server" received signal SIGSEGV, Segmentation fault.
[Switching to Thread 0x7ffd5bfff6c0 (LWP 4120)]
#0  __memmove_evex_unaligned_erms () at ../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:708
#1  0x00007ffff7a3c1e2 in std::char_traits<char>::copy (__n=64, __s2=0x0, __s1=<optimized out>) at /usr/include/c++/12/bits/char_traits.h:431
#2  0x00007ffff7a3c9a0 in ggml_compute_forward_cpy_f16 (params=0x7ffd5bffe0d0, dst=0x5555566a0) at /home/ci/llama.cpp/ggml/src/ggml-cpu/ops.cpp:388
#3  0x00007ffff7a41b20 in ggml_graph_compute_thread (data=0x7fffffffd040) at /home/ci/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c:2901
#4  0x00007ffff7e5a134 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442
#5  0x00007ffff7eda7dc in clone3 () at ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81
"""


def test_segfault_in_libc_memmove_is_blamed_on_the_first_app_frame() -> None:
    (crash,) = scan_bytes(SEGV_GDB).crashes
    assert crash.kind == "segfault"
    assert crash.backtrace is not None
    assert [f.in_app for f in crash.backtrace.frames] == [False, False, True, True, False, False]
    (finding,) = [f for f in findings_of(scan_bytes(SEGV_GDB)) if f.rule == "segfault"]
    assert finding.title == "SIGSEGV without an assert in ggml_compute_forward_cpy_f16 ops.cpp:388"
    assert finding.evidence[-1].text == (
        "first in-app frame: ggml_compute_forward_cpy_f16 ops.cpp:388")


@pytest.mark.skipif(native_ggml.GCC is None or native_ggml.GDB is None,
                    reason="needs gcc and gdb for a real segfault capture")
def test_real_segfault_under_gdb_names_the_op_not_memmove(tmp_path: Path) -> None:
    built = native_ggml.build(tmp_path)
    log = native_ggml.run_gdb(built, "segv")
    assert b"../sysdeps/" in log  # gdb printed a source file for the libc frame
    src_lines = built.src.read_text().splitlines()
    line = 1 + next(i for i, t in enumerate(src_lines) if "memmove(dst, src, n);" in t)
    (finding,) = [f for f in findings_of(scan_bytes(log)) if f.rule == "segfault"]
    assert finding.title == f"SIGSEGV without an assert in ggml_compute_forward_dup ggml.c:{line}"
