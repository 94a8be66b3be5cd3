"""The NumPy reference executor: ggml block storage, page copies and attention on the CPU.

Host pages and pool slots hold the real quantized bytes (kvdiag.executors.quant, bit-exact
with ggml), so a pool slot that the bookkeeping left stale or filled with another stream's
bytes changes the numbers exactly as it would on the GPU.
"""

from __future__ import annotations

import numpy as np

from kvdiag.executors.quant import dequantize_rows, quantize_rows
from kvdiag.kvstream.backend import HOST, F32Array, I64Array, StoreGeometry
from kvdiag.kvstream.ggml_types import ggml_type

_PageKey = tuple[int, int, int]


class _Page:
    """One page of quantized K and V rows plus a lazily dequantized copy."""

    __slots__ = ("_deq", "k", "v", "version")

    def __init__(self, k: np.ndarray, v: np.ndarray, version: int = 0) -> None:
        self.k = k
        self.v = v
        self.version = version
        self._deq: tuple[int, F32Array, F32Array] | None = None

    def dequantized(self, geom: StoreGeometry) -> tuple[F32Array, F32Array]:
        if self._deq is None or self._deq[0] != self.version:
            shape = (geom.page_tokens, geom.n_head_kv, geom.head_dim)
            k = dequantize_rows(geom.type_k, self.k, geom.head_dim * geom.n_head_kv).reshape(shape)
            v = dequantize_rows(geom.type_v, self.v, geom.head_dim * geom.n_head_kv).reshape(shape)
            if geom.f16_mode:
                k = k.astype(np.float16).astype(np.float32)
                v = v.astype(np.float16).astype(np.float32)
            self._deq = (self.version, k, v)
        return self._deq[1], self._deq[2]


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
        self.bytes_uploaded = 0

    def setup(self, geom: StoreGeometry) -> None:
        self.geom = geom
        self._host.clear()
        self._pool.clear()
        self.bytes_uploaded = 0

    def _g(self) -> StoreGeometry:
        if self.geom is None:
            raise RuntimeError("executor used before setup()")
        return self.geom

    def _host_page(self, layer: int, stream: int, page: int) -> _Page:
        key = (layer, stream, page)
        p = self._host.get(key)
        if p is None:
            g = self._g()
            width = g.head_dim * g.n_head_kv
            p = _Page(
                np.zeros((g.page_tokens, ggml_type(g.type_k).row_bytes(width)), np.uint8),
                np.zeros((g.page_tokens, ggml_type(g.type_v).row_bytes(width)), np.uint8),
            )
            self._host[key] = p
        return p

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
            copy = _Page(src.k.copy(), src.v.copy())
            if src._deq is not None and src._deq[0] == src.version:
                # same bytes, so the same dequantized values: share them (read-only)
                copy._deq = (0, src._deq[1], src._deq[2])
            self._pool[slot + i] = copy
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
        g = self._g()
        ks: list[F32Array] = []
        vs: list[F32Array] = []
        for p in range(n_pages):
            src = int(row[p])
            page = self._host_page(layer, stream, p) if src == HOST else self._pool_page(src)
            k, v = page.dequantized(g)
            ks.append(k)
            vs.append(v)
        return np.concatenate(ks), np.concatenate(vs)

    def _pool_page(self, slot: int) -> _Page:
        page = self._pool.get(slot)
        if page is None:
            g = self._g()
            width = g.head_dim * g.n_head_kv
            # cudaMalloc'd pool memory that was never uploaded: reads as whatever is there;
            # model it as zeros so the read is deterministic.
            page = _Page(
                np.zeros((g.page_tokens, ggml_type(g.type_k).row_bytes(width)), np.uint8),
                np.zeros((g.page_tokens, ggml_type(g.type_v).row_bytes(width)), np.uint8),
            )
            self._pool[slot] = page
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
        g = self._g()
        ns, tokens, n_head, d = q.shape
        hkv = g.n_head_kv
        group = n_head // hkv
        n_pages = n_kv // g.page_tokens
        scale = np.float32(1.0 / np.sqrt(d))
        out = np.empty((ns, tokens, n_head, g.head_dim), np.float32)
        cells = np.arange(n_kv)
        for i, stream in enumerate(streams):
            k, v = self._gather(layer, stream, page_table[i], n_pages)
            # [n_kv, hkv, d] -> contiguous [hkv, n_kv, d] so matmul takes the BLAS path
            k = np.ascontiguousarray(k.transpose(1, 0, 2))
            v = np.ascontiguousarray(v.transpose(1, 0, 2))
            qg = q[i].reshape(tokens, hkv, group, d).transpose(1, 0, 2, 3).reshape(hkv, tokens * group, d)
            scores = _bmm(qg, k.transpose(0, 2, 1))
            scores *= scale
            scores = scores.reshape(hkv, tokens, group, n_kv)
            bias = np.where(cells[None, :] > positions[i][:, None], -np.inf, 0.0)
            scores += bias.astype(np.float32)[None, :, None, :]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            o = _bmm(scores.reshape(hkv, tokens * group, n_kv), v)
            out[i] = o.reshape(hkv, tokens, group, g.head_dim).transpose(1, 0, 2, 3).reshape(
                tokens, n_head, g.head_dim
            )
        return out

    def close(self) -> None:
        self._host.clear()
        self._pool.clear()
