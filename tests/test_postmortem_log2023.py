"""``kvdiag postmortem`` on the crash output of late 2023.

Upstream ggml of that time (commit 3d68f36, 2023-11-13, in SJTU-IPADS/PowerInfer's history):
``ggml-cuda.cu``'s ``CUDA_CHECK`` printed ``"\\nCUDA error %d at %s:%d: %s\\n"`` and
``"current device: %d\\n"`` to stderr, then ``exit(1)`` (no abort, no backtrace, no function
name); ``GGML_ASSERT`` printed ``"GGML_ASSERT: %s:%d: %s\\n"``, ran ``ggml_print_backtrace`` (gdb
``bt -frame-info source-and-location``: each frame followed by its source line) and
``exit(1)``, so no signal either. The server's lines are 2023's LOG_TEE slot lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvdiag.postmortem import crashlines, grammar
from tests.postmortem_helpers import run_command, scan_bytes

BEFORE = ["llama_new_context_with_model: n_ctx      = 4096",
          "llama server listening at http://0.0.0.0:8000",
          "slot 1 is processing [task id: 3]",
          "slot 1 : kv cache rm - [0, end)"]


def test_a_2023_cuda_error_gives_its_device_and_place(tmp_path: Path, capsys: Any) -> None:
    log = [*BEFORE, "",
           "CUDA error 2 at /opt/src/llama.cpp/ggml-cuda.cu:9164: out of memory",
           "current device: 1"]
    scan = scan_bytes(("\n".join(log) + "\n").encode())
    (crash,) = scan.crashes
    err = crash.error
    assert err is not None
    assert (err.backend, err.message, err.device, err.function, err.location) == (
        "CUDA", "out of memory", 1, None, "/opt/src/llama.cpp/ggml-cuda.cu:9164")
    assert crash.signal is None and crash.active_slots == (1,)
    path = tmp_path / "server.log"
    path.write_text("\n".join(log) + "\n")
    _code, out = run_command([str(path)], capsys)
    assert "device 1, at /opt/src/llama.cpp/ggml-cuda.cu:9164" in out
    assert "None" not in out


def test_the_device_line_alone_is_only_2023s() -> None:
    assert crashlines.parse_device_alone("current device: 0") == 0
    assert crashlines.parse_device_alone(
        "  current device: 0, in function ggml_cuda_op at ggml-cuda.cu:10") is None
    assert crashlines.parse_device_alone("the current device: 3 is busy") is None


def test_a_2023_assert_with_gdb_source_lines_and_no_signal() -> None:
    log = [*BEFORE,
           "GGML_ASSERT: /opt/src/llama.cpp/ggml.c:4768: ggml_nelements(a) == ne0*ne1",
           "[New LWP 811]",
           "0x00007f00aa0ea42f in __GI___wait4 (pid=812, stat_loc=0x0, options=0, usage=0x0) "
           "at ../sysdeps/unix/sysv/linux/wait4.c:30",
           "30\t../sysdeps/unix/sysv/linux/wait4.c: No such file or directory.",
           "#0  0x00007f00aa0ea42f in __GI___wait4 (pid=812, stat_loc=0x0, options=0, "
           "usage=0x0) at ../sysdeps/unix/sysv/linux/wait4.c:30",
           "30\tin ../sysdeps/unix/sysv/linux/wait4.c",
           "#1  0x000055d0c1b2c4b4 in ggml_print_backtrace () at ggml.c:124",
           "124\t        waitpid(pid, NULL, 0);",
           "#2  0x000055d0c1b5e0a1 in ggml_reshape_2d (ctx=0x55d0c3a1e0c0, a=0x7eff5c020030, "
           "ne0=4096, ne1=7) at ggml.c:4768",
           "4768\t    GGML_ASSERT(ggml_nelements(a) == ne0*ne1);",
           "#3  0x000055d0c1a4c3f0 in llama_server_context::update_slots (this=0x7ffe1e5a10) "
           "at examples/server/server.cpp:1780",
           "1780\t                const int ret = llama_decode(ctx, batch_view);",
           "[Inferior 1 (process 810) detached]"]
    (crash,) = scan_bytes(("\n".join(log) + "\n").encode()).crashes
    assert crash.abort is not None and crash.abort.form == "legacy"
    assert (crash.abort.line, crash.abort.condition) == (4768, "ggml_nelements(a) == ne0*ne1")
    assert crash.backtrace is not None
    assert [(f.function, f.file, f.line) for f in crash.backtrace.frames] == [
        ("__GI___wait4", "../sysdeps/unix/sysv/linux/wait4.c", 30),
        ("ggml_print_backtrace", "ggml.c", 124), ("ggml_reshape_2d", "ggml.c", 4768),
        ("llama_server_context::update_slots", "examples/server/server.cpp", 1780)]
    assert crash.signal is None


def test_the_place_says_what_the_log_gave() -> None:
    from kvdiag.model.logrecords import GpuError, LogLine
    w = LogLine("t.log", 1, "")
    assert GpuError(where=w, backend="CUDA", message="m", device=1,
                    location="a.cu:9").place() == "device 1, at a.cu:9"
    assert GpuError(where=w, backend="CUDA", message="m", device=0, function="f",
                    location="a.cu:9").place() == "device 0, in f at a.cu:9"
    assert GpuError(where=w, backend="SYCL", message="m", function="g",
                    location="b.cpp:2").place() == "in g at b.cpp:2"
    assert GpuError(where=w, backend="CUDA", message="m").place() == ""


def test_a_legacy_assert_whose_path_has_spaces() -> None:
    """MSVC's __FILE__ is the whole path, often under a user name with a space; before, such a
    line was read as a GGML_ABORT message (no condition) or with the path cut at the space."""
    from kvdiag.model.logrecords import LogLine
    for text, file in [
        (r"GGML_ASSERT: C:\Users\Ana Lopez\src\llama.cpp\ggml-cuda.cu:7013: src0->type == "
         r"GGML_TYPE_F16", r"C:\Users\Ana Lopez\src\llama.cpp\ggml-cuda.cu"),
        ("GGML_ASSERT: /home/kim/My Projects/llama.cpp/ggml.c:4768: src0->type == "
         "GGML_TYPE_F16", "/home/kim/My Projects/llama.cpp/ggml.c"),
    ]:
        (ab,) = grammar.classify(LogLine("t.log", 1, text), text)
        assert (type(ab).__name__, getattr(ab, "form", None), getattr(ab, "file", None),
                getattr(ab, "condition", None)) == ("Abort", "legacy", file,
                                                    "src0->type == GGML_TYPE_F16")


def test_a_2023_restart_before_any_request_is_a_boot_of_its_own() -> None:
    """2023's ``llama server listening at`` (LOG_TEE, after the model loaded) ends a boot."""
    import io

    from kvdiag.postmortem.perfread import scan_stream
    lines = ["llama_new_context_with_model: n_ctx      = 4096", "",
             "llama server listening at http://127.0.0.1:8080", "",
             "llama_new_context_with_model: n_ctx      = 2048", "",
             "llama server listening at http://127.0.0.1:8080", "",
             "GGML_ASSERT: /opt/src/llama.cpp/ggml.c:4768: false"]
    data = ("\n".join(lines) + "\n").encode()
    assert [b.n_ctx for b in scan_bytes(data).boots] == [4096, 2048]
    assert [b.n_ctx for b in scan_stream("s.log", io.BytesIO(data)).boots] == [4096, 2048]
