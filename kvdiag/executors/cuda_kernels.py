"""The CUDA kernel sources and everything the host needs to launch them, without CuPy.

* :func:`kernel_source` finds ``kernels/`` (``kvdiag/_kernels`` inside a wheel, where
  pyproject's force-include puts it; the repository's top-level ``kernels/`` in a checkout) and
  inlines its ``#include "..."`` lines, so NVRTC never needs an include path.
* Parameter blocks: every kernel takes one pointer to a struct of 8-byte fields;
  :data:`FATTN_FIELDS` and :data:`SET_ROWS_FIELDS` list them in the order of
  ``struct FattnParams`` / ``struct SetRowsParams`` and :func:`pack` builds the int64 array.
* Shared-memory geometry and the split plan mirror ``FattnGeom`` in fattn_paged.cu.

The emulated-kernel tests use this module with host pointers, the CuPy executor with device
pointers; both therefore exercise the same packing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kvdiag.errors import DeviceUnavailable, UsageError
from kvdiag.kvstream.backend import StoreGeometry

KERNEL_FILES: tuple[str, ...] = (
    "fattn_paged.cu", "set_rows.cu", "compare_pages.cu", "membench.cu", "deadline.cu"
)

#: ggml type -> KvType enum value (kvdiag_blocks.cuh).
TYPE_IDS: dict[str, int] = {
    "f16": 0,
    "bf16": 1,
    "q8_0": 2,
    "q4_0": 3,
    "q4_1": 4,
    "q5_0": 5,
    "q5_1": 6,
}

#: Bytes of 32 consecutive elements (one ggml block; 32 f16/bf16 values for the plain types).
BLOCK32_BYTES: dict[str, int] = {
    "f16": 64,
    "bf16": 64,
    "q8_0": 34,
    "q4_0": 18,
    "q4_1": 20,
    "q5_0": 22,
    "q5_1": 24,
}

#: KvKernelId / KvSource (kvdiag_ring.cuh).
KERNEL_NAMES: dict[int, str] = {
    1: "fattn_streamed",
    2: "fattn_ordinary",
    3: "set_rows_k",
    4: "set_rows_v",
    5: "upload",
}
KERNEL_IDS: dict[str, int] = {v: k for k, v in KERNEL_NAMES.items()}
SOURCE_NAMES: dict[int, str] = {0: "pool", 1: "ring", 2: "host"}
RECORD_INTS = 8

FATTN_MAGIC = 0x6B76646961670001
SET_ROWS_MAGIC = 0x6B76646961670002

FATTN_FIELDS: tuple[str, ...] = (
    "magic",
    "q", "positions", "page_table", "streams", "host_k", "host_v", "pool",
    "part_o", "part_ml", "out",
    "ring_counter", "ring_records", "ring_capacity",
    "row_k", "row_v", "kv_size", "page_bytes", "v_offset", "page_tokens", "n_pages_tab",
    "ns", "T", "n_head", "n_head_kv", "G", "rows", "n_kv", "n_rowtiles",
    "tiles_per_block", "n_splits",
    "layer", "ring_slots", "kernel_id", "warp_smem",
    "grid_order", "interleave",
    "kv_mask", "mask_words",
    "scale_log2",
)  # fmt: skip
FATTN_FLOAT_FIELDS = frozenset({"scale_log2"})

SET_ROWS_FIELDS: tuple[str, ...] = (
    "magic",
    "src", "cells", "dst",
    "row_bytes", "kv_size", "stream", "n", "width", "page_tokens",
    "ring_counter", "ring_records", "ring_capacity",
    "layer", "kernel_id",
)  # fmt: skip

ROW_TILE = 8
"""Query rows per block (the N of the transposed mma)."""
CELL_TILE = 16
"""Cells per tile (the M of the transposed mma)."""

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernel_dir() -> Path:
    """The folder holding the ``.cu``/``.cuh`` sources (wheel first, then the checkout)."""
    packaged = resources.files("kvdiag") / "_kernels"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "kernels"
    if checkout.is_dir():
        return checkout
    raise DeviceUnavailable(
        f"kvdiag's CUDA kernel sources are missing (looked for {packaged} and {checkout})"
    )


def kernel_source(name: str, folder: Path | None = None) -> str:
    """``name`` with every ``#include "x"`` of the kernel folder inlined once (``#pragma once``
    semantics), so the text compiles without include paths."""
    root = folder or kernel_dir()
    seen: set[str] = set()

    def expand(fname: str) -> str:
        if fname in seen:
            return ""
        seen.add(fname)
        path = root / fname
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeviceUnavailable(f"cannot read kernel source {path}: {exc.strerror}") from None
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(name)


def struct_fields(source: str, struct: str) -> tuple[str, ...]:
    """Field names of ``struct <struct> { ... };`` in kernel source (for the layout check)."""
    m = re.search(r"struct\s+" + re.escape(struct) + r"\s*\{(.*?)\};", source, re.DOTALL)
    if m is None:
        raise ValueError(f"struct {struct} not found")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    names: list[str] = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        _type, _, rest = decl.partition(" ")
        names.extend(n.strip() for n in rest.split(","))
    return tuple(names)


def pack(fields: tuple[str, ...], values: dict[str, int | float],
         floats: frozenset[str] = frozenset()) -> npt.NDArray[np.int64]:
    """The parameter block: one int64 per field, floats stored as float64 bit patterns."""
    missing = [f for f in fields if f not in values]
    extra = [k for k in values if k not in fields]
    if missing or extra:
        raise ValueError(f"parameter block mismatch: missing {missing}, unknown {extra}")
    out = np.zeros(len(fields), np.int64)
    for i, f in enumerate(fields):
        v = values[f]
        if f in floats:
            out[i] = np.array([float(v)], np.float64).view(np.int64)[0]
        else:
            out[i] = np.int64(int(v)) if int(v) < 2**63 else np.uint64(int(v)).astype(np.int64)
    return out


def _smem_stride(nbytes: int, residue: int) -> int:
    s = -(-nbytes // 16) * 16
    while s % 128 != residue:
        s += 16
    return s


@dataclass(frozen=True)
class FattnLayout:
    """Per-warp shared memory of the attention kernels (``FattnGeom<TK, TV, D>``) and their
    copy unit."""

    type_k: str
    type_v: str
    head_dim: int
    head_k: int
    head_v: int
    stride_k: int
    stride_v: int
    stage_bytes: int
    vec: int
    n_head_kv: int = 1

    @property
    def warp_bytes(self) -> int:
        """Per-warp tile buffers of the streamed kernel (double buffered)."""
        return self.warp_bytes_for(True)

    def warp_bytes_for(self, paged: bool) -> int:
        """``FattnGeom<..., PAGED>::WARP``: two stages when paged, one for the ordinary kernel."""
        return (2 if paged else 1) * self.stage_bytes

    def block_smem(self, warps: int, paged: bool = True) -> int:
        """Dynamic shared memory of a block. Streamed kernel: the tile buffers and the tile
        counter its warps share, or the warp merge ([warp][row][m, l], [warp][row] weights,
        [warp][row][head dim] floats) if larger; the ordinary kernel's warps write
        their results unmerged."""
        tiles = warps * self.warp_bytes_for(paged)
        if not paged:
            return tiles
        return max(tiles + 16, warps * (96 + ROW_TILE * self.head_dim * 4))

    def partial_name(self, paged: bool) -> str:
        """The streamed kernel (kv_fattn_partial) or the ordinary one (kv_fattn_rows)."""
        kernel = "kv_fattn_partial" if paged else "kv_fattn_rows"
        return (f"{kernel}<{TYPE_IDS[self.type_k]}, {TYPE_IDS[self.type_v]}, "
                f"{self.head_dim}, {self.vec}>")

    def combine_name(self) -> str:
        return f"kv_fattn_combine<{self.head_dim}>"


def check_attention_geometry(type_k: str, type_v: str, head_dim: int, n_head: int,
                             n_head_kv: int, page_tokens: int) -> None:
    """What the kernels support; anything else is a one-line UsageError."""
    for t in (type_k, type_v):
        if t not in TYPE_IDS:
            raise UsageError(
                f"the CUDA kernels store {', '.join(TYPE_IDS)}; K/V type {t!r} is not one of them"
            )
    if head_dim % 32 or not 32 <= head_dim <= 256:
        raise UsageError(f"the CUDA kernels need a head dim that is a multiple of 32 up to 256, "
                         f"got {head_dim}")
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise UsageError(f"n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    if page_tokens % CELL_TILE:
        raise UsageError(f"page_tokens {page_tokens} is not a multiple of {CELL_TILE}")


def fattn_layout(type_k: str, type_v: str, head_dim: int, n_head_kv: int,
                 page_bytes: int = 0, v_offset: int = 0) -> FattnLayout:
    """Shared-memory strides (``FattnGeom``) and the widest copy unit (16, 8, 4 or 2 bytes)
    that divides every row, head and page offset the kernel adds to an aligned base."""
    hk = head_dim // 32 * BLOCK32_BYTES[type_k]
    hv = head_dim // 32 * BLOCK32_BYTES[type_v]
    # q8_0 K is read as words by 32 lanes over 8 rows (kv_load_q8_0_split), the others as
    # 16-byte units by 8 lanes over 2 rows: different bank-conflict-free residues.
    sk = _smem_stride(hk, 16 if type_k == "q8_0" else 64)
    sv = _smem_stride(hv, 16)
    offsets = [hk, hv, hk * n_head_kv, hv * n_head_kv]
    offsets += [x for x in (page_bytes, v_offset) if x]
    vec = next(v for v in (16, 8, 4, 2) if all(o % v == 0 for o in offsets))
    return FattnLayout(type_k, type_v, head_dim, hk, hv, sk, sv, CELL_TILE * (sk + sv), vec,
                       n_head_kv)


@dataclass(frozen=True)
class DeviceLimits:
    """What the launch plan needs to know about the GPU."""

    sm_count: int = 132
    smem_per_sm: int = 233472
    smem_per_block: int = 232448
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64


MAX_STREAMED_WARPS = 12
"""kv_fattn_partial's __launch_bounds__(384, 1): 12 warps, and 170 registers a thread."""


