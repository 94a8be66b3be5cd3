"""An executor without a data plane, for sweeps that only need the runtime's decisions.

The runner makes every decision (residency, uploads, routes, the adaptive partition) without
looking at the numbers an executor computes, so a sweep over stage sizes can skip storing,
copying and attending: with ``data_plane = False`` the runner makes no K/V/Q values and reports
no outputs. It is never used for a trace (``capture`` does not offer it), only by ``kvdiag
sweep`` with ``--executor decisions``.
"""

from __future__ import annotations

import numpy as np

from kvdiag.kvstream.backend import F32Array, I64Array, StoreGeometry


class DecisionsOnlyExecutor:
    name = "decisions"
    data_plane = False
    """The runner makes no K/V/Q values and reports no outputs for it."""

    def __init__(self) -> None:
        self.geom: StoreGeometry | None = None

    def setup(self, geom: StoreGeometry) -> None:
        self.geom = geom

    def write_rows(self, layer: int, stream: int, cells: I64Array, k: F32Array,
                   v: F32Array) -> None:
        pass

    def upload(self, layer: int, stream: int, page: int, n_pages: int, slot: int) -> None:
        pass

    def attend(self, layer: int, streams: tuple[int, ...], q: F32Array, positions: I64Array,
               n_kv: int, page_table: I64Array) -> F32Array:
        return np.zeros_like(q)

    def attend_masked(self, layer: int, streams: tuple[int, ...], q: F32Array,
                      kv_mask: np.ndarray, n_kv: int, page_table: I64Array) -> F32Array:
        return np.zeros_like(q)

    def close(self) -> None:
        pass
