"""``kvdiag import``: logs written here (one per shape, several wrappings) → trace events."""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader
from tests.conftest import Capture

ASSERT = ("/src/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:2011: "
          "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed")

BOOT = [
    "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes",
    "I print_info: n_head           = 24",
    "I print_info: n_head_kv        = 4",
    "I print_info: n_embd_head_k    = 256",
    "I print_info: n_embd_head_v    = 256",
    "W llama_context: flash attention is not supported on layer 0's device, falling back",
    "I llama_context: constructing llama_context",
    "I llama_context: n_seq_max     = 2",
    "I llama_context: n_ctx         = 32768",
    "I llama_context: kv_unified    = false",
    "I llama_context: experimental block KV streaming enabled, pool = 512 MiB",
    "I llama_kv_cache: CUDA_KV_Stream_Host KV buffer size =   522.00 MiB",
    "I llama_kv_cache: size =  522.00 MiB ( 16384 cells,   9 layers,  2/2 seqs), "
    "K (q8_0):  306.00 MiB, V (q5_1):  216.00 MiB",
    "I srv  llama_server: model loaded",
]


def fits_line(dst: str, ne: str, k: str, kr: str, vr: str, buf: str = "CUDA_KV_Stream_Host",
              tag: str = "E arm117 ") -> str:
    return (f'{tag}fits=false: dst={dst} ne=[{ne}] type=f32 k={k} kbuf="{buf}" | '
            f'v="{buf}" | kr={kr} vr={vr}')


def stamped(lines: list[str], start_us: int = 1_000_000, every_us: int = 1234) -> list[str]:
    """llama.cpp's prefix on lines that start with a level letter (§7.1)."""
    out = []
    for i, text in enumerate(lines):
        if len(text) > 2 and text[1] == " " and text[0] in "IWED":
            us = start_us + i * every_us
            m, rest = divmod(us, 60_000_000)
            s, rest = divmod(rest, 1_000_000)
            out.append(f"{m}.{s:02d}.{rest // 1000:03d}.{rest % 1000:03d} {text}")
        else:
            out.append(text)
    return out


def write(path: Path, lines: list[str], *, eol: str = "\n", gz: bool = False) -> Path:
    data = (eol.join(lines) + eol).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def run_import(log: Path, out: Path, *extra: str) -> int:
    return main(["import", str(log), "-o", str(out), *extra])


def read(path: Path) -> tuple[ev.Header, list[Any]]:
    with TraceReader.open(path) as reader:
        events = list(reader)
        assert reader.problems == []
        return reader.header, events


