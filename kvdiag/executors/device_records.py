"""Records drained from the GPU event ring, and their reduction to ``kernel`` trace events.

A record is 8 int32 (kernels/kvdiag_ring.cuh): kernel, block, layer, stream, page, source,
slot, aux. Attention kernels write one per (block, page) they read, set_rows one per run of
rows in one page, and the executor adds one per batched upload on the host. Many blocks read
the same page (one per KV head and split), so the reduction keeps each (page, source, slot)
once and collapses consecutive pages into ranges, as ``read`` events do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvdiag.executors.cuda_kernels import KERNEL_NAMES, RECORD_INTS, SOURCE_NAMES

I32Rows = npt.NDArray[np.int32]

KERNEL, BLOCK, LAYER, STREAM, PAGE, SOURCE, SLOT, AUX = range(RECORD_INTS)


def _empty() -> I32Rows:
    return np.zeros((0, RECORD_INTS), np.int32)


@dataclass(frozen=True)
class DeviceRecords:
    """One drain: the records (``[n, 8]`` int32) and how many a full ring dropped."""

    rows: I32Rows = field(default_factory=_empty)
    dropped: int = 0

    def __len__(self) -> int:
        return int(self.rows.shape[0])


# Order of the kernels within a layer in a step: rows are written, pages uploaded, then read.
_RUN_ORDER = {"set_rows_k": 0, "set_rows_v": 1, "upload": 2}


def kernel_events(records: DeviceRecords) -> list[dict[str, Any]]:
    """Fields of one ``Kernel`` event per (kernel, layer, stream), by layer and then in the
    order the kernels run within a layer."""
    rows = records.rows
    if rows.shape[0] == 0:
        return []
    out: list[dict[str, Any]] = []
    keys = np.unique(rows[:, [KERNEL, LAYER, STREAM]], axis=0).tolist()
    keys.sort(key=lambda k: (k[1], _RUN_ORDER.get(KERNEL_NAMES.get(k[0], ""), 3), k[0], k[2]))
    for kernel, layer, stream in keys:
        sel = rows[(rows[:, KERNEL] == kernel) & (rows[:, LAYER] == layer)
                   & (rows[:, STREAM] == stream)]
        pages = sorted({(int(p), int(src), int(slot)) for p, src, slot in
                        sel[:, [PAGE, SOURCE, SLOT]].tolist()})
        ranges: list[tuple[int, int, str, int]] = []
        for page, src, slot in pages:
            name = SOURCE_NAMES.get(src, f"source{src}")
            if ranges:
                b, e, s, first = ranges[-1]
                follows = page == e and s == name and (
                    (slot < 0 and first < 0) or (slot >= 0 and slot == first + (page - b)))
                if follows:
                    ranges[-1] = (b, e + 1, s, first)
                    continue
            ranges.append((page, page + 1, name, slot))
        out.append({
            "name": KERNEL_NAMES.get(int(kernel), f"kernel{kernel}"),
            "layer": int(layer),
            "stream": int(stream),
            "ranges": tuple(ranges),
            "records": int(sel.shape[0]),
            "dropped": records.dropped,
        })
    return out
