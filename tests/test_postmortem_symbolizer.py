"""DWARF symbolization against binutils addr2line, on a program compiled here with -g -O2.

The program (tests/fixtures/native/crashprog.cpp) prints a ggml-style assert and a glibc
``backtrace_symbols_fd`` backtrace, then aborts. Every frame symbolized from that log must
agree with ``addr2line -f -i -C`` (function, file and line, including inlined frames), with
one documented exception: for an inlined function that has no linkage name, binutils 2.40
prints the enclosing ELF symbol instead of the function's DWARF name; there the DWARF name
(what gdb and llvm-symbolizer print) is checked instead.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from kvdiag.errors import InputError
from kvdiag.model.frames import Frame
from kvdiag.postmortem.parse import LogParser
from kvdiag.postmortem.resymbolize import resymbolize
from kvdiag.postmortem.symbolizer import Module

SRC = Path(__file__).parent / "fixtures" / "native" / "crashprog.cpp"
GCC = shutil.which("gcc")
ADDR2LINE = shutil.which("addr2line")
pytestmark = pytest.mark.skipif(
    GCC is None or ADDR2LINE is None, reason="needs gcc and binutils addr2line to build and check"
)


@pytest.fixture(scope="module", params=["-gdwarf-5", "-gdwarf-4"])
def built(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> tuple[Path, bytes]:
    """The test program built with -g -O2, once with DWARF 5 and once with DWARF 4 (line
    programs, file numbering and range lists differ between the two)."""
    d = tmp_path_factory.mktemp("native")
    binary = d / "crashprog"
    assert GCC is not None
    subprocess.run([GCC, "-g", request.param, "-O2", "-Wl,--build-id", "-o", str(binary),
                    str(SRC)], check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(binary)], capture_output=True, timeout=30, check=False)
    assert proc.returncode == -signal.SIGABRT
    return binary, proc.stderr


def _addr2line(binary: Path, offsets: list[int]) -> list[list[tuple[str, str]]]:
    assert ADDR2LINE is not None
    out = subprocess.run(
        [ADDR2LINE, "-f", "-i", "-C", "-a", "-e", str(binary), *(hex(o) for o in offsets)],
        capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    chains: list[list[tuple[str, str]]] = []
    i = 0
    while i < len(out):
        if out[i].startswith("0x"):
            chains.append([])
            i += 1
            continue
        chains[-1].append((out[i], out[i + 1]))
        i += 2
    return chains


def _scan(stderr: bytes, binary: Path, tmp: Path, debug_dir: str | None = None) -> list[Frame]:
    parser = LogParser()
    parser.feed("crash.log", io.BytesIO(stderr))
    scan = resymbolize(parser.result(), [str(binary)], debug_dir, cache_root=str(tmp / "cache"))
    (crash,) = scan.crashes
    assert crash.backtrace is not None
    return list(crash.backtrace.frames)


def test_frames_agree_with_addr2line(built: tuple[Path, bytes], tmp_path: Path) -> None:
    binary, stderr = built
    assert b"GGML_ASSERT(row >= 0 && row < 4096) failed" in stderr
    frames = _scan(stderr, binary, tmp_path)
    ours = [f for f in frames
            if f.module and os.path.basename(f.module) == "crashprog" and f.offset is not None]
    offsets: list[int] = []
    for f in ours:
        if f.offset is not None and f.offset not in offsets:
            offsets.append(f.offset)
    ref = _addr2line(binary, [o - 1 for o in offsets])  # return addresses: the call is at -1
    checked = inlined_seen = 0
    for off, chain in zip(offsets, ref, strict=True):
        mine = [f for f in ours if f.offset == off]
        assert len(mine) == len(chain), (hex(off), mine, chain)
        for k, (fr, (func, loc)) in enumerate(zip(mine, chain, strict=True)):
            file, _, line = loc.rpartition(":")
            assert fr.inlined == (k < len(chain) - 1)
            if file == "??":
                assert fr.file is None
            else:
                assert (fr.file, fr.line) == (file, int(line))
            if fr.inlined and k == 0 and func == chain[-1][0]:
                # binutils' fallback to the enclosing symbol (see module docstring)
                assert fr.function == "page_of"
                inlined_seen += 1
            else:
                assert fr.function == func
            checked += 1
    assert checked >= 7 and inlined_seen == 1
    names = [f.function for f in frames]
    assert "kvtest::Bookkeeping<long>::mark_dirty(int const*, int)" in names
    assert any(n and n.startswith("kvtest::fail(char const*, int, char const*) [clone") for n in names)


def test_separate_debug_file_by_debuglink_and_build_id(built: tuple[Path, bytes],
                                                       tmp_path: Path) -> None:
    binary, stderr = built
    if shutil.which("objcopy") is None:
        pytest.skip("needs objcopy to split debug information")
    full = _scan(stderr, binary, tmp_path / "a")
    linked = tmp_path / "linked"
    linked.mkdir()
    debug = linked / "crashprog.debug"
    stripped = linked / "crashprog"
    subprocess.run(["objcopy", "--only-keep-debug", str(binary), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-debug", f"--add-gnu-debuglink={debug}", str(binary),
                    str(stripped)], check=True)
    assert _scan(stderr, stripped, tmp_path / "b") == full
    mod = Module(str(binary), [], use_cache=False, budget_s=30)
    bid = mod.image.build_id
    mod.close()
    assert bid is not None and len(bid) == 40
    ddir = tmp_path / "dbg"
    (ddir / ".build-id" / bid[:2]).mkdir(parents=True)
    shutil.copy(debug, ddir / ".build-id" / bid[:2] / f"{bid[2:]}.debug")
    bare = tmp_path / "bare"
    bare.mkdir()
    subprocess.run(["objcopy", "--strip-debug", str(binary), str(bare / "crashprog")], check=True)
    assert _scan(stderr, bare / "crashprog", tmp_path / "c", debug_dir=str(ddir)) == full


def test_second_run_reads_the_cache_not_dwarf(built: tuple[Path, bytes], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    binary, stderr = built
    first = _scan(stderr, binary, tmp_path)
    cached = list((tmp_path / "cache").rglob("cu-*.msgpack"))
    assert cached
    from kvdiag.postmortem import dwarfindex

    def no_dwarf(self: object) -> object:
        raise AssertionError("DWARF was parsed although the cache holds the answer")

    monkeypatch.setattr(dwarfindex.DwarfIndex, "dwarf", property(no_dwarf))
    assert _scan(stderr, binary, tmp_path) == first


def test_truncated_and_garbage_elf_are_one_line_errors(built: tuple[Path, bytes],
                                                       tmp_path: Path) -> None:
    binary, stderr = built
    data = binary.read_bytes()
    cases = {
        "truncated": data[:3000],
        "garbage": b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 40,
        "text": b"not an elf at all\n" * 100,
    }
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(InputError) as info:
            _scan(stderr, p, tmp_path)
        assert "\n" not in str(info.value) and name in str(info.value)


def test_damaged_debug_info_ends_with_an_error_not_a_hang(built: tuple[Path, bytes],
                                                          tmp_path: Path) -> None:
    binary, stderr = built
    from elftools.elf.elffile import ELFFile

    with open(binary, "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".debug_info")
        start, size = sec["sh_offset"], sec["sh_size"]
    data = bytearray(binary.read_bytes())
    for i in range(start + 11, start + size, 7):  # keep the unit header, scramble the DIEs
        data[i] = 0xFF
    bad = tmp_path / "scrambled"
    bad.write_bytes(bytes(data))
    try:
        frames = _scan(stderr, bad, tmp_path)
    except InputError as exc:
        assert "\n" not in str(exc) and "scrambled" in str(exc)
    else:  # nothing usable: frames keep what the log said
        assert len(frames) >= 8


def test_gdb_frames_without_source_get_the_load_bias_from_their_names(
        built: tuple[Path, bytes], tmp_path: Path) -> None:
    """A gdb stack of a PIE program prints absolute addresses and (from the symbol table) names
    but no offsets: the page-aligned load bias follows from a named frame."""
    binary, stderr = built
    glibc = _scan(stderr, binary, tmp_path / "g")
    mod = Module(str(binary), [], use_cache=False, budget_s=30)
    lines = []
    physical = [f for f in glibc if not f.inlined and f.module and f.module.endswith("crashprog")
                and f.address is not None]
    for n, fr in enumerate(physical, start=1):
        assert fr.address is not None and fr.offset is not None
        sym = mod.image.symbol_at(fr.offset - 1)
        assert sym is not None
        from kvdiag.postmortem.demangle import demangle

        lines.append(f"#{n}  0x{fr.address:016x} in {demangle(sym[0])} ()")
    mod.close()
    log = ("/x/crashprog.cpp:31: GGML_ASSERT(row >= 0 && row < 4096) failed\n"
           "#0  0x00007f0000001234 in __GI___wait4 () from /lib/x86_64-linux-gnu/libc.so.6\n"
           + "\n".join(lines) + "\n").encode()
    frames = _scan(log, binary, tmp_path / "d")
    got = [(f.function, f.file, f.line, f.inlined) for f in frames
           if f.function != "__GI___wait4"]
    want = [(f.function, f.file, f.line, f.inlined) for f in glibc
            if f.module and f.module.endswith("crashprog") and f.file is not None]
    assert got[: len(want)] == want
    assert any(f.inlined for f in frames)


def test_cli_binary_option_symbolizes_json_frames(
        built: tuple[Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from postmortem_helpers import run_json

    from kvdiag.errors import UsageError

    binary, stderr = built
    log = tmp_path / "crash.log"
    log.write_bytes(stderr)
    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(tmp_path / "cache"))
    code, data = run_json([str(log), "--binary", str(binary)], capsys)
    assert code == 1
    frames = data["crashes"][0]["frames"]
    inl = [f for f in frames if f["function"] == "page_of"]
    assert len(inl) == 1 and inl[0]["inlined"] and inl[0]["line"] == 31
    assert inl[0]["file"].endswith("crashprog.cpp") and inl[0]["offset"].startswith("0x")
    assert [f["index"] for f in frames] == list(range(len(frames)))
    with pytest.raises(UsageError):
        run_json([str(log), "--debug-dir", str(tmp_path), "--no-auto-binaries"], capsys)
    bad = tmp_path / "cut"
    bad.write_bytes(binary.read_bytes()[:100])
    with pytest.raises(InputError) as info:
        run_json([str(log), "--binary", str(bad)], capsys)
    assert info.value.exit_code == 2


def test_fast_die_scan_lists_the_same_functions_as_pyelftools(
        built: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    from kvdiag.postmortem import dwarfindex
    from kvdiag.postmortem.cache import CuIndex
    from kvdiag.postmortem.diescan import Unsupported

    binary, _ = built
    idx = dwarfindex.DwarfIndex(str(binary), None, 60)
    try:
        offsets = sorted({u[2] for u in idx.units()})
        fast = [idx._functions(off, CuIndex()) for off in offsets]

        def refuse(*_a: object, **_k: object) -> object:
            raise Unsupported("test")

        monkeypatch.setattr(dwarfindex, "scan_functions", refuse)
        slow = [idx._functions(off, CuIndex()) for off in offsets]
    finally:
        idx.close()
    assert fast == slow and sum(len(f) for f in fast) >= 5
