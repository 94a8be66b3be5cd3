"""Seeded mutation fuzzing of the post-mortem path (issue 11): hostile logs through the whole
command (open, text check, scan, binary choice and cross-check, symbolize, report) and hostile
ELF/DWARF files through open, cross-check and lookup. Whatever the bytes, the result is a report
or one ``InputError`` line, never another exception; each loop is bounded in iterations."""

from __future__ import annotations

import io
import json
import random
import re
import struct
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from kvdiag.analysis.signatures import evaluate
from kvdiag.errors import InputError
from kvdiag.files.logs import open_log
from kvdiag.model.logrecords import LogScan
from kvdiag.postmortem.binaries import verify
from kvdiag.postmortem.parse import LogParser
from kvdiag.postmortem.resymbolize import resymbolize
from kvdiag.postmortem.symbolizer import Module
from kvdiag.report.postmortem import postmortem_renderable, postmortem_to_json
from tests import native_ggml

pytestmark = pytest.mark.skipif(native_ggml.GCC is None, reason="needs gcc to build a library")


def _seed_log(built: native_ggml.Built) -> bytes:
    lib = str(built.lib)
    return "\n".join([
        "Mar 02 10:00:01 gpu7 llama-server[301]: llama_context: n_ctx = 8192",
        "llama-server[301]: slot launch_slot_: id  1 | task 9 | processing task",
        f"llama-server[301]: the answer is{built.src}:39: fatal error",
        f"{lib}(ggml_print_backtrace+0x18)[0x7f00aa0011e1]",
        f"{lib}(ggml_abort+0x11e)[0x7f00aa001317]",
        f"{lib}(+0x1346)[0x7f00aa001346]",
        "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85)[0x7f00a9e29305]",
        f"Module {lib} with build-id 0123456789abcdef0123456789abcdef01234567",
        "Stack trace of thread 301:",
        f"#0  0x00007f00aa001346 ggml_kv_stream_plan_pages ({built.lib.name} + 0x1346)",
        "#1  0x00007f00aa0ea42f in __GI___wait4 (pid=5122) at ../sysdeps/unix/wait4.c:30",
        f"#2  0x00007f00aa001362 in ggml_graph_compute_step () from {lib}",
        "zsh: abort (core dumped)  ./server",
        "",
    ]).encode()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 12)):
        op = rng.randrange(5)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:  # flip a byte
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == 1:  # insert noise, sometimes a NUL or invalid UTF-8
            out[at:at] = bytes(rng.choice((0, 0x0A, 0x3A, 0x28, 0x2B, 0xC3, 0xFF, 0x5B))
                               for _ in range(rng.randint(1, 6)))
        elif op == 2:  # cut
            del out[at:at + rng.randint(1, 200)]
        elif op == 3:  # duplicate a slice (repeated frames, glued lines)
            chunk = out[at:at + rng.randint(1, 300)]
            out[at:at] = chunk
        else:  # truncate
            del out[at:]
    return bytes(out)


def test_mutated_logs_give_a_report_or_one_line(tmp_path: Path) -> None:
    built = native_ggml.build(tmp_path / "b")
    seed = _seed_log(built)
    rng = random.Random(1111)
    outcomes = {"report": 0, "refused": 0}
    for i in range(120):
        data = _mutate(rng, seed)
        path = tmp_path / f"m{i % 4}.log"
        path.write_bytes(data)
        try:
            log = open_log(str(path))
        except InputError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
            continue
        with log:
            parser = LogParser()
            parser.feed(log.name, log.stream, leading_nuls=log.leading_nuls)
        scan = parser.result()
        scan = resymbolize(scan, [], None, use_cache=False, auto=True)
        findings = evaluate(scan)
        json.dumps(postmortem_to_json(scan, findings))
        Console(file=io.StringIO(), width=100).print(postmortem_renderable(scan, findings))
        for p in scan.problems:
            assert "\n" not in p.message
        outcomes["report"] += 1
    assert outcomes["report"] > 60 and outcomes["refused"] > 0, outcomes


