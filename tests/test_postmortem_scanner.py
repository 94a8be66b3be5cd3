"""The block scanner: results do not depend on where block boundaries fall, long lines are cut,
and a stack printed before a late crash line is found by looking back."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from postmortem_helpers import FIXTURES, scan_bytes

from kvdiag.postmortem import parse
from kvdiag.postmortem.parse import LogParser


def _scan(data: bytes) -> dict[str, object]:
    parser = LogParser()
    parser.feed("x.log", io.BytesIO(data))
    out: dict[str, object] = msgspec.to_builtins(parser.result())
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_block_boundaries_do_not_change_results(name: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    data = (FIXTURES / name).read_bytes()
    want = _scan(data)
    for block in (1, 7, 64, 333):
        monkeypatch.setattr(parse, "BLOCK", block)
        assert _scan(data) == want, (name, block)


def test_very_long_line_is_cut_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "BLOCK", 1000)
    monkeypatch.setattr(parse, "MAX_RAW_LINE", 5000)
    data = (b"slot x: " + b"y" * 50_000 + b"\n" + (FIXTURES / "msvc_windows.log").read_bytes())
    scan = scan_bytes(data)
    (crash,) = scan.crashes
    assert crash.abort is not None and crash.abort.where.line == 8
    (problem,) = scan.problems
    assert problem.line == 1 and problem.message.startswith("very long line")


@pytest.mark.parametrize("output", [5_000, 60_000, 3_000_000])
def test_an_assert_glued_to_a_long_line_of_output_is_read(
        monkeypatch: pytest.MonkeyPatch, output: int) -> None:
    """ggml_abort flushes stdout and writes its ``<file>:<line>: …`` after it: when the output
    had no line end the assert ends a long line. It was lost past 4096 characters (the crash
    became a bare abort, and the kv-stream finding with it); past MAX_RAW_LINE too."""
    monkeypatch.setattr(parse, "BLOCK", 1 << 16)
    assert_text = ("/src/llama.cpp/ggml/src/ggml-cuda/fattn.cu:388: "
                   "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed")
    data = (b"llama_context: constructing llama_context\n"
            + b"the answer is " * (output // 14) + assert_text.encode() + b"\n"
            + b"Aborted (core dumped)\n")
    (crash,) = scan_bytes(data).crashes
    assert crash.kind == "assert" and crash.abort is not None
    assert (crash.abort.line, crash.abort.condition) == (
        388, "ggml_cuda_kv_stream_fattn_fits(dst)")
    assert crash.where.line == 2


def test_stack_before_a_late_signal_line_is_found_by_looking_back() -> None:
    filler = b"".join(
        b"0.10.000.000 I slot update_slots: id  0 | task %d | prompt done, n_tokens = 9, "
        b"batch.n_tokens = 9\n" % i for i in range(8000))
    core = (FIXTURES / "coredump_segv.log").read_bytes().split(b"\n", 2)[2]
    scan = scan_bytes(filler + core)
    (crash,) = scan.crashes
    assert crash.kind == "segfault"
    bt = crash.backtrace
    assert bt is not None and bt.form == "coredump" and len(bt.frames) == 6
    assert bt.where.line == 8000 + 4
    assert crash.active_slots == (0,)


def test_lines_of_other_threads_inside_a_backtrace_do_not_split_it() -> None:
    data = (FIXTURES / "kvstream_np2_gdb.log").read_bytes()
    lines = data.split(b"\n")
    noisy: list[bytes] = []
    for line in lines:
        noisy.append(line)
        if line.startswith(b"#"):
            noisy.append(b"0.09.999.000 I slot update_slots: id  1 | task 0 | n_tokens = 5, "
                         b"memory_seq_rm [5, end)")
    (crash,) = scan_bytes(b"\n".join(noisy)).crashes
    (plain,) = scan_bytes(data).crashes
    assert crash.backtrace is not None and plain.backtrace is not None
    assert [f.function for f in crash.backtrace.frames] == [
        f.function for f in plain.backtrace.frames]
    assert crash.fingerprint == plain.fingerprint


def test_two_different_aborts_in_one_death_keep_their_own_stacks() -> None:
    data = b"\n".join([
        b"/s/ggml/src/ggml.c:100: GGML_ASSERT(a > 0) failed",
        b"/s/lib/libggml-base.so(ggml_print_backtrace+0x10)[0x7f0000001010]",
        b"/s/lib/libggml-base.so(ggml_abort+0x20)[0x7f0000002020]",
        b"/s/lib/libllama.so(_ZN13llama_context6decodeERK11llama_batch+0x30)[0x7f0000003030]",
        b"/s/ggml/src/ggml-cuda/ggml-cuda.cu:200: GGML_ASSERT(b != 0) failed",
        b"/s/lib/libggml-base.so(ggml_print_backtrace+0x10)[0x7f0000001010]",
        b"/s/lib/libggml-base.so(ggml_abort+0x20)[0x7f0000002020]",
        b"/s/lib/libggml-cuda.so(ggml_backend_cuda_graph_compute+0x40)[0x7f0000004040]",
        b""])
    first, second = scan_bytes(data).crashes
    assert first.abort is not None and second.abort is not None
    assert (first.abort.line, second.abort.line) == (100, 200)
    assert first.backtrace is not None and second.backtrace is not None
    assert first.backtrace.frames[-1].function == "llama_context::decode(llama_batch const&)"
    assert second.backtrace.frames[-1].function == "ggml_backend_cuda_graph_compute"
    assert first.fingerprint != second.fingerprint


def _capitals_boot(layer_lines: int) -> bytes:
    """A boot of the port (np 2, streaming on CUDA1) at debug verbosity: after the context's
    first lines, ``layer_lines`` per-layer device lines (no configuration in them), then the
    port's multi-sequence opt-in and device-filter lines, one naming only the environment
    variable in capitals, the other in "KV stream" words, neither with a ``llama_`` or
    ``kv_stream`` prefix."""
    lines = ["llama_model_loader: loaded meta data with 41 key-value pairs and 733 tensors from "
             "/models/Qwen3.5-27B-Q4_K_M.gguf (version GGUF V3 (latest))",
             "llama_context: constructing llama_context"]
    lines += [f"llama_kv_cache: layer {i:3d}: dev = CUDA1" for i in range(layer_lines)]
    lines += ["W LLAMA_KV_STREAM_ALLOW_MULTISEQ=1 set: 2 sequences stream through one pool, "
              "untested upstream",
              "I KV streaming device filter = CUDA1 (28 layers)",
              "main: server is listening on http://0.0.0.0:8081 - starting the main loop"]
    return ("\n".join(lines) + "\n").encode()


def test_kv_stream_words_in_capitals_are_read_past_the_boot_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "BOOT_MAX_LINES", 40)
    data = _capitals_boot(60)
    (boot,) = scan_bytes(data).boots
    assert (boot.multiseq_optin, boot.kv_stream_device, boot.kv_stream_layers) == (
        True, "CUDA1", 28)
    # inside the window (fewer loader lines than its cap) the same lines give the same boot
    (early,) = scan_bytes(_capitals_boot(10)).boots
    assert (early.multiseq_optin, early.kv_stream_device) == (True, "CUDA1")
    # the anchors are what finds them: without the capitals ones the lines are never read
    monkeypatch.setattr(parse, "LAUNCH_ANCHORS", tuple(
        a for a in parse.LAUNCH_ANCHORS if a not in parse.BOOT_CAPITALS))
    (blind,) = scan_bytes(data).boots
    assert (blind.multiseq_optin, blind.kv_stream_device) == (False, None)


def test_helper_process_gives_the_same_results(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With a helper process searching half of the anchors (as on large files), every record,
    line number and crash is the same as when one process does it all."""
    data = b"".join((FIXTURES / n).read_bytes() + b"\n"
                    for n in sorted(p.name for p in FIXTURES.glob("*.log")))
    path = tmp_path / "all.log"
    # kv-stream's capitals past the boot window (the main process searches them while the
    # boot waits for its first request, beside the helper's anchors)
    path.write_bytes(data * 3 + _capitals_boot(parse.BOOT_MAX_LINES + 20))

    def run() -> dict[str, object]:
        parser = LogParser()
        with open(path, "rb") as fh:
            parser.feed(str(path), fh)
        out: dict[str, object] = msgspec.to_builtins(parser.result())
        return out

    monkeypatch.setattr(parse, "BLOCK", 512)
    want = run()
    monkeypatch.setattr(parse, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parse, "spare_core", lambda: True)
    started: list[object] = []
    real = parse.ScanHelper

    def spy(*args: object) -> object:
        helper = real(*args)  # type: ignore[arg-type]
        started.append(helper)
        return helper

    monkeypatch.setattr(parse, "ScanHelper", spy)
    got = run()
    assert started, "the helper process was not used"
    assert got == want
    assert len(got["crashes"]) >= 30  # type: ignore[arg-type]
    last = got["boots"][-1]  # type: ignore[index]
    assert (last["multiseq_optin"], last["kv_stream_device"]) == (True, "CUDA1")
