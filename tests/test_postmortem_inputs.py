"""Hostile log and binary inputs for ``kvdiag postmortem`` (issue 11 #8, #22, #24): files that
are not text, files that are not regular files, and gzip data that breaks. Each ends with one
line on stderr and exit 2, never a hang or a silent exit."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from kvdiag.errors import InputError
from kvdiag.files.logs import open_log

CRASH_LOG = b"".join(line + b"\n" for line in (
    b"0.00.010.000 I llama_context: n_ctx         = 8192",
    b"0.01.220.115 I slot launch_slot_: id  1 | task 7 | processing task",
    b"/w/kv/ggml/src/ggml-cuda/fattn.cu:311: GGML_ASSERT(K->ne[1] % 256 == 0) failed",
    b"[New LWP 5121]",
    b"#0  0x00007f00aa0ea42f in __GI___wait4 (pid=5122) at ../sysdeps/unix/wait4.c:30",
    b"#1  0x00007f00ab6d1a3b in ggml_abort () from /w/kv/lib/libggml-base.so",
    b"#2  0x00007f00ab2c0f11 in ggml_cuda_flash_attn_ext () from /w/kv/lib/libggml-cuda.so",
))


def _cli(args: list[str], stdin: bytes | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "kvdiag", "postmortem", *args], input=stdin,
                          capture_output=True, check=False, timeout=timeout, env=env)


def _one_line_error(proc: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == 2, (proc.returncode, err, proc.stdout[:300])
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


# -- #22 non-regular files ------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_without_writer_as_log_or_binary_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    log = tmp_path / "real.log"
    log.write_bytes(CRASH_LOG)
    # a hang would end in subprocess.TimeoutExpired, failing the test
    _one_line_error(_cli([str(fifo), "--json"], timeout=30), "FIFO", str(fifo))
    _one_line_error(_cli([str(log), "--binary", str(fifo)], timeout=30), "FIFO", "binary")


def test_character_device_is_not_a_log() -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    with pytest.raises(InputError, match="a character device, not a regular log file"):
        open_log("/dev/zero")


# -- #8 binary data -------------------------------------------------------------------------


def test_random_bytes_plain_gzip_or_stdin_are_not_a_log(tmp_path: Path) -> None:
    rng = random.Random(8)
    noise = bytes(rng.randrange(256) for _ in range(20_000))
    plain = tmp_path / "core.bin"
    plain.write_bytes(noise)
    packed = tmp_path / "core.bin.gz"
    packed.write_bytes(gzip.compress(noise))
    for path in (plain, packed):
        _one_line_error(_cli([str(path)]), "not a text log", "are not text")
    _one_line_error(_cli(["-", "--json"], stdin=noise), "<stdin>", "not a text log")


def test_high_bytes_without_nul_are_not_a_log_but_a_few_stray_bytes_are(tmp_path: Path) -> None:
    rng = random.Random(80)
    high = bytes(rng.randrange(0x80, 0x100) for _ in range(5000))
    with pytest.raises(InputError, match=r"of the 5,000 bytes that are not NUL at its start are "
                                         r"not text"):
        _open_and_close(tmp_path / "high.bin", high)
    # a Latin-1 model path in an otherwise ASCII log is a log
    latin = CRASH_LOG.replace(b"/w/kv/", b"/home/J\xfcrgen/kv/")
    data = _open_and_close(tmp_path / "latin1.log", latin)
    assert data == latin


def test_utf16_log_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="UTF-16 byte-order mark"):
        _open_and_close(tmp_path / "ps.log", "\ufeffslot x\r\n".encode("utf-16-le"))


def test_stdin_text_is_read_whole_after_the_probe() -> None:
    """The probe reads stdin's first 64 KiB; they must be handed to the parser again."""
    filler = b"".join(b"srv  log_server_r: request: GET /health 200 %d\n" % i
                      for i in range(3000))
    assert len(filler) > 64 << 10
    proc = _cli(["-", "--json"], stdin=filler + CRASH_LOG)
    assert proc.returncode == 1, proc.stderr
    assert b'"condition": "K->ne[1] % 256 == 0"' in proc.stdout


def _open_and_close(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    with open_log(str(path)) as log:
        return log.stream.read()


# -- #24 broken gzip ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_truncated_and_corrupt_gzip_say_why_on_stderr_in_every_mode(
        tmp_path: Path, mode: list[str]) -> None:
    whole = gzip.compress(CRASH_LOG * 400, mtime=0)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    err = _one_line_error(_cli([str(cut), *mode]), str(cut), "input breaks after line",
                          "the .gz file is truncated")
    assert "end-of-stream marker" not in err
    # flip the stored CRC: every byte decodes, the check at the end fails
    bad = bytearray(whole)
    bad[-8] ^= 0xFF
    crc = tmp_path / "crc.log.gz"
    crc.write_bytes(bytes(bad))
    _one_line_error(_cli([str(crc), *mode]), "corrupt (CRC check failed)")
    # damage inside the deflate stream: the first damage (seeded) that zlib itself rejects
    rng = random.Random(24)
    while True:
        mid = bytearray(whole)
        at = rng.randrange(20, len(mid) - 20)
        mid[at:at + 4] = bytes(rng.randrange(256) for _ in range(4))
        try:
            zlib.decompressobj(31).decompress(bytes(mid))
        except zlib.error:
            break
    body = tmp_path / "body.log.gz"
    body.write_bytes(bytes(mid))
    _one_line_error(_cli([str(body), *mode]), str(body), "the gzip data is corrupt")
