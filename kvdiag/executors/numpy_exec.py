"""The NumPy reference executor: ggml block storage, page copies and attention on the CPU.

Host pages and pool slots hold the real quantized bytes (kvdiag.executors.quant, bit-exact
with ggml), so a pool slot that the bookkeeping left stale or filled with another stream's
bytes changes the numbers exactly as it would on the GPU.

Speed (project issue 12) without changing a bit of the results: dequantized views are kept
between steps within a memory bound (kvdiag.executors.kv_views); the streamed read and the
fully resident reference share one view per (layer, stream); and the work of each KV head is
spread over threads where NumPy releases the GIL. Decode products (a few query rows per head)
go through compiled kernels that round exactly as the einsum calls they replace
(kvdiag.executors.cpu_kernels, checked against einsum before use; einsum where they cannot be
built); prefill products stay one BLAS GEMM over the whole batch of heads; only per-head
pieces that do not change a row's arithmetic run apart. tests/test_capture_cache.py
compares captures with recordings made before these changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from kvdiag.errors import UsageError
from kvdiag.executors import cpu_kernels
from kvdiag.executors.kv_views import Page, View, ViewCache, dequantize_page
from kvdiag.executors.quant import quantize_rows
from kvdiag.kvstream.backend import HOST, F32Array, I64Array, StoreGeometry
from kvdiag.kvstream.ggml_types import ggml_type

_PageKey = tuple[int, int, int]
_Patches = dict[int, tuple[F32Array | None, F32Array | None]]

QUERY_CHUNK = 256
"""Query tokens per score matrix: bounds prefill memory to [hkv, 256 × group, n_kv] floats."""

SMALL_ROWS = 32
"""Query rows per KV head up to which products skip BLAS (einsum or the compiled kernels):
OpenBLAS's threaded GEMM costs ~10x more than the arithmetic at that size."""

PEAK_BYTES_PER_SHAPE = 1.5
"""Memory target (issue 12): peak RSS at most 1.5x the quantized K/V bytes of the shape."""
VIEW_RESERVE = 128 << 20
"""Kept out of the view budget for the interpreter, the scratch view and score matrices."""
VIEW_FLOOR = 256 << 20
"""Views may always take this much: below it a shape is smaller than the interpreter."""

THREADS_ENV = "KVDIAG_NUMPY_THREADS"
"""Threads for the per-head attention work (default: the CPUs this process may use)."""
KEEP_VIEWS_ENV = "KVDIAG_NUMPY_KEEP_VIEWS"
"""``0``: keep no dequantized view between reads (each read dequantizes its pages again), for
measuring what the views save."""


def _env_threads() -> int | None:
    text = os.environ.get(THREADS_ENV)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{THREADS_ENV} must be a positive integer, got {text!r}")
    return int(text)


def available_cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def _softmax_rows(scores: F32Array, bias: F32Array, scale: np.float32, tokens: int) -> None:
    """Scaled, masked softmax over the last axis of ``scores`` ``[h, tokens × group, n_kv]``,
    in place; ``bias`` ``[tokens, n_kv]`` is 0 where visible, -inf elsewhere. Element-wise
    operations and one reduction per row: a slice of heads gives the same bits as the whole."""
    scores *= scale
    s = scores.reshape(scores.shape[0], tokens, -1, scores.shape[-1])
    s += bias[None, :, None, :]
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)


