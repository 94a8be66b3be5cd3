"""Capture benchmark: ``pool-pressure`` at ctx 32768, 16 layers, np 2, 256 decode steps on the
NumPy executor. Reports wall time, peak RSS of the capture process and events/s.

Run: ``.venv/bin/python benchmarks/bench_capture.py`` (about two minutes on 2 cores).
The capture runs in a child process so its peak RSS is measured alone.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = ["--ctx", "32768", "--layers", "16", "--np", "2", "--stage-mib", "32"]
ARGS = ["--scenario", "pool-pressure", *SHAPE, "--steps", "256", "--executor", "numpy", "-q"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.kvtrace"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kvdiag", "capture", *ARGS, "-o", str(out)],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        info = subprocess.run([sys.executable, "-m", "kvdiag", "check", str(out), "--json",
                               "--fail-on", "critical"], capture_output=True, text=True)
        doc = json.loads(info.stdout)
        events = doc["summary"]["events"]
        size = out.stat().st_size
        plan = subprocess.run([sys.executable, "-m", "kvdiag", "plan", "--json", *SHAPE],
                              capture_output=True, text=True)
        p = json.loads(plan.stdout)
    print(f"machine: {platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}, cores={__import__('os').cpu_count()}")
    print(f"capture: {' '.join(ARGS)}")
    print(f"  pool: {p['pool_pages']} pages, {p['resident_pages_per_layer']} resident/layer, "
          f"{p['ring_slots']} ring slots; {doc['summary']['steps']} steps")
    print(f"  {proc.stdout.strip()}")
    print(f"wall time      {wall:8.2f} s")
    print(f"peak RSS       {rss_mib:8.1f} MiB")
    print(f"events         {events:8d} ({size / 2**20:.1f} MiB trace)")
    print(f"events/s       {events / wall:8.0f}")
    res = doc["summary"]["residency"]
    print(f"pages read     pool {res['pages_read']['pool']}, ring {res['pages_read']['ring']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
