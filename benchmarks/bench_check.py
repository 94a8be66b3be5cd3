"""``kvdiag check`` against ``kvdiag trace validate`` on the same 1,000,000-event trace.

Run: ``.venv/bin/python benchmarks/bench_check.py [--events N] [--repeat R] [--served-only |
--native]``.

The trace is a format 1.1 decode run shaped like the model's captures (kvdiag/kvstream/runner.py):
per step one ``step`` and one ``mark``; per layer (32) one ``write`` (the new token's page), one
``fits``, one resident ``upload`` of the dirty page, one ``ring`` upload of the pages beyond the
resident window and one ``read`` of 64 pages (48 from the pool, 16 through the ring) carrying
both ``served`` (the raw fact every page is judged from) and the model's annotated ``ranges``
(check judges and cross-checks them: the costlier case; ``--served-only`` drops the annotation,
as a native trace does); one ``output`` per step. Decode tokens land in the last resident
page, which a dirty upload refreshes; every 64th step skips that upload in one layer, so some
reads are stale and the judgement's non-exact path runs too.

``--native`` checks the header benchmark's trace instead: ``kvtrace_bench gen N`` (bench_native.py's
program, a native trace written by kernels/kvtrace.h; both streams' pages share resident slots,
so 44 % of the pages read are foreign).

Target (issue "One truth" §5): check costs ≤ 1.5x validate. Both run as the CLI in a fresh process
(``python -m kvdiag ...``), best of ``--repeat`` runs taken in turn after one untimed run of each
(it writes the bytecode, as pip does for an installed package, and builds the compiled helpers
once, as a user's first run does), so start-up is in both. Wall clock and the
child's CPU time are both shown: the project machine is shared (load average printed), and
CPU time moves less with other people's work.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvdiag.model.events import (
    Device,
    Fits,
    Mark,
    Output,
    Read,
    ReadRange,
    Served,
    Step,
    Upload,
    Write,
)
from kvdiag.model.geometry import Tensor
from kvdiag.trace.writer import TraceWriter, make_header

LAYERS = 32
PAGES = 64
WINDOW = 48
RING = 16
TARGET = 1.5


def write_trace(path: Path, n_events: int, annotate: bool) -> int:
    header = make_header("synthetic", Device("bench"), scenario={"name": "bench-check"})
    q = Tensor("q", "f32", (256, 1, 24, 1), (4, 1024, 1024, 24576), data=1, buffer="CUDA0")
    k = Tensor("k", "q8_0", (256, 16384, 4, 1), (34, 1088, 272, 17825792), data=2,
               buffer="CUDA_KV_Stream_Host", runtime=7)
    v = Tensor("v", "q5_1", (256, 16384, 4, 1), (24, 768, 192, 12582912), data=3,
               buffer="CUDA_KV_Stream_Host", runtime=7)
    dst = Tensor("dst", "f32", (256, 24, 1, 1), (4, 1024, 24576, 24576), data=4, buffer="CUDA0")
    base_cell = (WINDOW - 1) * 256  # decode tokens land in the last resident page
    with TraceWriter.create(path, header) as w:
        step = 0
        while w.seq < n_events:
            cell = base_cell + step % 256
            w.emit(Step, step, phase="decode", streams=(0,), tokens=1, n_kv=PAGES * 256)
            w.emit(Mark, step, rows=((cell, cell + 1),),
                   keys=tuple((layer, None, WINDOW - 1) for layer in range(LAYERS)))
            for layer in range(LAYERS):
                w.emit(Write, step, layer=layer, stream=0, cells=(cell, cell + 1),
                       rows=(cell, cell + 1), dirty=((layer, None, WINDOW - 1),))
                w.emit(Fits, step, node=f"__fattn__-{layer}", layer=layer, q=q, k=k, v=v,
                       dst=dst, stage_bytes=475136, result=True, route="streamed",
                       membership=True)
                slot0 = RING + layer * WINDOW
                first = step == 0
                skip = step % 64 == 63 and layer == 5
                if not first and not skip:
                    w.emit(Upload, step, layer=layer, stream=0, pages=(WINDOW - 1, WINDOW),
                           slot=slot0 + WINDOW - 1, target="resident", bytes=475136,
                           reason="dirty")
                if first:
                    w.emit(Upload, step, layer=layer, stream=0, pages=(0, 32), slot=slot0,
                           target="resident", bytes=32 * 475136, reason="miss")
                    w.emit(Upload, step, layer=layer, stream=0, pages=(32, WINDOW),
                           slot=slot0 + 32, target="resident", bytes=16 * 475136, reason="miss")
                w.emit(Upload, step, layer=layer, stream=0, pages=(WINDOW, PAGES), slot=0,
                       target="ring", bytes=RING * 475136, reason="ring")
                served = (Served(0, WINDOW, "pool", slot0), Served(WINDOW, PAGES, "ring", 0))
                ranges: tuple[ReadRange, ...] = ()
                if annotate:
                    pool = ((ReadRange(0, WINDOW - 1, "pool", 0, "exact"),
                             ReadRange(WINDOW - 1, WINDOW, "pool", 0, "stale", 1)) if skip
                            else (ReadRange(0, WINDOW, "pool", 0, "exact"),))
                    ranges = (*pool, ReadRange(WINDOW, PAGES, "ring", 0, "exact"))
                w.emit(Read, step, layer=layer, stream=0, pool=WINDOW, ring=RING, host=0,
                       ranges=ranges, served=served)
            w.emit(Output, step, stream=0, checksum="1a2b3c4d", ref_checksum="1a2b3c4d",
                   max_abs_delta=0.0, tolerance=1e-3)
            w.end_step()
            step += 1
        written = w.seq
    return written + 1


def once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall clock and CPU time (user + system of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env, check=False).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, code


def best(cmds: list[list[str]], repeat: int, env: dict[str, str]
         ) -> list[tuple[float, float, int]]:
    """Per command, the best wall clock and best CPU time over ``repeat`` runs, the commands
    taken in turn (so that a machine whose speed drifts slows both alike), after one run of
    each that is not timed: it writes the modules' bytecode and builds the compiled helpers
    (kvdiag.compiled) as an installed kvdiag's first run has."""
    for cmd in cmds:
        once(cmd, env)
    out = [(float("inf"), float("inf"), 0)] * len(cmds)
    for _ in range(repeat):
        for i, cmd in enumerate(cmds):
            wall, cpu, code = once(cmd, env)
            out[i] = (min(out[i][0], wall), min(out[i][1], cpu), code)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--served-only", action="store_true",
                    help="reads carry only served pages (a native trace), no annotation")
    ap.add_argument("--native", action="store_true",
                    help="the header benchmark's trace (kvtrace_bench gen: kernels/kvtrace.h)")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.kvtrace"
        if args.native:
            from bench_native import build, run

            n = int(run(build(Path(tmp)), "gen", str(args.events), trace=path)[0])
        else:
            n = write_trace(path, args.events, annotate=not args.served_only)
        size = path.stat().st_size
        py = [sys.executable, "-m", "kvdiag"]
        # bytecode written as for an installed package (pip compiles it), whatever the shell
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        (validate, vcpu, vcode), (check, ccpu, ccode) = best(
            [[*py, "trace", "validate", str(path)], [*py, "check", str(path), "--json"]],
            args.repeat, env)
        paths = subprocess.run(
            [sys.executable, "-c", "from kvdiag import compiled; "
             "from kvdiag.analysis.judgement import columns, seqjudge; "
             "columns._compiled(); compiled.load(seqjudge._SOURCE, seqjudge._MODULE); "
             "print('; '.join(w.split(':')[0] + ' ' + m.rpartition('.')[2] "
             "for m, w in compiled.status().items()))"],
            env=env, capture_output=True, text=True, check=False).stdout.strip()
    ratio, cpu_ratio = check / validate, ccpu / vcpu
    print(f"$ {' '.join(sys.argv)}")
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    if args.native:
        print(f"trace     {n:,} events ({size / 1e6:.1f} MB), kvtrace_bench gen (native, "
              f"kernels/kvtrace.h; 44 % of the pages read are foreign)")
    else:
        print(f"trace     {n:,} events ({size / 1e6:.1f} MB), reads of {PAGES} pages "
              f"({'served only' if args.served_only else 'served + annotated ranges'})")
    print(f"          wall clock (CPU time of the process), best of {args.repeat}, taken in turn"
          f" after one run of each; judgement helpers: {paths or 'unknown'}")
    print(f"validate  {validate:6.2f} s ({vcpu:6.2f} s)  exit {vcode}")
    print(f"check     {check:6.2f} s ({ccpu:6.2f} s)  exit {ccode}")
    print(f"ratio     {ratio:.2f}x ({cpu_ratio:.2f}x) check / validate")
    print(f"target    ratio ≤ {TARGET} (wall): {'PASS' if ratio <= TARGET else 'MISS'}; "
          f"(CPU): {'PASS' if cpu_ratio <= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
