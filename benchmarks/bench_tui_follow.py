"""Latency of ``kvdiag tui --follow``: from an event's write to the screen showing it, at 3,000
events/s.

Run: ``.venv/bin/python benchmarks/bench_tui_follow.py [--rate 3000] [--rounds 2] [--lead 3]``.

Each round runs the viewer headlessly (Textual's ``App.run_test``) on one screen, following a
file that bench_follow.py's writer thread appends in this process (one ``write()`` per event
at ``--rate`` events/s: exact reads, then after ``--lead`` seconds one foreign read, then two
more seconds). Every 5 ms the benchmark samples what that screen's own data holds — the
Timeline's rows, the step Pages shows, the Findings screen's list — and each batch of writes
(timed just before its first write) counts as shown at the first sample that holds its last
event. Per screen: the Timeline's latency over every batch, Pages' over every step (it
follows the newest), the Findings' for the foreign read. Target (issue 18): ≤ 1 s. Baseline
in the same round: ``tail -F`` on the same file, to the trigger line. CPU: the viewer's
share of a core while following (this process's CPU time less the writer thread's own).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_follow import TARGET_S, Writer, first_line

from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.screens.findings import FindingsScreen
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.timeline import TimelineScreen

SCREENS = {"timeline": "2", "pages": "4", "findings": "7"}
SAMPLE_S = 0.005
RULE = "foreign-page-read"


class TimedWriter(Writer):
    """bench_follow's writer, with its own CPU time (to leave it out of the viewer's)."""

    cpu = 0.0

    def run(self) -> None:
        t0 = time.thread_time()
        try:
            super().run()
        finally:
            self.cpu = time.thread_time() - t0


def shown(screen: Any) -> tuple[int, int, bool]:
    """(Timeline rows, Pages step, Findings has the rule) as the current screen holds them;
    -1 / False for what another screen holds."""
    if isinstance(screen, TimelineScreen):
        return (len(screen.rows) if screen.rows is not None else 0), -1, False
    if isinstance(screen, PagesScreen):
        return -1, screen.shown_step, False
    if isinstance(screen, FindingsScreen):
        return -1, -1, any(f.rule == RULE for f in screen.findings)
    return -1, -1, False


def first_at(samples: list[tuple[float, int, int, bool]], t: float, ok: Any) -> float | None:
    for s in samples:
        if s[0] >= t and ok(s):
            return s[0]
    return None


def one_round(tmp: Path, screen: str, rate: float, lead: float, prefix: Path | None,
              prefix_events: int) -> dict[str, Any]:
    path = tmp / f"live-{time.monotonic_ns()}.kvtrace"
    if prefix is not None:
        shutil.copyfile(prefix, path)
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    got_tail: dict[str, float] = {}
    reader = threading.Thread(target=first_line, args=(tail, b'"pool",999', got_tail),
                              daemon=True)
    reader.start()
    w = TimedWriter(path, rate, lead, 2.0, prefix=prefix_events)
    samples: list[tuple[float, int, int, bool]] = []
    cpu: dict[str, float] = {}

    async def run() -> None:
        app = KvdiagApp([str(path)], follow=True)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press(SCREENS[screen])
            t_open = time.monotonic()
            while prefix_events and getattr(getattr(app.doc, "index", None), "n", -1) \
                    < prefix_events:
                await asyncio.sleep(0.05)
            cpu["catch_up"] = time.monotonic() - t_open
            await asyncio.sleep(0.5)
            c0, t0 = time.process_time(), time.monotonic()
            w.start()
            while w.is_alive() or time.monotonic() - (w.marks[-1][0] if w.marks else 0) < 1.5:
                samples.append((time.monotonic(), *shown(app.screen)))
                await asyncio.sleep(SAMPLE_S)
            cpu["s"], cpu["wall"] = time.process_time() - c0, time.monotonic() - t0
            app.exit(None)

    asyncio.run(run())
    reader.join(timeout=5)
    tail.kill()
    tail.wait()
    path.unlink(missing_ok=True)
    assert w.trigger_at is not None
    out: dict[str, Any] = {"screen": screen, "events": w.events, "rate": w.events / w.elapsed,
                           "tail": got_tail.get("t", float("nan")) - w.trigger_at,
                           "cpu": (cpu["s"] - w.cpu) / cpu["wall"],
                           "catch_up": cpu["catch_up"]}
    lat: list[float] = []
    if screen == "timeline":
        for t, n, _step in w.marks:
            at = first_at(samples, t, lambda s, n=n: s[1] >= n)
            lat.append(float("inf") if at is None else at - t)
    elif screen == "pages":
        firsts: dict[int, float] = {}
        for t, _n, step in w.marks:
            firsts.setdefault(step, t)  # the batch that wrote the step's first events
        for step, t in firsts.items():
            at = first_at(samples, t, lambda s, step=step: s[2] >= step)
            lat.append(float("inf") if at is None else at - t)
    else:
        at = first_at(samples, w.trigger_at, lambda s: s[3])
        lat.append(float("inf") if at is None else at - w.trigger_at)
    out["lat"] = sorted(lat)
    return out


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--rate", type=float, default=3000.0)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per screen")
    ap.add_argument("--lead", type=float, default=3.0,
                    help="seconds of exact reads before the foreign one")
    ap.add_argument("--prefix", type=int, default=0, metavar="N",
                    help="events already in the file when the viewer opens it (a run that has "
                         "been going on: 3,000 events/s is 10.8 million an hour)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        prefix = None
        if args.prefix:
            prefix = Path(tmp) / "prefix.kvtrace"
            TimedWriter(prefix, args.rate, 0, 0, prefix=args.prefix).write_prefix()
        for _ in range(args.rounds):
            for screen in SCREENS:
                results.append(one_round(Path(tmp), screen, args.rate, args.lead, prefix,
                                         args.prefix))
    load_after = os.getloadavg()
    rates = [r["rate"] for r in results]
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
          f"{platform.release()}, Python {platform.python_version()}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (shared machine)")
    print(f"writer    {min(rates):,.0f}-{max(rates):,.0f} events/s achieved (asked "
          f"{args.rate:,.0f}), one write() per event, a thread of the viewer's process")
    if args.prefix:
        caught = sorted(r["catch_up"] for r in results)
        print(f"prefix    {args.prefix:,} events in the file before the viewer opened it "
              f"(read and judged in {caught[0]:.1f}-{caught[-1]:.1f} s), then appended to")
    worst = 0.0
    for screen, what in (("timeline", "every batch of events"), ("pages", "every step"),
                         ("findings", "the foreign read's finding")):
        lat = sorted(x for r in results if r["screen"] == screen for x in r["lat"])
        cpu = [r["cpu"] for r in results if r["screen"] == screen]
        worst = max(worst, lat[-1])
        print(f"{screen:<9} write → shown ({what}, {len(lat)} samples): median "
              f"{pct(lat, 0.5):.3f} s, p99 {pct(lat, 0.99):.3f} s, max {lat[-1]:.3f} s; "
              f"viewer CPU {min(cpu):.0%}-{max(cpu):.0%} of a core")
    tails = sorted(r["tail"] for r in results)
    trig = sorted(x for r in results if r["screen"] == "findings" for x in r["lat"])
    print(f"baseline  write → tail -F output (the trigger line): median "
          f"{pct(tails, 0.5):.3f} s, max {tails[-1]:.3f} s; ratio (medians, Findings) "
          f"{pct(trig, 0.5) / pct(tails, 0.5):.2f}x")
    print(f"target    ≤ {TARGET_S:.0f} s at {args.rate:,.0f} events/s, every screen: "
          f"{'PASS' if worst <= TARGET_S else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
