"""Cost of kernels/kvtrace.h, off and on, and of checking a native trace.

Run: ``.venv/bin/python benchmarks/bench_native.py [--events N] [--repeat R] [--dir D]``.

Builds kernels/native_tests/kvtrace_bench.c with ``gcc -O2`` and measures, each against a
baseline from the same run:

- OFF (KVTRACE_FILE unset): ns per iteration of a loop holding one ``KVTRACE_UPLOAD`` vs the
  same loop empty. Target (issue 10): indistinguishable, < 1 ns per call.
- ON, one thread and 8 threads: events/s written to a file in ``--dir`` and bytes per event,
  vs a loop of plain ``write()`` calls of a line of the same size to an O_APPEND file (the
  floor: kvtrace.h does one write() per event). Target: >= 1,000,000 events/s single-threaded.
  The same two into /dev/null give kvtrace.h's own cost per event without the file system.
- ROTATION (issue 18): the decode-shaped ``gen`` workload (below) into a file, written by
  kvtrace.h as it is on ``main`` (``git show main:kernels/kvtrace.h``, when git has it), by this
  kvtrace.h with plain tracing, and by this kvtrace.h rotating (``KVTRACE_MAX_MB``,
  ``KVTRACE_KEEP=2``: the shadow of slots and versions, a snapshot per segment, deletions),
  alternating runs, best of ``--repeat``. Target: rotation costs within 5 % of today's header.
- ``kvdiag check`` on a native trace of ``--events`` events written by the same program
  (a decode-shaped mix: step, mark, per layer write/upload/read, outputs, fits every 64th
  step; both streams' pages share slots, so 44 % of the pages read are foreign), wall and CPU
  time as a ratio to ``kvdiag trace validate`` on the same file. Target (issue "One truth"
  §5): ≤ 1.5x.
- ``--rss N,N,...``: the same program's trace of N events streamed straight into
  ``kvdiag check -`` (never stored), peak RSS of the check process for each N. Target: memory
  independent of the trace's length (the issue's 50M-event run: ``--rss
  5000000,25000000,50000000``).

Timings are best of ``--repeat``, wall clock with this process's CPU time (all threads)
beside it in parentheses: on a shared machine, or a VM where system calls exit to the
hypervisor, the two differ a lot and the CPU figure is the steadier. The load average is
printed. The off cost is judged on CPU time (it is a property of the instructions), the
on and check targets on wall clock.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "kernels" / "native_tests" / "kvtrace_bench.c"
OFF_TARGET_NS = 1.0
ON_TARGET = 1_000_000
CHECK_TARGET = 1.5
ROTATION_TARGET = 1.05


def build(out: Path, include: Path = ROOT / "kernels", name: str = "kvtrace_bench") -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("bench_native: no C compiler (gcc) found")
    exe = out / name
    subprocess.run([cc, "-std=c99", "-O2", "-I", str(include), str(SOURCE), "-o",
                    str(exe), "-pthread"], check=True)
    return exe


TODAY_HEADER = "9c53cd1^1"
"""The commit whose kvtrace.h was today's when issue 18 asked for rotation: the first parent of
the merge that brought bounded traces in (``main`` itself has them since)."""


def main_header(out: Path) -> Path | None:
    """A folder holding the kvtrace.h of :data:`TODAY_HEADER` (the header before bounded
    traces), or None where the history does not hold it (a shallow clone)."""
    proc = subprocess.run(["git", "-C", str(ROOT), "show", f"{TODAY_HEADER}:kernels/kvtrace.h"],
                          capture_output=True, check=False)
    if proc.returncode != 0 or b"kvtrace_12_" not in proc.stdout:
        return None
    folder = out / "main_kernels"
    folder.mkdir()
    (folder / "kvtrace.h").write_bytes(proc.stdout)
    return folder


def run(exe: Path, *args: str, trace: Path | None = None,
        env_extra: dict[str, str] | None = None) -> list[float]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVTRACE_FILE", "KVTRACE_MAX_MB", "KVTRACE_KEEP", "KVTRACE_RING_MB")}
    env.update(env_extra or {})
    if trace is not None:
        env["KVTRACE_FILE"] = str(trace)
    proc = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=True)
    return [float(x) for x in proc.stdout.split()]


def timed(cmd: list[str]) -> tuple[float, int, str, float]:
    """(wall s, exit code, output, CPU s of the child)."""
    import resource

    extra = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + extra if extra else "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, proc.returncode, proc.stdout + proc.stderr, cpu


def streamed_check(exe: Path, n: int) -> tuple[float, float, int, int]:
    """``kvtrace_bench gen n`` piped into ``kvdiag check -``: (wall s, CPU s, peak RSS KiB,
    exit code) of the check process."""
    extra = os.environ.get("PYTHONPATH")
    read_end, write_end = os.pipe()
    # the pipe's own descriptor, kept open in the child (a dup2 to 3 in preexec_fn was closed
    # again by close_fds: the generator traced nothing)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + extra if extra else ""),
           "KVTRACE_FILE": f"/dev/fd/{write_end}"}
    t = time.perf_counter()
    gen = subprocess.Popen([str(exe), "gen", str(n)], env=env, stdout=subprocess.DEVNULL,
                           pass_fds=(write_end,))
    os.close(write_end)
    check = subprocess.Popen([sys.executable, "-m", "kvdiag", "check", "-", "--json"],
                             stdin=read_end, stdout=subprocess.DEVNULL)
    os.close(read_end)
    _, status, usage = os.wait4(check.pid, 0)
    wall = time.perf_counter() - t
    gen.wait()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, os.waitstatus_to_exitcode(
        status)


def rss_run(counts: list[int], where: Path | None) -> int:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=where) as tmp_name:
        exe = build(Path(tmp_name))
        rows = [(n, *streamed_check(exe, n)) for n in counts]
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    for n, wall, cpu, rss, code in rows:
        print(f"streamed  {n:>12,} events into kvdiag check -: peak RSS {rss / 1024:7.1f} MiB, "
              f"{wall:7.1f} s wall ({cpu:7.1f} s CPU), exit {code}")
    grow = rows[-1][3] - rows[0][3]
    print(f"target    memory independent of length: {verdict(grow < 0.1 * rows[0][3])} "
          f"(peak RSS {rows[0][3] / 1024:.1f} → {rows[-1][3] / 1024:.1f} MiB from "
          f"{rows[0][0]:,} to {rows[-1][0]:,} events)")
    return 0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--off-iters", type=int, default=300_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None,
                    help="where trace files go (default: the system temp folder)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the kvdiag check/validate part (C figures only)")
    ap.add_argument("--rotation-only", action="store_true",
                    help="only the rotation figures (issue 18)")
    ap.add_argument("--max-mb", default="16", help="KVTRACE_MAX_MB of the rotation runs")
    ap.add_argument("--rss", default="",
                    help="comma-separated event counts: peak RSS of kvdiag check on each "
                         "streamed trace (only this is measured)")
    args = ap.parse_args()
    if args.rss:
        return rss_run([int(x) for x in args.rss.split(",")], args.dir)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        exe = build(tmp)
        n, r = args.events, max(1, args.repeat)
        rotation = rotation_runs(tmp, exe, n, r, args.max_mb)
        if args.rotation_only:
            print_header(load_before)
            print_rotation(rotation, n, args.max_mb)
            return 0

        offs = [run(exe, "off", str(args.off_iters)) for _ in range(r)]
        empty, macro = min(o[0] for o in offs), min(o[1] for o in offs)
        empty_cpu, macro_cpu = min(o[2] for o in offs), min(o[3] for o in offs)
        spread = max(o[2] for o in offs) - empty_cpu

        trace = tmp / "on.kvtrace"
        one = [run(exe, "on", str(n), "1", trace=trace) for _ in range(r)]
        t1, c1 = min(o[0] for o in one), min(o[2] for o in one)
        line_bytes = one[0][1]
        eight = [run(exe, "on", str(n), "8", trace=trace) for _ in range(r)]
        t8, c8 = min(o[0] for o in eight), min(o[2] for o in eight)
        plains = [run(exe, "write", str(n), str(round(line_bytes)), str(tmp / "plain.txt"))
                  for _ in range(r)]
        plain, plain_c = min(o[0] for o in plains), min(o[1] for o in plains)
        trace.unlink()
        (tmp / "plain.txt").unlink()
        # the same into /dev/null: the system call costs little there, so the difference is
        # kvtrace.h's own work per event (format, lock, clock)
        null = Path(os.devnull)
        nulls = [run(exe, "on", str(n), "1", trace=null) for _ in range(r)]
        t_null, c_null = min(o[0] for o in nulls), min(o[2] for o in nulls)
        pnulls = [run(exe, "write", str(n), str(round(line_bytes)), str(null)) for _ in range(r)]
        plain_null, plain_null_c = min(o[0] for o in pnulls), min(o[1] for o in pnulls)

        check = validate = None
        check_cpu = validate_cpu = 1.0
        check_rc = 0
        events_written = 0
        if not args.no_check:
            gen = tmp / "gen.kvtrace"
            events_written = int(run(exe, "gen", str(n), trace=gen)[0])
            size = gen.stat().st_size
            validate_runs = [timed([sys.executable, "-m", "kvdiag", "trace", "validate",
                                    str(gen)]) for _ in range(r)]
            check_runs = [timed([sys.executable, "-m", "kvdiag", "check", str(gen)])
                          for _ in range(r)]
            if validate_runs[0][1] != 0:
                print(validate_runs[0][2], file=sys.stderr)
                sys.exit("bench_native: the generated trace does not validate")
            validate = min(v[0] for v in validate_runs)
            check = min(c[0] for c in check_runs)
            validate_cpu = min(v[3] for v in validate_runs)
            check_cpu = min(c[3] for c in check_runs)
            check_rc = check_runs[0][1]

    print_header(load_before)
    print(f"off       empty loop {empty:.3f} ({empty_cpu:.3f}) ns/iter, with KVTRACE_UPLOAD "
          f"{macro:.3f} ({macro_cpu:.3f}) ns/iter: +{macro - empty:.3f} "
          f"({macro_cpu - empty_cpu:.3f}) ns per call; CPU spread of the empty loop over "
          f"{r} runs {spread:.3f} ns; {args.off_iters:,} iterations")
    print(f"on 1 thr  {n / t1:11,.0f} ({n / c1:11,.0f}) events/s, {line_bytes:.1f} B/event; "
          f"plain write() of the same line {n / plain:11,.0f} ({n / plain_c:11,.0f}) /s; "
          f"ratio {t1 / plain:.2f}x ({c1 / plain_c:.2f}x) the write() time")
    print(f"on null   {n / t_null:11,.0f} ({n / c_null:11,.0f}) events/s into /dev/null; plain "
          f"write() {n / plain_null:11,.0f} ({n / plain_null_c:11,.0f}) /s; kvtrace.h's own "
          f"work {(t_null - plain_null) / n * 1e9:.0f} ({(c_null - plain_null_c) / n * 1e9:.0f})"
          f" ns/event")
    print(f"on 8 thr  {n / t8:11,.0f} ({n / c8:11,.0f}) events/s (all threads); ratio "
          f"{t8 / plain:.2f}x ({c8 / plain_c:.2f}x) the single-thread write() time")
    if check is not None and validate is not None:
        print(f"check     {events_written:,} events ({size / 1e6:.1f} MB): kvdiag check "
              f"{check:.2f} s ({check_cpu:.2f} s CPU, exit {check_rc}), kvdiag trace validate "
              f"{validate:.2f} s ({validate_cpu:.2f} s CPU); ratio {check / validate:.2f}x "
              f"({check_cpu / validate_cpu:.2f}x CPU)")
    off_ok = macro_cpu - empty_cpu < OFF_TARGET_NS
    print(f"target    off < {OFF_TARGET_NS} ns per call (CPU): {verdict(off_ok)}")
    print(f"target    on >= {ON_TARGET:,} events/s single-threaded: {verdict(n / t1 >= ON_TARGET)}")
    if check is not None and validate is not None:
        print(f"target    check ≤ {CHECK_TARGET}x validate (wall): "
              f"{verdict(check / validate <= CHECK_TARGET)}; (CPU): "
              f"{verdict(check_cpu / validate_cpu <= CHECK_TARGET)}")
    print_rotation(rotation, n, args.max_mb)
    return 0


def print_header(load_before: tuple[float, float, float]) -> None:
    load_after = os.getloadavg()
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, no GPU used, "
          f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print("          wall clock (this process's CPU time)")


def rotation_runs(tmp: Path, exe: Path, n: int, r: int, max_mb: str
                  ) -> dict[str, tuple[float, float, int]]:
    """Best (wall, CPU) of the gen workload per variant, runs alternating; and the segments a
    rotating run leaves."""
    today_dir = main_header(tmp)
    variants: dict[str, tuple[Path, dict[str, str]]] = {
        "plain": (exe, {}), "rotate": (exe, {"KVTRACE_MAX_MB": max_mb, "KVTRACE_KEEP": "2"})}
    if today_dir is not None:
        variants["today"] = (build(tmp, today_dir, "kvtrace_bench_main"), {})
    best: dict[str, list[float]] = {k: [float("inf"), float("inf")] for k in variants}
    segments = 0
    for _ in range(r):
        for name, (program, env) in variants.items():
            folder = tmp / f"rot_{name}"
            folder.mkdir(exist_ok=True)
            _, wall, cpu = run(program, "gen", str(n), trace=folder / "g.kvtrace",
                               env_extra=env)
            best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
            if name == "rotate":
                segments = len(list(folder.glob("g.*.kvtrace")))
            shutil.rmtree(folder)
    return {k: (v[0], v[1], segments if k == "rotate" else 0) for k, v in best.items()}


def print_rotation(res: dict[str, tuple[float, float, int]], n: int, max_mb: str) -> None:
    base = res.get("today", res["plain"])
    label = ("the header before bounded traces" if "today" in res
             else "plain tracing (the header before bounded traces not found)")
    for name, text in (("today", "header before rotation"), ("plain", "plain tracing "),
                       ("rotate", f"rotating {max_mb} MB, keep 2")):
        if name not in res:
            continue
        wall, cpu, _ = res[name]
        print(f"rotation  {text:27s} {n / wall:11,.0f} ({n / cpu:11,.0f}) events/s, "
              f"{wall / n * 1e9:5.0f} ({cpu / n * 1e9:5.0f}) ns/event")
    wall, cpu, segs = res["rotate"]
    print(f"rotation  ratio to {label}: {wall / base[0]:.3f}x wall ({cpu / base[1]:.3f}x CPU); "
          f"{segs} segments kept of the last run")
    print(f"target    rotation within {ROTATION_TARGET:.2f}x today's cost (CPU): "
          f"{verdict(cpu / base[1] <= ROTATION_TARGET)}")


if __name__ == "__main__":
    raise SystemExit(main())