def test_mutated_libraries_open_check_and_resolve_or_fail_in_one_line(tmp_path: Path) -> None:
    built = native_ggml.build(tmp_path / "b", extra=("-gdwarf-5",))
    good = built.lib.read_bytes()
    log = tmp_path / "seed.log"
    log.write_bytes(_seed_log(built))
    parser = LogParser()
    with open_log(str(log)) as opened:
        parser.feed(opened.name, opened.stream)
    scan = parser.result()
    rng = random.Random(2222)
    errors = 0
    for i in range(80):
        data = bytearray(good)
        # damage the headers half the time, the debug sections (which follow the code) else
        lo, hi = (0, 0x400) if i % 2 else (len(data) // 3, len(data))
        for _ in range(rng.randint(1, 10)):
            data[rng.randrange(lo, hi)] = rng.randrange(256)
        bad = tmp_path / f"libggml-base.so.{i % 3}"
        bad.write_bytes(bytes(data))
        try:
            mod = Module(str(bad), [], use_cache=False, budget_s=5)
        except InputError as exc:
            assert "\n" not in str(exc) and "Error" not in str(exc), str(exc)
            errors += 1
            continue
        try:
            verify(scan, mod, False, 62)
            for off in range(0x1100, 0x1400, 0x40):
                mod.resolve(off, True)
        except InputError as exc:
            assert "\n" not in str(exc) and "Error" not in str(exc), str(exc)
            errors += 1
        finally:
            mod.close()
    assert errors > 0


def test_wrong_binaries_are_refused_in_every_frame_form(tmp_path: Path) -> None:
    """Seeded (issue 16 #5): the library frames of a real run, cut to random choices of three
    or more and printed as glibc ``sym+0xOFF`` or ``(+0xOFF)`` frames, with or without the libc
    lines that name the machine. The build that ran is always used and checked; other builds
    of the same source and the same file marked for other machines are always refused."""
    built = native_ggml.build(tmp_path / "ran")
    ran = native_ggml.run(built, "abort", backtrace=True)
    lib = str(built.lib)
    frames = [(s.decode(), int(o, 16), int(a, 16)) for s, o, a in re.findall(
        rb"libggml-base\.so\((\w+)\+0x([0-9a-f]+)\)\[0x([0-9a-f]+)\]", ran)]
    assert len(frames) >= 4
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                        check=True).stdout
    value = {m.group(2): int(m.group(1), 16) for m in re.finditer(r"^([0-9a-f]+) T (\w+)$", nm,
                                                                   re.M)}
    wrong: list[Path] = [native_ggml.build(tmp_path / f"o{opt}", opt=opt).lib
                         for opt in ("-O0", "-O2", "-Os")]
    for machine in (183, 243, 21, 258, 40):
        folder = tmp_path / f"m{machine}"
        folder.mkdir()
        data = bytearray(built.lib.read_bytes())
        data[18:20] = struct.pack("<H", machine)
        (folder / built.lib.name).write_bytes(bytes(data))
        wrong.append(folder / built.lib.name)
    rng = random.Random(1616)
    for i in range(40):
        chosen = sorted(rng.sample(range(len(frames)), rng.randint(3, len(frames))))
        named = rng.random() < 0.5
        lines = [f"{built.src}:39: fatal error"]
        for k in chosen:
            sym, off, addr = frames[k]
            where = f"{sym}+0x{off:x}" if named else f"+0x{value[sym] + off:x}"
            lines.append(f"{lib}({where})[0x{addr:x}]")
        if rng.random() < 0.5:
            lines.append("/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85)[0x7f0a1c2305]")
        scan = _scan(("\n".join(lines) + "\nAborted (core dumped)\n").encode())
        used = resymbolize(scan, [lib], None, use_cache=False)
        assert [(b.checked_by, b.path) for b in used.binaries] == [("frames", lib)], (i, lines)
        other = wrong[i % len(wrong)]
        refused = resymbolize(scan, [str(other)], None, use_cache=False)
        assert refused.binaries == (), (i, other, lines)
        (p,) = [p for p in refused.problems if p.code == "binary-mismatch"]
        assert str(other) in p.message and "\n" not in p.message


def _scan(data: bytes) -> LogScan:
    parser = LogParser()
    parser.feed("fuzz.log", io.BytesIO(data))
    return parser.result()
