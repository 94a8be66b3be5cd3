"""glibc frames ``MODULE(SYMBOL+0xOFF)[0xABS]`` (issue 11 #3): with the module at hand the frame
gets its module offset (the symbol's value + OFF, a versioned ``SYMBOL@VER`` named by the part
before ``@``) and is symbolized at offset − 1 like a ``(+0xOFF)`` frame. Checked against
``nm`` on a library built here, with its symbol table and stripped to ``.dynsym``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvdiag.postmortem.resymbolize import resymbolize
from tests import native_ggml
from tests.postmortem_helpers import scan_bytes

NM = shutil.which("nm")
STRIP = shutil.which("strip")
pytestmark = pytest.mark.skipif(native_ggml.GCC is None or NM is None or STRIP is None,
                                reason="needs gcc and binutils nm/strip")


def _dynsyms(lib: Path) -> dict[str, int]:
    assert NM is not None
    out = subprocess.run([NM, "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {name.split("@")[0]: int(value, 16)
            for value, _kind, name in (ln.split() for ln in out.splitlines() if ln.count(" ") == 2)}


@pytest.mark.parametrize("stripped", [False, True])
def test_glibc_symbol_frames_get_module_offsets_and_lines(tmp_path: Path, stripped: bool) -> None:
    built = native_ggml.build(tmp_path)
    log = native_ggml.run(built, "abort", backtrace=True)
    syms = _dynsyms(built.lib)
    if stripped:
        assert STRIP is not None
        subprocess.run([STRIP, "--strip-all", str(built.lib)], check=True)
    printed = re.findall(rb"libggml-base\.so\((\w+)\+0x([0-9a-f]+)\)", log)
    assert [p[0] for p in printed][:3] == [b"ggml_print_backtrace", b"ggml_abort",
                                           b"ggml_compute_forward_dup"]
    scan = resymbolize(scan_bytes(log), [str(built.lib)], None, use_cache=False)
    (crash,) = scan.crashes
    assert crash.backtrace is not None
    frames = [f for f in crash.backtrace.frames if f.module == str(built.lib)]
    physical = [f for f in frames if not f.inlined]
    assert [f.offset for f in physical] == [syms[s.decode()] + int(o, 16) for s, o in printed]
    if stripped:
        return  # no DWARF and no local symbols left: offsets only
    src = built.src.read_text().splitlines()
    abort_line = 1 + next(i for i, t in enumerate(src) if 'GGML_ABORT("fatal error")' in t)
    # "ggml_compute_forward_dup+0x0" is the return address after the noreturn call that ends
    # ggml_kv_stream_plan_pages: looked up at offset − 1 it is the abort's line there
    by_name = {f.function: f for f in frames}
    plan = by_name["ggml_kv_stream_plan_pages"]
    assert (plan.file, plan.line, plan.in_app) == (str(built.src), abort_line, True)


def test_versioned_symbol_name_is_looked_up_without_its_version(tmp_path: Path) -> None:
    script = tmp_path / "ggml.map"
    script.write_text("GGML_1.0 { global: ggml_*; local: *; };\n")
    built = native_ggml.build(tmp_path, extra=(f"-Wl,--version-script={script}",))
    syms = _dynsyms(built.lib)
    lib = str(built.lib)
    # a real run's frames (one load address, return addresses after calls), with the symbol
    # names versioned the two ways a dynamic symbol table spells them
    ran = native_ggml.run(built, "abort", backtrace=True)
    printed = dict(re.findall(rb"\((ggml_abort|ggml_graph_compute_step)\+0x([0-9a-f]+)\)", ran))
    off = syms["ggml_graph_compute_step"] + int(printed[b"ggml_graph_compute_step"], 16)
    log = ran.replace(b"(ggml_abort+", b"(ggml_abort@@GGML_1.0+").replace(
        b"(ggml_graph_compute_step+", b"(ggml_graph_compute_step@GGML_1.0+")
    scan = resymbolize(scan_bytes(log), [lib], None, use_cache=False)
    (crash,) = scan.crashes
    assert crash.backtrace is not None
    offsets = {f.function: f.offset for f in crash.backtrace.frames if not f.inlined}
    assert scan.binaries[0].checked_by == "frames"
    assert offsets["ggml_abort"] == syms["ggml_abort"] + int(printed[b"ggml_abort"], 16)
    assert offsets["ggml_graph_compute_step"] == off