def heads_per_block(n_head_kv: int) -> int:
    """KV heads (= warps) of an ordinary-kernel block: the most, up to 4, that divide
    n_head_kv, so that the block reads the widest span of every host-store row."""
    return next(h for h in (4, 3, 2, 1) if n_head_kv % h == 0)


def warps_per_block(layout: FattnLayout, limits: DeviceLimits, regs_per_thread: int,
                    paged: bool = True, max_warps: int = MAX_STREAMED_WARPS) -> tuple[int, int]:
    """(warps a block, blocks an SM). Streamed kernel: one block an SM with as many warps as
    registers and shared memory allow (up to ``max_warps``, at most
    :data:`MAX_STREAMED_WARPS`), since its warps balance their tiles among themselves (a shared
    counter) and blocks sharing an SM would not; ordinary kernel: one warp per KV head of the
    block's group (:func:`heads_per_block`)."""
    if paged:
        for w in range(min(max_warps, MAX_STREAMED_WARPS), 0, -1):
            smem = layout.block_smem(w, True)
            if (smem <= limits.smem_per_block and smem + 1024 <= limits.smem_per_sm
                    and regs_per_thread * 32 * w <= limits.regs_per_sm
                    and w <= limits.max_warps_per_sm):
                return w, 1
    else:
        w = heads_per_block(layout.n_head_kv)
        smem = layout.block_smem(w, False)
        blocks = min(limits.smem_per_sm // (smem + 1024),
                     limits.regs_per_sm // max(1, regs_per_thread * 32 * w),
                     limits.max_warps_per_sm // w)
        if smem <= limits.smem_per_block and blocks > 0:
            return w, blocks
    raise UsageError(
        f"a {layout.type_k}/{layout.type_v} head of {layout.head_dim} needs "
        f"{layout.block_smem(1, paged)} bytes of shared memory per warp; the GPU allows "
        f"{limits.smem_per_block}"
    )


def mask_words(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint32]:
    """A KQ mask ``[ns, tokens, n_kv]`` (True = visible) as the kernels read it (kv_mask_row):
    bit c % 32 of word c // 32 of row [stream, token] is cell c, rows padded to whole words."""
    ns, tokens, n_kv = mask.shape
    words = -(-n_kv // 32)
    padded = np.zeros((ns, tokens, 32 * words), np.bool_)
    padded[..., :n_kv] = mask
    packed = np.packbits(padded, axis=-1, bitorder="little")  # contiguous, 4 bytes a word
    return packed.view("<u4").astype(np.uint32)


@dataclass(frozen=True)
class SplitPlan:
    n_rowtiles: int
    n_splits: int
    tiles_per_block: int


def split_plan(ns: int, n_head_kv: int, rows: int, n_kv: int,
               resident_blocks: int) -> SplitPlan:
    """Cut each (stream, KV head, row tile) into splits so that one wave of blocks covers the
    GPU (flash-decoding); the block's warps share its tiles out among themselves. (The
    ordinary kernel passes its head groups as ``n_head_kv``.)"""
    n_rowtiles = -(-rows // ROW_TILE)
    n_tiles = max(1, -(-n_kv // CELL_TILE))
    units = ns * n_head_kv * n_rowtiles
    splits = max(1, math.ceil(resident_blocks / units))
    per_block = max(1, -(-n_tiles // splits))
    return SplitPlan(n_rowtiles, -(-n_tiles // per_block), per_block)


@dataclass(frozen=True)
class LaunchGeometry:
    """Grids of one attention call: the partial kernel (streamed or ordinary) and the merge."""

    grid: tuple[int, int, int]
    block: int
    smem: int
    combine_grid: tuple[int, int, int]
    plan: SplitPlan

    @property
    def items(self) -> int:
        """Partial results (8 query rows each) the partial kernel writes."""
        return self.combine_grid[1] * self.plan.n_rowtiles * self.plan.n_splits


def launch_geometry(layout: FattnLayout, shape: tuple[int, int], sm_count: int, paged: bool,
                    ns: int, rows: int, n_kv: int, grid_order: int = 0) -> LaunchGeometry:
    """Where each block of the call goes, from ``shape`` = (warps a block, blocks an SM) of
    :func:`warps_per_block`. Streamed: blockIdx = (split, row tile, stream x KV head), or
    (stream x KV head, row tile, split) with ``grid_order`` 1; ordinary: (split, row tile,
    stream x head group), the block's warps being the group's heads."""
    warps, blocks_per_sm = shape
    nhk = layout.n_head_kv
    resident = sm_count * blocks_per_sm
    if paged:
        plan = split_plan(ns, nhk, rows, n_kv, resident)
        grid = ((ns * nhk, plan.n_rowtiles, plan.n_splits) if grid_order
                else (plan.n_splits, plan.n_rowtiles, ns * nhk))
    else:
        groups = nhk // warps
        plan = split_plan(ns, groups, rows, n_kv, resident)
        grid = (plan.n_splits, plan.n_rowtiles, ns * groups)
    return LaunchGeometry(grid, 32 * warps, layout.block_smem(warps, paged),
                          (rows, ns * nhk, layout.head_dim // 32), plan)


def fattn_params(geom: StoreGeometry, layout: FattnLayout, geo: LaunchGeometry, paged: bool,
                 buffers: dict[str, int], *, layer: int, ns: int, tokens: int, n_kv: int,
                 n_pages_tab: int, ring_slots: int, grid_order: int = 0, interleave: int = 0,
                 mask_words: int = 0) -> npt.NDArray[np.int64]:
    """The parameter block (FattnParams) of one attention call launched as ``geo``.
    ``buffers``: the call's addresses (q, positions, page_table, streams, host_k, host_v, pool,
    part_o, part_ml, out, kv_mask -- 0 without a mask) and its record ring (ring_counter,
    ring_records, ring_capacity); everything else follows from the geometry and the launch."""
    gq = geom.n_head // geom.n_head_kv
    plan = geo.plan
    return pack(FATTN_FIELDS, {
        "magic": FATTN_MAGIC, **buffers,
        "row_k": layout.head_k * layout.n_head_kv, "row_v": layout.head_v * layout.n_head_kv,
        "kv_size": geom.kv_size, "page_bytes": geom.page_bytes, "v_offset": geom.v_offset,
        "page_tokens": geom.page_tokens, "n_pages_tab": n_pages_tab, "ns": ns, "T": tokens,
        "n_head": geom.n_head, "n_head_kv": geom.n_head_kv, "G": gq, "rows": tokens * gq,
        "n_kv": n_kv, "n_rowtiles": plan.n_rowtiles, "tiles_per_block": plan.tiles_per_block,
        "n_splits": plan.n_splits, "layer": layer, "ring_slots": ring_slots,
        "kernel_id": KERNEL_IDS["fattn_streamed" if paged else "fattn_ordinary"],
        "warp_smem": layout.warp_bytes_for(paged), "grid_order": grid_order,
        "interleave": interleave, "mask_words": mask_words,
        "scale_log2": math.log2(math.e) / math.sqrt(layout.head_dim),
    }, FATTN_FLOAT_FIELDS)
