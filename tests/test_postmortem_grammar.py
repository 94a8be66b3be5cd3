"""Single-line recognisers: aborts, GPU errors, slot lines, kv-stream lines, frame forms."""

from __future__ import annotations

import pytest

from kvdiag.model.logrecords import (
    ConfigItem,
    FitsLine,
    GpuError,
    LogLine,
    SlotEvent,
    StreamEvent,
)
from kvdiag.postmortem import crashlines, grammar
from kvdiag.postmortem.backtrace import base_name, is_in_app, parse_frame

W = LogLine("t", 1, "")


def test_abort_forms() -> None:
    (a,) = crashlines.parse_abort(W, "ggml/src/ggml.c:1554: GGML_ASSERT(a->ne[2] == (b)->ne[0]) failed")
    assert (a.form, a.file, a.line, a.condition) == ("ggml", "ggml/src/ggml.c", 1554,
                                                     "a->ne[2] == (b)->ne[0]")
    (b,) = crashlines.parse_abort(W, "GGML_ASSERT: /x/ggml.c:77: n > 0")
    assert (b.form, b.line, b.condition) == ("legacy", 77, "n > 0")
    (c,) = crashlines.parse_abort(W, r"Assertion failed: x != 0, file C:\s\ggml.c, line 12")
    assert (c.form, c.file, c.line, c.condition) == ("msvc", r"C:\s\ggml.c", 12, "x != 0")
    (d,) = crashlines.parse_abort(W, "llama-server: /s/a.cpp:9: void f(): Assertion `p' failed.")
    assert (d.form, d.file, d.line, d.condition) == ("libc", "/s/a.cpp", 9, "p")
    (e,) = crashlines.parse_abort(W, "/s/ggml-cuda/ggml-cuda.cu:102: CUDA error")
    assert (e.form, e.line, e.message, e.condition) == ("message", 102, "CUDA error", None)
    glued = crashlines.parse_abort(W, "tokens!/a/b.cpp:3: GGML_ASSERT(x) failed/a/b.cpp:4: GGML_ASSERT(y) failed")
    assert [(g.file, g.line, g.condition) for g in glued] == [("/a/b.cpp", 3, "x"),
                                                               ("/a/b.cpp", 4, "y")]
    assert crashlines.parse_abort(W, "src/a.c:12: warning: unused") == []


def test_a_forks_own_assert_macro_from_any_source_file() -> None:
    """A runtime built without ggml aborts with its own macro in ggml_abort's shape (what
    KVTRACE_ABORT records): read as an abort with its condition, from any source file; a
    message that only looks like it (lower case, no parentheses, a diagnostic) is not."""
    (a,) = crashlines.parse_abort(W, "src/kv_pool.cc:214: KV_ASSERT(slot < pool->n_slots) failed")
    assert (a.form, a.file, a.line, a.condition) == ("message", "src/kv_pool.cc", 214,
                                                     "slot < pool->n_slots")
    (b,) = crashlines.parse_abort(W, r"C:\rt\stream.cpp:9: RT_CHECK_MSG(n > 0) failed")
    assert (b.file, b.line, b.condition) == (r"C:\rt\stream.cpp", 9, "n > 0")
    assert crashlines.parse_abort(W, "src/kv_pool.cc:214: request failed") == []
    assert crashlines.parse_abort(W, "src/kv_pool.cc:214: check(x) failed") == []
    assert crashlines.parse_abort(W, "src/kv_pool.cc:214: error: KV_ASSERT(x) failed") == []


def test_gpu_errors_and_details() -> None:
    e = crashlines.parse_gpu_error(W, "ROCm error: out of memory")
    assert isinstance(e, GpuError) and (e.backend, e.message) == ("ROCm", "out of memory")
    old = crashlines.parse_gpu_error(W, "CUDA error 2 at /s/ggml-cuda.cu:6210: out of memory")
    assert old is not None and (old.location, old.message) == ("/s/ggml-cuda.cu:6210",
                                                               "out of memory")
    assert crashlines.parse_current_device(
        "  current device: -1, in function ggml_cuda_set_device at /s/common.cuh:90"
    ) == (-1, "ggml_cuda_set_device", "/s/common.cuh:90")
    assert crashlines.parse_failed_op("ggml_cuda_compute_forward: SCALE failed") == "SCALE"


