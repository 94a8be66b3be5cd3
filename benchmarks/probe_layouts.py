"""Probe: why does the zero-copy attention path fall short of the zero-copy read limit, and
which launch layout serves each path best? One GPU run.

    .venv/bin/python benchmarks/probe_layouts.py

1. kv_read_chunks (kernels/membench.cu) over pinned host memory and over device memory: warps
   read 16-row chunks one after another (like attention tiles), in one moving window (order 0)
   or each in its own contiguous range (order 1, like contiguous splits), with loads (mode 0)
   or double-buffered cp.async (mode 1), as whole 8 KiB chunks or as one KV head's row slices
   (q8_0: 272 of every 1088 bytes; f16: 512 of every 2048).
2. Decode attention at 64K/128K for each (grid_order, interleave) of the CuPy executor.
Figures are GB/s of bytes the kernel needs (timing as in bench_kernels.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk

from kvdiag.errors import DeviceUnavailable
from kvdiag.executors import cuda_kernels as ck
from kvdiag.kvstream.backend import HOST

SHAPES = (("8 KiB chunks", 512, 512), ("q8_0 K head rows", 272, 1088),
          ("f16 head rows", 512, 2048))


def probe_reads(cp: Any) -> list[str]:
    mod = cp.RawModule(code=ck.kernel_source("membench.cu"), options=("-std=c++17",))
    kern = mod.get_function("kv_read_chunks")
    kern.max_dynamic_shared_size_bytes = 4 * 2 * 16 * 512
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    sink = cp.zeros(1, cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    nbytes = 1 << 30
    hptr = cp.cuda.runtime.hostAlloc(nbytes, 3)
    import ctypes

    ctypes.memset(hptr, 0x5A, nbytes)
    dev = cp.random.randint(0, 2**31 - 1, nbytes // 4, dtype=cp.int32)
    lines = [f"{'memory':7} {'shape':18} {'order':>5} {'mode':>5} {'GB/s':>7}"]
    try:
        for mem, ptr in (("host", hptr), ("device", int(dev.data.ptr))):
            for name, seg, pitch in SHAPES:
                useful = nbytes * seg // pitch
                for order in (0, 1):
                    for mode in (0, 1):
                        smem = 4 * 2 * 16 * seg if mode else 0

                        def body(_i: int, ptr: int = ptr, seg: int = seg, pitch: int = pitch,
                                 order: int = order, mode: int = mode, smem: int = smem) -> None:
                            kern((sms * 3,), (128,), (np.uint64(ptr), np.int64(nbytes),
                                                      np.int32(seg), np.int32(pitch),
                                                      np.int32(order), np.int32(mode), sink),
                                 shared_mem=smem)

                        us, _ = bk.time_graph(cp, stream, body)
                        lines.append(f"{mem:7} {name:18} {order:5d} {mode:5d} "
                                     f"{useful / us / 1e3:7.1f}")
                        print(lines[-1], flush=True)
    finally:
        cp.cuda.runtime.freeHost(hptr)
    return lines


def probe_attention(cp: Any) -> list[str]:
    from kvdiag.executors.cupy_exec import CupyExecutor

    l2 = int(cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
    lines = [f"{'types':10} {'ctx':>7} {'mode':8} {'grid':>4} {'inter':>5} {'µs':>9} {'GB/s':>7}"]
    q = np.random.default_rng(1).standard_normal((1, 1, bk.N_HEAD, bk.HEAD_DIM), np.float32)
    for tk, tv in bk.PAIRS:
        for ctx in (65536, 131072):
            width = bk.HEAD_DIM * bk.N_HEAD_KV
            kv_bytes = ctx * width // 32 * (ck.BLOCK32_BYTES[tk] + ck.BLOCK32_BYTES[tv])
            layers = max(1, -(-4 * l2 // kv_bytes))
            geom = bk.geometry(tk, tv, ctx, layers)
            pages = ctx // bk.PAGE
            ex = CupyExecutor(instrument=False)
            try:
                ex.setup(geom)
                bk.fill(cp, ex, geom, seed=7)
                for mode in ("resident", "host"):
                    for grid_order in (0, 1):
                        for interleave in (0, 1):
                            ex.grid_order, ex.interleave = grid_order, interleave
                            launches = []
                            for layer in range(layers):
                                table = (np.arange(pages, dtype=np.int64)[None, :] + layer * pages
                                         if mode == "resident"
                                         else np.full((1, pages), HOST, np.int64))
                                launches.append(ex.prepare_attend(layer, (0,), q,
                                                                  np.array([[ctx - 1]]), ctx,
                                                                  table))
                            us, _ = bk.time_graph(cp, ex._stream,
                                                  lambda i, ls=launches: ls[i % len(ls)].run())
                            lines.append(f"{tk}/{tv:5} {ctx:7d} {mode:8} {grid_order:4d} "
                                         f"{interleave:5d} {us:9.1f} {kv_bytes / us / 1e3:7.0f}")
                            print(lines[-1], flush=True)
            finally:
                ex.close()
    return lines


def main() -> int:
    try:
        from kvdiag.executors.cupy_exec import load_cupy

        cp = load_cupy()
    except DeviceUnavailable as exc:
        print(f"probe_layouts: {exc}", file=sys.stderr)
        return 2
    reads = probe_reads(cp)
    attn = probe_attention(cp)
    print("\n".join(["# probe_layouts: chunked reads", *reads, "# attention layouts", *attn]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
