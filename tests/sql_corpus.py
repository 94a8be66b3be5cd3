"""A small fleet for kvdiag sql's tests and docs/sql.md: model captures of each failure class, an
imported-style log with request timings, and a crash log.

- ``s1r.kvtrace``: slot1-first (stale and foreign pool reads of stream 1, its output
  diverging), with a ``repartition`` event put in before step 4 (the model's run has none at
  this shape; the judgement does not depend on it, the question "after the first
  repartition" does);
- ``two.kvtrace``: two-slot-concurrent (fits mismatch on ne[3], the abort);
- ``lj.kvtrace``: late-join with fits dispatch (fallbacks, the layer-identity abort);
- ``pp.kvtrace``: pool-pressure with the adaptive partition (ring uploads, a repartition,
  ring-starved);
- ``stream.log``: the seed's streaming log (12 requests' print_timing blocks);
- ``crash.log``: tests/fixtures/logs/kvstream_np2_gdb.log (the fits abort with a gdb backtrace);
- ``pycrash.log``: :data:`PYCRASH` (the fits abort in llama-cpp-python: faulthandler's stacks
  of two named threads, as 3.14 prints them, and no native backtrace).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
from seed_arm117 import seed_logs

from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader

CAPTURES: dict[str, list[str]] = {
    "s1r": ["--scenario", "slot1-first", "--steps", "4"],
    "two": ["--scenario", "two-slot-concurrent"],
    "lj": ["--scenario", "late-join", "--dispatch", "fits", "--preset", "small", "--layers", "2",
           "--streamed-layers", "2"],
    "pp": ["--scenario", "pool-pressure", "--adaptive", "--preset", "small", "--layers", "2",
           "--streamed-layers", "2", "--steps", "3", "--n-head", "4"],
}
REPARTITION_STEP = 4
PYCRASH = """\
llama_model_loader: loaded meta data with 29 key-value pairs
llama_context: constructing llama_context
llama_context: n_ctx         = 4096
/src/llama-cpp-python/vendor/llama.cpp/ggml/src/ggml-cuda/fattn.cu:412: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed
Fatal Python error: Aborted

Thread 0x00007fd1a9ffb6c0 [uvicorn-worker] (most recent call first):
  File "/usr/lib/python3.14/threading.py", line 359 in wait
  File "/opt/app/.venv/lib/python3.14/site-packages/anyio/_backends/_asyncio.py", line 976 in run

Current thread 0x00007fd1c3a4e740 [MainThread] (most recent call first):
  File "/opt/app/.venv/lib/python3.14/site-packages/llama_cpp/_internals.py", line 306 in decode
  File "/opt/app/.venv/lib/python3.14/site-packages/llama_cpp/llama.py", line 642 in eval
  File "/opt/app/server/generate.py", line 88 in stream_tokens
  File "<frozen runpy>", line 198 in _run_module_as_main

Extension modules: numpy._core._multiarray_umath (total: 1)
"""


def _insert_repartition(path: Path) -> None:
    """Put a repartition event before the first event of step REPARTITION_STEP, renumbering
    what follows (and the End's count)."""
    with TraceReader.open(path) as reader:
        header_line = path.read_bytes().split(b"\n", 1)[0] + b"\n"
        events = list(reader)
    out: list[ev.AnyEvent | ev.Unknown] = []
    shift = 0
    for e in events:
        if not shift and e.step == REPARTITION_STEP:
            out.append(ev.Repartition(seq=e.seq, t_ns=e.t_ns, step=e.step, resident=(8, 6),
                                      ring=(4, 12), reason="test: moved the boundary"))
            shift = 1
        if isinstance(e, ev.End):
            e = msgspec.structs.replace(e, events=e.events + 1)
        out.append(msgspec.structs.replace(e, seq=e.seq + shift))
    enc = msgspec.json.Encoder()
    path.write_bytes(header_line + enc.encode_lines(out))


def build(root: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for name, args in CAPTURES.items():
        out = root / f"{name}.kvtrace"
        main(["capture", *args, "-q", "--executor", "numpy", "-o", str(out)])
        files[name] = out
    _insert_repartition(files["s1r"])
    _base, stream = seed_logs()
    files["stream"] = root / "stream.log"
    files["stream"].write_text(stream)
    files["crash"] = root / "crash.log"
    shutil.copy(Path(__file__).parent / "fixtures" / "logs" / "kvstream_np2_gdb.log",
                files["crash"])
    files["pycrash"] = root / "pycrash.log"
    files["pycrash"].write_text(PYCRASH)
    return files
