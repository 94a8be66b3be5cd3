"""Block timelines of the decode attention calls (where the fixed cost goes), on one GPU:

    python3 benchmarks/probe_timeline.py [--ctx 4096,65536] [--pairs f16/f16,q8_0/q5_1]
        [--defines KVDIAG_PDL_TRIGGER=1,...] [--warps N]

The kernels are built with KVDIAG_TIMELINE=1 (fattn_paged.cu): every block writes %globaltimer
stamps. 20 calls run back to back from a CUDA graph, as bench_kernels times them (every page
resident, the KV rotating over enough layers to miss L2); the third replay's stamps are read
and summarised per call (median over calls 2..19, µs):

  period       streamed-kernel start to the next call's streamed-kernel start
  start spread first to last block start of the streamed kernel
  first tile   block start to warp 0's first tile in shared memory (median block)
  tiles        first tile to all warps done (median block; max block in brackets)
  epilogue     tiles done to block exit (warp merge, partial store; median block)
  tail         median block exit to last block exit
  -> merge     last streamed block exit to the merge kernel's first block start (negative:
               its blocks started early, programmatic dependent launch)
  merge        merge kernel: first block start to last block exit; wait = first start to the
               last block past its wait for the partial results
  merge -> next  last merge block exit to the next call's first streamed block start
Exit 2 without CuPy or a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk
from probe_intercept import prepared

from kvdiag.executors import cuda_kernels as ck

CALLS = 20


def timeline(cp: Any, tk: str, tv: str, ctx: int, l2: int, defines: dict[str, int],
             grid_order: int = 0, interleave: int = 0, pdl: bool = True,
             warps: int = 0) -> dict[str, float]:
    import dataclasses

    ex, ls, layers, _ = prepared(cp, tk, tv, ctx, l2, {**defines, "KVDIAG_TIMELINE": 1},
                                 grid_order, interleave, warps)
    try:
        layer_field = ck.FATTN_FIELDS.index("layer")
        calls = []
        for k in range(CALLS):  # the stamps' slot is the params' layer field: make it the call
            params = ls[k % layers].params.copy()
            params[layer_field] = k
            calls.append(dataclasses.replace(ls[k % layers], params=params,
                                             programmatic=ls[0].programmatic and pdl))
        geo = calls[0].geometry
        n_partial = int(np.prod(geo.grid))
        n_combine = int(np.prod(geo.combine_grid))
        per_call = n_partial + n_combine
        stream = ex._stream
        with stream:
            for c in calls[:3]:
                c.run()
            stream.begin_capture()
            for c in calls:
                c.run()
            graph = stream.end_capture()
            for _ in range(3):
                graph.launch(stream)
            stream.synchronize()
        stamps = ex._records.view(cp.uint64).ravel()[: CALLS * per_call * 8]
        st = cp.asnumpy(stamps).astype(np.int64).reshape(CALLS, per_call, 8)
        grid, grid_order = geo.grid, ex.grid_order
    finally:
        ex.close()
    part = st[:, :n_partial, :4] / 1e3  # µs
    comb = st[:, n_partial:, :4] / 1e3
    _where_time_goes(st[CALLS // 2, :n_partial], grid, grid_order)
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(float(value))

    for k in range(2, CALLS - 1):
        p, c = part[k], comb[k]
        p_start, p_end = p[:, 0].min(), p[:, 3].max()
        add("period", part[k + 1][:, 0].min() - p_start)
        add("start spread", p[:, 0].max() - p_start)
        add("first tile", float(np.median(p[:, 1] - p[:, 0])))
        add("tiles", float(np.median(p[:, 2] - p[:, 1])))
        add("tiles max", float((p[:, 2] - p[:, 1]).max()))
        add("epilogue", float(np.median(p[:, 3] - p[:, 2])))
        full = st[k, :n_partial] / 1e3
        add("ep: O to smem", float(np.median(full[:, 5] - p[:, 2])))
        add("ep: weights", float(np.median(full[:, 6] - full[:, 5])))
        add("tail", p_end - float(np.median(p[:, 3])))
        add("-> merge", c[:, 0].min() - p_end)
        add("merge", c[:, 2].max() - c[:, 0].min())
        add("merge wait", c[:, 1].max() - c[:, 0].min())
        add("merge -> next", part[k + 1][:, 0].min() - c[:, 2].max())
        add("streamed span", p_end - p_start)
    return {name: statistics.median(v) for name, v in rows.items()}


def _where_time_goes(blocks: np.ndarray, grid: tuple[int, int, int], grid_order: int) -> None:
    """One call's streamed blocks: tile time by head group (stream x head group) and by how
    many blocks shared the SM, and the slowest blocks."""
    tiles = (blocks[:, 2] - blocks[:, 1]) / 1e3
    sm = blocks[:, 4]
    idx = np.arange(blocks.shape[0])
    gx, gy = grid[0], grid[1]
    ih = (idx % gx) if grid_order else idx // (gx * gy)
    split = idx // (gx * gy) if grid_order else idx % gx
    per_sm = np.bincount(sm, minlength=int(sm.max()) + 1)[sm]
    by_head = ", ".join(f"{h}: {np.median(tiles[ih == h]):.1f}/{tiles[ih == h].max():.1f}"
                        for h in np.unique(ih))
    by_load = ", ".join(f"{n} a SM: {np.median(tiles[per_sm == n]):.1f} ({(per_sm == n).sum()})"
                        for n in np.unique(per_sm))
    slow = np.argsort(tiles)[-8:]
    print(f"#   tiles µs median/max by head group {by_head}; by blocks on the SM {by_load}; "
          "slowest: "
          + ", ".join(f"h{ih[b]} s{split[b]} sm{sm[b]}({per_sm[b]}) {tiles[b]:.1f}" for b in slow))
    sm_med = {int(x): float(np.median(tiles[sm == x])) for x in np.unique(sm)}
    worst = sorted(sm_med, key=sm_med.get)[-6:]
    print("#   slowest SMs (median tiles µs): " + ", ".join(f"sm{x} {sm_med[x]:.1f}" for x in worst)
          + "; fastest: " + ", ".join(f"sm{x} {sm_med[x]:.1f}"
                                      for x in sorted(sm_med, key=sm_med.get)[:3]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False)
    ap.add_argument("--ctx", default="4096,65536")
    ap.add_argument("--pairs", default="f16/f16,q8_0/q5_1")
    ap.add_argument("--defines", default="", help="more kernel macros, NAME=INT,...")
    ap.add_argument("--grid-order", type=int, default=0)
    ap.add_argument("--interleave", type=int, default=0)
    ap.add_argument("--no-pdl", action="store_true", help="merge kernel launched plainly")
    ap.add_argument("--warps", type=int, default=0,
                    help="warps a streamed block (default: as many as fit)")
    args = ap.parse_args(argv)
    defines = bk.parse_defines(args.defines)
    cp = bk.cupy_or_none("probe_timeline")
    if cp is None:
        return 2
    l2 = int(cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
    cols = ("period", "streamed span", "start spread", "first tile", "tiles", "tiles max",
            "epilogue", "tail", "-> merge", "merge", "merge wait", "merge -> next",
            "ep: O to smem", "ep: weights")
    print(f"# kernel macros: {defines or 'defaults'}, grid_order {args.grid_order}, "
          f"interleave {args.interleave}, "
          f"PDL {not args.no_pdl}, warps {args.warps or 'as many as fit'}; µs, median over calls")
    print(f"{'types':10} {'ctx':>7} " + " ".join(f"{c:>13}" for c in cols))
    for pair in args.pairs.split(","):
        tk, tv = pair.split("/")
        for ctx in (int(c) for c in args.ctx.split(",")):
            r = timeline(cp, tk, tv, ctx, l2, defines, args.grid_order, args.interleave,
                         not args.no_pdl, args.warps)
            print(f"{pair:10} {ctx:7d} " + " ".join(f"{r[c]:13.2f}" for c in cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
