"""Latency of ``kvdiag check --follow``: from an event's write to its alert, at 3,000 events/s.

Run: ``.venv/bin/python benchmarks/bench_follow.py [--rate 3000] [--rounds 5] [--lead 3]``.

Each round, a writer thread (this process) appends a trace one event at a time, one
``write()`` per line as kvtrace.h does, at ``--rate`` events/s: per step a step event and, per
layer, a write, an upload into the pool and a read served from the slot it was uploaded to
(all exact). After ``--lead`` seconds it writes one read from a pool slot nothing was
uploaded to (a foreign page: an error) and notes the time, then goes on writing for two more
seconds. ``kvdiag check --follow F --exit-on error --json`` follows the file from before it is
created; the time its finding line reaches this process is the alert. Target (issue 18):
≤ 1 s. Baseline in the same round: ``tail -F`` on the same file, the time the trigger line
reaches this process through it (what following a file costs without judging anything).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from kvdiag.model import events as ev
from kvdiag.trace.version import FORMAT_VERSION

LAYERS = 4
TARGET_S = 1.0


def header() -> bytes:
    return msgspec.json.encode({
        "format": "kvtrace", "version": FORMAT_VERSION, "kvdiag_version": "bench",
        "created": "2026-01-01T00:00:00+00:00", "backend": "bench",
        "device": {"name": "none"}, "scenario": {"name": "bench-follow"}}) + b"\n"


class Writer(threading.Thread):
    def __init__(self, path: Path, rate: float, lead: float, tail: float, *,
                 prefix: int = 0) -> None:
        super().__init__(daemon=True)
        self.path, self.rate, self.lead, self.tail = path, rate, lead, tail
        self.prefix = prefix
        """Events already in the file (written by :meth:`write_prefix`): go on after them."""
        self.trigger_at: float | None = None
        self.events = 0
        self.elapsed = 0.0
        self.marks: list[tuple[float, int, int]] = []
        """Per batch of writes: (time just before its first write, events written after it,
        the step of its last event) — what a reader's latency is measured against."""

    def events_(self, step: int = 0) -> Iterator[ev.AnyEvent]:
        """Exact reads forever, from step ``step + 1`` (seq 0: numbered when written)."""
        while True:
            step += 1
            yield ev.Step(seq=0, t_ns=0, step=step, phase="decode", streams=(0,), tokens=1,
                          n_kv=256)
            for layer in range(LAYERS):
                yield ev.Write(seq=0, t_ns=0, step=step, layer=layer, stream=0, cells=(0, 1),
                               rows=(0, 1))
                yield ev.Upload(seq=0, t_ns=0, step=step, layer=layer, stream=0, pages=(0, 1),
                                slot=layer, target="resident", bytes=4096, reason="dirty")
                yield ev.Read(seq=0, t_ns=0, step=step, layer=layer, stream=0, pool=1, ring=0,
                              host=0, served=(ev.Served(0, 1, "pool", layer),))

    def write_prefix(self) -> None:
        """The header and ``prefix`` events at once (a run that has been going on)."""
        enc = msgspec.json.Encoder()
        gen = self.events_()
        with open(self.path, "wb") as fh:
            fh.write(header())
            for n in range(1, self.prefix + 1):
                fh.write(enc.encode(msgspec.structs.replace(next(gen), seq=n, t_ns=n)) + b"\n")

    def _prefix_steps(self) -> int:
        return -(-self.prefix // (1 + 3 * LAYERS))

    def run(self) -> None:
        enc = msgspec.json.Encoder()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if not self.prefix:
                os.write(fd, header())
            start = time.monotonic()
            # after a prefix, from the step after its last (a prefix ends mid-step at worst:
            # that step then shows twice, which only delays nothing)
            gen = self.events_(self._prefix_steps())
            n = 0
            step = 0
            while True:
                now = time.monotonic() - start
                if now >= self.lead + self.tail:
                    break
                if self.trigger_at is None and now >= self.lead:
                    # a read from a pool slot nothing was uploaded to: foreign (an error)
                    n += 1
                    bad = ev.Read(seq=self.prefix + n, t_ns=n, step=step, layer=0, stream=0,
                                  pool=1, ring=0, host=0, served=(ev.Served(0, 1, "pool", 999),))
                    self.trigger_at = time.monotonic()
                    os.write(fd, enc.encode(bad) + b"\n")
                    continue
                batch = max(0, int(now * self.rate) - n)
                t_batch = time.monotonic()
                for _ in range(batch):
                    e = next(gen)
                    n += 1
                    step = e.step
                    os.write(fd, enc.encode(msgspec.structs.replace(
                        e, seq=self.prefix + n, t_ns=n)) + b"\n")
                if batch:
                    self.marks.append((t_batch, self.prefix + n, step))
                time.sleep(0.001)
            self.events, self.elapsed = n, time.monotonic() - start
        finally:
            os.close(fd)


def first_line(proc: subprocess.Popen[bytes], needle: bytes, out: dict[str, float]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            out["t"] = time.monotonic()
            return


def one_round(tmp: Path, rate: float, lead: float) -> tuple[float, float, int, float]:
    path = tmp / f"live-{time.monotonic_ns()}.kvtrace"
    follow = subprocess.Popen([sys.executable, "-m", "kvdiag", "check", "--follow", str(path),
                               "--exit-on", "error", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    got_follow: dict[str, float] = {}
    got_tail: dict[str, float] = {}
    readers = [threading.Thread(target=first_line, args=(follow, b'"foreign-page-read"',
                                                         got_follow), daemon=True),
               threading.Thread(target=first_line, args=(tail, b'"pool",999', got_tail),
                                daemon=True)]
    for r in readers:
        r.start()
    time.sleep(1.5)  # both followers started (kvdiag's imports) before the file exists
    w = Writer(path, rate, lead, 2.0)
    w.start()
    w.join()
    for r in readers:
        r.join(timeout=5)
    follow.wait(timeout=10)
    tail.kill()
    tail.wait()
    path.unlink(missing_ok=True)
    assert w.trigger_at is not None
    if "t" not in got_follow:
        sys.exit(f"bench_follow: kvdiag check --follow reported nothing (exit {follow.returncode})")
    return (got_follow["t"] - w.trigger_at, got_tail.get("t", float("nan")) - w.trigger_at,
            w.events, w.events / w.elapsed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--rate", type=float, default=3000.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lead", type=float, default=3.0,
                    help="seconds of exact reads before the foreign one")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_round(Path(tmp), args.rate, args.lead) for _ in range(args.rounds)]
    load_after = os.getloadavg()
    lat = sorted(r[0] for r in results)
    tails = sorted(r[1] for r in results)
    rates = [r[3] for r in results]
    print(f"date      {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
          f"{platform.release()}, Python {platform.python_version()}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (shared machine)")
    print(f"writer    {min(rates):,.0f}-{max(rates):,.0f} events/s achieved (asked "
          f"{args.rate:,.0f}), one write() per event, {args.lead:.0f} s before the trigger")
    print(f"latency   write → kvdiag check --follow alert: median {lat[len(lat) // 2]:.3f} s, "
          f"max {lat[-1]:.3f} s over {len(lat)} rounds ({', '.join(f'{x:.3f}' for x in lat)})")
    print(f"baseline  write → tail -F output: median {tails[len(tails) // 2]:.3f} s, max "
          f"{tails[-1]:.3f} s; ratio (medians) {lat[len(lat) // 2] / tails[len(tails) // 2]:.1f}x")
    print(f"target    ≤ {TARGET_S:.0f} s at {args.rate:,.0f} events/s: "
          f"{'PASS' if lat[-1] <= TARGET_S else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