def of(events: list[Any], cls: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


# -- fits lines and their routes ------------------------------------------------------------


def test_fits_line_then_assert_is_an_abort_route(tmp_path: Path) -> None:
    lines = stamped([
        *BOOT,
        "I slot launch_slot_: id  1 | task 7 | processing task, is_child = 0",
        fits_line("0x7f00aa000100", "256,24,1,2", "0x7f2000000000", "0x55aa00001230",
                  "0x55aa00001230"),
        ASSERT,
        "[New LWP 4242]",
        "#0  0x00007f3208ef0c17 in __GI___wait4 () from /lib/x86_64-linux-gnu/libc.so.6",
        "#1  0x00007f3209a1c5a3 in ggml_print_backtrace () from /opt/lib/libggml-base.so",
        "#2  0x00007f3209a1c6f0 in ggml_abort () from /opt/lib/libggml-base.so",
        "#3  0x00007f32084b9d11 in ggml_cuda_kv_stream_fattn () from /opt/lib/libggml-cuda.so",
        "Aborted (core dumped)",
    ])
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "crash.log", lines), out) == 0
    header, events = read(out)
    (fits,) = of(events, ev.Fits)
    assert (fits.result, fits.route, fits.evaluated, fits.membership) == (
        False, "abort", False, True)
    assert fits.dst.ne == (256, 24, 1, 2) and fits.dst.type == "f32"
    assert fits.dst.data == 0x7F00AA000100 and fits.dst.nb == (0, 0, 0, 0)
    assert fits.k.data == 0x7F2000000000 and fits.k.runtime == 0x55AA00001230
    assert fits.v.runtime == 0x55AA00001230 and fits.k.buffer == "CUDA_KV_Stream_Host"
    # the view's type is the streamed cache's (size line); its shape the log does not give
    assert (fits.k.type, fits.v.type, fits.k.ne, fits.q.ne) == (
        "q8_0", "q5_1", (0, 0, 0, 0), (0, 0, 0, 0))
    assert fits.failed == () and fits.layer == -1
    (abort,) = of(events, ev.Abort)
    assert abort.condition == "ggml_cuda_kv_stream_fattn_fits(dst)" and abort.line == 2011
    assert abort.backtrace[:4] == ("__GI___wait4", "ggml_print_backtrace", "ggml_abort",
                                   "ggml_cuda_kv_stream_fattn")
    assert abort.seq == fits.seq + 1
    end = events[-1]
    assert isinstance(end, ev.End) and end.status == "aborted"
    # t_ns from the llama.cpp timestamp of the fits line (line 16 of the log, 0-based 15)
    assert fits.t_ns == (1_000_000 + 15 * 1234) * 1000
    assert (header.device.name, header.device.compute_capability) == ("NVIDIA H200", "9.0")
    # the plan: from the boot lines, page bytes computed (q8_0/q5_1, 256, 4 KV heads: §1.3)
    plan = header.plan
    assert (plan["kv_size"], plan["n_stream"], plan["layers"], plan["type_k"]) == (
        16384, 2, 9, "q8_0")
    assert plan["page_bytes"] == 475_136 and plan["host_kv_buffer_mib"] == 522.0
    assert fits.stage_bytes == 475_136
    assert {"page_bytes", "stage_bytes"} <= set(header.extra["import"]["derived"])
    assert header.backend == "import" and header.scenario["source"] == "log"
    assert header.scenario["name"] == "crash.log"
    assert header.scenario["config"] == {
        "layout": "", "dispatch": "", "np": 2, "kv_unified": False, "ctx": 32768, "layers": 9,
        "type_k": "q8_0", "type_v": "q5_1", "stage_mib": 512.0, "head_dim": 256, "n_head": 24,
        "n_head_kv": 4}


def test_fallback_warnings_nil_runtimes_and_inferred_routes(tmp_path: Path) -> None:
    lines = [
        *BOOT,
        fits_line("0x1000", "128,8,4,1", "0x2000", "(nil)", "(nil)", buf="CUDA0"),
        fits_line("0x1100", "256,24,3,2", "0x2100", "0x9000", "0x9000"),
        "W ggml_cuda_kv_stream_fattn: kv-stream FA node of layer 5 does not fit the streamed "
        "kernel; falling back to ordinary flash attention",
        fits_line("0x1200", "256,24,3,2", "0x2200", "0x9000", "(nil)"),
        "I slot update_slots: id  0 | task 3 | prompt done, n_tokens = 12, batch.n_tokens = 3",
        "I srv  update_slots: all slots are idle",
    ]
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "fb.log", lines), out) == 0
    _, events = read(out)
    fits = of(events, ev.Fits)
    assert [(f.route, f.membership, f.layer) for f in fits] == [
        ("ordinary", False, -1), ("fallback", True, 5), ("fallback", True, -1)]
    assert fits[0].k.type == "" and fits[0].k.runtime is None  # a CUDA0 buffer: not the cache
    warns = of(events, ev.Warn)
    assert [w.code for w in warns] == ["kv-stream-fallback", "import-route-inferred"]
    assert warns[0].layer == 5 and "falling back" in warns[0].message
    assert "fb.log:18" in warns[1].message
    end = events[-1]
    assert end.status == "completed" and end.reason == ""


@pytest.mark.parametrize("case", [str.upper, str.title, lambda t: t.replace("kv-stream",
                                                                            "KV_STREAM")])
def test_a_fallback_warning_in_another_case_decides_the_route_alike(
        tmp_path: Path, case: Callable[[str], str]) -> None:
    """The grammar reads a fallback warning in any case (its text is not public), and so does
    ``kvdiag perf``: import reads the same lines, its layer too. Only the warning's case
    differs between the two logs."""
    from kvdiag.postmortem.perfscan import PerfScanner

    warn = ("ggml_cuda_kv_stream_fattn: kv-stream FA node of layer 7 does not fit the "
            "streamed kernel; falling back to ordinary flash attention")
    got = []
    for text in (warn, case(warn)):
        lines = stamped([*BOOT, fits_line("0x1100", "256,24,3,2", "0x2100", "0x9000", "0x9000"),
                         f"W {text}", "I srv  update_slots: all slots are idle"])
        log = write(tmp_path / "fb.log", lines)
        out = tmp_path / "fb.kvtrace"
        assert run_import(log, out, "--force") == 0
        _, events = read(out)
        perf = PerfScanner("fb.log")
        perf.feed(log.read_bytes())
        notes = [(n.kind, n.layer) for n in perf.finish().notes]
        got.append(([(f.route, f.layer) for f in of(events, ev.Fits)],
                    [(w.code, w.layer) for w in of(events, ev.Warn)], notes))
    assert got[1] == got[0] == ([("fallback", 7)], [("kv-stream-fallback", 7)],
                                [("fits-false", None), ("fallback", 7)])


