"""Dequantized K/V views of the NumPy executor's host store, kept between steps within a
memory bound.

Attention needs each (layer, stream)'s K and V as float32 ``[hkv, cells, d]``. A decode step
rewrites one page of a view, so a view is dequantized again only where the page object or its
write count changed since the view last held it (``Page.tag``). Float32 views take 4-7x the
quantized bytes (8 KiB per cell for 4 KV heads of 256 against 1856 B for q8_0 K and q5_1 V), so
they cannot all be kept for a large shape: views are kept while the total stays under a limit
derived from the shape (``ViewCache``); a view beyond it is rebuilt in a scratch view at every
read, slower but bounded.

Streamed reads differ from the host view only in the pool pages whose bytes differ from the
host page they stand for (stale or foreign copies). Those pages are patched into the view for
the read and put back afterwards (``View.patched``), so one view per (layer, stream) serves
both the streamed read and the fully resident reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from kvdiag.executors.quant import dequantize_rows
from kvdiag.kvstream.backend import F32Array, StoreGeometry

HISTORY = 4
"""Writes a page remembers the rows of, so that a view one to four writes behind dequantizes
only those rows (a decode step writes one row of one page per layer)."""


class Page:
    """One page of quantized K and V rows. ``serial`` names this object (pool copies are new
    objects); ``version`` counts writes into it; ``history`` holds (version, rows) of the
    latest writes."""

    __slots__ = ("history", "k", "serial", "v", "version")
    _next_serial = 0

    def __init__(self, k: np.ndarray, v: np.ndarray) -> None:
        self.k = k
        self.v = v
        self.version = 0
        self.history: list[tuple[int, np.ndarray]] = []
        Page._next_serial += 1
        self.serial = Page._next_serial

    @property
    def tag(self) -> tuple[int, int]:
        return self.serial, self.version

    def wrote(self, rows: np.ndarray) -> None:
        self.version += 1
        self.history.append((self.version, rows))
        del self.history[:-HISTORY]

    def rows_since(self, version: int) -> np.ndarray | None:
        """Rows written after ``version``, or None when the history does not reach back."""
        newer = [rows for v, rows in self.history if v > version]
        if len(newer) != self.version - version:
            return None
        return np.unique(np.concatenate(newer)) if len(newer) > 1 else newer[0]


def dequantize_page(geom: StoreGeometry, page: Page, rows: np.ndarray | None = None
                    ) -> tuple[F32Array, F32Array]:
    """K and V of one page (or of its ``rows``) as float32 ``[hkv, rows, d]`` (rounded through
    f16 in F16 attention mode, where the kernels convert K/V to half before the dot
    products). Rows dequantize independently, so a subset gives the same bits."""
    width = geom.head_dim * geom.n_head_kv
    kq, vq = (page.k, page.v) if rows is None else (page.k[rows], page.v[rows])
    shape = (kq.shape[0], geom.n_head_kv, geom.head_dim)
    k = dequantize_rows(geom.type_k, kq, width).reshape(shape)
    v = dequantize_rows(geom.type_v, vq, width).reshape(shape)
    if geom.f16_mode:
        k = k.astype(np.float16).astype(np.float32)
        v = v.astype(np.float16).astype(np.float32)
    return k.transpose(1, 0, 2), v.transpose(1, 0, 2)


class View:
    """K and V ``[hkv, cells, d]`` of one (layer, stream), contiguous per head so that the
    matmuls take the BLAS path; ``tags[p]`` is the (serial, version) page ``p`` holds."""

    def __init__(self, geom: StoreGeometry) -> None:
        self.geom = geom
        self.k = np.zeros((geom.n_head_kv, 0, geom.head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.tags: list[tuple[int, int] | None] = []

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    @staticmethod
    def bytes_for(geom: StoreGeometry, pages: int) -> int:
        return 2 * 4 * geom.n_head_kv * geom.head_dim * geom.page_tokens * pages

    def reserve(self, pages: int) -> None:
        """Room for ``pages`` pages; grows a page at a time (the views are the executor's
        largest memory)."""
        g = self.geom
        if len(self.tags) >= pages:
            return
        cells = pages * g.page_tokens
        for name in ("k", "v"):
            grown = np.zeros((g.n_head_kv, cells, g.head_dim), np.float32)
            old = getattr(self, name)
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)
        self.tags += [None] * (pages - len(self.tags))

    def fill(self, pages: Sequence[Page]) -> tuple[F32Array, F32Array]:
        """The view over ``pages``, dequantizing only pages whose tag changed."""
        self.reserve(len(pages))
        pt = self.geom.page_tokens
        for p, page in enumerate(pages):
            held = self.tags[p]
            if held == page.tag:
                continue
            rows = page.rows_since(held[1]) if held and held[0] == page.serial else None
            k, v = dequantize_page(self.geom, page, rows)
            if rows is None:
                self.k[:, p * pt : (p + 1) * pt] = k
                self.v[:, p * pt : (p + 1) * pt] = v
            else:
                self.k[:, p * pt + rows] = k
                self.v[:, p * pt + rows] = v
            self.tags[p] = page.tag
        n = len(pages) * pt
        return self.k[:, :n], self.v[:, :n]

    @contextmanager
    def patched(self, patches: dict[int, tuple[F32Array | None, F32Array | None]]
                ) -> Iterator[None]:
        """Pages ``p`` replaced by the given K and/or V ``[hkv, page_tokens, d]`` for the
        duration of the block, then restored bit for bit."""
        pt = self.geom.page_tokens
        saved: list[tuple[np.ndarray, int, np.ndarray]] = []
        try:
            for p, pair in patches.items():
                for arr, new in zip((self.k, self.v), pair, strict=True):
                    if new is not None:
                        block = arr[:, p * pt : (p + 1) * pt]
                        saved.append((arr, p, block.copy()))
                        block[...] = new
            yield
        finally:
            for arr, p, old in reversed(saved):
                arr[:, p * pt : (p + 1) * pt] = old


class ViewCache:
    """The views of every (layer, stream), kept while their bytes stay within ``limit``.

    ``limit(store_bytes)`` says how many bytes the kept views may take while the quantized
    store holds ``store_bytes``; the executor derives it from the shape. A view that would pass
    it is dropped and read through the shared scratch view from then on (its pages are
    dequantized at every read); views are dropped newest first, so the layers kept are stable.
    """

    def __init__(self, geom: StoreGeometry, limit_bytes: int) -> None:
        self.geom = geom
        self.limit_bytes = limit_bytes
        self.kept: dict[tuple[int, int], View] = {}
        self.dropped: set[tuple[int, int]] = set()
        self.scratch = View(geom)

    @property
    def kept_bytes(self) -> int:
        return sum(v.nbytes for v in self.kept.values())

    def view(self, layer: int, stream: int, pages: int) -> View:
        """The view to read (layer, stream) through, with room for ``pages`` pages."""
        key = (layer, stream)
        view = self.kept.get(key)
        if view is None and key not in self.dropped:
            view = self.kept[key] = View(self.geom)
        if view is not None:
            growth = View.bytes_for(self.geom, max(0, pages - len(view.tags)))
            if growth and self.kept_bytes + growth > self.limit_bytes:
                del self.kept[key]
                self.dropped.add(key)
                view = None
        if view is None:
            view = self.scratch
        view.reserve(pages)
        return view

    def shrink_to(self, limit_bytes: int) -> None:
        """Drop views, newest first, until the kept ones fit ``limit_bytes``."""
        self.limit_bytes = limit_bytes
        while self.kept and self.kept_bytes > limit_bytes:
            key = next(reversed(self.kept))
            del self.kept[key]
            self.dropped.add(key)