class NumpyExecutor:
    name = "numpy"

    def __init__(self, threads: int | None = None, keep_views: bool | None = None) -> None:
        self.geom: StoreGeometry | None = None
        self._host: dict[_PageKey, Page] = {}
        self._pool: dict[int, Page] = {}
        self._views: ViewCache | None = None
        # (pool serial, host serial, host version) -> (K bytes equal, V bytes equal)
        self._same: dict[tuple[int, int, int], tuple[bool, bool]] = {}
        self._threads = threads if threads is not None else (_env_threads() or available_cpus())
        if keep_views is None:
            keep_views = os.environ.get(KEEP_VIEWS_ENV, "1") != "0"
        self._keep_views = keep_views
        self._workers: ThreadPoolExecutor | None = None
        self._kernels: cpu_kernels.CpuKernels | None = None
        self._parts: list[tuple[int, int]] = []
        self._shape_bytes = 0
        self._page_bytes = 0
        self.bytes_uploaded = 0

    def setup(self, geom: StoreGeometry) -> None:
        self.geom = geom
        self._host.clear()
        self._pool.clear()
        self._same.clear()
        self.bytes_uploaded = 0
        width = geom.head_dim * geom.n_head_kv
        row = ggml_type(geom.type_k).row_bytes(width) + ggml_type(geom.type_v).row_bytes(width)
        self._shape_bytes = geom.n_layers * geom.n_stream * geom.kv_size * row
        self._page_bytes = geom.page_tokens * row
        self._views = ViewCache(geom, self._view_limit())
        self._kernels = cpu_kernels.load()
        n = max(1, min(self._threads, geom.n_head_kv))
        self._parts = [(geom.n_head_kv * i // n, geom.n_head_kv * (i + 1) // n) for i in range(n)]
        if n > 1 and self._workers is None:
            self._workers = ThreadPoolExecutor(n - 1, thread_name_prefix="kvdiag-numpy")

    def _view_limit(self) -> int:
        """Bytes the kept views may take: what the peak-memory target leaves after the
        quantized store and a reserve, and never less than VIEW_FLOOR."""
        if not self._keep_views:
            return 0
        store = len(self._host) * self._page_bytes
        target = int(PEAK_BYTES_PER_SHAPE * self._shape_bytes) - store - VIEW_RESERVE
        return max(VIEW_FLOOR, target)

    def _g(self) -> StoreGeometry:
        if self.geom is None:
            raise RuntimeError("executor used before setup()")
        return self.geom

    def _cache(self) -> ViewCache:
        if self._views is None:
            raise RuntimeError("executor used before setup()")
        return self._views

    def _host_page(self, layer: int, stream: int, page: int) -> Page:
        key = (layer, stream, page)
        p = self._host.get(key)
        if p is None:
            p = self._host[key] = self._zero_page()
            if self._keep_views:
                self._cache().shrink_to(self._view_limit())
        return p

    def _zero_page(self) -> Page:
        g = self._g()
        width = g.head_dim * g.n_head_kv
        return Page(
            np.zeros((g.page_tokens, ggml_type(g.type_k).row_bytes(width)), np.uint8),
            np.zeros((g.page_tokens, ggml_type(g.type_v).row_bytes(width)), np.uint8),
        )

    def write_rows(
        self, layer: int, stream: int, cells: I64Array, k: F32Array, v: F32Array
    ) -> None:
        g = self._g()
        kq = quantize_rows(g.type_k, np.ascontiguousarray(k, dtype=np.float32))
        vq = quantize_rows(g.type_v, np.ascontiguousarray(v, dtype=np.float32))
        pages = cells // g.page_tokens
        for page in np.unique(pages):
            sel = pages == page
            p = self._host_page(layer, stream, int(page))
            rows = cells[sel] % g.page_tokens
            p.k[rows] = kq[sel]
            p.v[rows] = vq[sel]
            p.wrote(rows)

    def upload(self, layer: int, stream: int, page: int, n_pages: int, slot: int) -> None:
        for i in range(n_pages):
            src = self._host_page(layer, stream, page + i)
            self._pool[slot + i] = Page(src.k.copy(), src.v.copy())
            self.bytes_uploaded += src.k.nbytes + src.v.nbytes

    def _compare(self, pool: Page, host: Page) -> tuple[bool, bool]:
        """Whether the pool copy holds the host page's K bytes and V bytes. A pool copy never
        changes after its upload and a host page changes only with its version, so the answer
        is kept per (copy, page, version)."""
        key = (pool.serial, host.serial, host.version)
        same = self._same.get(key)
        if same is None:
            if len(self._same) > 1 << 16:
                self._same.clear()
            same = self._same[key] = (bool(np.array_equal(pool.k, host.k)),
                                      bool(np.array_equal(pool.v, host.v)))
        return same

    def reads_match_host(
        self, layer: int, streams: tuple[int, ...], page_table: I64Array
    ) -> bool:
        """True when every pool slot in ``page_table`` holds exactly the bytes of the host
        page it stands for, so attention over it equals the fully resident reference."""
        for i, stream in enumerate(streams):
            for p, slot in enumerate(page_table[i]):
                if slot == HOST:
                    continue
                pool = self._pool.get(int(slot))
                host = self._host.get((layer, stream, p))
                if pool is None or host is None or self._compare(pool, host) != (True, True):
                    return False
        return True

    def _pool_page(self, slot: int) -> Page:
        page = self._pool.get(slot)
        if page is None:
            # cudaMalloc'd pool memory never uploaded to reads as whatever is there; zeros
            # keep the read deterministic
            page = self._pool[slot] = self._zero_page()
        return page

    def _view(self, layer: int, stream: int, n_pages: int) -> View:
        """The dequantized host pages ``0 .. n_pages-1`` of (layer, stream)."""
        view = self._cache().view(layer, stream, n_pages)
        view.fill([self._host_page(layer, stream, p) for p in range(n_pages)])
        return view

    def _patches(self, layer: int, stream: int, row: I64Array, n_pages: int) -> _Patches:
        """Pages whose pool copy differs from the host page: their K and/or V as read."""
        patches: _Patches = {}
        for p in range(n_pages):
            slot = int(row[p])
            if slot == HOST:
                continue
            pool = self._pool_page(slot)
            k_same, v_same = self._compare(pool, self._host_page(layer, stream, p))
            if not (k_same and v_same):
                k, v = dequantize_page(self._g(), pool)
                patches[p] = (None if k_same else k, None if v_same else v)
        return patches

    def attend(
        self,
        layer: int,
        streams: tuple[int, ...],
        q: F32Array,
        positions: I64Array,
        n_kv: int,
        page_table: I64Array,
    ) -> F32Array:
        cells = np.arange(n_kv)
        visible = cells[None, None, :] <= positions[:, :, None]
        return self.attend_masked(layer, streams, q, visible, n_kv, page_table)

    def attend_masked(
        self,
        layer: int,
        streams: tuple[int, ...],
        q: F32Array,
        kv_mask: npt.NDArray[np.bool_],
        n_kv: int,
        page_table: I64Array,
    ) -> F32Array:
        """Attention with an explicit KQ mask ``[ns, tokens, n_kv]`` (True = visible), for a
        unified cache whose stream holds several sequences."""
        g = self._g()
        ns, tokens, n_head, d = q.shape
        n_pages = n_kv // g.page_tokens
        scale = np.float32(1.0 / np.sqrt(d))
        out = np.empty((ns, tokens, n_head, g.head_dim), np.float32)
        for i, stream in enumerate(streams):
            view = self._view(layer, stream, n_pages)
            with view.patched(self._patches(layer, stream, page_table[i], n_pages)):
                # [hkv, n_kv, d], contiguous per head, so matmul takes the BLAS path
                k, v = view.k[:, :n_kv], view.v[:, :n_kv]
                # query chunks bound the score matrix (prefill): [hkv, chunk × group, n_kv]
                for t0 in range(0, tokens, QUERY_CHUNK):
                    t1 = min(tokens, t0 + QUERY_CHUNK)
                    out[i, t0:t1] = self._attend_chunk(q[i, t0:t1], kv_mask[i, t0:t1], k, v,
                                                       scale)
        return out

    def _each(self, work: Callable[[int, int], None]) -> None:
        """``work(h0, h1)`` for each group of KV heads, the first on this thread."""
        if self._workers is None or len(self._parts) == 1:
            work(0, self._g().n_head_kv)
            return
        futures = [self._workers.submit(work, h0, h1) for h0, h1 in self._parts[1:]]
        try:
            work(*self._parts[0])
        finally:
            for f in futures:
                f.result()

    def _attend_chunk(self, q: F32Array, visible: npt.NDArray[np.bool_], k: F32Array,
                      v: F32Array, scale: np.float32) -> F32Array:
        tokens, n_head, d = q.shape
        hkv, _, dv = v.shape
        group = n_head // hkv
        rows = tokens * group
        qg = q.reshape(tokens, hkv, group, d).transpose(1, 0, 2, 3).reshape(hkv, rows, d)
        bias = np.where(visible, np.float32(0.0), np.float32(-np.inf))
        o: F32Array
        if rows <= SMALL_ROWS:
            # einsum (or the compiled kernels that round as it does) computes each head apart
            # and never calls BLAS: heads split freely
            o = np.empty((hkv, rows, dv), np.float32)
            kern = self._kernels

            def heads(h0: int, h1: int) -> None:
                if kern is not None:
                    s = kern.scores(qg[h0:h1], k[h0:h1])
                else:
                    s = np.einsum("hqd,hdk->hqk", qg[h0:h1], k[h0:h1].transpose(0, 2, 1))
                _softmax_rows(s, bias, scale, tokens)
                if kern is not None:
                    kern.pv(s, v[h0:h1], o[h0:h1])
                else:
                    o[h0:h1] = np.einsum("hqd,hdk->hqk", s, v[h0:h1])

            self._each(heads)
        else:
            # the GEMMs stay whole calls on this thread: OpenBLAS's rounding depends on the
            # shape it is given and on the threads it finds free
            scores = np.matmul(qg, k.transpose(0, 2, 1))
            self._each(lambda h0, h1: _softmax_rows(scores[h0:h1], bias, scale, tokens))
            o = np.matmul(scores, v)
        result: F32Array = o.reshape(hkv, tokens, group, dv).transpose(1, 0, 2, 3).reshape(
            tokens, n_head, dv)
        return result

    def close(self) -> None:
        self._host.clear()
        self._pool.clear()
        self._same.clear()
        self._views = None
        if self._workers is not None:
            self._workers.shutdown(wait=True)
            self._workers = None
