"""The CUDA kernels, run on the CPU through the warp emulator in tests/kernel_emu, against the
NumPy reference executor and the bit-exact quantizers.

GIVEN kernel sources compiled as host C++ (g++ -std=c++20) with emulated mma/movmatrix/shuffles,
WHEN set_rows and the paged attention run over host arrays laid out exactly like the pinned
store and the device pool,
THEN set_rows bytes equal quant.quantize_rows and attention outputs match NumpyExecutor within
the tolerance the GPU executor states (f16 tensor-core operands).
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvdiag.executors import cuda_kernels as ck
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.executors.quant import dequantize_rows, quantize_rows
from kvdiag.kvstream.backend import HOST, StoreGeometry
from tests.kv_rows import fill_rows, store_geometry

ROOT = Path(__file__).resolve().parents[1]
EMU = ROOT / "tests" / "kernel_emu"
KERNELS = ROOT / "kernels"

#: |cupy - numpy| bound the CuPy executor states for unit-variance Q/K/V (f16 operands).
ATOL = 6e-3


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctypes.CDLL]:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found: the kernel emulator needs a C++20 compiler")
    sources = [EMU / "emu.hpp", EMU / "harness.cpp", *sorted(KERNELS.glob("*.cu*"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    lib = tmp_path_factory.mktemp("kvemu") / f"libkvemu-{digest}.so"
    # -U_FORTIFY_SOURCE: the fibers switch stacks with _longjmp, which the fortified
    # __longjmp_chk of some distributions' default flags would refuse.
    # KVDIAG_KQ_MASK=1: the build that can apply an explicit KQ mask (the GPU executor's
    # masked build; without a mask both builds compute the same)
    cmd = [cxx, "-std=c++20", "-O1", "-U_FORTIFY_SOURCE", "-shared", "-fPIC", "-pthread",
           "-DKVDIAG_KQ_MASK=1", "-I", str(KERNELS),
           str(EMU / "harness.cpp"), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        if "barrier" in res.stderr and "No such file" in res.stderr:
            pytest.skip("the C++ standard library lacks <barrier> (C++20)")
        pytest.fail(f"emulator build failed:\n{res.stderr[-4000:]}")
    dll = ctypes.CDLL(str(lib))
    i, vp = ctypes.c_int, ctypes.c_void_p
    dll.emu_fattn.argtypes = [i, i, i, i, i, vp, i, i, i, i, i]
    dll.emu_fattn_warp_bytes.argtypes = [i, i, i, i]
    dll.emu_set_rows.argtypes = [i, vp, i, i, i]
    yield dll


def _ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


# --- set_rows ------------------------------------------------------------------------------


def _rows_with_edge_cases(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    x = rng.standard_normal((n, width), dtype=np.float32) * np.float32(3.0)
    x[0, :32] = 0.0  # an all-zero block: d = 0, 1/d = 0
    x[0, 32:64] = 1.25  # constant block: max == min
    x[1, :32] = np.where(np.arange(32) % 2 == 0, -0.0, 0.0).astype(np.float32)
    x[1, 40] = -x[1, 41]  # equal magnitudes of both signs: the first one wins
    x[2, :32] *= np.float32(1e-6)
    return x


@pytest.mark.parametrize("type_name", list(ck.TYPE_IDS))
def test_set_rows_bytes_equal_the_numpy_quantizer(emu: ctypes.CDLL, type_name: str) -> None:
    rng = np.random.default_rng(7)
    width, kv_size, n_stream, stream = 128, 64, 2, 1
    cells = np.array([5, 6, 7, 40, 41, 3], np.int32)
    x = _rows_with_edge_cases(rng, len(cells), width)
    row_bytes = width // 32 * ck.BLOCK32_BYTES[type_name]
    dst = np.zeros((n_stream * kv_size, row_bytes), np.uint8)
    counter = np.zeros(1, np.uint32)
    records = np.zeros((64, 8), np.int32)
    params = ck.pack(ck.SET_ROWS_FIELDS, {
        "magic": ck.SET_ROWS_MAGIC, "src": _ptr(x), "cells": _ptr(cells), "dst": _ptr(dst),
        "row_bytes": row_bytes, "kv_size": kv_size, "stream": stream, "n": len(cells),
        "width": width, "page_tokens": 16, "ring_counter": _ptr(counter),
        "ring_records": _ptr(records), "ring_capacity": 64, "layer": 3,
        "kernel_id": ck.KERNEL_IDS["set_rows_k"],
    })
    assert emu.emu_set_rows(ck.TYPE_IDS[type_name], _ptr(params), 2, 64, 128) == 0
    want = quantize_rows(type_name, x)
    got = dst[stream * kv_size + cells]
    np.testing.assert_array_equal(got, want)
    # untouched rows stay zero
    mask = np.ones(n_stream * kv_size, bool)
    mask[stream * kv_size + cells] = False
    assert not dst[mask].any()
    # one record per run of cells in one page (page_tokens 16): cells 5-7 | 40-41 | 3
    n = int(counter[0])
    got_pages = sorted((int(r[4]), int(r[7])) for r in records[:n])
    assert got_pages == [(64 // 16 + 0, 0), (64 // 16 + 0, 0), (64 // 16 + 2, 2)]
    assert all(r[0] == ck.KERNEL_IDS["set_rows_k"] and r[2] == 3 and r[3] == 1 and r[5] == 2
               for r in records[:n])


# --- attention -----------------------------------------------------------------------------


class _EmuStore:
    """Host store and pool laid out as the CuPy executor lays them out, in NumPy arrays."""

    def __init__(self, geom: StoreGeometry) -> None:
        self.g = geom
        width = geom.head_dim * geom.n_head_kv
        self.row_k = width // 32 * ck.BLOCK32_BYTES[geom.type_k]
        self.row_v = width // 32 * ck.BLOCK32_BYTES[geom.type_v]
        rows = geom.n_stream * geom.kv_size
        self.k = [np.zeros((rows, self.row_k), np.uint8) for _ in range(geom.n_layers)]
        self.v = [np.zeros((rows, self.row_v), np.uint8) for _ in range(geom.n_layers)]
        self.pool = np.zeros(geom.pool_pages * geom.page_bytes, np.uint8)

    def write_rows(self, layer: int, stream: int, cells: np.ndarray, k: np.ndarray,
              v: np.ndarray) -> None:
        r = stream * self.g.kv_size + cells
        self.k[layer][r] = quantize_rows(self.g.type_k, k)
        self.v[layer][r] = quantize_rows(self.g.type_v, v)

    def upload(self, layer: int, stream: int, page: int, n: int, slot: int) -> None:
        pt, pb = self.g.page_tokens, self.g.page_bytes
        for j in range(n):
            r0 = stream * self.g.kv_size + (page + j) * pt
            base = (slot + j) * pb
            kb = self.k[layer][r0:r0 + pt].reshape(-1)
            vb = self.v[layer][r0:r0 + pt].reshape(-1)
            self.pool[base:base + kb.size] = kb
            self.pool[base + self.g.v_offset:base + self.g.v_offset + vb.size] = vb

    def attend(self, emu: ctypes.CDLL, layer: int, streams: tuple[int, ...], q: np.ndarray,
               positions: np.ndarray, n_kv: int, table: np.ndarray, sm_count: int = 3,
               regs: int = 168, grid_order: int = 0, interleave: int = 0,
               kv_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        g = self.g
        ns, tokens, n_head, d = q.shape
        lay = ck.fattn_layout(g.type_k, g.type_v, d, g.n_head_kv, g.page_bytes, g.v_offset)
        paged = not bool((table == HOST).all())
        shape = ck.warps_per_block(lay, ck.DeviceLimits(sm_count=sm_count), regs, paged)
        geo = ck.launch_geometry(lay, shape, sm_count, paged, ns, tokens * (n_head // g.n_head_kv),
                                 n_kv, grid_order)
        q32 = np.ascontiguousarray(q, np.float32)
        pos = np.ascontiguousarray(positions, np.int32)
        tab = np.ascontiguousarray(table, np.int32)
        st = np.array(streams, np.int32)
        items = geo.items
        bits = None if kv_mask is None else ck.mask_words(kv_mask)
        part_o = np.full(items * 8 * d, np.nan, np.float32)
        part_ml = np.full(items * 16, np.nan, np.float32)
        out = np.full((ns, tokens, n_head, d), np.nan, np.float32)
        counter = np.zeros(1, np.uint32)
        records = np.zeros((4096, 8), np.int32)
        params = ck.fattn_params(g, lay, geo, paged, {
            "q": _ptr(q32), "positions": _ptr(pos), "page_table": _ptr(tab), "streams": _ptr(st),
            "host_k": _ptr(self.k[layer]), "host_v": _ptr(self.v[layer]), "pool": _ptr(self.pool),
            "part_o": _ptr(part_o), "part_ml": _ptr(part_ml), "out": _ptr(out),
            "kv_mask": 0 if bits is None else _ptr(bits), "ring_counter": _ptr(counter),
            "ring_records": _ptr(records), "ring_capacity": 4096,
        }, layer=layer, ns=ns, tokens=tokens, n_kv=n_kv, n_pages_tab=tab.shape[1], ring_slots=1,
            grid_order=grid_order, interleave=interleave,
            mask_words=0 if bits is None else bits.shape[-1])
        assert emu.emu_fattn_warp_bytes(ck.TYPE_IDS[g.type_k], ck.TYPE_IDS[g.type_v], d,
                                        int(paged)) == lay.warp_bytes_for(paged)
        rc = emu.emu_fattn(ck.TYPE_IDS[g.type_k], ck.TYPE_IDS[g.type_v], d, lay.vec, int(paged),
                           _ptr(params), *geo.grid, geo.block, geo.smem)
        assert rc == 0, f"combination {g.type_k}/{g.type_v}/{d}/vec {lay.vec} not in the harness"
        return out, records[: int(counter[0])]


def _geometry(type_k: str, type_v: str, head_dim: int, n_head: int, n_head_kv: int,
              kv_size: int = 512, n_stream: int = 2, pool_pages: int = 4) -> StoreGeometry:
    return store_geometry(type_k, type_v, head_dim, n_head, n_head_kv, kv_size, n_stream,
                          pool_pages)


CASES = [
    # type_k, type_v, head_dim, n_head, n_head_kv
    ("f16", "f16", 64, 4, 2),
    ("bf16", "bf16", 64, 4, 2),
    ("q8_0", "q8_0", 64, 6, 1),
    ("q4_0", "q4_0", 64, 4, 2),
    ("q4_1", "q4_1", 64, 4, 2),
    ("q5_0", "q5_0", 64, 4, 2),
    ("q5_1", "q5_1", 64, 4, 2),
    ("q8_0", "q4_1", 128, 6, 2),
    ("q5_0", "q8_0", 96, 2, 2),
]


@pytest.mark.parametrize(("type_k", "type_v", "head_dim", "n_head", "n_head_kv"), CASES)
def test_decode_over_pool_ring_and_host_pages_matches_numpy(
    emu: ctypes.CDLL, type_k: str, type_v: str, head_dim: int, n_head: int, n_head_kv: int
) -> None:
    geom = _geometry(type_k, type_v, head_dim, n_head, n_head_kv)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    layer = 1
    fill_rows(geom, (store, ref), layer, 500, seed=head_dim + n_head)
    # stream 1 page 0 -> slot 2 (resident); stream 0 page 1 -> slot 0 (a ring slot); page 0 of
    # stream 0 and page 1 of stream 1 read zero-copy from the host store.
    for args in ((layer, 1, 0, 1, 2), (layer, 0, 1, 1, 0)):
        store.upload(*args)
        ref.upload(*args)
    table = np.array([[HOST, 0], [2, HOST]], np.int64)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 1, n_head, head_dim), dtype=np.float32)
    positions = np.array([[499], [300]], np.int64)  # stream 1 sees a partial second page
    want = ref.attend(layer, (0, 1), q, positions, 512, table)
    got, recs = store.attend(emu, layer, (0, 1), q, positions, 512, table)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # slot 2 refilled with stream 0's page 0 (a foreign read): the kernel reads what the slot
    # holds, exactly as the reference does
    store.upload(layer, 0, 0, 1, 2)
    ref.upload(layer, 0, 0, 1, 2)
    foreign_want = ref.attend(layer, (0, 1), q, positions, 512, table)
    foreign, _ = store.attend(emu, layer, (0, 1), q, positions, 512, table)
    np.testing.assert_allclose(foreign, foreign_want, rtol=0, atol=ATOL)
    assert np.abs(foreign[1] - got[1]).max() > 10 * ATOL
    np.testing.assert_array_equal(foreign[0], got[0])
    # device records: every page each block read, with its source and slot
    seen = {(int(r[3]), int(r[4]), ck.SOURCE_NAMES[int(r[5])], int(r[6])) for r in recs}
    assert seen == {(0, 0, "host", -1), (0, 1, "ring", 0), (1, 0, "pool", 2), (1, 1, "host", -1)}
    assert {int(r[0]) for r in recs} == {ck.KERNEL_IDS["fattn_streamed"]}
    assert {int(r[2]) for r in recs} == {layer}


def test_prefill_with_causal_mask_and_gqa_rows_matches_numpy(emu: ctypes.CDLL) -> None:
    geom = _geometry("q8_0", "q5_1", 256, 6, 2, kv_size=512, n_stream=1, pool_pages=3)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    fill_rows(geom, (store, ref), 0, 512, seed=3)
    store.upload(0, 0, 0, 2, 1)
    ref.upload(0, 0, 0, 2, 1)
    rng = np.random.default_rng(2)
    tokens = 5  # 5 tokens x 3 heads per KV head = 15 rows: two row tiles, the second partial
    q = rng.standard_normal((1, tokens, 6, 256), dtype=np.float32)
    positions = np.array([[0, 17, 255, 256, 400]], np.int64)
    table = np.array([[1, 2]], np.int64)
    want = ref.attend(0, (0,), q, positions, 512, table)
    got, _ = store.attend(emu, 0, (0,), q, positions, 512, table)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # token 0 sees only cell 0: its output is V[0] of its KV head exactly up to f16 rounding
    v0 = dequantize_rows(geom.type_v, store.v[0][0], 256 * 2).reshape(2, 256)
    np.testing.assert_allclose(got[0, 0, :3], np.broadcast_to(v0[0], (3, 256)), atol=2e-3)
    np.testing.assert_allclose(got[0, 0, 3:], np.broadcast_to(v0[1], (3, 256)), atol=2e-3)


def test_ordinary_fallback_reads_only_the_host_store(emu: ctypes.CDLL) -> None:
    geom = _geometry("f16", "f16", 256, 8, 1, kv_size=512, n_stream=2, pool_pages=2)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    fill_rows(geom, (store, ref), 0, 512, seed=4)
    store.pool[:] = 0xFF  # NaN everywhere in the pool: any pool read would show
    table = np.full((2, 2), HOST, np.int64)
    q = np.random.default_rng(5).standard_normal((2, 1, 8, 256), dtype=np.float32)
    positions = np.array([[511], [128]], np.int64)
    want = ref.attend(0, (0, 1), q, positions, 512, table)
    got, recs = store.attend(emu, 0, (0, 1), q, positions, 512, table)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert {int(r[0]) for r in recs} == {ck.KERNEL_IDS["fattn_ordinary"]}
    assert {ck.SOURCE_NAMES[int(r[5])] for r in recs} == {"host"}
    # stream 1 stops at cell 128: only page 0 is read for it
    assert {int(r[4]) for r in recs if r[3] == 1} == {0}


@pytest.mark.parametrize(("type_k", "type_v", "head_dim", "n_head", "n_head_kv", "warps"), [
    ("q8_0", "q5_1", 256, 8, 4, 4),  # one group: each tile is 16 whole K and V rows
    ("q4_1", "q5_1", 128, 12, 6, 3),  # two groups of 3 heads: half rows
])
def test_ordinary_kernel_blocks_share_whole_rows_across_their_heads(
    emu: ctypes.CDLL, type_k: str, type_v: str, head_dim: int, n_head: int, n_head_kv: int,
    warps: int
) -> None:
    geom = _geometry(type_k, type_v, head_dim, n_head, n_head_kv, kv_size=512, n_stream=2)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    fill_rows(geom, (store, ref), 0, 500, seed=21)
    table = np.full((2, 2), HOST, np.int64)
    tokens = 3  # prefill rows of both streams; stream 1 ends inside a 16-cell tile
    q = np.random.default_rng(6).standard_normal((2, tokens, n_head, head_dim), np.float32)
    positions = np.array([[497, 498, 499], [40, 41, 300]], np.int64)
    lay = ck.fattn_layout(type_k, type_v, head_dim, n_head_kv, geom.page_bytes, geom.v_offset)
    assert ck.warps_per_block(lay, ck.DeviceLimits(sm_count=3), 168, paged=False)[0] == warps
    want = ref.attend(0, (0, 1), q, positions, 512, table)
    got, recs = store.attend(emu, 0, (0, 1), q, positions, 512, table)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # every head of every stream recorded the pages it read, from the host store
    assert {(int(r[3]), int(r[7])) for r in recs} == {
        (s, h) for s in (0, 1) for h in range(n_head_kv)}
    assert {(int(r[3]), int(r[4])) for r in recs} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert {ck.SOURCE_NAMES[int(r[5])] for r in recs} == {"host"}


@pytest.mark.parametrize(("grid_order", "interleave"), [(1, 0), (0, 1), (1, 1)])
def test_launch_layouts_compute_the_same_and_record_each_page_once(
    emu: ctypes.CDLL, grid_order: int, interleave: int
) -> None:
    geom = _geometry("q4_1", "q5_1", 128, 8, 2, kv_size=1024, n_stream=1, pool_pages=4)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    fill_rows(geom, (store, ref), 0, 1000, seed=12)
    store.upload(0, 0, 1, 2, 1)
    ref.upload(0, 0, 1, 2, 1)
    table = np.array([[HOST, 1, 2, HOST]], np.int64)
    q = np.random.default_rng(8).standard_normal((1, 1, 8, 128), dtype=np.float32)
    positions = np.array([[999]], np.int64)
    want = ref.attend(0, (0,), q, positions, 1024, table)
    base, base_recs = store.attend(emu, 0, (0,), q, positions, 1024, table, sm_count=8)
    got, recs = store.attend(emu, 0, (0,), q, positions, 1024, table, sm_count=8,
                             grid_order=grid_order, interleave=interleave)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # only the order of the online-softmax merges moves (and with it the f16 rounding of P)
    np.testing.assert_allclose(got, base, rtol=0, atol=1e-4)

    def pages(rs: np.ndarray) -> set[tuple[int, int, int, int]]:
        return {(int(r[7]), int(r[4]), int(r[5]), int(r[6])) for r in rs}

    # every page read is recorded for every KV head, with its source and slot; interleaved
    # splits record each page exactly once per head (contiguous splits: once per block that
    # touched it)
    assert pages(recs) == pages(base_recs)
    assert {(p, s) for _h, p, _src, s in pages(recs)} == {(0, -1), (1, 1), (2, 2), (3, -1)}
    assert {h for h, *_ in pages(recs)} == {0, 1}
    if interleave:
        assert len(recs) == 2 * 4


@pytest.mark.parametrize("host_only", [False, True])
def test_explicit_kq_mask_of_a_unified_stream_matches_numpy(emu: ctypes.CDLL,
                                                             host_only: bool) -> None:
    # GIVEN one stream holding two sequences' cells interleaved (a unified cache), and a
    # prefill ubatch whose rows belong to either sequence
    geom = _geometry("q4_1", "q5_1", 128, 8, 2, kv_size=1024, n_stream=1, pool_pages=4)
    store, ref = _EmuStore(geom), NumpyExecutor()
    ref.setup(geom)
    fill_rows(geom, (store, ref), 0, 700, seed=17)
    store.upload(0, 0, 1, 2, 1)
    ref.upload(0, 0, 1, 2, 1)
    table = (np.full((1, 3), HOST, np.int64) if host_only
             else np.array([[HOST, 1, 2]], np.int64))
    rng = np.random.default_rng(4)
    n_kv = 768  # three pages; cells 700.. hold no sequence
    owner = np.concatenate([rng.integers(0, 2, 700), np.full(68, 2)])  # each cell's sequence
    order = np.zeros(n_kv, np.int64)  # its position within that sequence
    for s in (0, 1):
        order[owner == s] = np.arange(int((owner == s).sum()))
    tokens = 5
    seqs = np.array([0, 1, 1, 0, 1])
    pos = np.array([40, 10, 300, 333, 0])  # the last row sees one cell
    mask = (owner[None, :] == seqs[:, None]) & (order[None, :] <= pos[:, None])
    mask[4] = False
    mask[4, int(np.flatnonzero(owner == 1)[0])] = True
    kv_mask = mask[None, :, :]
    q = rng.standard_normal((1, tokens, 8, 128), dtype=np.float32)
    # WHEN the kernels run with the mask (positions then only bound the cells at n_kv)
    want = ref.attend_masked(0, (0,), q, kv_mask, n_kv, table)
    got, _ = store.attend(emu, 0, (0,), q, np.full((1, tokens), n_kv - 1, np.int64), n_kv,
                          table, kv_mask=kv_mask)
    # THEN each row attends exactly its own sequence's visible cells
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    causal = ref.attend(0, (0,), q, pos[None, :], n_kv, table)
    assert np.abs(got - causal).max() > 10 * ATOL  # the mask is what decides, not positions

