"""The CuPy executor on a real GPU against the NumPy reference executor (data plane).

GIVEN the same rows, uploads and page tables on both executors, THEN set_rows writes the bytes
of quant.quantize_rows into the pinned host store, uploads copy whole pages into pool slots,
attention agrees within PARITY_ATOL for every K/V type, stale and foreign slots are read as
such, and the device ring reports what each kernel read. Skipped without CuPy or a GPU.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvdiag.errors import DeviceUnavailable
from kvdiag.executors import cuda_kernels as ck
from kvdiag.executors.device_records import kernel_events
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.executors.quant import quantize_rows
from kvdiag.kvstream.backend import HOST, StoreGeometry
from tests.kv_rows import fill_rows, store_geometry

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:::cupy")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cupy_exec() -> Any:
    pytest.importorskip("cupy", reason="CuPy is not installed")
    from kvdiag.executors import cupy_exec as mod

    try:
        mod.load_cupy()
    except DeviceUnavailable as exc:
        pytest.skip(f"no GPU: {exc}")
    return mod


def _report(line: str) -> None:
    path = os.environ.get("KVDIAG_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def geometry(type_k: str, type_v: str, head_dim: int = 256, n_head: int = 24,
             n_head_kv: int = 4, kv_size: int = 1024, n_stream: int = 2, pool_pages: int = 8,
             n_layers: int = 2) -> StoreGeometry:
    return store_geometry(type_k, type_v, head_dim, n_head, n_head_kv, kv_size, n_stream,
                          pool_pages, n_layers)


def host_rows(ex: Any, layer: int, stream: int, tensor: str) -> np.ndarray:
    g = ex.geom
    row = ex.row_k if tensor == "k" else ex.row_v
    buf = (ctypes.c_uint8 * (g.kv_size * row)).from_address(ex.host_pointer(layer, stream, tensor))
    return np.ctypeslib.as_array(buf).reshape(g.kv_size, row).copy()


def both(geom: StoreGeometry, cupy_exec: Any, **kw: Any) -> tuple[Any, NumpyExecutor]:
    ex = cupy_exec.CupyExecutor(**kw)
    ex.setup(geom)
    ref = NumpyExecutor()
    ref.setup(geom)
    return ex, ref


@pytest.mark.parametrize("type_name", ck.TYPE_IDS)
def test_set_rows_writes_the_reference_quantizer_bytes(cupy_exec: Any, type_name: str) -> None:
    geom = geometry(type_name, type_name, head_dim=128, n_head=8, n_head_kv=2, kv_size=512)
    ex = cupy_exec.CupyExecutor()
    ex.setup(geom)
    try:
        rng = np.random.default_rng(11)
        cells = np.array([3, 4, 5, 255, 256, 300, 511], np.int64)
        k = rng.standard_normal((len(cells), 256), dtype=np.float32) * np.float32(4)
        v = rng.standard_normal((len(cells), 256), dtype=np.float32)
        k[0] = 0.0
        v[1, :32] = np.float32(-2.5)
        ex.write_rows(1, 1, cells, k, v)
        ex.synchronize()
        got_k, got_v = host_rows(ex, 1, 1, "k"), host_rows(ex, 1, 1, "v")
        np.testing.assert_array_equal(got_k[cells], quantize_rows(type_name, k))
        np.testing.assert_array_equal(got_v[cells], quantize_rows(type_name, v))
        others = np.setdiff1d(np.arange(512), cells)
        assert not got_k[others].any() and not host_rows(ex, 1, 0, "k").any()
    finally:
        ex.close()


PAIRS = [(t, t) for t in ck.TYPE_IDS] + [("q8_0", "q5_1"), ("q8_0", "q4_0"), ("f16", "q8_0")]


@pytest.mark.parametrize(("type_k", "type_v"), PAIRS)
def test_decode_and_prefill_match_numpy(cupy_exec: Any, type_k: str, type_v: str) -> None:
    geom = geometry(type_k, type_v)
    ex, ref = both(geom, cupy_exec)
    try:
        fill_rows(geom, (ex, ref), 1, 1000, seed=len(type_k + type_v))
        for e in (ex, ref):
            e.upload(1, 0, 0, 2, 2)  # stream 0 pages 0-1 -> slots 2-3 (one batch)
            e.upload(1, 1, 3, 1, 0)  # stream 1 page 3 -> slot 0 (a ring slot)
        table = np.array([[2, 3, HOST, HOST], [HOST, HOST, HOST, 0]], np.int64)
        rng = np.random.default_rng(5)
        worst = 0.0
        for tokens, pos in ((1, [[999], [900]]), (7, [[0, 1, 100, 255, 256, 700, 999]] * 2)):
            q = rng.standard_normal((2, tokens, 24, 256), dtype=np.float32)
            positions = np.array(pos, np.int64)
            want = ref.attend(1, (0, 1), q, positions, 1024, table)
            got = ex.attend(1, (0, 1), q, positions, 1024, table)
            assert np.isfinite(got).all()
            err = float(np.abs(got - want).max())
            worst = max(worst, err)
            assert err <= cupy_exec.PARITY_ATOL, (tokens, err)
            # the ordinary fallback (every page zero-copy from the host store) agrees too
            host = np.full_like(table, HOST)
            err_h = float(np.abs(ex.attend(1, (0, 1), q, positions, 1024, host)
                                 - ref.attend(1, (0, 1), q, positions, 1024, host)).max())
            worst = max(worst, err_h)
            assert err_h <= cupy_exec.PARITY_ATOL
        _report(f"parity {type_k}/{type_v} D=256 24/4 heads: max |cupy-numpy| = {worst:.2e}")
    finally:
        ex.close()


@pytest.mark.parametrize(("type_k", "type_v"), [("q8_0", "q5_1"), ("f16", "f16")])
def test_an_explicit_kq_mask_matches_numpy(cupy_exec: Any, type_k: str, type_v: str) -> None:
    # GIVEN one stream holding two sequences' cells interleaved (a unified KV cache)
    geom = geometry(type_k, type_v, n_stream=1)
    ex, ref = both(geom, cupy_exec)
    try:
        fill_rows(geom, (ex, ref), 0, 1000, seed=3)
        for e in (ex, ref):
            e.upload(0, 0, 1, 2, 2)
        table = np.array([[HOST, 2, 3, HOST]], np.int64)
        rng = np.random.default_rng(8)
        owner = rng.integers(0, 2, 1024)
        order = np.zeros(1024, np.int64)
        for s in (0, 1):
            order[owner == s] = np.arange(int((owner == s).sum()))
        seqs, pos = np.array([0, 1, 1, 0]), np.array([500, 3, 480, 10])
        mask = ((owner[None, :] == seqs[:, None]) & (order[None, :] <= pos[:, None]))[None]
        q = rng.standard_normal((1, 4, 24, 256), dtype=np.float32)
        worst = 0.0
        # WHEN both executors attend with the mask, resident pages and host pages alike
        for tab in (table, np.full_like(table, HOST)):
            want = ref.attend_masked(0, (0,), q, mask, 1024, tab)
            got = ex.attend_masked(0, (0,), q, mask, 1024, tab)
            # THEN they agree, and the mask (not the positions) decided
            worst = max(worst, float(np.abs(got - want).max()))
            assert worst <= cupy_exec.PARITY_ATOL
            causal = ref.attend(0, (0,), q, pos[None, :], 1024, tab)
            assert float(np.abs(got - causal).max()) > 10 * cupy_exec.PARITY_ATOL
        _report(f"parity {type_k}/{type_v} with a KQ mask (unified stream, two sequences): "
                f"max |cupy-numpy| = {worst:.2e}")
    finally:
        ex.close()


@pytest.mark.parametrize(("type_k", "type_v", "head_dim", "n_head", "n_head_kv"), [
    ("q8_0", "q4_1", 128, 8, 2), ("q5_0", "q8_0", 96, 4, 1), ("f16", "f16", 64, 16, 2),
    ("q4_0", "q5_1", 64, 6, 3),
])
def test_other_head_dims_and_group_sizes(cupy_exec: Any, type_k: str, type_v: str,
                                         head_dim: int, n_head: int, n_head_kv: int) -> None:
    geom = geometry(type_k, type_v, head_dim, n_head, n_head_kv, kv_size=768, n_stream=1)
    ex, ref = both(geom, cupy_exec)
    try:
        fill_rows(geom, (ex, ref), 0, 768, seed=head_dim)
        for e in (ex, ref):
            e.upload(0, 0, 1, 2, 5)
        table = np.array([[HOST, 5, 6]], np.int64)
        q = np.random.default_rng(3).standard_normal((1, 3, n_head, head_dim), dtype=np.float32)
        positions = np.array([[40, 600, 767]], np.int64)
        err = float(np.abs(ex.attend(0, (0,), q, positions, 768, table)
                           - ref.attend(0, (0,), q, positions, 768, table)).max())
        # the ordinary kernel: blocks of heads_per_block(n_head_kv) heads sharing each tile
        host = np.full_like(table, HOST)
        err_h = float(np.abs(ex.attend(0, (0,), q, positions, 768, host)
                             - ref.attend(0, (0,), q, positions, 768, host)).max())
        _report(f"parity {type_k}/{type_v} D={head_dim} {n_head}/{n_head_kv} heads "
                f"(copy unit {ex.layout.vec} B): max |cupy-numpy| = {err:.2e}, "
                f"ordinary kernel ({ex.launch_shape[False][0]} heads a block) {err_h:.2e}")
        assert err <= cupy_exec.PARITY_ATOL
        assert err_h <= cupy_exec.PARITY_ATOL
    finally:
        ex.close()


def test_driver_launch_with_and_without_pdl_equals_cupys_launch(cupy_exec: Any) -> None:
    """The merge kernel as a programmatic dependent launch (cuLaunchKernelEx), as a plain
    driver launch and through CuPy: the same kernels on the same bytes give the same bits,
    also inside a CUDA graph."""
    import dataclasses

    geom = geometry("q8_0", "q5_1", kv_size=4096, n_stream=1, pool_pages=16, n_layers=1)
    ex = cupy_exec.CupyExecutor(instrument=False)
    ex.setup(geom)
    try:
        fill_rows(geom, (ex,), 0, 4096, seed=9)
        ex.upload(0, 0, 0, 16, 0)
        q = np.random.default_rng(4).standard_normal((1, 1, 24, 256), dtype=np.float32)
        pos = np.array([[4095]])
        cp = ex.cp
        outs = {}
        for table in (np.arange(16, dtype=np.int64)[None, :], np.full((1, 16), HOST)):
            launch = ex.prepare_attend(0, (0,), q, pos, 4096, table)
            variants = {"pdl": launch, "driver": dataclasses.replace(launch, programmatic=False),
                        "cupy": dataclasses.replace(launch, launcher=None)}
            for name, v in variants.items():
                with ex._stream:
                    v.out[...] = cp.nan
                    if name == "pdl":  # replayed from a graph, as the benchmark times it
                        ex._stream.begin_capture()
                        v.run()
                        graph = ex._stream.end_capture()
                        graph.launch(ex._stream)
                    else:
                        v.run()
                    ex._stream.synchronize()
                outs[(int(table[0, 0]), name)] = cp.asnumpy(v.out)
        for paged in (0, HOST):
            assert np.isfinite(outs[(paged, "pdl")]).all()
            np.testing.assert_array_equal(outs[(paged, "pdl")], outs[(paged, "driver")])
            np.testing.assert_array_equal(outs[(paged, "pdl")], outs[(paged, "cupy")])
        assert ex.launcher is not None
        _report(f"launch paths: driver launcher present, programmatic dependent launch "
                f"{'on' if ex.programmatic else 'off'} (cc {ex.compute_capability}); PDL, plain "
                f"driver and CuPy launches bit-identical")
    finally:
        ex.close()


def test_uploads_copy_whole_pages_into_slots_in_batches_of_32(cupy_exec: Any) -> None:
    geom = geometry("q8_0", "q5_1", head_dim=64, n_head=4, n_head_kv=1, kv_size=40 * 256,
                    n_stream=2, pool_pages=40)
    ex = cupy_exec.CupyExecutor()
    ex.setup(geom)
    try:
        fill_rows(geom, (ex,), 0, 40 * 256, seed=9)
        ex.upload(0, 1, 4, 32, 8)
        ex.synchronize()
        pool = ex.cp.asnumpy(ex.cp.ndarray(
            (geom.pool_pages, geom.page_bytes), ex.cp.uint8,
            ex.cp.cuda.MemoryPointer(ex._pool, 0)))
        hk, hv = host_rows(ex, 0, 1, "k"), host_rows(ex, 0, 1, "v")
        for j in range(32):
            page = 4 + j
            k_bytes = hk[page * 256:(page + 1) * 256].reshape(-1)
            v_bytes = hv[page * 256:(page + 1) * 256].reshape(-1)
            np.testing.assert_array_equal(pool[8 + j, :k_bytes.size], k_bytes)
            np.testing.assert_array_equal(pool[8 + j, geom.v_offset:geom.v_offset + v_bytes.size],
                                          v_bytes)
        assert not pool[:8].any()  # slots before the batch untouched
        recs = ex.drain_records()
        ups = recs.rows[recs.rows[:, 0] == ck.KERNEL_IDS["upload"]]
        assert sorted(ups[:, 4].tolist()) == list(range(4, 36))
        assert sorted(ups[:, 6].tolist()) == list(range(8, 40))
    finally:
        ex.close()


def test_stale_and_foreign_slots_are_read_as_the_reference_reads_them(cupy_exec: Any) -> None:
    geom = geometry("q8_0", "q5_1", kv_size=512)
    ex, ref = both(geom, cupy_exec)
    try:
        fill_rows(geom, (ex, ref), 0, 512, seed=1)
        for e in (ex, ref):
            e.upload(0, 0, 0, 1, 4)  # slot 4 holds stream 0 page 0
        table = np.array([[4, HOST], [4, HOST]], np.int64)  # stream 1 reads it too: foreign
        q = np.random.default_rng(2).standard_normal((2, 1, 24, 256), dtype=np.float32)
        pos = np.array([[511], [511]], np.int64)
        got = ex.attend(0, (0, 1), q, pos, 512, table)
        want = ref.attend(0, (0, 1), q, pos, 512, table)
        np.testing.assert_allclose(got, want, rtol=0, atol=cupy_exec.PARITY_ATOL)
        exact = ex.attend(0, (0, 1), q, pos, 512, np.full_like(table, HOST))
        # same bytes: equal up to the summation order of the two kernels' block shapes
        np.testing.assert_allclose(got[0], exact[0], rtol=0, atol=1e-5)
        assert np.abs(got[1] - exact[1]).max() > 20 * cupy_exec.PARITY_ATOL
        # the runner's shortcut: slot 4 holds stream 0's page 0, not stream 1's
        assert ex.reads_match_host(0, (0, 1), np.array([[4, HOST], [HOST, HOST]]))
        assert not ex.reads_match_host(0, (0, 1), table)
        assert ex.reads_match_host(0, (0, 1), np.full_like(table, HOST))
        # new rows for stream 0 page 0 without a re-upload: slot 4 is now stale
        rng = np.random.default_rng(4)
        k = rng.standard_normal((10, 1024), dtype=np.float32)
        for e in (ex, ref):
            e.write_rows(0, 0, np.arange(10, dtype=np.int64), k, k)
        got = ex.attend(0, (0, 1), q, pos, 512, table)
        want = ref.attend(0, (0, 1), q, pos, 512, table)
        np.testing.assert_allclose(got, want, rtol=0, atol=cupy_exec.PARITY_ATOL)
        stale = np.array([[4, HOST], [HOST, HOST]])
        assert not ex.reads_match_host(0, (0, 1), stale)
        assert ref.reads_match_host(0, (0, 1), stale) is False
        ex.upload(0, 0, 0, 1, 4)
        assert ex.reads_match_host(0, (0, 1), stale)
    finally:
        ex.close()


def test_the_device_ring_reports_writes_uploads_and_reads(cupy_exec: Any) -> None:
    geom = geometry("q8_0", "q5_1", kv_size=1024)
    ex = cupy_exec.CupyExecutor()
    ex.setup(geom)
    try:
        fill_rows(geom, (ex,), 1, 600, seed=3)
        ex.upload(1, 0, 0, 2, 3)
        ex.attend(1, (0, 1), np.ones((2, 1, 24, 256), np.float32),
                  np.array([[599], [599]], np.int64), 768,
                  np.array([[3, 4, HOST], [HOST, HOST, HOST]], np.int64))
        recs = ex.drain_records()
        assert recs.dropped == 0
        events = {(e["name"], e["layer"], e["stream"]): e for e in kernel_events(recs)}
        # rows 0..599 of each stream: global-row pages (stream * 1024 + cell) // 256
        assert events[("set_rows_k", 1, 1)]["ranges"] == ((4, 7, "host", -1),)
        assert events[("set_rows_v", 1, 0)]["ranges"] == ((0, 3, "host", -1),)
        assert events[("upload", 1, 0)]["ranges"] == ((0, 2, "pool", 3),)
        assert events[("fattn_streamed", 1, 0)]["ranges"] == ((0, 2, "pool", 3),
                                                               (2, 3, "host", -1))
        assert events[("fattn_streamed", 1, 1)]["ranges"] == ((0, 3, "host", -1),)
        assert len(ex.drain_records()) == 0
        # a ring too small keeps counting: the drain says how many were lost
        small = cupy_exec.CupyExecutor(ring_capacity=4)
        small.setup(geom)
        fill_rows(geom, (small,), 0, 600, seed=3)
        got = small.drain_records()
        assert len(got) == 4 and got.dropped > 0
        small.close()
        # instrumentation compiled out: no device records at all
        off = cupy_exec.CupyExecutor(instrument=False)
        off.setup(geom)
        fill_rows(geom, (off,), 0, 600, seed=3)
        off.attend(0, (0,), np.ones((1, 1, 24, 256), np.float32), np.array([[10]], np.int64),
                   256, np.array([[HOST]], np.int64))
        assert len(off.drain_records()) == 0
        off.close()
    finally:
        ex.close()


def test_pointers_are_the_real_pinned_and_device_addresses(cupy_exec: Any) -> None:
    geom = geometry("f16", "f16", head_dim=64, n_head=2, n_head_kv=1, kv_size=256)
    ex = cupy_exec.CupyExecutor()
    ex.setup(geom)
    try:
        rt = ex.cp.cuda.runtime
        host = rt.pointerGetAttributes(ex.host_pointer(1, 1))
        pool = rt.pointerGetAttributes(ex.pool_pointer())
        assert host.type == rt.memoryTypeHost and pool.type == rt.memoryTypeDevice
        assert ex.host_pointer(1, 1) - ex.host_pointer(1, 0) == 256 * ex.row_k
        amap = ex.address_map(n_streamed=2)
        assert amap.host_base == ex.host_pointer(0, 0) and amap.pool_base == ex.pool_pointer()
    finally:
        ex.close()


def test_a_cuda_fault_becomes_a_cuda_failure_with_cudas_text(cupy_exec: Any) -> None:
    # In a child process: an illegal address poisons the CUDA context for the whole process.
    script = f"""