def test_a_route_waits_at_most_the_window(tmp_path: Path) -> None:
    from kvdiag.logimport.convert import WINDOW_LINES

    lines = [fits_line("0x1", "256,24,1,2", "0x2", "0x3", "0x3"),
             *(["I srv  log_server_r: done request: GET /health 127.0.0.1 200"]
               * (WINDOW_LINES + 5)), ASSERT]
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "w.log", lines), out) == 0
    _, events = read(out)
    assert [f.route for f in of(events, ev.Fits)] == ["fallback"]
    assert [type(e).__name__ for e in events] == ["Fits", "Warn", "Abort", "End"]


# -- kv_stream_adapt shapes -----------------------------------------------------------------

ADAPT = [
    "W kv_stream_adapt: adaptive KV partition: resident pages/layer 40 -> 39, ring slots 8 -> 17,"
    " miss 3.5%, copy busy 41.0%",
    "W kv_stream_adapt: active 10496, resident 39, ring 17, samples 120, misses 4, copy busy "
    "38.5%, peak 12",
    "W kv_stream_adapt: active 10752, resident 39, ring 17, layout 42, samples 130, misses 0, "
    "copy busy 12.0%, peak 9, skipped 2, resident attended 351",
    "W kv_stream_adapt: active 11008, resident 38, ring 26, samples 140, misses 1, copy busy "
    "55.0%, peak 20, cpu pages 3, cpu declines prefill/no eligible/below min 1/0/2",
    "W kv_stream_adapt: adaptive KV partition: resident pages/layer 39 -> 38, ring slots 17 -> 26",
    "W kv_stream_adapt: ignoring invalid CUDA feedback: KV stream deadline misses exceed samples",
    "W kv_stream_adapt: ignoring invalid partition feedback: previous KV stream partition does "
    "not cover the fixed pool",
    "W kv_stream_adapt: failed to publish CUDA KV decode layout 44 with ring 12",
    "W llama_kv_cache_stream: KV layout revision 3, resident pages/layer 30, ring slots 80, "
    "active pages 44, padded H2D 12.50 MiB/eval",
]


def test_every_adapt_shape(tmp_path: Path) -> None:
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "a.log", stamped(ADAPT)), out) == 0
    _, events = read(out)
    reps = of(events, ev.Repartition)
    assert [(r.resident, r.ring, r.miss_pct, r.busy_pct) for r in reps] == [
        ((40, 39), (8, 17), 3.5, 41.0), ((39, 38), (17, 26), None, None),
        ((38, 30), (26, 80), None, None)]
    assert reps[2].reason.startswith("KV layout revision 3")
    adapts = of(events, ev.Adapt)
    assert [(a.active, a.resident, a.ring, a.samples, a.misses, a.busy_pct, a.peak)
            for a in adapts] == [(10496, 39, 17, 120, 4, 38.5, 12),
                                 (10752, 39, 17, 130, 0, 12.0, 9),
                                 (11008, 38, 26, 140, 1, 55.0, 20)]
    assert (adapts[1].layout, adapts[1].skipped, adapts[1].resident_attended) == (42, 2, 351)
    assert (adapts[0].layout, adapts[2].skipped) == (None, None)
    warns = of(events, ev.Warn)
    assert [w.code for w in warns] == ["kv-stream-feedback", "kv-stream-feedback",
                                       "kv-stream-layout"]
    assert "deadline misses exceed samples" in warns[0].message
    assert "partition feedback" in warns[1].message
    # each adapt line ends a step: the first repartition and adapt are step 0
    assert [e.step for e in events if not isinstance(e, ev.End)] == [0, 0, 1, 2, 3, 3, 3, 3, 3]
    assert events[-1].steps == 4


