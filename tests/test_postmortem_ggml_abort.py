"""GGML_ABORT without a backtrace (issue 11 #1): upstream ggml_abort prints
``<file>:<line>: <message>`` (no ``GGML_ASSERT(``) and the process ends. Such a log is a crash of
kind ``ggml_abort``, whatever follows it, for any source extension and POSIX or Windows paths,
glued to model output or not; compiler, linker and Python output naming the same files is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvdiag.model.logrecords import LogLine
from kvdiag.postmortem import crashlines
from tests import native_ggml
from tests.postmortem_helpers import run_json, scan_bytes

W = LogLine("t.log", 1, "")


@pytest.mark.parametrize(("text", "file", "line", "message"), [
    ("/srv/build/llama.cpp/ggml/src/ggml-cpu/ops.cpp:5821: fatal error",
     "/srv/build/llama.cpp/ggml/src/ggml-cpu/ops.cpp", 5821, "fatal error"),
    (r"C:\Users\Ana Lopez\src\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu:2412: unsupported op",
     r"C:\Users\Ana Lopez\src\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu", 2412, "unsupported op"),
    ("/Users/kim/llama.cpp/ggml/src/ggml-metal/ggml-metal.m:1911: MUL_MAT_ID not implemented",
     "/Users/kim/llama.cpp/ggml/src/ggml-metal/ggml-metal.m", 1911, "MUL_MAT_ID not implemented"),
    ("ggml/src/ggml.c:2274: invalid tensor type 41", "ggml/src/ggml.c", 2274,
     "invalid tensor type 41"),
    # glued to model output that had no newline (ggml_abort flushes stdout, writes stderr)
    ("Sure! The capital of Peru is/opt/ll/vendor/ggml/src/ggml-cuda/mmq.cuh:3710: fatal error",
     "/opt/ll/vendor/ggml/src/ggml-cuda/mmq.cuh", 3710, "fatal error"),
    ("ends here.D:/a/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp:5120: Unsupported type",
     "D:/a/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp", 5120, "Unsupported type"),
    # a bare file name: only with a message GGML_ABORT is called with
    ("fattn-tile.cu:88: fatal error", "fattn-tile.cu", 88, "fatal error"),
    ("/w/src/llama-model.cpp:14021: unknown architecture 'qwen9'",
     "/w/src/llama-model.cpp", 14021, "unknown architecture 'qwen9'"),
])
def test_ggml_abort_lines(text: str, file: str, line: int, message: str) -> None:
    (ab,) = crashlines.parse_abort(W, text)
    assert (ab.form, ab.file, ab.line, ab.message, ab.condition) == (
        "message", file, line, message, None)


@pytest.mark.parametrize("text", [
    "/srv/llama.cpp/ggml/src/ggml.c:4531:17: error: 'src1' undeclared (first use here)",
    "/srv/llama.cpp/ggml/src/ggml.c:4531: warning: implicit declaration of 'f'",
    "/srv/llama.cpp/ggml/src/ggml.c:4531:5: fatal error: ggml-impl.h: No such file or directory",
    "/srv/llama.cpp/ggml/src/ggml.c:4531: fatal error: ggml-impl.h: No such file or directory",
    "/srv/llama.cpp/ggml/src/ggml.c:812: undefined reference to `ggml_vec_dot_q9'",
    "/srv/llama.cpp/ggml/src/ggml.c:812: multiple definition of `ggml_init'; first here",
    "/srv/llama.cpp/ggml/src/ggml.c: In function 'ggml_init':",
    "In file included from /srv/llama.cpp/ggml/src/ggml.c:12:",
    "                 from /srv/llama.cpp/ggml/src/ggml-cuda/common.cuh:7,",
    '  File "/srv/venv/lib/python3.11/site-packages/llama_cpp/llama.py", line 1123, in eval',
    "/srv/venv/lib/python3.11/site-packages/llama_cpp/llama.py:1123: UserWarning: low memory",
    "src/app/main.c:12: something happened",
    "note the path /srv/app/server.c:40: handled request",
    # a location cited in another message is not glued to it
    "CUDA error 2 at /s/ggml/src/ggml-cuda.cu:6210: out of memory",
    "cudaMalloc failed in /s/ggml/src/ggml-cuda.cu:512: out of memory",
])
def test_compiler_linker_and_python_lines_are_not_aborts(text: str) -> None:
    assert crashlines.parse_abort(W, text) == []


COMPILER_LOG = b"""\
[ 12%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
/srv/llama.cpp/ggml/src/ggml.c: In function 'ggml_compute_forward_dup':
/srv/llama.cpp/ggml/src/ggml.c:4531:17: error: 'src1' undeclared (first use in this function)
 4531 |     memmove(dst, src1, n);
      |                  ^~~~
/srv/llama.cpp/ggml/src/ggml.c:4531: warning: old-style diagnostic without a column
/usr/bin/ld: CMakeFiles/ggml-base.dir/ggml.c.o: in function `ggml_graph_compute':
/srv/llama.cpp/ggml/src/ggml.c:812: undefined reference to `ggml_vec_dot_q9'
collect2: error: ld returned 1 exit status
gmake[2]: *** [ggml/src/CMakeFiles/ggml-base.dir/build.make:76: ggml/src/ggml-base.so] Error 1
"""

TRACEBACK_LOG = b"""\
Traceback (most recent call last):
  File "/srv/venv/lib/python3.11/site-packages/llama_cpp/llama.py", line 1123, in eval
    self._ctx.decode(self._batch)
  File "/srv/venv/lib/python3.11/site-packages/llama_cpp/_internals.py", line 312, in decode
    raise RuntimeError(f"llama_decode returned {return_code}")
RuntimeError: llama_decode returned -3
/srv/venv/lib/python3.11/site-packages/llama_cpp/llama.py:88: UserWarning: ggml context freed
"""


def test_build_logs_and_python_tracebacks_have_no_crash() -> None:
    for log in (COMPILER_LOG, TRACEBACK_LOG, COMPILER_LOG + TRACEBACK_LOG):
        assert scan_bytes(log).crashes == ()


ABORT = b"/home/dev/llama.cpp/ggml/src/ggml-cuda/cpy.cu:412: unsupported type combination"


@pytest.mark.parametrize("after", [
    b"",  # nothing: the process died before anything else was written
    b"zsh: abort (core dumped)  ./build/bin/llama-server -m q.gguf -c 8192",
    b"Aborted (core dumped)",
    b"\nProcess finished with exit code 134 (interrupted by signal 6:SIGABRT)",
    b"error: Could not convert process PID 20311 into a process",
])
def test_abort_without_backtrace_is_a_crash_whatever_follows(after: bytes, tmp_path: Path,
                                                             capsys: Any) -> None:
    log = b"srv  update_slots: all slots are idle\nslot launch_slot_: id  0 | task 4 | " \
          b"processing task\n" + ABORT + b"\n" + (after + b"\n" if after else b"")
    (crash,) = scan_bytes(log).crashes
    assert crash.kind == "ggml_abort"
    assert crash.abort is not None
    assert (crash.abort.file, crash.abort.line, crash.abort.message) == (
        "/home/dev/llama.cpp/ggml/src/ggml-cuda/cpy.cu", 412, "unsupported type combination")
    p = tmp_path / "server.log"
    p.write_bytes(log)
    code, data = run_json([str(p)], capsys)
    assert code == 1
    (c,) = data["crashes"]
    assert c["kind"] == "ggml_abort"
    assert c["assert"] == {"file": "/home/dev/llama.cpp/ggml/src/ggml-cuda/cpy.cu", "line": 412,
                           "condition": "unsupported type combination"}
    (f,) = [f for f in data["findings"] if f["rule"] == "ggml-assert"]
    assert "GGML_ABORT: unsupported type combination at cpy.cu:412" in f["title"]


@pytest.mark.skipif(native_ggml.GCC is None, reason="needs gcc to build the test library")
def test_real_abort_glued_to_model_output(tmp_path: Path) -> None:
    built = native_ggml.build(tmp_path)
    out = native_ggml.run(built, "abort")
    src_lines = built.src.read_text().splitlines()
    abort_line = 1 + next(i for i, t in enumerate(src_lines) if 'GGML_ABORT("fatal error")' in t)
    assert out.startswith(b"The capital of France is" + str(built.src).encode() + b":")
    (crash,) = scan_bytes(out).crashes
    assert crash.kind == "ggml_abort"
    assert crash.abort is not None
    assert (crash.abort.file, crash.abort.line, crash.abort.message) == (
        str(built.src), abort_line, "fatal error")


def test_windows_cuda_abort_with_spaces_in_the_path_keeps_function_and_statement() -> None:
    """Found running a Windows CRLF log by hand: the detail line's path has a space."""
    src = r"C:\Users\Ana Ruiz\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu"
    log = "\r\n".join([
        "CUDA error: an illegal memory access was encountered",
        f"  current device: 0, in function ggml_backend_cuda_synchronize at {src}:2623",
        "  cudaStreamSynchronize(cuda_ctx->stream())",
        f"{src}:75: CUDA error",
        "",
    ]).encode()
    (crash,) = scan_bytes(log).crashes
    assert crash.kind == "cuda_error"
    assert crash.error is not None and crash.abort is not None
    assert (crash.error.function, crash.error.location, crash.error.statement) == (
        "ggml_backend_cuda_synchronize", f"{src}:2623",
        "cudaStreamSynchronize(cuda_ctx->stream())")
    assert (crash.abort.file, crash.abort.line) == (src, 75)
