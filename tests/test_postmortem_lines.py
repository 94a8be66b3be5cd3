"""Prefix stripping and decoding of single lines (lines.clean) and opening of logs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvdiag.errors import InputError
from kvdiag.postmortem.lines import MAX_LINE_CHARS, clean, open_log


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


def test_clean_caps_very_long_lines() -> None:
    text, _ = clean(b"x" * (MAX_LINE_CHARS * 10))
    assert len(text) == MAX_LINE_CHARS


def test_open_log_plain_gzip_and_errors(tmp_path: Path) -> None:
    plain = tmp_path / "a.log"
    plain.write_bytes(b"hello\n")
    packed = tmp_path / "b.log.gz"
    packed.write_bytes(gzip.compress(b"world\n"))
    for path, want in ((plain, b"hello\n"), (packed, b"world\n")):
        name, stream, closers = open_log(str(path))
        assert name == str(path) and stream.read() == want
        for c in closers:
            c.close()
    with pytest.raises(InputError, match="cannot open"):
        open_log(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="is a directory"):
        open_log(str(tmp_path))