# -- wrappings: the same lines behind every prefix the post-mortem reader strips -------------

CONTENT = [
    *BOOT,
    ADAPT[0], ADAPT[2],
    fits_line("0x7f00aa000100", "256,24,1,2", "0x7f2000000000", "0x55aa00001230", "(nil)"),
    "W ggml_cuda_kv_stream_fattn: kv-stream FA node of layer 3 does not fit; falling back",
    ADAPT[5],
]


def _ansi(text: str) -> str:
    return f"\x1b[33m{text[:2]}\x1b[0m{text[2:]}" if text[:1] in "IWE" else text


def _ansi_stamp(text: str) -> str:
    stamp, _, rest = text.partition(" ")
    if not stamp[:1].isdigit():
        return text
    return f"\x1b[34m{stamp}\x1b[0m \x1b[32m{rest[:2]}\x1b[0m{rest[2:]}"


WRAPS: dict[str, Callable[[list[str]], list[str]]] = {
    "plain": lambda ls: ls,
    "bare": lambda ls: [t[2:] if t[1:2] == " " else t for t in ls],
    "llama-timestamps": stamped,
    "journald": lambda ls: [f"Mar 03 10:11:12 gpu-box llama-server[4711]: {t}" for t in ls],
    "router": lambda ls: [f"[ 8080] {t}" for t in stamped(ls)],
    "journald+router+timestamps": lambda ls: [
        f"Mar 03 10:11:12 gpu-box llama-server[4711]: [ 8081] {t}" for t in stamped(ls)],
    "ansi": lambda ls: [_ansi(t) for t in ls],
    # common/log.cpp with colours: blue timestamp, coloured level letter
    "ansi-timestamps": lambda ls: [_ansi_stamp(t) for t in stamped(ls)],
    "docker-iso": lambda ls: [f"2026-03-03T10:11:12.123456789Z {t}" for t in stamped(ls)],
}


