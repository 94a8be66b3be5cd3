"""Scan a 1 GiB synthetic llama-server log that ends in a crash; compare with ``grep -c -E``.

Run: ``.venv/bin/python benchmarks/bench_logscan.py [--mib 1024] [--repeat 2]``.

On a machine with an idle second core the scan hands half of the substring searches to a
helper process (``kvdiag.postmortem.scanhelper``); the output says whether it did.
The log is written to a temporary directory (deleted afterwards): a kv-stream boot (the
configuration lines of the domain brief §7.2), then requests as llama-server prints them at
its default verbosity (§7.3: slot selection, launch, new prompt, cache reuse, prompt progress,
prompt done, timings, release, "all slots are idle", the HTTP line), with two slots
alternating and one ``kv_stream_adapt`` repartition line every 200 requests; at the end the
fits-dispatch abort with a gdb backtrace. The baseline is GNU grep counting the lines that
hold any of the parser's anchor substrings (``kvdiag.postmortem.parse.ANCHORS``) in the same
file, run in the same process; each figure is the best of ``--repeat`` runs with the file in
the page cache. Target (issue 4): kvdiag's throughput ≥ 0.33 × grep's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvdiag.postmortem import parse
from kvdiag.postmortem.parse import ANCHORS, LogParser

TARGET = 0.33

BOOT = """0.00.000.210 I build: 7012 (4ba0b9b25) with cc (GCC) 13.2.0 for x86_64-linux-gnu
0.00.001.101 I srv    load_model: loading model '/models/qwen3.5-27b-q4_k_m.gguf'
0.02.114.007 W llama_context: LLAMA_KV_STREAM_ALLOW_MULTISEQ=1: multi-sequence KV streaming enabled
0.02.114.220 I llama_context: constructing llama_context
0.02.114.230 I llama_context: n_seq_max     = 2
0.02.114.231 I llama_context: n_ctx         = 16384
0.02.114.232 I llama_context: n_ctx_seq     = 8192
0.02.114.233 I llama_context: n_batch       = 2048
0.02.114.234 I llama_context: n_ubatch      = 512
0.02.114.236 I llama_context: flash_attn    = enabled
0.02.114.237 I llama_context: kv_unified    = false
0.02.114.301 I llama_context: experimental block KV streaming enabled, pool = 1536 MiB
0.02.115.010 I llama_kv_cache: CUDA_KV_Stream_Host KV buffer size =  1024.00 MiB
0.02.115.011 I llama_kv_cache: size = 1024.00 MiB (  8192 cells,  16 layers,  2/2 seqs), \
K (q8_0):  544.00 MiB, V (q8_0):  480.00 MiB
0.03.001.002 I srv  llama_server: server is listening on http://127.0.0.1:8080
0.03.001.003 I srv  update_slots: all slots are idle
"""

CRASH = """/home/ci/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:1898: \
GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed
[Thread debugging using libthread_db enabled]
#0  0x00007f3208ef0c17 in __GI___wait4 (pid=40288, stat_loc=0x0, options=0, usage=0x0) at \
../sysdeps/unix/sysv/linux/wait4.c:30
#1  0x00007f3209a1c5a3 in ggml_print_backtrace () from /opt/llama/lib/libggml-base.so
#2  0x00007f3209a1c6f0 in ggml_abort () from /opt/llama/lib/libggml-base.so
#3  0x00007f32084b9d11 in ggml_cuda_graph_evaluate_and_capture(ggml_backend_cuda_context*, \
ggml_cgraph*, bool, bool) () from /opt/llama/lib/libggml-cuda.so
#4  0x00007f32084c1b07 in ggml_backend_cuda_graph_compute(ggml_backend*, ggml_cgraph*) () \
from /opt/llama/lib/libggml-cuda.so
#5  0x00007f3209c2c311 in llama_context::decode(llama_batch const&) () from \
/opt/llama/lib/libllama.so
[Inferior 1 (process 40207) detached]
"""


def _ts(us: int) -> str:
    return f"{us // 60_000_000}.{(us // 1_000_000) % 60:02d}.{(us // 1000) % 1000:03d}.{us % 1000:03d}"


def request_block(first_task: int, n_requests: int, t0: int) -> tuple[bytes, int]:
    """``n_requests`` requests as the server logs them; returns the text and the end time."""
    out: list[str] = []
    t = t0
    for r in range(n_requests):
        task = first_task + r
        s = task % 2
        n_prompt = 200 + (task * 37) % 3000

        def line(msg: str, level: str = "I", task: int = task) -> None:
            nonlocal t
            t += 137 + (task * 13) % 900
            out.append(f"{_ts(t)} {level} {msg}")

        line("srv  params_from_: Chat format: peg-native")
        line(f"slot get_availabl: id  {s} | task -1 | selected slot by LRU, t_last = {t - 5000}")
        line(f"slot launch_slot_: id  {s} | task -1 | sampler chain: logits -> penalties -> "
             "dry -> top-k -> typical -> top-p -> min-p -> xtc -> temp-ext -> dist")
        line(f"slot launch_slot_: id  {s} | task {task} | processing task, is_child = 0")
        line(f"slot update_slots: id  {s} | task {task} | new prompt, n_ctx_slot = 8192, "
             f"n_keep = 0, task.n_tokens = {n_prompt}")
        line(f"slot update_slots: id  {s} | task {task} | n_tokens = 0, memory_seq_rm [0, end)")
        done = 0
        while done + 512 < n_prompt:
            done += 512
            line(f"slot update_slots: id  {s} | task {task} | prompt processing progress, "
                 f"n_tokens = {done}, batch.n_tokens = 512, progress = {done / n_prompt:.6f}")
        line(f"slot update_slots: id  {s} | task {task} | prompt done, n_tokens = {n_prompt}, "
             f"batch.n_tokens = {n_prompt - done}")
        line(f"slot print_timing: id  {s} | task {task} | ")
        out.append(f"prompt eval time =     312.55 ms / {n_prompt:5d} tokens (    0.39 ms per "
                   "token,  2585.18 tokens per second)")
        out.append("       eval time =    4120.10 ms /   256 tokens (   16.09 ms per token,    "
                   "62.13 tokens per second)")
        out.append(f"      total time =    4432.65 ms / {n_prompt + 256:5d} tokens")
        line(f"slot      release: id  {s} | task {task} | stop processing: "
             f"n_tokens = {n_prompt + 256}, truncated = 0")
        line("srv  update_slots: all slots are idle")
        line("srv  log_server_r: done request: POST /v1/chat/completions 127.0.0.1 200")
        if task % 200 == 199:
            line("kv_stream_adapt: adaptive KV partition: resident pages/layer 12 -> 10, ring "
                 "slots 4 -> 6, miss 31.5%, copy busy 72.0%", "W")
    return ("\n".join(out) + "\n").encode(), t


def write_log(path: Path, target_bytes: int) -> tuple[int, int]:
    """Write the log; returns (bytes, requests)."""
    written = 0
    task = 0
    t = 200_000_000
    with open(path, "wb") as fh:
        fh.write(BOOT.encode())
        written += len(BOOT)
        block, t = request_block(task, 2000, t)
        per_block = 2000
        while written + len(block) < target_bytes:
            fh.write(block)
            written += len(block)
            task += per_block
        fh.write(CRASH.encode())
        written += len(CRASH)
    return written, task


def time_kvdiag(path: Path, repeat: int) -> tuple[float, int, float]:
    best = float("inf")
    cpu = float("inf")
    crashes = 0
    for _ in range(repeat):
        start = time.perf_counter()
        cpu0 = time.process_time()
        parser = LogParser()
        with open(path, "rb") as fh:
            parser.feed(str(path), fh)
        scan = parser.result()
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - cpu0)
        crashes = len(scan.crashes)
        assert scan.crashes and scan.crashes[-1].abort is not None, "crash not found"
        assert scan.crashes[-1].abort.line == 1898
        assert scan.boots and scan.boots[0].n_stream == 2
        bt = scan.crashes[-1].backtrace
        assert bt is not None and len(bt.frames) == 6
    return best, crashes, cpu


def time_grep(path: Path, repeat: int) -> tuple[float, int, str]:
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("grep not found")
    pattern = "|".join(re.escape(a.decode()) for a in ANCHORS)
    best = float("inf")
    count = 0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([grep, "-c", "-E", pattern, str(path)], capture_output=True,
                              check=False, env={**os.environ, "LC_ALL": "C"})
        best = min(best, time.perf_counter() - start)
        count = int(proc.stdout.strip() or 0)
    return best, count, pattern


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--mib", type=int, default=1024, help="log size in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvdiag-bench-") as tmp:
        path = Path(tmp) / "server.log"
        t0 = time.perf_counter()
        size, requests = write_log(path, args.mib << 20)
        gen_s = time.perf_counter() - t0
        with open(path, "rb") as fh:  # bring the file into the page cache for both tools
            while fh.read(16 << 20):
                pass
        g_s, g_count, pattern = time_grep(path, args.repeat)
        helper = parse.spare_core() and size >= parse.PARALLEL_MIN_BYTES
        k_s, crashes, k_cpu = time_kvdiag(path, args.repeat)
        g2_s, _, _ = time_grep(path, args.repeat)
        g_s = min(g_s, g2_s)
    mb = size / 1e6
    ratio = (mb / k_s) / (mb / g_s)
    print(f"date: {datetime.date.today().isoformat()}  machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus, {platform.python_implementation()} "
          f"{platform.python_version()}, {sys.platform}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"log: {size / (1 << 20):.0f} MiB, {requests} requests, crash at the end "
          f"(written in {gen_s:.1f} s)")
    print(f"anchors (grep -c -E): {pattern}")
    print(f"grep -c -E : {g_s:7.3f} s  {mb / g_s:8.1f} MB/s  ({g_count} matching lines)")
    print(f"kvdiag scan: {k_s:7.3f} s  {mb / k_s:8.1f} MB/s  ({crashes} crash found, "
          "boot config, slot timeline and backtrace parsed)")
    print(f"             main-process CPU {k_cpu:.3f} s; helper process "
          f"{'used' if helper else 'not used (no idle core)'}")
    print(f"ratio kvdiag/grep throughput: {ratio:.2f}  (target >= {TARGET})  "
          f"{'PASS' if ratio >= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
