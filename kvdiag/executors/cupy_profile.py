"""Measure a GPU's :class:`~kvdiag.kvstream.timing.DeviceProfile` with kvdiag's own kernels.

- HBM read: the plain streaming read kernel (kernels/membench.cu) over a 4 GiB device buffer;
- zero-copy read: the same kernel over 1 GiB of pinned, host-mapped memory (what the ordinary
  fallback reads over PCIe);
- pinned H2D: ``cudaMemcpyAsync`` of that 1 GiB host buffer into device memory (what ring and
  resident uploads use);
- launch latency: back-to-back launches of an empty kernel, without a graph.

Each is timed with CUDA events around CUDA graphs of repeated calls (median of several graph
launches after warm-up), as the kernel benchmark times everything (benchmarks/bench_kernels).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from kvdiag.executors import cuda_kernels as ck
from kvdiag.kvstream.timing import DeviceProfile

PER_GRAPH, GRAPHS, WARMUP_GRAPHS = 20, 10, 2

_EMPTY = 'extern "C" __global__ void kv_empty() {}'


def time_graph(cp: Any, stream: Any, body: Callable[[int], None], per_graph: int = PER_GRAPH,
               graphs: int = GRAPHS) -> tuple[float, str]:
    """Median µs of one ``body(i)`` from graphs of ``per_graph`` calls; falls back to a plain
    loop between events if stream capture fails."""
    with stream:
        for i in range(3):
            body(i)
        stream.synchronize()
        try:
            stream.begin_capture()
            for i in range(per_graph):
                body(i)
            graph = stream.end_capture()
            method = "graph"

            def run() -> None:
                graph.launch(stream)
        except Exception:
            with contextlib.suppress(Exception):
                stream.end_capture()
            method = "loop"

            def run() -> None:
                for i in range(per_graph):
                    body(i)
        times = []
        for _ in range(WARMUP_GRAPHS + graphs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            run()
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1000.0 / per_graph)
    return statistics.median(times[WARMUP_GRAPHS:]), method


def read_kernel(cp: Any) -> tuple[Any, int]:
    """The plain streaming read kernel (membench.cu) and the grid it runs with (8 blocks an
    SM)."""
    mod = cp.RawModule(code=ck.kernel_source("membench.cu"), options=("-std=c++17",))
    return mod.get_function("kv_read_bandwidth"), 8 * int(
        cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"])


def read_limits(cp: Any, dev_bytes: int = 4 << 30, host_bytes: int = 1 << 30) -> dict[str, float]:
    """GB/s of the HBM read, the zero-copy read and the pinned host→device copy."""
    out: dict[str, float] = {}
    kern, blocks = read_kernel(cp)
    sink = cp.zeros(1, cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.random.randint(0, 2**31 - 1, dev_bytes // 4, dtype=cp.int32)
    hptr = cp.cuda.runtime.hostAlloc(host_bytes, 3)  # portable | mapped
    ctypes.memset(hptr, 0xA5, host_bytes)  # PCIe moves bytes as they are: a pattern will do
    try:
        for name, ptr, nbytes in (("hbm_read", dev.data.ptr, dev_bytes),
                                  ("zero_copy_read", hptr, host_bytes)):
            n_vec = nbytes // 16

            def body(_i: int, ptr: int = ptr, n_vec: int = n_vec) -> None:
                kern((blocks,), (256,), (np.uint64(ptr), np.int64(n_vec), sink))

            us, _ = time_graph(cp, stream, body)
            out[name] = nbytes / us / 1e3
        d = cp.empty(host_bytes, cp.uint8)

        def copy(_i: int) -> None:
            cp.cuda.runtime.memcpyAsync(d.data.ptr, hptr, host_bytes, 1, stream.ptr)

        us, _ = time_graph(cp, stream, copy)
        out["h2d_copy"] = host_bytes / us / 1e3
    finally:
        cp.cuda.runtime.freeHost(hptr)
    return out


def launch_latency_us(cp: Any, launches: int = 2000) -> float:
    """µs per launch of an empty kernel issued back to back on one stream (no graph)."""
    kern = cp.RawModule(code=_EMPTY).get_function("kv_empty")
    stream = cp.cuda.Stream(non_blocking=True)
    samples = []
    with stream:
        for _ in range(3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            for _ in range(launches):
                kern((1,), (32,), ())
            b.record(stream)
            b.synchronize()
            samples.append(cp.cuda.get_elapsed_time(a, b) * 1000.0 / launches)
    return float(statistics.median(samples))


def measure_profile(cp: Any, name: str) -> DeviceProfile:
    limits = read_limits(cp)
    launch = launch_latency_us(cp)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return DeviceProfile(
        name=name, hbm_read_gbps=round(limits["hbm_read"], 1),
        zero_copy_read_gbps=round(limits["zero_copy_read"], 2),
        h2d_gbps=round(limits["h2d_copy"], 2), launch_us=round(launch, 2),
        source=f"kvdiag devices --profile on {name}, {when} (4 GiB device read, 1 GiB pinned "
               "mapped read, 1 GiB pinned memcpyAsync, empty-kernel launches)")