def _essence(events: list[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        match e:
            case ev.Fits():
                out.append(("fits", e.route, e.dst.ne, e.k.data, e.k.runtime, e.v.runtime,
                            e.layer, e.k.type))
            case ev.Adapt():
                out.append(("adapt", e.active, e.layout, e.resident_attended))
            case ev.Repartition():
                out.append(("rep", e.resident, e.ring, e.miss_pct))
            case ev.Warn():
                out.append(("warn", e.code, e.layer))
            case ev.End():
                out.append(("end", e.status, e.steps))
    return out


EXPECTED = [("rep", (40, 39), (8, 17), 3.5), ("adapt", 10752, 42, 351),
            ("fits", "fallback", (256, 24, 1, 2), 0x7F2000000000, 0x55AA00001230, None, 3,
             "q8_0"),
            ("warn", "kv-stream-fallback", 3), ("warn", "kv-stream-feedback", None),
            ("end", "completed", 2)]


@pytest.mark.parametrize("wrap", sorted(WRAPS))
@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_prefixes_and_line_ends_give_the_same_events(tmp_path: Path, wrap: str,
                                                     eol: str) -> None:
    out = tmp_path / "t.kvtrace"
    log = write(tmp_path / "w.log", WRAPS[wrap](CONTENT), eol=eol)
    assert run_import(log, out) == 0
    header, events = read(out)
    assert _essence(events) == EXPECTED
    assert header.plan["page_bytes"] == 475_136
    stamps = "timestamps" in wrap or wrap in ("router", "docker-iso")
    first = CONTENT.index(ADAPT[0])
    assert events[0].t_ns == ((1_000_000 + first * 1234) * 1000 if stamps else 0)


def test_gzip_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = write(tmp_path / "server.log.gz", stamped(CONTENT), gz=True)
    assert main(["import", str(log)]) == 0  # default output: beside the log
    _, events = read(tmp_path / "server.kvtrace")
    assert _essence(events) == EXPECTED
    raw = ("\n".join(CONTENT) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert main(["import", "-", "-o", str(tmp_path / "s.kvtrace")]) == 0
    header, events = read(tmp_path / "s.kvtrace")
    assert _essence(events) == EXPECTED and header.scenario["name"] == "<stdin>"


# -- restarts, damage, bad input --------------------------------------------------------------


def test_a_second_boot_is_a_warn_and_time_keeps_going(tmp_path: Path) -> None:
    first = stamped([*BOOT, ADAPT[1]], start_us=5_000_000)
    second = stamped([*BOOT, ADAPT[3]], start_us=100)
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "r.log", first + second), out) == 0
    header, events = read(out)
    assert [type(e).__name__ for e in events] == ["Adapt", "Warn", "Adapt", "End"]
    assert events[1].code == "import-boot" and "boot 2 of 2" in events[1].message
    times = [e.t_ns for e in events[:3]]
    assert times == sorted(times) and times[2] > times[0]
    assert header.extra["import"]["boots"] == 2


def test_truncated_gzip_keeps_every_event_before_the_break(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = stamped([*BOOT, *(ADAPT[1] for _ in range(4000))])
    data = gzip.compress(("\n".join(body) + "\n").encode())
    log = tmp_path / "cut.log.gz"
    log.write_bytes(data[: len(data) * 2 // 3])
    out = tmp_path / "t.kvtrace"
    assert run_import(log, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "breaks after line" in err[0]
    _, events = read(out)
    adapts = of(events, ev.Adapt)
    end = events[-1]
    assert 0 < len(adapts) < 4000 and end.status == "error"
    assert f"breaks after line {len(adapts) + len(BOOT)}" in end.reason


def test_a_short_log_cut_inside_its_gzip_is_imported_up_to_the_cut(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """All its text is shorter than the 4 KiB import first reads to tell a trace from a log:
    that read meets the cut too, and must leave it to the passes (it was an internal error)."""
    body = stamped([*BOOT, fits_line("0x1100", "256,24,3,2", "0x2100", "0x9000", "0x9000"),
                    ASSERT, "Aborted (core dumped)"])
    data = gzip.compress(("\n".join(body) + "\n").encode())
    log = tmp_path / "short.log.gz"
    log.write_bytes(data[:-12])  # the gzip trailer and the last bytes of the stream
    out = tmp_path / "t.kvtrace"
    assert run_import(log, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "breaks after line" in err[0] and "internal" not in err[0]
    _, events = read(out)
    assert [f.route for f in of(events, ev.Fits)] == ["abort"]
    assert of(events, ev.Abort)[0].line == 2011


def test_last_line_without_line_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "cut.log"
    log.write_bytes(("\n".join([ADAPT[1], ADAPT[2][:52]])).encode())  # cut inside "ring 17"
    out = tmp_path / "t.kvtrace"
    assert run_import(log, out) == 0
    assert "ends inside line 2" in capsys.readouterr().err
    _, events = read(out)
    assert len(of(events, ev.Adapt)) == 1 and events[-1].status == "error"


@pytest.mark.parametrize(("name", "content", "code", "words"), [
    ("missing.log", None, 2, "no such file"),
    ("a-directory", "dir", 2, "is a directory"),
    ("elf.bin", b"\x7fELF\x02\x01\x01" + bytes(4000), 2, "not a text log"),
    ("random.bin", bytes(range(256)) * 40, 2, "not a text log"),
    ("empty.log", b"", 2, "empty"),
    ("notes.txt", b"just some notes\nnothing from a server here\n", 1, "nothing to import"),
    ("boot-only.log", ("\n".join(BOOT) + "\n").encode(), 1, "nothing to import"),
    # a trace (here one holding a GGML_ASSERT abort the log grammar half-matches) is not a log
    ("run.kvtrace", b'{"format":"kvtrace","version":"1.2"}\n{"kind":"abort","seq":1,"t_ns":0,'
     b'"step":0,"message":"a.cu:9: GGML_ASSERT(fits) failed"}\n', 2, "is a kvtrace trace"),
    ("run.kvtrace.gz", gzip.compress(b'{"format":"kvtrace"}\n'), 2, "is a kvtrace trace"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                               content: bytes | str | None, code: int, words: str) -> None:
    log = tmp_path / name
    if content == "dir":
        log.mkdir()
    elif content is not None:
        log.write_bytes(content)
    out = tmp_path / "t.kvtrace"
    assert run_import(log, out) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]
    assert not out.exists() and not list(tmp_path.glob(".t.kvtrace*"))


def test_an_existing_output_needs_force(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    log = write(tmp_path / "a.log", ADAPT)
    out = tmp_path / "t.kvtrace"
    out.write_text("keep me")
    assert run_import(log, out) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "keep me"
    assert run_import(log, out, "--force") == 0
    assert len(of(read(out)[1], ev.Adapt)) == 3


# -- round trip through the model's log export ---------------------------------------------


def _decisions(events: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.result, e.route, e.membership, e.dst.ne, e.dst.type, e.layer)
            for e in events if isinstance(e, ev.Fits) and not e.result and e.membership]


@pytest.mark.parametrize("dispatch", ["membership", "fits"])
def test_export_then_import_gives_the_same_fits_decisions(
        tmp_path: Path, captured: Capture, dispatch: str) -> None:
    trace, _ = captured("two-slot-concurrent", "shared", dispatch)
    log = tmp_path / "exported.log"
    assert main(["trace", "export", str(trace), "--format", "llama-log", "-o", str(log)]) == 0
    out = tmp_path / "back.kvtrace"
    assert run_import(log, out) == 0
    _, model = read(trace)
    _, back = read(out)
    expected = _decisions(model)
    assert expected and _decisions(back) == [
        (r, route, m, ne, t, layer if route == "fallback" else -1)
        for r, route, m, ne, t, layer in expected]
    assert of(back, ev.Abort) if dispatch == "membership" else not of(back, ev.Abort)
    assert all(not f.evaluated for f in of(back, ev.Fits))


def test_slot_lines_end_a_step_only_when_it_holds_an_event(tmp_path: Path) -> None:
    slot = "I slot update_slots: id  1 | task 4 | prompt processing progress, n_tokens = 512, " \
           "batch.n_tokens = 512, progress = 0.5"
    lines = [slot, slot, ADAPT[0], "I srv  update_slots: all slots are idle", ADAPT[0], slot,
             slot, ADAPT[5], "I slot launch_slot_: id  0 | task 9 | processing task", ADAPT[7]]
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "s.log", lines), out) == 0
    _, events = read(out)
    assert [(type(e).__name__, e.step) for e in events] == [
        ("Repartition", 0), ("Repartition", 0), ("Warn", 1), ("Warn", 2), ("End", 2)]


class _Chunks(io.RawIOBase):
    """A stream that hands out ``size`` bytes per read, as a pipe or a gzip member might."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def read1(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + self.size]
        self.pos += len(out)
        return out


@pytest.mark.parametrize("size", [1, 3, 7, 64, 1 << 20])
def test_lines_survive_any_chunking(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvdiag.logimport import source

    monkeypatch.setattr(source, "MAX_LINE_BYTES", 40)
    data = b"first\nsecond line\r\n" + b"x" * 100 + b"\nlast one\ntail without end"
    breaks = source.Breaks()
    got = list(source.iter_lines(_Chunks(data, size), breaks))  # type: ignore[arg-type]
    assert got == [b"first", b"second line\r", b"x" * 40, b"last one"]
    assert (breaks.line, breaks.no_newline, breaks.error) == (4, True, None)


def test_other_crashes_are_aborts_and_do_not_decide_a_fits_route(tmp_path: Path) -> None:
    lines = stamped([
        fits_line("0x10", "256,24,1,1", "0x20", "0x30", "0x30"),
        "/src/ggml/src/ggml-cuda/ggml-cuda.cu:102: CUDA error",
        "E CUDA error: an illegal memory access was encountered",
        "E   current device: 0, in function ggml_cuda_op_mul_mat at /src/ggml-cuda.cu:1770",
        "E   cudaStreamSynchronize(stream)",
    ])
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "cuda.log", lines), out) == 0
    _, events = read(out)
    assert [type(e).__name__ for e in events] == ["Fits", "Warn", "Abort", "End"]
    assert events[0].route == "fallback" and events[1].code == "import-route-inferred"
    abort = events[2]
    assert abort.cuda_error == "an illegal memory access was encountered"
    assert abort.message == "/src/ggml/src/ggml-cuda/ggml-cuda.cu:102: CUDA error"
    assert events[3].status == "aborted"

    seg = write(tmp_path / "segv.log", [ADAPT[1], "Segmentation fault (core dumped)"])
    assert run_import(seg, out, "--force") == 0
    _, events = read(out)
    assert [type(e).__name__ for e in events] == ["Adapt", "Abort", "End"]
    assert events[1].message == "SIGSEGV" and events[2].status == "aborted"


def test_an_abort_on_a_last_line_without_line_end_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "cut.log"
    log.write_bytes("\n".join([fits_line("0x10", "256,24,1,2", "0x20", "0x30", "0x30"),
                               ASSERT]).encode())
    out = tmp_path / "t.kvtrace"
    assert run_import(log, out) == 0
    _, events = read(out)
    assert [(type(e).__name__, getattr(e, "route", "")) for e in events] == [
        ("Fits", "abort"), ("Abort", ""), ("End", "")]
    assert events[2].status == "aborted" and "ends inside line 2" in events[2].reason


BIG = "9" * 30


def test_numbers_a_trace_cannot_hold_are_said_not_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged line can print any digits; the trace's integers are 64-bit and its reader
    refuses a wider one (the whole header, or the event's line). Import wrote them: the trace
    it made was refused by check, and its own summary lost the events."""
    lines = stamped([
        *BOOT[:7], f"I llama_context: n_seq_max     = {BIG}", *BOOT[8:],
        fits_line(f"0x{'f' * 24}", f"{BIG},24,1,2", "0x2100", f"0x{'b' * 22}", "0x9000"),
        f"W kv_stream_adapt: active {BIG}, resident 40, ring 8, samples 200, misses 0, "
        "copy busy 20.0%, peak 4",
        "W kv_stream_adapt: active 9300, resident 40, ring 8, samples 200, misses 6, "
        "copy busy 35.0%, peak 4",
    ])
    out = tmp_path / "t.kvtrace"
    assert run_import(write(tmp_path / "big.log", lines), out) == 0
    said = capsys.readouterr().out
    assert "1 line(s) not imported: a number wider than 64 bits" in said
    assert main(["trace", "validate", str(out)]) == 0
    header, events = read(out)
    assert header.extra["import"]["wider_than_64_bits"] == [
        "scenario.config.np", "scenario.boot.n_seq_max"]
    assert "np" not in header.scenario["config"] and header.plan["n_stream"] == 2
    (fits,) = of(events, ev.Fits)
    # the shape and the K runtime are unknown; the V runtime still says it is streamed
    assert fits.dst.ne == (0, 0, 0, 0) and fits.dst.data == 0 and fits.v.runtime == 0x9000
    assert fits.k.runtime is None and fits.membership
    assert [a.active for a in of(events, ev.Adapt)] == [9300]
    (wide,) = [w for w in of(events, ev.Warn) if w.code == "import-out-of-range"]
    assert wide.message.endswith(f"big.log:{len(BOOT) + 2}: active wider than 64 bits; the "
                                 "line is not imported")


@pytest.mark.parametrize("command", ["import", "postmortem", "perf"])
def test_a_number_that_is_not_one_is_no_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """``1.2.3`` or ``...`` where the grammar wants a number (a cut or overwritten line) was
    read as one and float() raised: every log command stopped with an internal error."""
    log = write(tmp_path / "dots.log", stamped([
        *BOOT[:11], "I llama_kv_cache: CUDA_KV_Stream_Host KV buffer size =   ... MiB",
        *BOOT[12:],
        "W kv_stream_adapt: active 1.2.3, resident 40, ring 8, samples 200, misses 0, "
        "copy busy 20.0%, peak 4",
        "W kv_stream_adapt: adaptive KV partition: resident pages/layer 40 -> 37, ring slots "
        "8 -> 35, miss 1.2.3%, copy busy 35.0%",
        "W kv_stream_adapt: active 9300, resident 37, ring 35, samples 200, misses 6, "
        "copy busy 35.0%, peak 4",
    ]))
    argv = {"import": ["import", str(log), "-o", str(tmp_path / "t.kvtrace")],
            "postmortem": ["postmortem", str(log), "--json"],
            "perf": ["perf", str(log)]}[command]
    code = main(argv)
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err
    if command == "import":
        assert code == 0
        _, events = read(tmp_path / "t.kvtrace")
        # the line with "1.2.3" for its active count is no adapt line; the others are read
        assert [(a.active, a.ring) for a in of(events, ev.Adapt)] == [(9300, 35)]
        (rep,) = of(events, ev.Repartition)
        assert (rep.resident, rep.ring, rep.miss_pct) == ((40, 37), (8, 35), None)
    elif command == "postmortem":
        assert code == 0
        config = json.loads(out)["config"]
        # the buffer line without a size gives none; the rest of the boot is read
        assert "kv_buffers" not in config and config["kv_stream_pool_mib"] == 512.0
    else:
        assert code == 1 and "no completed request" in err