import numpy as np, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.test_gpu_executor import geometry
from kvdiag.executors import cuda_kernels as ck
from kvdiag.executors.cupy_exec import CupyExecutor, CudaFailure
ex = CupyExecutor()
ex.setup(geometry("q8_0", "q8_0", kv_size=512))
launch = ex.prepare_attend(0, (0,), np.ones((1, 1, 24, 256), np.float32),
                           np.array([[300]]), 512, np.array([[1, 2]]))
bad = launch.params.copy()
bad[ck.FATTN_FIELDS.index("pool")] = 1 << 47
launch.params = bad
try:
    with ex._cuda("attention"), ex._stream:
        launch.run()
        ex.synchronize()
except CudaFailure as exc:
    print("CUDA-FAILURE:", exc.cuda_error, "| exit", exc.exit_code)
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("CUDA-FAILURE:")), None)
    assert line is not None, res.stdout + res.stderr
    assert "illegal memory access" in line or "cudaErrorIllegalAddress" in line
    assert line.endswith("| exit 3")
    _report(f"fault injection: {line}")


@pytest.mark.parametrize(("type_k", "type_v"), [("f16", "f16"), ("q8_0", "q5_1")])
def test_long_context_decode_matches_a_float64_reference(cupy_exec: Any, type_k: str,
                                                          type_v: str) -> None:
    """128K cells, 24/4 heads, D=256: the split-K path at full length against float64 math on
    the dequantized rows (and, for f16, torch's SDPA against the same reference)."""
    from kvdiag.executors.quant import dequantize_rows

    ctx, width = 131072, 1024
    geom = geometry(type_k, type_v, kv_size=ctx, n_stream=1, pool_pages=ctx // 256, n_layers=1)
    ex = cupy_exec.CupyExecutor()
    ex.setup(geom)
    try:
        rng = np.random.default_rng(21)
        k = rng.standard_normal((ctx, width), dtype=np.float32)
        v = rng.standard_normal((ctx, width), dtype=np.float32)
        ex.write_rows(0, 0, np.arange(ctx, dtype=np.int64), k, v)
        for p in range(0, ctx // 256, 32):
            ex.upload(0, 0, p, 32, p)
        q = rng.standard_normal((1, 1, 24, 256), dtype=np.float32)
        pos = np.array([[ctx - 1]], np.int64)
        pool = ex.attend(0, (0,), q, pos, ctx, np.arange(ctx // 256, dtype=np.int64)[None, :])
        host = ex.attend(0, (0,), q, pos, ctx, np.full((1, ctx // 256), HOST, np.int64))
        kd = dequantize_rows(type_k, quantize_rows(type_k, k), width).reshape(ctx, 4, 256)
        vd = dequantize_rows(type_v, quantize_rows(type_v, v), width).reshape(ctx, 4, 256)
        want = np.empty((24, 256))
        for h in range(24):
            s = kd[:, h // 6, :].astype(np.float64) @ q[0, 0, h].astype(np.float64) / 16.0
            w = np.exp(s - s.max())
            want[h] = (w @ vd[:, h // 6, :].astype(np.float64)) / w.sum()
        err_pool = float(np.abs(pool[0, 0] - want).max())
        err_host = float(np.abs(host[0, 0] - want).max())
        line = (f"long context {type_k}/{type_v} 128K: max |cupy-float64| pool {err_pool:.2e}, "
                f"host {err_host:.2e} (outputs up to {np.abs(want).max():.2e})")
        if type_k == "f16":
            try:
                import torch
                import torch.nn.functional as F

                tq = torch.tensor(q[0, 0][None, :, None, :], device="cuda")
                tk = torch.tensor(k.reshape(ctx, 4, 256).transpose(1, 0, 2)[None],
                                  device="cuda").half()
                tv = torch.tensor(v.reshape(ctx, 4, 256).transpose(1, 0, 2)[None],
                                  device="cuda").half()
                for name, args in (("f16", (tq.half(), tk, tv)),
                                   ("f32", (tq, tk.float(), tv.float()))):
                    t_out = F.scaled_dot_product_attention(*args, enable_gqa=True)
                    t_err = float(np.abs(t_out[0, :, 0].float().cpu().numpy() - want).max())
                    line += f"; torch SDPA {name} {t_err:.2e}"
            except Exception as exc:  # torch is optional here: only the report line
                line += f"; torch unavailable ({type(exc).__name__})"
        _report(line)
        assert err_pool <= cupy_exec.PARITY_ATOL and err_host <= cupy_exec.PARITY_ATOL
    finally:
        ex.close()
