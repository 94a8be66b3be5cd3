"""``kvdiag perf`` on bench_logscan's 1 GiB log, against bench_logscan's own scan of the same file.

Run: ``.venv/bin/python benchmarks/bench_perf.py [--mib 1024] [--repeat 2]``.

The log is bench_logscan's (``write_log``: a kv-stream boot, then requests as llama-server
prints them — slot selection, launch, new prompt, cache reuse, prompt progress, prompt done,
the older-shape print_timing block, release — two slots alternating, a repartition line every
200 requests, a crash at the end), written to a temporary directory and deleted afterwards. The
baseline is bench_logscan's measurement, made here in the same run on the same file: the
post-mortem scan (``LogParser``, with its helper process when a core is idle). ``kvdiag perf``
is timed end to end as the command runs it (``kvdiag perf LOG``: read every request, bin by
depth, render the text report), with its output thrown away; on a large file and an idle second
core it reads the file in two halves at once (kvdiag/postmortem/perfsplit.py); where a C
compiler is at hand it finds its lines with a compiled pass (kvdiag/postmortem/perfbytes.c;
``KVDIAG_COMPILED=0``: the Python path, which the output names). Each figure is
the best of ``--repeat`` runs, alternating, with the file in the page cache. Target (issue 17):
perf ≤ 1.5 × bench_logscan's time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_logscan

from kvdiag.cli import main as kvdiag_main
from kvdiag.postmortem import parse

TARGET = 1.5


def time_perf(path: Path) -> tuple[float, float]:
    """(wall, main-process CPU) of ``kvdiag perf LOG`` with stdout to /dev/null."""
    start, cpu0 = time.perf_counter(), time.process_time()
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        code = kvdiag_main(["perf", str(path)])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    if code != 0:
        raise SystemExit(f"kvdiag perf exited {code}")
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--mib", type=int, default=1024, help="log size in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--second-process", action="store_true",
                    help="let both tools start their second process even when the load average "
                         "says no core is idle (what they do on an idle 2-core machine; on a "
                         "loaded one the four processes share two cores)")
    args = ap.parse_args()
    if args.second_process:
        from kvdiag.postmortem import perfread, perfsplit

        for module in (parse, perfread, perfsplit):
            module.spare_core = lambda: True  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix="kvdiag-bench-") as tmp:
        path = Path(tmp) / "server.log"
        t0 = time.perf_counter()
        size, requests = bench_logscan.write_log(path, args.mib << 20)
        gen_s = time.perf_counter() - t0
        with open(path, "rb") as fh:  # the page cache, for both tools
            while fh.read(16 << 20):
                pass
        scan_s = scan_cpu = perf_s = perf_cpu = float("inf")
        spare = []
        for _ in range(args.repeat):
            spare.append(parse.spare_core())
            s, _crashes, cpu = bench_logscan.time_kvdiag(path, 1)
            if s < scan_s:
                scan_s, scan_cpu = s, cpu
            spare.append(parse.spare_core())
            w, c = time_perf(path)
            if w < perf_s:
                perf_s, perf_cpu = w, c
        from kvdiag.postmortem.perfread import scan_paths

        (run,) = scan_paths([str(path)])
    mb = size / 1e6
    ratio = perf_s / scan_s
    print(f"date: {datetime.date.today().isoformat()}  machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus, {platform.python_implementation()} "
          f"{platform.python_version()}, {sys.platform}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"log: {size / (1 << 20):.0f} MiB, {requests} requests (bench_logscan.write_log, "
          f"written in {gen_s:.1f} s)")
    print(f"bench_logscan scan : {scan_s:7.3f} s  {mb / scan_s:8.1f} MB/s  (main-process CPU "
          f"{scan_cpu:.3f} s)")
    print(f"kvdiag perf LOG    : {perf_s:7.3f} s  {mb / perf_s:8.1f} MB/s  "
          f"(main-process CPU {perf_cpu:.3f} s; {len(run.requests)} requests read, "
          f"{run.unfinished} unfinished)")
    from kvdiag import compiled

    how = compiled.status().get("kvdiag.postmortem._perfbytes", "not loaded: the Python path")
    print(f"perf's byte scan   : {how.split(':')[0]} (kvdiag/postmortem/perfbytes.c; "
          "KVDIAG_COMPILED=0: the Python path)")
    print(f"idle second core   : {sum(spare)} of {len(spare)} measurements (the scan's helper "
          "and perf's second half run only then)"
          + ("; --second-process: both started anyway" if args.second_process else ""))
    print(f"ratio perf / bench_logscan: {ratio:.2f}  (target <= {TARGET})  "
          f"{'PASS' if ratio <= TARGET else 'MISS'}; main-process CPU ratio "
          f"{perf_cpu / scan_cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