def test_slot_lines() -> None:
    ev = grammar.parse_slot(W, "slot update_slots: id  3 | task 812 | prompt processing progress, "
                               "n_tokens = 2048, batch.n_tokens = 512, progress = 0.250000")
    assert isinstance(ev, SlotEvent)
    assert (ev.kind, ev.slot, ev.task, ev.n_tokens, ev.progress) == ("progress", 3, 812, 2048, 0.25)
    rel = grammar.parse_slot(W, "slot      release: id  0 | task 9 | stop processing: n_tokens = 77, truncated = 0")
    assert rel is not None and (rel.kind, rel.n_tokens) == ("release", 77)
    cache = grammar.parse_slot(W, "slot update_slots: id  1 | task 4 | n_past = 12, slot.prompt.tokens.size() = 40, seq_id = 1, pos_min = 39, n_swa = 0")
    assert cache is not None and (cache.kind, cache.n_past) == ("cache", 12)
    old = grammar.parse_slot(W, "INFO [ launch_slot_with_task] slot is processing task | tid=\"1\" id_slot=2 id_task=7")
    assert old is not None and (old.kind, old.slot, old.task) == ("launch", 2, 7)
    (idle,) = grammar.classify(W, "srv  update_slots: all slots are idle")
    assert isinstance(idle, SlotEvent) and idle.kind == "idle" and idle.slot is None


def test_config_and_stream_lines() -> None:
    items = grammar.classify(W, "llama_kv_cache: size =  512.00 MiB (  4096 cells,  32 layers,  2/1 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB")
    got = {i.key: i.value for i in items if isinstance(i, ConfigItem)}
    assert got == {"kv_cells": 4096, "n_layer": 32, "n_seq_max": 2, "n_stream": 1,
                   "type_k": "f16", "type_v": "f16"}
    (fa,) = grammar.classify(W, "llama_new_context_with_model: flash_attn = 1")
    assert isinstance(fa, ConfigItem) and fa.value == "enabled"
    arena = [i for i in grammar.classify(W, "llama_context: experimental block KV streaming enabled, arena = 3072 MiB, bootstrap KV = 128 MiB")]
    assert {i.key: i.value for i in arena if isinstance(i, ConfigItem)} == {
        "kv_stream": True, "kv_stream_arena_mib": 3072.0}
    (fb,) = grammar.classify(W, "kv_stream_adapt: ignoring invalid CUDA feedback: KV stream feedback counters moved backwards")
    assert isinstance(fb, StreamEvent) and fb.kind == "feedback_error"
    assert fb.message == "KV stream feedback counters moved backwards"
    (al,) = grammar.classify(W, "ggml_backend_cuda_kv_stream_buffer_alloc: allocating 4096.00 MiB pinned KV storage failed: out of memory")
    assert isinstance(al, StreamEvent) and al.kind == "alloc_failure" and al.values["mib"] == 4096
    (fits,) = grammar.classify(W, 'E arm117 fits=false: dst=0x1 ne=[256,24,2,1] type=f32 k=0x2 kbuf="CUDA0" | v="CUDA0" | kr=(nil) vr=(nil)')
    assert isinstance(fits, FitsLine)
    assert fits.ne == (256, 24, 2, 1) and fits.kr == "(nil)"


