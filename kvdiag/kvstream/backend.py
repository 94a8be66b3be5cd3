"""The data plane an executor provides. The runtime model makes every decision; an executor
only stores rows, copies pages and computes attention where it is told to read.

Memory layout (what both executors allocate):

* host store (``CUDA_KV_Stream_Host``): per layer a K tensor ``[n_embd_k_gqa, kv_size,
  n_stream]`` and a V tensor likewise, rows in ggml block format (token-major, all kv heads
  of one token in one row);
* device pool of ``pool_pages`` slots of ``page_bytes``: ring slots first
  (``0 .. ring_slots-1``), then resident slots. A slot holds 256 K rows, then (at
  ``v_offset`` = K bytes rounded up to 128) 256 V rows.

An executor may also offer ``attend_masked(layer, streams, q, kv_mask, n_kv, page_table)``
with an explicit KQ mask ``[ns, tokens, n_kv]`` (True = visible): a unified cache puts several
sequences in one stream, where the causal rule ``cell <= position`` is not the mask. Without
it the runner refuses such captures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

HOST = -1
"""Page-table entry meaning: read this page zero-copy from the host store."""

F32Array = npt.NDArray[np.float32]
I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StoreGeometry:
    n_layers: int
    n_stream: int
    kv_size: int
    head_dim: int
    n_head: int
    n_head_kv: int
    type_k: str
    type_v: str
    page_tokens: int
    page_bytes: int
    v_offset: int
    pool_pages: int
    f16_mode: bool = False
    """F16 attention mode: K/V are converted to f16 before the dot products."""


class Executor(Protocol):
    name: str

    def setup(self, geom: StoreGeometry) -> None: ...

    def write_rows(
        self, layer: int, stream: int, cells: I64Array, k: F32Array, v: F32Array
    ) -> None:
        """Quantize ``k``/``v`` (``[n, n_head_kv*head_dim]``) into the host rows ``cells``."""

    def upload(self, layer: int, stream: int, page: int, n_pages: int, slot: int) -> None:
        """Copy host pages ``page .. page+n_pages-1`` of (layer, stream) to slots
        ``slot .. slot+n_pages-1`` (one batched copy)."""

    def attend(
        self,
        layer: int,
        streams: tuple[int, ...],
        q: F32Array,
        positions: I64Array,
        n_kv: int,
        page_table: I64Array,
    ) -> F32Array:
        """Attention of ``q`` ``[ns, tokens, n_head, head_dim]`` over the first ``n_kv``
        cells of each stream. Query token ``t`` of stream ``i`` sits at position
        ``positions[i, t]`` and sees cells ``0..positions[i, t]`` (causal mask).
        ``page_table[i, p]`` is the pool slot to read page ``p`` of stream ``i`` from, or
        HOST. Returns ``[ns, tokens, n_head, head_dim]`` float32."""

    def close(self) -> None: ...
