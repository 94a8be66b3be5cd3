"""Every kernel source compiles with the machine's nvcc (``nvcc --ptx -arch=sm_90 -I kernels``),
with the event ring compiled in and out, so CI catches a kernel that no longer builds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvdiag.executors import cuda_kernels as ck

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
_LOCAL_NVCC = Path("/usr/local/bin/nvcc")
NVCC = shutil.which("nvcc") or (str(_LOCAL_NVCC) if _LOCAL_NVCC.exists() else None)

ATOMIC_ADD = re.compile(r"\batom(\.global)?\.add\.u32\b")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")


def _nvcc(src: Path, out: Path, *defines: str) -> subprocess.Popen[str]:
    assert NVCC is not None
    cmd = [NVCC, "--ptx", "-arch=sm_90", "-I", str(KERNELS), *defines, "-o", str(out), str(src)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_every_kernel_file_is_listed() -> None:
    assert sorted(p.name for p in KERNELS.glob("*.cu")) == sorted(ck.KERNEL_FILES)


@needs_nvcc
def test_kernels_compile_to_ptx_with_and_without_the_event_ring(tmp_path: Path) -> None:
    jobs = {}
    for name in ck.KERNEL_FILES:
        for flag in ("1", "0"):
            out = tmp_path / f"{name}.{flag}.ptx"
            jobs[(name, flag)] = (out, _nvcc(KERNELS / name, out, f"-DKVDIAG_INSTRUMENT={flag}"))
    for (name, flag), (out, proc) in jobs.items():
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} (KVDIAG_INSTRUMENT={flag}) failed:\n{log}"
        assert out.stat().st_size > 0
    # The explicit instantiations reach the PTX, and only the instrumented build appends to the
    # ring (an atomic add on its counter).
    fattn_on = (tmp_path / "fattn_paged.cu.1.ptx").read_text()
    fattn_off = (tmp_path / "fattn_paged.cu.0.ptx").read_text()
    entries = re.findall(r"\.entry\s+(\S+)\(", fattn_on)
    assert sum("kv_fattn_partial" in e for e in entries) == 11
    assert sum("kv_fattn_rows" in e for e in entries) == 11
    assert sum("kv_fattn_combine" in e for e in entries) == 4
    # the merge kernel waits for the partial results (programmatic dependent launch), the
    # partial kernels let it start early
    assert fattn_on.count("griddepcontrol.wait") == 4
    assert fattn_on.count("griddepcontrol.launch_dependents") == 22
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in fattn_on
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in fattn_on
    assert "cp.async.cg.shared.global" in fattn_on
    assert ATOMIC_ADD.search(fattn_on)
    assert not ATOMIC_ADD.search(fattn_off)
    rows_on = (tmp_path / "set_rows.cu.1.ptx").read_text()
    rows_off = (tmp_path / "set_rows.cu.0.ptx").read_text()
    assert len(re.findall(r"\.entry\s+\S*kv_set_rows", rows_on)) == 7
    assert ATOMIC_ADD.search(rows_on) and not ATOMIC_ADD.search(rows_off)


@needs_nvcc
def test_a_broken_kernel_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "kvdiag_platform.cuh"\n__global__ void k() { undefined_thing(); }\n')
    proc = _nvcc(bad, tmp_path / "bad.ptx")
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "undefined_thing" in log


def test_inlined_sources_need_no_include_path() -> None:
    for name in ck.KERNEL_FILES:
        text = ck.kernel_source(name)
        assert '#include "' not in text
        assert text.count("#pragma once") <= 3  # each header inlined at most once


def test_parameter_blocks_match_the_kernel_structs() -> None:
    assert ck.struct_fields(ck.kernel_source("fattn_paged.cu"), "FattnParams") == ck.FATTN_FIELDS
    assert ck.struct_fields(ck.kernel_source("set_rows.cu"), "SetRowsParams") == ck.SET_ROWS_FIELDS