def test_frame_forms() -> None:
    g = parse_frame("#3  0x00007f in ggml_cuda_error (stmt=0x1 \"x\", func=0x2 \"f\") at /s/common.cuh:120")
    assert g is not None and g.form == "gdb"
    assert (g.frame.function, g.frame.file, g.frame.line) == ("ggml_cuda_error", "/s/common.cuh", 120)
    cpp = parse_frame("#6  0x1 in llama_grammar_accept_token(llama_grammar&, int) [clone .cold] () from /l/libllama.so.0")
    assert cpp is not None and cpp.frame.module == "/l/libllama.so.0"
    assert cpp.frame.function == "llama_grammar_accept_token(llama_grammar&, int) [clone .cold]"
    assert base_name(cpp.frame.function) == "llama_grammar_accept_token"
    wrapped = parse_frame("#5  0x1 in f (a=1,")
    assert wrapped is not None and wrapped.complete is False
    gl = parse_frame("./llama-server(_ZN13llama_context6decodeERK11llama_batch+0x14c3) [0x55d0]")
    assert gl is not None and gl.symref == ("_ZN13llama_context6decodeERK11llama_batch", 0x14C3)
    assert gl.frame.function == "llama_context::decode(llama_batch const&)"
    nospace = parse_frame("/lib/libggml-base.so(+0x12ff6)[0x7fdf]")
    assert nospace is not None and (nospace.frame.offset, nospace.frame.address) == (0x12FF6, 0x7FDF)
    assert parse_frame("the answer is (42) [x]") is None
    assert not is_in_app("raise", None) and not is_in_app("f", "/usr/lib/libstdc++.so.6")
    assert not is_in_app("ggml_print_backtrace_symbols", "libggml-base.so")
    assert is_in_app("ggml_cuda_op_mul_mat", "libggml-cuda.so")


# What gdb 13 printed (`gdb -batch -ex run -ex bt`) for a g++ -O2 program whose always-inline
# kv_stream_fattn, inlined into compute_forward, calls ggml_abort; then a SIGSEGV through two
# inlined levels and a signal handler frame.
GDB_INLINED = """\
main: build = 4242 (abcdef0)
inl2.cpp:9: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed

Program received signal SIGABRT, Aborted.
#0  __pthread_kill_implementation (threadid=<optimized out>, signo=signo@entry=6, no_tid=no_tid@entry=0) at ./nptl/pthread_kill.c:44
#1  0x00007ffff7e5ff4f in __pthread_kill_internal (signo=6, threadid=<optimized out>) at ./nptl/pthread_kill.c:78
#2  0x00007ffff7e10fb2 in __GI_raise (sig=sig@entry=6) at ../sysdeps/posix/raise.c:26
#3  0x00007ffff7dfb472 in __GI_abort () at ./stdlib/abort.c:79
#4  0x00005555555551b6 in ggml_abort (file=file@entry=0x55555555604c "inl2.cpp", line=line@entry=9, cond=cond@entry=0x555555556028 "ggml_cuda_kv_stream_fattn_fits(dst)") at inl2.cpp:6
#5  0x00005555555551e6 in kv_stream_fattn (t=t@entry=0x7fffffffe680) at inl2.cpp:9
#6  compute_forward (t=t@entry=0x7fffffffe6b0) at inl2.cpp:12
#7  0x0000555555555084 in main (argc=<optimized out>, argv=<optimized out>) at inl2.cpp:17
"""

GDB_SEGV = """\
Thread 1 "llama-server" received signal SIGSEGV, Segmentation fault.
#0  load_page (i=0, t=0x7fffffffe6c0) at inl.cpp:5
#1  stream_pages (n=2, t=0x7fffffffe6c0) at inl.cpp:9
#2  kv_stream_fattn (t=t@entry=0x7fffffffe6c0, n=<optimized out>) at inl.cpp:13
#3  0x00007ffff7e2b050 in handler (sig=11) at inl.cpp:30
#4  <signal handler called>
#5  0x0000555555555067 in main (argc=<optimized out>, argv=<optimized out>) at inl.cpp:17
"""


def test_gdb_marks_the_inlined_frame_not_the_one_it_sits_in() -> None:
    """gdb prints no address for the frame an inlined function sits in (its pc is the inlined
    frame's); the frame before it is the inlined one."""
    from tests.postmortem_helpers import scan_bytes

    (crash,) = scan_bytes(GDB_INLINED.encode()).crashes
    assert crash.backtrace is not None
    marked = [(f.function, f.inlined) for f in crash.backtrace.frames]
    assert marked[4:] == [("ggml_abort", False), ("kv_stream_fattn", True),
                          ("compute_forward", False), ("main", False)]
    assert not any(inl for _, inl in marked[:4])
    (crash,) = scan_bytes(GDB_SEGV.encode()).crashes
    assert crash.backtrace is not None
    assert [(f.function, f.inlined) for f in crash.backtrace.frames] == [
        ("load_page", True), ("stream_pages", True), ("kv_stream_fattn", False),
        ("handler", False), ("<signal handler called>", False), ("main", False)]


