"""Shared by the kernel tests, emulated and on the GPU: a store geometry with the runtime's
page math (kvstream.pages.PageGeometry), and the same random K/V rows written into several
executors (or the emulator's store) through their ``write_rows``."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvdiag.kvstream.backend import StoreGeometry
from kvdiag.kvstream.pages import PageGeometry


def store_geometry(type_k: str, type_v: str, head_dim: int, n_head: int, n_head_kv: int,
                   kv_size: int, n_stream: int, pool_pages: int,
                   n_layers: int = 2) -> StoreGeometry:
    pg = PageGeometry(type_k, type_v, head_dim, head_dim, n_head_kv)
    return StoreGeometry(n_layers=n_layers, n_stream=n_stream, kv_size=kv_size,
                         head_dim=head_dim, n_head=n_head, n_head_kv=n_head_kv, type_k=type_k,
                         type_v=type_v, page_tokens=pg.page_tokens, page_bytes=pg.page_bytes,
                         v_offset=pg.v_offset, pool_pages=pool_pages)


def fill_rows(geom: StoreGeometry, writers: tuple[Any, ...], layer: int, n_cells: int,
              seed: int) -> None:
    """Cells 0..n_cells-1 of every stream of ``layer``: unit-variance K and V rows (seeded),
    the same bytes in each writer."""
    rng = np.random.default_rng(seed)
    width = geom.head_dim * geom.n_head_kv
    for s in range(geom.n_stream):
        cells = np.arange(n_cells, dtype=np.int64)
        k = rng.standard_normal((n_cells, width), dtype=np.float32)
        v = rng.standard_normal((n_cells, width), dtype=np.float32)
        for w in writers:
            w.write_rows(layer, s, cells, k, v)
