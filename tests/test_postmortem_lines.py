"""Prefix stripping and decoding of single lines (lines.clean) and opening of logs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvdiag.errors import InputError
from kvdiag.files.logs import open_log
from kvdiag.postmortem.lines import CUT, MAX_LINE_CHARS, clean, clean_cut


@pytest.mark.parametrize(
    ("raw", "text", "level"),
    [
        (b"12.03.441.002 W kv_stream_adapt: x\r\n", "kv_stream_adapt: x", "W"),
        (b"Jan 10 16:31:55 node1 ollama[119046]: 0.01.000.000 E CUDA error: y", "CUDA error: y",
         "E"),
        ("7月 08 11:11:34 dar ollama[5991]: #0  0x1 in f ()".encode(), "#0  0x1 in f ()", None),
        (b"2024-01-06T20:15:25.882123456Z slot a", "slot a", None),
        (b"2024-01-06T20:15:25.882123456Z stderr F 0.01.000.000 E CUDA error: x",
         "CUDA error: x", "E"),
        (b"2025-03-01T10:00:00.000000+00:00 node7 llama-server[3011]: llama_context: n_ctx = 1",
         "llama_context: n_ctx = 1", None),
        # docker logs -t before a line without llama.cpp's own prefix (ggml's stderr, servers
        # started without --log-prefix): two words and a colon are the message, not a host
        # and program
        (b"2024-11-20T09:00:00.007000123Z CUDA error: an illegal memory access was encountered",
         "CUDA error: an illegal memory access was encountered", None),
        (b"2024-11-20T09:00:01.5Z slot launch_slot_: id  1 | task 0 | processing task",
         "slot launch_slot_: id  1 | task 0 | processing task", None),
        (b"genai-stack-llm-gpu-1  | GGML_ASSERT: a.c:1: x", "GGML_ASSERT: a.c:1: x", None),
        (b"[ 8081] 0.07.101.311 E CUDA error: z", "CUDA error: z", "E"),
        (b"[40195] #1  0x1 in g ()", "#1  0x1 in g ()", None),
        (b"\x1b[1;31m0.00.001.000 I \x1b[0mllama_context: n_ctx = 8\x1b[0m", "llama_context: n_ctx = 8",
         "I"),
        (b"abc \xff\xfe def", "abc \ufffd\ufffd def", None),
    ],
)
def test_clean_strips_prefixes(raw: bytes, text: str, level: str | None) -> None:
    assert clean(raw) == (text, level)


def test_clean_caps_very_long_lines_keeping_both_ends() -> None:
    """A long line keeps its first and last characters: ggml_abort's text ends a line that
    stdout's unfinished output began (domain brief §6.1)."""
    for size in (MAX_LINE_CHARS + 1, MAX_LINE_CHARS * 3, MAX_LINE_CHARS * 10):
        raw = b"0.00.001.100 I " + b"a" * (size // 2) + b"z" * (size - size // 2)
        text, level, cut = clean_cut(raw)
        assert level == "I" and cut and len(text) == MAX_LINE_CHARS + len(CUT)
        assert text == "a" * (MAX_LINE_CHARS // 2) + CUT + "z" * (MAX_LINE_CHARS // 2)
    short, _, cut = clean_cut(b"a" * MAX_LINE_CHARS)
    assert short == "a" * MAX_LINE_CHARS and not cut
    # four bytes a character: the bytes in between are dropped, and the cut is still marked
    wide, _, cut = clean_cut("\U0001f600".encode() * 5000 + b"\x1b[1mEND\x1b[0m")
    assert cut and wide.endswith("\U0001f600END") and CUT in wide


def test_open_log_plain_gzip_and_errors(tmp_path: Path) -> None:
    plain = tmp_path / "a.log"
    plain.write_bytes(b"hello\n")
    packed = tmp_path / "b.log.gz"
    packed.write_bytes(gzip.compress(b"world\n"))
    for path, want in ((plain, b"hello\n"), (packed, b"world\n")):
        with open_log(str(path)) as log:
            assert log.name == str(path) and log.stream.read() == want
    with pytest.raises(InputError, match="no such file"):
        open_log(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="is a directory"):
        open_log(str(tmp_path))


def test_short_journald_prefix_is_stripped_from_abort_frames_and_statement() -> None:
    """``name[pid]: `` without a date (a journal copied without its first columns): the abort,
    its gdb frames and the CUDA statement are read as if the prefix were not there."""
    from tests.postmortem_helpers import scan_bytes

    assert clean(b"llama-server[88]: #4  0x1 in g ()") == ("#4  0x1 in g ()", None)
    assert clean(b"tensor[12]:x") == ("tensor[12]:x", None)  # no space: not a prefix
    log = b"".join(p + b"\n" for p in (
        b"kv-svc[40211]: srv  update_slots: all slots are idle",
        b"kv-svc[40211]: CUDA error: an illegal memory access was encountered",
        b"kv-svc[40211]:   current device: 1, in function ggml_backend_cuda_synchronize at "
        b"/b/ggml/src/ggml-cuda/ggml-cuda.cu:2741",
        b"kv-svc[40211]:   cudaStreamSynchronize(cuda_ctx->stream())",
        b"kv-svc[40211]: /b/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error",
        b"kv-svc[40211]: #0  0x00007f3a1c0ea42f in __GI___wait4 (pid=77) at wait4.c:30",
        b"kv-svc[40211]: #1  0x00007f3a1c6d1a3b in ggml_abort () from /opt/kv/libggml-base.so",
        b"kv-svc[40211]: #2  0x00007f3a1b2c0f11 in ggml_backend_cuda_synchronize () from "
        b"/opt/kv/libggml-cuda.so",
    ))
    (crash,) = scan_bytes(log).crashes
    assert crash.kind == "cuda_error"
    assert crash.error is not None
    assert crash.error.statement == "cudaStreamSynchronize(cuda_ctx->stream())"
    assert crash.error.function == "ggml_backend_cuda_synchronize"
    assert crash.backtrace is not None
    assert [f.function for f in crash.backtrace.frames] == [
        "__GI___wait4", "ggml_abort", "ggml_backend_cuda_synchronize"]