LLDB_INLINED = """\
inl2.cpp:9: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed
* thread #1, name = 'llama-server', stop reason = signal SIGABRT
  * frame #0: 0x00007ffff7e5ff4f libc.so.6`__pthread_kill_implementation(no_tid=0, signo=6, threadid=<unavailable>) at pthread_kill.c:44:76
    frame #1: 0x00005555555551b6 llama-server`ggml_abort(file="inl2.cpp", line=9) at inl2.cpp:6:10
    frame #2: 0x00005555555551e6 llama-server`compute_forward(tensor const*) [inlined] kv_stream_fattn(t=0x00007fffffffe680) at inl2.cpp:9:34
    frame #3: 0x00005555555551e6 llama-server`compute_forward(t=0x00007fffffffe680) at inl2.cpp:12:20 [opt]
    frame #4: 0x0000555555555084 llama-server`main(argc=<unavailable>, argv=<unavailable>) at inl2.cpp:17:35
"""


def test_lldb_inlined_frame_names_the_callee() -> None:
    """lldb writes an inlined frame as ``caller [inlined] callee(args)``: the frame is the
    callee's, inlined into the next one (it named the whole text, not inlined)."""
    from tests.postmortem_helpers import scan_bytes

    (crash,) = scan_bytes(LLDB_INLINED.encode()).crashes
    assert crash.backtrace is not None and crash.backtrace.form == "lldb"
    assert [(f.function, f.line, f.inlined) for f in crash.backtrace.frames] == [
        ("__pthread_kill_implementation", 44, False), ("ggml_abort", 6, False),
        ("kv_stream_fattn", 9, True), ("compute_forward", 12, False), ("main", 17, False)]


@pytest.mark.parametrize(("text", "file"), [
    # MSVC's __FILE__ under a user name with a space; a POSIX folder with one
    (r"C:\Users\Ana Lopez\src\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu:2412: "
     r"GGML_ASSERT(ggml_nbytes(src0) <= INT_MAX) failed",
     r"C:\Users\Ana Lopez\src\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu"),
    ("/home/kim/My Models/llama.cpp/ggml/src/ggml.c:1598: GGML_ASSERT(ggml_nbytes(src0) <= "
     "INT_MAX) failed", "/home/kim/My Models/llama.cpp/ggml/src/ggml.c"),
    # glued to model output: a Windows path keeps its spaces, a POSIX one starts at its "/"
    (r"The answer is 42.C:\Users\Ana Lopez\ggml\src\ggml.c:77: GGML_ASSERT(ggml_nbytes(src0) "
     r"<= INT_MAX) failed", r"C:\Users\Ana Lopez\ggml\src\ggml.c"),
    ("The answer is 42. /srv/llama.cpp/ggml/src/ggml.c:77: GGML_ASSERT(ggml_nbytes(src0) <= "
     "INT_MAX) failed", "/srv/llama.cpp/ggml/src/ggml.c"),
])
def test_ggml_assert_paths_with_spaces(text: str, file: str) -> None:
    (ab,) = crashlines.parse_abort(LogLine("t.log", 1, text), text)
    assert (ab.form, ab.file, ab.condition) == ("ggml", file, "ggml_nbytes(src0) <= INT_MAX")


def test_ggml_abort_after_a_posix_path_with_spaces() -> None:
    text = "/home/kim/My Models/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:70: CUDA error"
    (ab,) = crashlines.parse_abort(LogLine("t.log", 1, text), text)
    assert (ab.form, ab.file, ab.line, ab.message) == (
        "message", "/home/kim/My Models/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu", 70,
        "CUDA error")
