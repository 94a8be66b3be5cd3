"""Headless benchmark of ``kvdiag tui`` on a synthetic trace of 5,000,000 events.

Run: ``.venv/bin/python benchmarks/bench_tui.py [--events N] [--presses N] [--no-baselines]``.

A child process writes the trace (TraceWriter, one decode step of a 32-layer, 2-stream model per
~230 events: per layer a write per stream, every 8th step a rewrite of the holder stream's last
resident page (stale until the next re-upload), a fits decision, every 8th step a resident
re-upload of each layer (with evictions every 64th), per stream a ring upload of the pages past
the window and a read with its ``served`` runs — the shared (layer, page) keys make the other
stream's pool pages foreign — and the model's matching ``ranges`` annotation; outputs;
telemetry every 10th step). A viewer then runs headlessly (``App.run_test``, 160x48) in a
process of its own, with an empty judgement cache (``KVDIAG_CACHE_DIR`` in the run's temporary
folder: a first open) and the C helpers built (``KVDIAG_COMPILED_DIR`` there too, filled by a
viewer on a 20,000-event trace before: they are built once per install, on first use; the time
that took is printed apart), and measures:

- first paint: from before ``import kvdiag.tui.app`` until the Overview shows the trace header
  (target < 1 s; issue 15 measured 0.73 s before the judgement), and that indexing was still
  running then;
- first judged prefix / fully indexed / pages ready / judged (findings ready, the whole trace's
  findings shown; target <= 10 s): when the loader published each stage (the Judge runs behind
  the indexer, in a child process for a trace this big), with the viewer's CPU time by then
  and the judging process's own CPU time;
- memory: peak RSS of the viewer process plus the judging process's own peak (``VmHWM``, which
  it reports), target <= 600 MiB together;
- Pages scrub: one ``right``/``left`` key press until the screen has processed it and repainted
  (targets: median < 50 ms, p95 < 150 ms);
- Timeline filter: setting the filter input to a new expression until the table repainted
  (same targets).

Then a second viewer opens the same file, its judgement now cached (issue 15 §5: computed once
per trace, cached for the TUI): first paint, findings ready, indexed and its peak RSS, reported
apart from the first open (the targets are judged on the first open).

Baselines measured in the same run: indexing vs. a full typed read with ``TraceReader``;
findings ready vs. ``kvdiag check`` on the same file (the same Judge, one pass, nothing else);
a scrub step vs. rebuilding that step's state by replaying the trace from the start
(``PagesReplay``), which is what random access over the index avoids.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAYERS = 32
STREAMS = 2
PAGES = 64
WINDOW = 8
RING = PAGES - WINDOW
PROMPT = 4096
KV_SIZE = PAGES * 256
FILTERS = ("kind:read", "layer:3", "stream:1 step:1000-2000", "slot:40", "kind:fits layer:0-7",
           "kind:upload,evict", "read stream:0 layer:31", "step:20000-20100", "kind:telemetry",
           "")


# -- the synthetic trace -------------------------------------------------------------------

def write_trace(path: Path, n_events: int, annotated: bool = True) -> int:
    from kvdiag.model.events import (
        Device,
        Evict,
        Fits,
        Output,
        Read,
        ReadRange,
        Served,
        Step,
        Telemetry,
        Upload,
        Write,
    )
    from kvdiag.model.geometry import Tensor
    from kvdiag.trace.writer import TraceWriter, make_header

    def tensor(name: str, ne: tuple[int, int, int, int], data: int, buffer: str,
               runtime: int | None = None, type_: str = "f16") -> Tensor:
        nb0 = 2 if type_ == "f16" else 4
        nb = (nb0, nb0 * ne[0], nb0 * ne[0] * ne[1], nb0 * ne[0] * ne[1] * ne[2])
        return Tensor(name, type_, ne, nb, data=data, buffer=buffer, runtime=runtime)

    header = make_header(
        "synthetic", Device("bench GPU", memory_bytes=24 << 30, driver="560.35", pcie="Gen4 x16"),
        scenario={"name": "bench", "description": "synthetic decode, 32 layers, 2 streams",
                  "config": {"layers": LAYERS, "np": STREAMS, "layout": "shared",
                             "dispatch": "membership", "ctx": KV_SIZE * STREAMS}},
        plan={"pages_per_stream": PAGES, "resident_pages_per_layer": WINDOW,
              "ring_slots": RING, "pool_pages": LAYERS * WINDOW + RING, "n_stream": STREAMS,
              "page_bytes": 1 << 20},
    )
    q = tensor("Qcur", (256, 1, 32, 1), 0, "CUDA0", type_="f32")
    ks = [tensor(f"cache_k_l{i}", (256, KV_SIZE, 8, 1), 0x7F3A00000000 + i * (1 << 28),
                 "CUDA_KV_Stream_Host", 1) for i in range(LAYERS)]
    vs = [tensor(f"cache_v_l{i}", (256, KV_SIZE, 8, 1), 0x7F3A08000000 + i * (1 << 28),
                 "CUDA_KV_Stream_Host", 1) for i in range(LAYERS)]
    dst = tensor("kqv_out", (256, 32, 1, 1), 0, "CUDA0", type_="f32")
    versions: dict[tuple[int, int, int], int] = {}
    copied: dict[tuple[int, int], int] = {}  # (layer, pool page) -> version the slot holds

    def write(step: int, layer: int, s: int, cell: int, dirty: bool) -> None:
        page = cell // 256
        key = (layer, s, page)
        versions[key] = versions.get(key, 0) + 1
        w.emit(Write, step, layer=layer, stream=s, cells=(cell, cell + 1),
               rows=(s * KV_SIZE + cell, s * KV_SIZE + cell + 1),
               dirty=((layer, None, page),) if dirty else (),
               versions=((page, versions[key]),))

    with TraceWriter.create(path, header) as w:
        step = 0
        while w.seq < n_events - 1:
            cell = PROMPT + step % (KV_SIZE - PROMPT)
            page = cell // 256
            n_pages = page + 1
            holder = step // 8 % 2  # the stream whose pages the layer's pool slots hold
            w.emit(Step, step, phase="decode", streams=(0, 1), tokens=1, n_kv=n_pages * 256,
                   slots=(0, 1))
            for layer in range(LAYERS):
                for s in range(STREAMS):
                    write(step, layer, s, cell, False)
                if step % 8 == 4:
                    # a rewrite of the holder's last resident page: its pool copy is stale
                    # until the next re-upload (the dirty mark is keyed (layer, page))
                    write(step, layer, holder, (WINDOW - 1) * 256, True)
                w.emit(Fits, step, node=f"__fattn__-{layer}", layer=layer, q=q, k=ks[layer],
                       v=vs[layer], dst=dst, stage_bytes=12 << 20, result=True,
                       route="streamed", membership=True)
                base = layer * WINDOW
                if step % 8 == 0:
                    if step % 64 == 0 and step:
                        for p in range(WINDOW):
                            w.emit(Evict, step, slot=base + p, layer=layer, page=p,
                                   stream=1 - holder, bytes=1 << 20, reason="replaced")
                    w.emit(Upload, step, layer=layer, stream=holder, pages=(0, WINDOW),
                           slot=base, target="resident", bytes=WINDOW << 20, reason="dirty")
                    for p in range(WINDOW):
                        copied[(layer, p)] = versions.get((layer, holder, p), 0)
                for s in range(STREAMS):
                    # the pages beyond the window stream through the ring, copied just before
                    # the read (exact)
                    w.emit(Upload, step, layer=layer, stream=s, pages=(WINDOW, n_pages),
                           slot=0, target="ring", bytes=(n_pages - WINDOW) << 20,
                           reason="ring")
                    if holder == s:
                        lag = versions.get((layer, s, WINDOW - 1), 0) - copied[(layer, WINDOW - 1)]
                        ranges = [ReadRange(0, WINDOW, "pool", s, "exact")] if lag == 0 else [
                            ReadRange(0, WINDOW - 1, "pool", s, "exact"),
                            ReadRange(WINDOW - 1, WINDOW, "pool", s, "stale", lag)]
                    else:
                        ranges = [ReadRange(0, WINDOW, "pool", holder, "foreign")]
                    ranges.append(ReadRange(WINDOW, n_pages, "ring", s, "exact"))
                    w.emit(Read, step, layer=layer, stream=s, pool=WINDOW,
                           ring=n_pages - WINDOW, host=0,
                           ranges=tuple(ranges) if annotated else (),
                           served=(Served(0, WINDOW, "pool", base),
                                   Served(WINDOW, n_pages, "ring", 0)))
            for s in range(STREAMS):
                w.emit(Output, step, stream=s, checksum="1a2b3c4d", ref_checksum="1a2b3c4d",
                       max_abs_delta=0.0, tolerance=1e-3, worst_layer=0)
            if step % 10 == 0:
                w.emit(Telemetry, step, mem_used=(20 << 30) + (step % 97) * (1 << 24),
                       mem_total=24 << 30, gpu_util=60 + step % 40, mem_util=30 + step % 20,
                       pcie_rx_kbps=12_000_000 + (step % 13) * 100_000,
                       pcie_tx_kbps=400_000 + (step % 7) * 10_000, sm_clock_mhz=2520,
                       mem_clock_mhz=10501)
            w.end_step()
            step += 1
        return w.seq + 1


# -- measuring -----------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def rss_mib() -> dict[str, float]:
    """VmRSS and its parts: RssAnon (the process's own memory) and RssFile (mapped file pages,
    reclaimable: the trace's pages the viewer has looked at)."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


async def settle(pilot: Any, done: Any, timeout: float = 30.0) -> None:
    """Let queued messages run until ``done()``, then render the pending update now.

    Pilot's ``press``/``pause`` wait for the process to look idle (20 ms sleeps, repeated),
    which would be counted as latency; this waits only for the work itself.
    """
    deadline = time.perf_counter() + timeout
    while not done():
        await pilot._wait_for_screen()
        if done():
            break
        await asyncio.sleep(0)
        if time.perf_counter() > deadline:
            raise TimeoutError("the viewer did not react")
    pilot.app.screen._on_timer_update()


async def measure(path: Path, presses: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    from textual import events

    from kvdiag.tui.app import KvdiagApp  # counted: the user waits for this import too
    from kvdiag.tui.document import TraceDoc
    from kvdiag.tui.screens.overview import OverviewScreen
    from kvdiag.tui.screens.pages import PagesScreen
    from kvdiag.tui.screens.timeline import TimelineScreen

    t_import = time.perf_counter() - t0
    app = KvdiagApp([str(path)])
    out: dict[str, Any] = {"import_s": t_import}
    painted: list[float] = []
    display = app._display

    def spy(screen: Any, renderable: Any) -> None:
        # The first frame written while the Overview shows the trace: the first paint.
        if not painted and renderable is not None and isinstance(screen, OverviewScreen) and \
                isinstance(screen.doc, TraceDoc):
            painted.append(time.perf_counter() - t0)
            stage = app.docs[0].stage
            out["indexing_at_first_paint"] = stage == "indexing"
        display(screen, renderable)

    app._display = spy  # type: ignore[method-assign]
    async with app.run_test(size=(160, 48)) as pilot:
        while not painted:
            await asyncio.sleep(0.001)
        out["first_paint_s"] = painted[0]
        marks = {"first_judged_s": lambda d: getattr(d, "digest", None) is not None,
                 "indexed_s": lambda d: d.geometry is not None,
                 "pages_ready_s": lambda d: d.pages is not None,
                 "judged_s": lambda d: d.digest is not None and d.digest.done,
                 "ready_s": lambda d: d.stage == "ready"}
        pending = dict(marks)
        while pending:
            for key, done in list(pending.items()):
                if done(app.docs[0]):
                    out[key] = time.perf_counter() - t0
                    out[key.replace("_s", "_cpu_s")] = time.process_time()
                    del pending[key]
            await asyncio.sleep(0.005)
        doc = app.docs[0]
        assert isinstance(doc, TraceDoc) and doc.digest is not None and doc.judge_error is None
        out["findings"] = [f.rule for f in doc.digest.findings]
        out["judge_costs"] = dict(doc.digest.costs)
        out["read_classes"] = doc.digest.judgement.residency["read_classes"]
        out["events"] = doc.index.n
        out["steps"] = doc.index.last_step + 1
        out["file_mb"] = path.stat().st_size / 1e6
        out["rss_loaded_mib"] = rss_mib()
        out["cached"] = "cached" in doc.timings
        await pilot.pause()
        if presses == 0:
            out["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            app.exit(None)
            return out

        def key(name: str) -> None:
            app._driver.send_message(events.Key(name, None))  # type: ignore[union-attr]

        # Pages: scrub from the middle, right then left.
        await pilot.press("4")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        screen.set_step(out["steps"] // 2)
        await pilot.pause()
        scrub: list[float] = []
        scrub_cpu: list[float] = []
        for name in ["right"] * (presses // 2) + ["left"] * (presses - presses // 2):
            target = app.step + (1 if name == "right" else -1)
            t, c = time.perf_counter(), time.process_time()
            key(name)
            await settle(pilot, lambda t=target: screen.shown_step == t)  # type: ignore[misc]
            scrub.append(time.perf_counter() - t)
            scrub_cpu.append(time.process_time() - c)
        out["scrub_ms"] = scrub
        out["scrub_cpu_ms"] = scrub_cpu
        t = time.perf_counter()
        key("end")
        await settle(pilot, lambda: screen.shown_step == out["steps"] - 1)
        out["scrub_end_ms"] = [(time.perf_counter() - t)]

        # Timeline: filter changes through the filter input.
        await pilot.press("2")
        await pilot.pause()
        tl = app.screen
        assert isinstance(tl, TimelineScreen)
        filt = tl.query_one("#filter")
        flt: list[float] = []
        flt_cpu: list[float] = []
        shown: dict[str, int] = {}
        for _ in range(max(1, presses // (2 * len(FILTERS)))):
            for text in FILTERS:
                before = tl.rows
                t, c = time.perf_counter(), time.process_time()
                filt.value = text  # type: ignore[attr-defined]
                await settle(pilot, lambda b=before: tl.rows is not b)  # type: ignore[misc]
                flt.append(time.perf_counter() - t)
                flt_cpu.append(time.process_time() - c)
                shown[text] = len(tl.rows) if tl.rows is not None else -1
        out["filter_ms"] = flt
        out["filter_cpu_ms"] = flt_cpu
        out["filter_rows"] = shown
        out["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        app.exit(None)
    return out


REPLAY_SAMPLE = 50_000


def baselines(path: Path, step: int) -> dict[str, float]:
    from kvdiag.analysis.replay import PagesReplay, geometry_from_header
    from kvdiag.trace.reader import TraceReader

    # kvdiag check: the same Judge over the same file in one process, nothing else
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvdiag", "check", "--json", str(path)],
                   stdout=subprocess.DEVNULL, check=False)
    check_s = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    check_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    t = time.perf_counter()
    with TraceReader.open(path) as r:
        n = sum(1 for _ in r)
    read_s = time.perf_counter() - t
    with TraceReader.open(path) as r:
        to_middle = sum(1 for e in r if e.step <= step)
    # The reference replay feeds its Judge one event at a time (about a millisecond each on
    # this machine): the first REPLAY_SAMPLE events are timed and the rest extrapolated.
    replayed = 0
    t = time.perf_counter()
    with TraceReader.open(path) as r:
        replay = PagesReplay(geometry_from_header(r.header))
        for e in r:
            if e.step > step or replayed >= REPLAY_SAMPLE:
                break
            replay.apply(e)
            replayed += 1
        replay.snapshot(step)
    replay_s = (time.perf_counter() - t) * to_middle / max(replayed, 1)
    return {"read_s": read_s, "read_events": n, "replay_to_middle_s": replay_s,
            "replayed": replayed, "to_middle": to_middle,
            "check_s": check_s, "check_cpu_s": check_cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--presses", type=int, default=200)
    ap.add_argument("--unannotated", action="store_true",
                    help="reads without the model's ranges annotation, as a fork writes them "
                         "(the judgement then has no annotation to cross-check)")
    ap.add_argument("--no-baselines", action="store_true",
                    help="skip kvdiag check, the typed read and the replay (minutes on 5M)")
    ap.add_argument("--write-only", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--measure", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_only:
        print(write_trace(Path(args.write_only), args.events, not args.unannotated))
        return 0
    if args.measure:
        # one viewer in a process of its own: its peak RSS is its own
        print(json.dumps(asyncio.run(measure(Path(args.measure), args.presses))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.kvtrace"
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--events", str(args.events), "--write-only",
                        str(path), *(["--unannotated"] if args.unannotated else [])],
                       check=True, stdout=subprocess.DEVNULL)
        t_write = time.perf_counter() - t
        # an empty cache folder: the first open judges; the second finds the judgement cached.
        # The C helpers (kvdiag.compiled) are built once per install, on the first use of
        # each: a viewer opens a small trace first, so that the opens measured build none
        # (their build, seconds of a compiler's CPU in both processes, is said apart).
        env = {**os.environ, "KVDIAG_CACHE_DIR": str(Path(tmp) / "cache"),
               "KVDIAG_COMPILED_DIR": str(Path(tmp) / "compiled")}
        small = Path(tmp) / "small.kvtrace"
        subprocess.run([sys.executable, __file__, "--events", "20000", "--write-only",
                        str(small)], check=True, stdout=subprocess.DEVNULL)
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--measure", str(small), "--presses", "0"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        t_build = time.perf_counter() - t

        def viewer(presses: int) -> dict[str, Any]:
            done = subprocess.run([sys.executable, __file__, "--measure", str(path),
                                   "--presses", str(presses)], check=True, env=env,
                                  stdout=subprocess.PIPE, text=True)
            got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return got

        res = viewer(args.presses)
        cache_mb = sum(f.stat().st_size for f in (Path(tmp) / "cache").rglob("*.kvjudge")) / 1e6
        again = viewer(0)
        base = (None if args.no_baselines else baselines(path, res["steps"] // 2))
    scrub = [x * 1000 for x in res["scrub_ms"]]
    flt = [x * 1000 for x in res["filter_ms"]]
    costs = res["judge_costs"]
    viewer_peak = res["rss_peak_mib"]
    judge_peak = costs.get("peak_rss_mib", 0.0)
    ok = {
        "first paint < 1 s (issue 15 measured 0.73 s before this change)":
            res["first_paint_s"] < 1.0,
        "findings ready <= 10 s (first open)": res["judged_s"] <= 10.0,
        "peak RSS <= 600 MiB (viewer + judging process)": viewer_peak + judge_peak <= 600,
        "scrub median < 50 ms": statistics.median(scrub) < 50,
        "scrub p95 < 150 ms": pct(scrub, 0.95) < 150,
        "filter median < 50 ms": statistics.median(flt) < 50,
        "filter p95 < 150 ms": pct(flt, 0.95) < 150,
    }
    print(f"date      {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine   {platform.machine()} {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}, {platform.system()}, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (shared machine)")
    print(f"trace     {res['events']:,} events, {res['steps']:,} steps, {res['file_mb']:.0f} MB "
          f"(written in {t_write:.1f} s by a child process)"
          + ("; reads without the model's annotation" if args.unannotated else ""))
    print(f"helpers   {t_build:.1f} s  a viewer on a 20,000-event trace first, building the C "
          f"helpers (kvdiag.compiled: once per install) so that the opens below build none")
    print("first open (an empty judgement cache):")
    print(f"import    {res['import_s']:.2f} s  (kvdiag.tui.app and textual)")
    print(f"paint     {res['first_paint_s']:.2f} s  first paint of the Overview with the trace "
          f"header (indexing still running: {res['indexing_at_first_paint']})")
    print(f"prefix    {res['first_judged_s']:.2f} s  first judged prefix published")
    read = "" if base is None else (
        f"; baseline TraceReader full typed read {base['read_s']:.2f} s -> "
        f"{base['read_s'] / res['indexed_s']:.2f}x")
    print(f"indexed   {res['indexed_s']:.2f} s  ({res['events'] / res['indexed_s']:,.0f} "
          f"events/s, viewer CPU {res['indexed_cpu_s']:.1f} s){read}")
    print(f"pages     {res['pages_ready_s']:.2f} s  page-replay groups built")
    check = "" if base is None else (
        f"; baseline kvdiag check on the same file {base['check_s']:.2f} s "
        f"({base['check_cpu_s']:.1f} s CPU) -> {res['judged_s'] / base['check_s']:.2f}x")
    judge_cpu = costs.get("cpu_s", float("nan"))
    print(f"judged    {res['judged_s']:.2f} s  findings ready: the Judge behind the indexer, in a "
          f"child process ({judge_cpu:.1f} s CPU there: wall / Judge CPU "
          f"{res['judged_s'] / judge_cpu:.2f}, {costs.get('pipe_wait_s', float('nan')):.2f} s "
          f"waiting for the pipe; the viewer's CPU by then "
          f"{res['judged_cpu_s']:.1f} s){check}")
    print(f"          findings {', '.join(res['findings'])}; pages "
          + ", ".join(f"{k} {v:,}" for k, v in res["read_classes"].items()))
    mem = res["rss_loaded_mib"]
    print(f"memory    peak RSS {viewer_peak:.0f} MiB viewer + {judge_peak:.0f} MiB judging "
          f"process = {viewer_peak + judge_peak:.0f} MiB; after loading the viewer's RSS "
          f"{mem['VmRSS']:.0f} MiB = {mem['RssAnon']:.0f} MiB own + {mem['RssFile']:.0f} MiB "
          f"mapped file pages (the {res['file_mb']:.0f} MB trace and the {cache_mb:.0f} MB "
          "ledger file are mapped, not read into memory)")
    replay = "" if base is None else (
        f"; baseline replay to the middle step {base['replay_to_middle_s']:.2f} s "
        f"(extrapolated from its first {base['replayed']:,} of {base['to_middle']:,} events) -> "
        f"{base['replay_to_middle_s'] * 1000 / statistics.median(scrub):,.0f}x")
    scrub_cpu = [x * 1000 for x in res["scrub_cpu_ms"]]
    flt_cpu = [x * 1000 for x in res["filter_cpu_ms"]]
    print(f"scrub     median {statistics.median(scrub):.1f} ms, p95 {pct(scrub, 0.95):.1f} ms, "
          f"max {max(scrub):.1f} ms over {len(scrub)} presses (the viewer's CPU: median "
          f"{statistics.median(scrub_cpu):.1f} ms, p95 {pct(scrub_cpu, 0.95):.1f} ms); end key "
          f"{res['scrub_end_ms'][0] * 1000:.1f} ms{replay}")
    print(f"filter    median {statistics.median(flt):.1f} ms, p95 {pct(flt, 0.95):.1f} ms, "
          f"max {max(flt):.1f} ms over {len(flt)} changes (the viewer's CPU: median "
          f"{statistics.median(flt_cpu):.1f} ms, p95 {pct(flt_cpu, 0.95):.1f} ms)")
    print("          rows shown: " + ", ".join(f"{k or '(none)'}={v:,}"
                                             for k, v in res["filter_rows"].items()))
    same = again["findings"] == res["findings"] and again["read_classes"] == res["read_classes"]
    print(f"reopen    (a second viewer, the judgement cached: {cache_mb:.0f} MB; used: "
          f"{again['cached']}, same findings and page classes: {same}) paint "
          f"{again['first_paint_s']:.2f} s, findings ready {again['judged_s']:.2f} s, "
          f"indexed {again['indexed_s']:.2f} s, pages {again['pages_ready_s']:.2f} s; peak RSS "
          f"{again['rss_peak_mib']:.0f} MiB (no judging process)")
    for name, good in ok.items():
        print(f"target    {name}: {'PASS' if good else 'MISS'}")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
