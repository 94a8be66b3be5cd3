"""Capture benchmark (project issue 12, "A capture fast enough to sweep"): NumPy-executor
captures as a new user runs them, each timed in a child process of its own (wall clock, CPU
time, peak RSS), against the same captures made by a baseline revision of kvdiag in the same
run, whose traces must carry the same decisions and the same outputs bit for bit.

Run from the repository root:

    .venv/bin/python benchmarks/bench_capture.py                 # both cases, baseline 1e6fb9e
    .venv/bin/python benchmarks/bench_capture.py --cases arm117-slot1-first --no-baseline

The baseline is the ``kvdiag/`` tree of ``--baseline REV`` (default: 1e6fb9e, the commit before
issue 12's executor changes), taken with ``git archive`` into a temporary directory. Targets:
arm117 slot1-first <= 3 s, pool-pressure 3000 steps at ctx 65536 <= 30 s, peak RSS <= 1.5x the
K/V bytes the shape holds (every layer, stream and cell at the K and V types' row sizes). The
pool-pressure baseline takes about ten minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.capture_fixtures import decisions  # noqa: E402

CASES: dict[str, list[str]] = {
    "arm117-slot1-first": ["--preset", "arm117", "--scenario", "slot1-first"],
    "pool-pressure-3000": ["--scenario", "pool-pressure", "--steps", "3000", "--ctx", "65536"],
}
TARGET_S = {"arm117-slot1-first": 3.0, "pool-pressure-3000": 30.0}
PEAK_PER_SHAPE = 1.5
DEFAULT_BASELINE = "1e6fb9e"


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    rss_bytes: int
    events: int
    trace: Path


def _capture(pythonpath: Path, args: list[str], out: Path, env: dict[str, str]) -> Run:
    """One capture in a child process; its own rusage gives CPU time and peak RSS."""
    cmd = [sys.executable, "-m", "kvdiag", "capture", *args, "--executor", "numpy", "-q",
           "-o", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=pythonpath, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env, "PYTHONPATH": str(pythonpath)})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 3):
        raise SystemExit(f"capture failed ({code}): {' '.join(cmd)}\n{stdout}{stderr}")
    with out.open("rb") as f:
        events = sum(1 for _ in f) - 1
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, events, out)


def _shape_kv_bytes(args: list[str]) -> int:
    """K/V bytes of every layer, stream and cell of the capture's shape."""
    from kvdiag.cli import build_parser
    from kvdiag.commands._shape import build_config
    from kvdiag.commands.capture import scenario_from_args
    from kvdiag.kvstream.ggml_types import ggml_type

    ns = build_parser().parse_args(["capture", *args, "-o", "unused"])
    cfg = build_config(ns, base=scenario_from_args(ns).config,
                       sizing=scenario_from_args(ns).sizing)
    width = cfg.head_dim * cfg.n_head_kv
    row = ggml_type(cfg.type_k).row_bytes(width) + ggml_type(cfg.type_v).row_bytes(width)
    return int(cfg.layers * cfg.n_stream * cfg.kv_size * row)


def _baseline_tree(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kvdiag"],
                             capture_output=True, check=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _same_results(a: Path, b: Path) -> str:
    """'identical' when both traces hold the same decisions and outputs (the comparison of
    tests/capture_fixtures.py), else where they first differ."""
    da, db = decisions(a), decisions(b)
    if len(da) != len(db):
        return f"DIFFERENT: {len(da)} vs {len(db)} events"
    for i, (x, y) in enumerate(zip(da, db, strict=True)):
        diff = sorted(k for k in x if x[k] != y.get(k))
        if diff:
            return f"DIFFERENT at event {i} ({x['kind']}, step {x['step']}): {', '.join(diff)}"
    outputs = sum(1 for e in da if e["kind"] == "output")
    return f"identical ({len(da)} events, {outputs} outputs)"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"git revision to compare with (default {DEFAULT_BASELINE})")
    parser.add_argument("--no-baseline", action="store_true", help="time this tree only")
    parser.add_argument("--keep-views", choices=("0", "1"), default="1",
                        help="KVDIAG_NUMPY_KEEP_VIEWS for this tree's captures (0: no views)")
    parser.add_argument("--threads", type=int, help="KVDIAG_NUMPY_THREADS for this tree")
    args = parser.parse_args()
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    env = {"KVDIAG_NUMPY_KEEP_VIEWS": args.keep_views}
    if args.threads:
        env["KVDIAG_NUMPY_THREADS"] = str(args.threads)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "?"
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; this tree at {head} "
          f"(keep views {args.keep_views}, threads {args.threads or 'default'})")
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base_root = None if args.no_baseline else _baseline_tree(args.baseline, tmp / "base")
        for name in names:
            cargs = CASES[name]
            shape = _shape_kv_bytes(cargs)
            print(f"\n{name}: kvdiag capture {' '.join(cargs)} --executor numpy")
            print(f"  K/V bytes of the shape {shape / 2**20:.0f} MiB; peak RSS target "
                  f"{PEAK_PER_SHAPE * shape / 2**20:.0f} MiB; time target {TARGET_S[name]:.0f} s")
            load0 = _load()
            new = _capture(ROOT, cargs, tmp / f"{name}.kvtrace", env)
            rows = [("this tree", new)]
            if base_root is not None:
                old = _capture(base_root, cargs, tmp / f"{name}.base.kvtrace", {})
                rows.append((f"baseline {args.baseline}", old))
            print(f"  load average {load0} before, {_load()} after")
            print(f"  {'':18} {'wall s':>8} {'cpu s':>8} {'peak RSS MiB':>13} {'xK/V':>6} "
                  f"{'events':>7} {'events/s':>9}")
            for label, r in rows:
                print(f"  {label:18} {r.wall_s:8.2f} {r.cpu_s:8.2f} {r.rss_bytes / 2**20:13.0f} "
                      f"{r.rss_bytes / shape:6.2f} {r.events:7d} {r.events / r.wall_s:9.0f}")
            if base_root is not None:
                old = rows[1][1]
                print(f"  ratio baseline/this: wall {old.wall_s / new.wall_s:.2f}x, "
                      f"cpu {old.cpu_s / new.cpu_s:.2f}x, peak RSS "
                      f"{old.rss_bytes / new.rss_bytes:.2f}x")
                print(f"  results vs baseline: {_same_results(old.trace, new.trace)}")
            ok_t = new.wall_s <= TARGET_S[name]
            ok_m = new.rss_bytes <= PEAK_PER_SHAPE * shape
            verdicts.append(f"{name}: time {'PASS' if ok_t else 'MISS'} "
                            f"({new.wall_s:.1f} s vs {TARGET_S[name]:.0f} s), memory "
                            f"{'PASS' if ok_m else 'MISS'} ({new.rss_bytes / shape:.2f}x)")
    print()
    for v in verdicts:
        print(f"target    {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
