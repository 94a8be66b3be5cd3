"""Where the fixed cost of one decode attention goes (the ~19 µs intercept of
benchmarks/results/bench_kernels.txt), on one GPU, one run:

    python3 benchmarks/probe_intercept.py [--ctx 4096,65536] [--pairs f16/f16,q8_0/q5_1]

For each shape (the benchmark's: head dim 256, 24/4 heads, every page resident, KV rotating
over enough layers to miss L2), CUDA-graph timings (µs per call, median) of:
  full        partial + combine kernel (what bench_kernels reports)
  no PDL      the same without programmatic dependent launch of the combine kernel
  CuPy        the same launched by CuPy (no driver launcher, no PDL)
  PDL@start   full, the partial kernel built with KVDIAG_PDL_TRIGGER=1 (trigger at its start)
  PDL@exit    full, built with KVDIAG_PDL_TRIGGER=0 (no explicit trigger: at block exit)
  partial     the partial kernel alone
  combine     the combine kernel alone
  no-tiles    partial with tiles_per_block = 0 (prologue, warp merge, partial store: no K/V)
              + combine
  nop x2      two empty kernels with the same grids and block sizes (launch floor)
  read        a plain HBM read kernel over the same number of bytes (membench.cu)
Exit 2 without CuPy or a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk

from kvdiag.executors import cuda_kernels as ck

NOP = 'extern "C" __global__ void kv_nop(const long long* p) { if (p == nullptr) __trap(); }'


def prepared(cp: Any, tk: str, tv: str, ctx: int, l2: int, defines: dict[str, int],
             grid_order: int = 0, interleave: int = 0,
             warps: int = 0) -> tuple[Any, list[Any], int, int]:
    """An executor with every page of every layer resident, and one prepared decode call per
    layer (``warps``: the streamed kernel's warps a block, 0 for the executor's choice)."""
    from kvdiag.executors.cupy_exec import CupyExecutor

    width = bk.HEAD_DIM * bk.N_HEAD_KV
    kv_bytes = ctx * width // 32 * (ck.BLOCK32_BYTES[tk] + ck.BLOCK32_BYTES[tv])
    layers = max(1, -(-4 * l2 // kv_bytes))
    geom = bk.geometry(tk, tv, ctx, layers)
    pages = ctx // bk.PAGE
    q = np.random.default_rng(1).standard_normal((1, 1, bk.N_HEAD, bk.HEAD_DIM), np.float32)
    pos = np.array([[ctx - 1]], np.int64)
    ex = CupyExecutor(instrument=False, defines=defines)
    ex.grid_order, ex.interleave = grid_order, interleave
    if warps:
        ex.max_streamed_warps = warps
    ex.setup(geom)
    bk.fill(cp, ex, geom, seed=7)
    ls = [ex.prepare_attend(layer, (0,), q, pos, ctx,
                            np.arange(pages, dtype=np.int64)[None, :] + layer * pages)
          for layer in range(layers)]
    return ex, ls, layers, kv_bytes


def _median_us(cp: Any, stream: Any, body: Any) -> float:
    return statistics.median(bk.time_graph(cp, stream, body)[0] for _ in range(3))


def probe(cp: Any, tk: str, tv: str, ctx: int, l2: int) -> dict[str, float]:
    res: dict[str, float] = {}
    for name, trigger in (("PDL@start", 1), ("PDL@exit", 0)):
        ex, ls, layers, _ = prepared(cp, tk, tv, ctx, l2, {"KVDIAG_PDL_TRIGGER": trigger})
        try:
            res[name] = _median_us(cp, ex._stream, lambda i, ls=ls: ls[i % len(ls)].run())
        finally:
            ex.close()
    ex, ls, layers, kv_bytes = prepared(cp, tk, tv, ctx, l2, {})
    try:
        stream = ex._stream
        nop = cp.RawKernel(NOP, "kv_nop")
        tpb = ck.FATTN_FIELDS.index("tiles_per_block")
        empty = []
        for launch in ls:
            p2 = launch.params.copy()
            p2[tpb] = 0
            empty.append(p2)
        buf = cp.zeros(16, cp.uint8)  # the no-op kernels' argument

        plain = [dataclasses.replace(x, programmatic=False) for x in ls]
        by_cupy = [dataclasses.replace(x, launcher=None) for x in ls]

        def full(i: int) -> None:
            ls[i % layers].run()

        def full_plain(i: int) -> None:
            plain[i % layers].run()

        def full_cupy(i: int) -> None:
            by_cupy[i % layers].run()

        def partial(i: int) -> None:
            ls[i % layers].run_partial()

        def combine(i: int) -> None:
            ls[i % layers].run_combine()

        def no_tiles(i: int) -> None:
            ls[i % layers].run_partial(empty[i % layers])
            ls[i % layers].run_combine(empty[i % layers])

        def nops(i: int) -> None:
            geo = ls[i % layers].geometry
            nop(geo.grid, (geo.block,), (buf,))
            nop(geo.combine_grid, (256,), (buf,))

        for name, body in (("full", full), ("no PDL", full_plain), ("CuPy", full_cupy),
                           ("partial", partial), ("combine", combine),
                           ("no-tiles", no_tiles), ("nop x2", nops),
                           ("read", bk.plain_read(cp, kv_bytes, layers))):
            res[name] = _median_us(cp, stream, body)
        res["grid"] = float(np.prod(ls[0].grid))
        res["kv_mib"] = kv_bytes / 2**20
    finally:
        ex.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False)
    ap.add_argument("--ctx", default="4096,65536")
    ap.add_argument("--pairs", default="f16/f16,q8_0/q5_1")
    args = ap.parse_args(argv)
    cp = bk.cupy_or_none("probe_intercept")
    if cp is None:
        return 2
    props = cp.cuda.runtime.getDeviceProperties(0)
    l2 = int(props["l2CacheSize"])
    cols = ("full", "no PDL", "CuPy", "PDL@start", "PDL@exit", "partial", "combine", "no-tiles", "nop x2", "read")
    print(f"{'types':10} {'ctx':>7} {'MiB':>6} {'blocks':>6} " + " ".join(f"{c:>9}" for c in cols)
          + "   (µs per call, CUDA graph of 20, median of 3 x 10)")
    for pair in args.pairs.split(","):
        tk, tv = pair.split("/")
        for ctx in (int(c) for c in args.ctx.split(",")):
            r = probe(cp, tk, tv, ctx, l2)
            print(f"{pair:10} {ctx:7d} {r['kv_mib']:6.1f} {int(r['grid']):6d} "
                  + " ".join(f"{r[c]:9.2f}" for c in cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
