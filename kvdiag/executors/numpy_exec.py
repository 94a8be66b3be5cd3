"""The NumPy reference executor: ggml block storage, page copies and attention on the CPU.

Host pages and pool slots hold the real quantized bytes (kvdiag.executors.quant, bit-exact
with ggml), so a pool slot that the bookkeeping left stale or filled with another stream's
bytes changes the numbers exactly as it would on the GPU.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvdiag.executors.quant import dequantize_rows, quantize_rows
from kvdiag.kvstream.backend import HOST, F32Array, I64Array, StoreGeometry
from kvdiag.kvstream.ggml_types import ggml_type

_PageKey = tuple[int, int, int]

QUERY_CHUNK = 256
"""Query tokens per score matrix: bounds prefill memory to [hkv, 256 × group, n_kv] floats."""


class _Page:
    """One page of quantized K and V rows. ``serial`` names this object for the assembly
    cache (pool copies are new objects); ``version`` counts writes into it."""

    __slots__ = ("k", "serial", "v", "version")
    _next_serial = 0

    def __init__(self, k: np.ndarray, v: np.ndarray) -> None:
        self.k = k
        self.v = v
        self.version = 0
        _Page._next_serial += 1
        self.serial = _Page._next_serial


class _Assembly:
    """Dequantized K and V of one (layer, stream) view laid out ``[hkv, cells, d]`` for the
    matmuls. A page is dequantized again only when the object or version behind it changed:
    a decode step rewrites one page, not the whole view."""

    def __init__(self, geom: StoreGeometry) -> None:
        self.geom = geom
        self.k = np.zeros((geom.n_head_kv, 0, geom.head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.sources: list[tuple[int, int] | None] = []

    def update(self, pages: list[_Page]) -> tuple[F32Array, F32Array]:
        g = self.geom
        pt = g.page_tokens
        n = len(pages) * pt
        if self.k.shape[1] < n:
            cap = n  # grows a page at a time: the buffers are the executor's largest memory
            for name in ("k", "v"):
                grown = np.zeros((g.n_head_kv, cap, g.head_dim), np.float32)
                old = getattr(self, name)
                grown[:, : old.shape[1]] = old
                setattr(self, name, grown)
            self.sources += [None] * (cap // pt - len(self.sources))
        width = g.head_dim * g.n_head_kv
        shape = (pt, g.n_head_kv, g.head_dim)
        for p, page in enumerate(pages):
            tag = (page.serial, page.version)
            if self.sources[p] == tag:
                continue
            k = dequantize_rows(g.type_k, page.k, width).reshape(shape)
            v = dequantize_rows(g.type_v, page.v, width).reshape(shape)
            if g.f16_mode:
                k = k.astype(np.float16).astype(np.float32)
                v = v.astype(np.float16).astype(np.float32)
            self.k[:, p * pt : (p + 1) * pt] = k.transpose(1, 0, 2)
            self.v[:, p * pt : (p + 1) * pt] = v.transpose(1, 0, 2)
            self.sources[p] = tag
        return self.k[:, :n], self.v[:, :n]


def _bmm(a: F32Array, b: F32Array) -> F32Array:
    """Batched matmul. Small products (decode: a handful of query rows) go through einsum:
    OpenBLAS's threaded GEMM costs ~10x more than the arithmetic at that size."""
    if a.shape[-2] <= 32:
        small: F32Array = np.einsum("hqd,hdk->hqk", a, b)
        return small
    large: F32Array = np.matmul(a, b)
    return large


class NumpyExecutor:
    name = "numpy"

    def __init__(self) -> None:
        self.geom: StoreGeometry | None = None
        self._host: dict[_PageKey, _Page] = {}
        self._pool: dict[int, _Page] = {}
        self._assembled: dict[tuple[int, int, bool], _Assembly] = {}
        self.bytes_uploaded = 0

    def setup(self, geom: StoreGeometry) -> None:
        self.geom = geom
        self._host.clear()
        self._pool.clear()
        self._assembled.clear()
        self.bytes_uploaded = 0

    def _g(self) -> StoreGeometry:
        if self.geom is None:
            raise RuntimeError("executor used before setup()")
        return self.geom

    def _host_page(self, layer: int, stream: int, page: int) -> _Page:
        key = (layer, stream, page)
        p = self._host.get(key)
        if p is None:
            p = self._host[key] = self._zero_page()
        return p

    def _zero_page(self) -> _Page:
        g = self._g()
        width = g.head_dim * g.n_head_kv
        return _Page(
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
            p.version += 1

    def upload(self, layer: int, stream: int, page: int, n_pages: int, slot: int) -> None:
        for i in range(n_pages):
            src = self._host_page(layer, stream, page + i)
            self._pool[slot + i] = _Page(src.k.copy(), src.v.copy())
            self.bytes_uploaded += src.k.nbytes + src.v.nbytes

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
                if pool is None or host is None:
                    return False
                if not (np.array_equal(pool.k, host.k) and np.array_equal(pool.v, host.v)):
                    return False
        return True

    def _gather(
        self, layer: int, stream: int, row: I64Array, n_pages: int
    ) -> tuple[F32Array, F32Array]:
        """K and V ``[hkv, n_kv, d]`` of the view, each page from where ``row`` says."""
        pages = [self._host_page(layer, stream, p) if int(row[p]) == HOST
                 else self._pool_page(int(row[p])) for p in range(n_pages)]
        key = (layer, stream, bool((row[:n_pages] == HOST).all()))
        assembly = self._assembled.get(key)
        if assembly is None:
            assembly = self._assembled[key] = _Assembly(self._g())
        return assembly.update(pages)

    def _pool_page(self, slot: int) -> _Page:
        page = self._pool.get(slot)
        if page is None:
            # cudaMalloc'd pool memory never uploaded to reads as whatever is there; zeros
            # keep the read deterministic
            page = self._pool[slot] = self._zero_page()
        return page

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
            # [hkv, n_kv, d], contiguous per head, so matmul takes the BLAS path
            k, v = self._gather(layer, stream, page_table[i], n_pages)
            # query chunks bound the score matrix (prefill): [hkv, chunk × group, n_kv]
            for t0 in range(0, tokens, QUERY_CHUNK):
                t1 = min(tokens, t0 + QUERY_CHUNK)
                out[i, t0:t1] = self._attend_chunk(q[i, t0:t1], kv_mask[i, t0:t1], k, v, scale)
        return out

    def _attend_chunk(self, q: F32Array, visible: npt.NDArray[np.bool_], k: F32Array,
                      v: F32Array, scale: np.float32) -> F32Array:
        tokens, n_head, d = q.shape
        hkv, n_kv, dv = v.shape
        group = n_head // hkv
        qg = q.reshape(tokens, hkv, group, d).transpose(1, 0, 2, 3).reshape(
            hkv, tokens * group, d)
        scores = _bmm(qg, k.transpose(0, 2, 1))
        scores *= scale
        scores = scores.reshape(hkv, tokens, group, n_kv)
        bias = np.where(visible, np.float32(0.0), np.float32(-np.inf))
        scores += bias[None, :, None, :]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        o = _bmm(scores.reshape(hkv, tokens * group, n_kv), v)
        result: F32Array = o.reshape(hkv, tokens, group, dv).transpose(1, 0, 2, 3).reshape(
            tokens, n_head, dv)
        return result

    def close(self) -> None:
        self._host.clear()
        self._pool.clear()
        self._assembled.clear()
