"""kvdiag sql on a large native trace: conversion, then a group-by over its judged pages.

Run: ``.venv/bin/python benchmarks/bench_sql.py [--events N] [--dir D] [--keep]``.

1. Writes a native trace of ``--events`` events with kernels/native_tests/kvtrace_bench.c's
   generator (``gen``, bench_native.py's: a decode-shaped mix of step, mark, per layer write,
   upload and read, outputs, fits every 64th step), streamed to disk by the C program.
2. Conversion of the judged pages: ``kvdiag sql --parquet DIR --tables pages TRACE`` (the
   trace read once, judged once, memory independent of its length): wall time, CPU time of
   the process and its threads, peak RSS. Every table (events too) is converted for the first
   ``--full-events`` events of the same trace, to state that rate as well.
3. The query: ``kvdiag sql "SELECT layer, class, sum(pages) … FROM pages GROUP BY …" DIR``, the
   whole command (start-up included), best of ``--repeat``. Target (issue 18): ≤ 10 s.
   Baseline in the same run: ``kvdiag check TRACE`` — the only other way to get the judged
   page counts, one pass over the trace — and the sums are compared with check's
   ``read_classes`` (they must agree).
4. Loader paths on this machine (``--loaders``): 1M rows of the pages table into DuckDB via a
   JSON Lines spool + read_json (what kvdiag uses) vs via a dict of numpy arrays.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_native import build, run

QUERY = ("SELECT layer, class, sum(pages) AS pages, count(*) AS runs FROM pages "
         "GROUP BY layer, class ORDER BY layer, class")
TARGET_S = 10.0


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds of the child (all threads), exit code, stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        sys.exit(f"bench_sql: {' '.join(cmd[:4])} failed: {proc.stderr.strip()}")
    return wall, cpu, proc.returncode, proc.stdout


def loaders(n: int) -> tuple[float, float]:
    import duckdb
    import msgspec
    import numpy as np

    from kvdiag.sql.schema import PAGES
    from kvdiag.sql.store import _row_select

    rows = [(i, i // 40, i % 40, i % 2, "pool", i % 500, i % 700, i % 700 + 1, 1,
             ("exact", "stale", "foreign")[i % 3], None, None, None, None, None, None, None)
            for i in range(n)]
    con = duckdb.connect()
    con.execute("CREATE SCHEMA loaded")
    con.execute(PAGES.ddl().replace('CREATE TABLE "', 'CREATE TABLE loaded."', 1))
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = Path(tmp) / "b.jsonl"
        path.write_bytes(msgspec.json.Encoder().encode_lines(rows))
        con.execute(_row_select(PAGES, str(path)), {"file": "x"})
        spool = time.perf_counter() - t
    t = time.perf_counter()
    cols = list(zip(*rows, strict=True))
    # DuckDB finds the local name `batch` in the query (its replacement scan)
    batch = {  # noqa: F841
        name: np.array(col, dtype=object if typ == "VARCHAR" or None in col else np.int64)
        for (name, typ), col in zip(PAGES.columns[1:], cols, strict=True)}
    con.execute("CREATE TABLE b AS SELECT * FROM batch")
    numpy_s = time.perf_counter() - t
    assert con.execute("SELECT count(*) FROM b").fetchone() == (n,)
    return spool, numpy_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--events", type=int, default=50_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the trace and the Parquet folder")
    ap.add_argument("--trace", type=Path, default=None,
                    help="use this native trace instead of generating one")
    ap.add_argument("--full-events", type=int, default=1_000_000,
                    help="events converted with every table, for that rate (0: skip)")
    ap.add_argument("--loaders", type=int, default=1_000_000,
                    help="rows for the loader comparison (0: skip)")
    args = ap.parse_args()
    kvdiag = [sys.executable, "-m", "kvdiag"]
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-sql-"))
    exe = build(tmp)
    gen_s = 0.0
    if args.trace is not None:
        trace = args.trace
        with open(trace, "rb") as fh:
            written = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 24), b"")) - 1
    else:
        trace = tmp / "gen.kvtrace"
        t = time.perf_counter()
        written = int(run(exe, "gen", str(args.events), trace=trace)[0])
        gen_s = time.perf_counter() - t
    size = trace.stat().st_size
    out = tmp / "parquet"
    conv_wall, conv_cpu, _, _ = timed([*kvdiag, "sql", "--parquet", str(out), "--tables",
                                       "pages", str(trace)])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    full = None
    if args.full_events:
        head = tmp / "head.kvtrace"
        with open(trace, "rb") as src, open(head, "wb") as dst:
            for i, line in enumerate(src):
                if i > args.full_events:
                    break
                dst.write(line)
        f_wall, f_cpu, _, _ = timed([*kvdiag, "sql", "--parquet", str(tmp / "full"),
                                     str(head)])
        full = (f_wall, f_cpu)
    parquet_mb = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    queries = [timed([*kvdiag, "sql", "--format", "json", QUERY, str(out)])
               for _ in range(max(1, args.repeat))]
    q_wall = min(q[0] for q in queries)
    check_wall, check_cpu, _, check_out = timed([*kvdiag, "check", "--json", str(trace)])
    classes = json.loads(check_out)["summary"]["residency"]["read_classes"]
    sums: dict[str, int] = {}
    for line in queries[0][3].splitlines():
        row = json.loads(line)
        sums[row["class"]] = sums.get(row["class"], 0) + row["pages"]
    agree = all(sums.get(k.replace("_", " "), 0) == v for k, v in classes.items())
    spool_s = numpy_s = None
    if args.loaders:
        spool_s, numpy_s = loaders(args.loaders)
    load_after = os.getloadavg()
    if not args.keep:
        import shutil

        shutil.rmtree(tmp)
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
          f"{platform.release()}, Python {platform.python_version()}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (shared machine)")
    print(f"trace     {written:,} events, {size / 1e9:.2f} GB"
          + (f", generated in {gen_s:.1f} s" if gen_s else f" ({trace})"))
    print(f"convert   kvdiag sql --parquet --tables pages: {conv_wall:.1f} s wall, "
          f"{conv_cpu:.1f} s CPU ({written / conv_cpu:,.0f} events per CPU second), peak RSS "
          f"{peak:.0f} MB, Parquet {parquet_mb:.0f} MB")
    if full is not None:
        print(f"convert   every table (events too), first {args.full_events:,} events: "
              f"{full[0]:.1f} s wall, {full[1]:.1f} s CPU ({args.full_events / full[1]:,.0f} "
              "events per CPU second)")
    print(f"query     {QUERY}")
    print(f"          kvdiag sql over the Parquet folder: {q_wall:.2f} s (best of "
          f"{len(queries)}: {', '.join(f'{q[0]:.2f}' for q in queries)})")
    print(f"baseline  kvdiag check on the trace: {check_wall:.1f} s wall ({check_cpu:.1f} s "
          f"CPU); ratio query / check {q_wall / check_wall:.3f}")
    print(f"agree     page sums by class {sums} vs check's read_classes {classes}: "
          f"{'yes' if agree else 'NO'}")
    if spool_s is not None and numpy_s is not None:
        print(f"loaders   {args.loaders:,} pages rows: JSON Lines spool + read_json "
              f"{spool_s:.2f} s, dict of numpy arrays {numpy_s:.2f} s")
    print(f"target    group-by <= {TARGET_S:.0f} s: {'PASS' if q_wall <= TARGET_S else 'MISS'}")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
