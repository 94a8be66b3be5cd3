"""Write then read 2,000,000 synthetic trace events; compare reading with bare msgspec.

Run: ``.venv/bin/python benchmarks/bench_trace_io.py [--events N] [--repeat R]``.

The mix follows one decode step of a 32-layer model with 4 streams, as the capture runner
emits it: per layer one ``fits``, per stream one ``write`` and one ``read`` (with page ranges),
one ``upload`` every other layer, and per step one ``step`` and one ``output`` per stream.
Targets (task brief): full read ≥ 1,000,000 events/s, and full read (decode + validate into
typed events) ≥ 0.7x the speed of ``msgspec.json.decode`` of each line to dicts, measured here
in the same run on the same file. Each timing is the best of ``--repeat`` runs; targets are
judged on wall-clock time, and CPU time of this process is shown beside it because the
machine may be shared with other work (the load average is printed).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from kvdiag.model.events import Device, Fits, Output, Read, ReadRange, Step, Upload, Write
from kvdiag.model.geometry import Tensor
from kvdiag.trace.reader import TraceReader
from kvdiag.trace.writer import TraceWriter, make_header

LAYERS = 32
STREAMS = 4
READ_TARGET = 1_000_000
RATIO_TARGET = 0.7


def tensor(name: str, ne: tuple[int, int, int, int], data: int, buffer: str) -> Tensor:
    nb0 = 2
    nb = (nb0, nb0 * ne[0], nb0 * ne[0] * ne[1], nb0 * ne[0] * ne[1] * ne[2])
    return Tensor(name, "f16", ne, nb, data=data, buffer=buffer, runtime=1 if "k" in name else None)


def write_trace(path: Path, n_events: int) -> int:
    header = make_header("synthetic", Device("bench", memory_bytes=24 << 30))
    q = tensor("q-0", (128, 1, 32, 4), 0x7F0000000000, "CUDA0")
    k = tensor("k-0", (128, 4096, 8, 1), 0x7F1000000000, "CUDA_KV_Stream_Host")
    v = tensor("v-0", (128, 4096, 8, 1), 0x7F2000000000, "CUDA_KV_Stream_Host")
    dst = tensor("dst-0", (128, 32, 1, 4), 0x7F3000000000, "CUDA0")
    ranges = (ReadRange(0, 12, "pool", 0, "exact"), ReadRange(12, 16, "host", 1, "stale", 1))
    with TraceWriter.create(path, header) as w:
        step = 0
        while w.seq < n_events:
            w.emit(Step, step, phase="decode", streams=(0, 1, 2, 3), tokens=1, n_kv=4096)
            for layer in range(LAYERS):
                w.emit(
                    Fits,
                    step,
                    node=f"fattn-{layer}",
                    layer=layer,
                    q=q,
                    k=k,
                    v=v,
                    dst=dst,
                    stage_bytes=1 << 20,
                    result=True,
                    route="streamed",
                )
                for s in range(STREAMS):
                    w.emit(
                        Write,
                        step,
                        layer=layer,
                        stream=s,
                        cells=(step, step + 1),
                        rows=(s * 4096 + step, s * 4096 + step + 1),
                        dirty=((layer, s, 0),),
                    )
                if layer % 2 == 0:
                    w.emit(
                        Upload,
                        step,
                        layer=layer,
                        stream=0,
                        pages=(0, 12),
                        slot=layer,
                        target="resident",
                        bytes=12 << 16,
                        reason="dirty",
                    )
                for s in range(STREAMS):
                    w.emit(
                        Read, step, layer=layer, stream=s, pool=12, ring=0, host=4, ranges=ranges
                    )
            for s in range(STREAMS):
                w.emit(
                    Output,
                    step,
                    stream=s,
                    checksum="1a2b3c4d",
                    ref_checksum="1a2b3c4d",
                    max_abs_delta=0.0,
                    tolerance=1e-3,
                )
            w.end_step()
            step += 1
        written = w.seq
    return written + 1  # + End


def read_kvdiag(path: Path) -> int:
    with TraceReader.open(path) as reader:
        n = 0
        for _ in reader:
            n += 1
        assert not reader.problems and reader.complete, reader.problems
        return n


def read_bare(path: Path) -> int:
    decode = msgspec.json.decode
    n = 0
    with path.open("rb") as f:
        next(f)
        for line in f:
            decode(line)
            n += 1
    return n


class Timing:
    """Best wall-clock and best CPU time (this process only) over repeated runs."""

    def __init__(self) -> None:
        self.wall = float("inf")
        self.cpu = float("inf")

    def run(self, fn: Callable[[], int]) -> int:
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        self.wall = min(self.wall, time.perf_counter() - w0)
        self.cpu = min(self.cpu, time.process_time() - c0)
        return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.kvtrace"
        write = Timing()
        n = write.run(lambda: write_trace(path, args.events))
        size = path.stat().st_size
        mix: collections.Counter[str] = collections.Counter()
        with TraceReader.open(path) as r:
            for ev in r:
                mix[type(ev).__name__.lower()] += 1
        read, bare = Timing(), Timing()
        # Alternate the two so that load from other processes hits both alike.
        for _ in range(args.repeat):
            n_read = read.run(lambda: read_kvdiag(path))
            n_bare = bare.run(lambda: read_bare(path))
            assert n_read == n == n_bare, (n_read, n, n_bare)
    load_after = os.getloadavg()[0]
    read_rate, bare_rate = n / read.wall, n / bare.wall
    ratio = read_rate / bare_rate
    print(f"date      {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(
        f"machine   {platform.machine()}, {os.cpu_count()} cores, no GPU used,"
        f" Python {sys.version.split()[0]}, msgspec {msgspec.__version__};"
        f" load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print(f"events    {n:,} ({size / 1e6:.1f} MB, {size / n:.0f} B/event)")
    print("mix       " + ", ".join(f"{k} {v / n:.1%}" for k, v in mix.most_common()))
    print("          events/s by wall clock (events/s by this process's CPU time)")
    print(
        f"write     {n / write.wall:>12,.0f} ({n / write.cpu:>11,.0f})  one run, TraceWriter.emit"
    )
    print(
        f"read      {read_rate:>12,.0f} ({n / read.cpu:>11,.0f})  best of {args.repeat},"
        " TraceReader: typed events + checks"
    )
    print(
        f"baseline  {bare_rate:>12,.0f} ({n / bare.cpu:>11,.0f})  best of {args.repeat},"
        " msgspec.json.decode per line to dicts"
    )
    print(f"ratio     {ratio:.2f}x ({bare.cpu / read.cpu:.2f}x)  kvdiag read / bare decode")
    ok_read = read_rate >= READ_TARGET
    ok_ratio = ratio >= RATIO_TARGET
    print(f"target    read >= {READ_TARGET:,} events/s (wall): {'PASS' if ok_read else 'MISS'}")
    print(f"target    ratio >= {RATIO_TARGET} (wall): {'PASS' if ok_ratio else 'MISS'}")
    return 0 if ok_read and ok_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
