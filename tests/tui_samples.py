"""Small deterministic traces for the viewer's tests (tests/test_tui_*.py).

They are written with the real :class:`~kvdiag.trace.writer.TraceWriter`, with a fixed creation
time and a fake monotonic clock, so every byte (``t_ns`` included) is the same on every run and
screenshots of them are stable. The events follow the runtime's bookkeeping by hand, on a model
small enough to check by eye: 2 layers, 2 streams (slots), 4 pages per stream, a resident window
of 2 pages per layer keyed by (layer, page) (the shared layout).

``aliasing``: slot 1 prefills pages 0-1 (uploaded to pool slots 2-3 / 4-5), then slot 0 prefills
its own pages 0-1, which the shared key marks dirty and re-uploads over slot 1's (evictions), then
slot 1 decodes and reads pages 0-1 from the pool: slot 0's bytes (foreign), and its output
diverges. Telemetry samples ride along. ``abort``: two slots in one ubatch, 4-D views, fits()
false, membership dispatch routes to the streamed kernel and the assert aborts.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvdiag.model.events import (
    Abort,
    Device,
    Evict,
    Fits,
    Learn,
    Mark,
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
from kvdiag.trace import writer as writer_module
from kvdiag.trace.writer import TraceWriter, make_header

CREATED = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
LAYERS = 2
KV = 1024  # cells per stream: 4 pages
RING = 2
WINDOW = 2
K_BASE = 0x7F3A00000000
ASSERT_FILE = "/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"


def header(name: str, description: str, layers: int = LAYERS, layout: str = "shared",
           **plan: Any) -> Any:
    return make_header(
        "numpy", Device("test device", memory_bytes=8 << 30, driver="1.0", pcie="Gen4 x16"),
        scenario={"name": name, "description": description, "seed": 0,
                  "config": {"layers": layers, "np": 2, "kv_unified": False, "ctx": 2 * KV,
                             "type_k": "q8_0", "type_v": "q8_0", "stage_mib": 1,
                             "layout": layout, "dispatch": "membership"}},
        plan={"pages_per_stream": 4, "resident_pages_per_layer": WINDOW, "ring_slots": RING,
              "pool_pages": RING + LAYERS * WINDOW, "n_stream": 2, "page_bytes": 4096, **plan},
        created=CREATED)


def _tensor(name: str, type_: str, ne: tuple[int, int, int, int], data: int = 0,
            buffer: str = "CUDA0", runtime: int | None = None, contiguous: bool = True
            ) -> Tensor:
    size = {"f32": 4, "f16": 2, "q8_0": 34}[type_]
    row = size if type_ != "q8_0" else 34 * ne[0] // 32
    nb = (size, row * ne[2], row, row * ne[2] * ne[1]) if type_ == "q8_0" else (
        size, size * ne[0], size * ne[0] * ne[1], size * ne[0] * ne[1] * ne[2])
    return Tensor(name, type_, ne, nb, data=data, buffer=buffer, runtime=runtime,
                  contiguous=contiguous)


def fits_fields(layer: int, n_kv: int, tokens: int, streams: int) -> dict[str, Any]:
    k_ptr = K_BASE + layer * 0x100000
    q = _tensor(f"Qcur-{layer}", "f32", (256, tokens, 8, streams), contiguous=False)
    k = _tensor(f"cache_k_l{layer} (view)", "q8_0", (256, n_kv, 2, streams), k_ptr,
                "CUDA_KV_Stream_Host", 1, contiguous=False)
    v = _tensor(f"cache_v_l{layer} (view)", "q8_0", (256, n_kv, 2, streams), k_ptr + 0x80000,
                "CUDA_KV_Stream_Host", 1, contiguous=False)
    dst = _tensor(f"__fattn__-{layer}", "f32", (256, 8, tokens, streams))
    mask = _tensor("attn_inp_kq_mask", "f16", (n_kv, tokens, 1, streams))
    failed = tuple(f"{t}.ne[3]==1" for t in ("Q", "K", "V")) if streams > 1 else ()
    return dict(node=f"__fattn__-{layer}", layer=layer, q=q, k=k, v=v, dst=dst, mask=mask,
                stage_bytes=1 << 20, result=not failed,
                route="abort" if failed else "streamed", failed=failed, membership=True)


class FakeClock:
    """Stands in for ``time.monotonic_ns`` in the writer: 1 µs per call."""

    def __init__(self) -> None:
        self.ticks: Iterator[int] = itertools.count(0, 1000)

    def __call__(self) -> int:
        return next(self.ticks)


def write_aliasing(path: Path, monkeypatch: pytest.MonkeyPatch, telemetry: bool = True) -> Path:
    monkeypatch.setattr(writer_module.time, "monotonic_ns", FakeClock())
    w = TraceWriter.create(path, header(
        "aliasing", "slot 1 first, then slot 0 overwrites the shared resident pages"))

    def prefill(step: int, stream: int, learn: bool) -> None:
        w.emit(Step, step, phase="prefill", streams=(stream,), tokens=300, n_kv=512,
               slots=(stream,))
        for layer in range(LAYERS):
            base = RING + layer * WINDOW
            dirty = ((layer, None, 0), (layer, None, 1)) if stream == 0 else ()
            w.emit(Write, step, layer=layer, stream=stream, cells=(0, 300),
                   rows=(stream * KV, stream * KV + 300), dirty=dirty,
                   versions=((0, 1), (1, 1)))
            w.emit(Fits, step, **fits_fields(layer, 512, 300, 1))
            if learn:
                if layer == 0:
                    w.emit(Learn, step, layer=-1, k_ptr=0, relearn=True)
                w.emit(Learn, step, layer=layer, k_ptr=K_BASE + layer * 0x100000)
            if stream == 0:
                for p in range(WINDOW):
                    w.emit(Evict, step, slot=base + p, layer=layer, page=p, stream=1,
                           bytes=4096, reason="replaced")
            w.emit(Upload, step, layer=layer, stream=stream, pages=(0, 2), slot=base,
                   target="resident", bytes=8192, reason="miss" if stream == 1 else "dirty")
            w.emit(Read, step, layer=layer, stream=stream, pool=2, ring=0, host=0,
                   ranges=(ReadRange(0, 2, "pool", stream, "exact"),),
                   served=(Served(0, 2, "pool", base),))
        w.emit(Output, step, stream=stream, checksum="0000aaaa", ref_checksum="0000aaaa",
               max_abs_delta=0.0, tolerance=1e-3, worst_layer=0)

    def sample(step: int, i: int) -> None:
        if telemetry:
            w.emit(Telemetry, step, mem_used=(4 << 30) + i * (64 << 20), mem_total=8 << 30,
                   gpu_util=40 + 10 * (i % 5), mem_util=20 + i,
                   pcie_rx_kbps=int(8_000_000 + 2_000_000 * math.sin(i)),
                   pcie_tx_kbps=300_000 + 1000 * i, sm_clock_mhz=2100 + 10 * i,
                   mem_clock_mhz=9001)

    prefill(0, 1, learn=True)
    sample(0, 0)
    w.end_step()
    prefill(1, 0, learn=True)
    sample(1, 1)
    w.end_step()
    for step in (2, 3, 4):
        w.emit(Step, step, phase="decode", streams=(1,), tokens=1, n_kv=512, slots=(1,))
        for layer in range(LAYERS):
            cell = 300 + step - 2
            w.emit(Write, step, layer=layer, stream=1, cells=(cell, cell + 1),
                   rows=(KV + cell, KV + cell + 1), versions=((1, step),))
            w.emit(Fits, step, **fits_fields(layer, 512, 1, 1))
            w.emit(Read, step, layer=layer, stream=1, pool=2, ring=0, host=0,
                   ranges=(ReadRange(0, 1, "pool", 0, "foreign"),
                           ReadRange(1, 2, "pool", 0, "foreign")),
                   served=(Served(0, 2, "pool", RING + layer * WINDOW),))
        w.emit(Output, step, stream=1, checksum=f"0000bb{step:02x}",
               ref_checksum=f"0000cc{step:02x}", max_abs_delta=0.25 * step, tolerance=1e-3,
               worst_layer=1)
        sample(step, step)
        w.end_step()
    w.close()
    return path


def write_abort(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(writer_module.time, "monotonic_ns", FakeClock())
    w = TraceWriter.create(path, header("abort", "two slots in one ubatch: 4-D views, fits false"))
    w.emit(Step, 0, phase="decode", streams=(0, 1), tokens=1, n_kv=512, slots=(0, 1))
    for stream in (0, 1):
        w.emit(Write, 0, layer=0, stream=stream, cells=(300, 301),
               rows=(stream * KV + 300, stream * KV + 301), versions=((1, 1),))
    w.emit(Fits, 0, **fits_fields(0, 512, 1, 2))
    w.emit(Abort, 0, message=f"{ASSERT_FILE}:1898: GGML_ASSERT("
                             "ggml_cuda_kv_stream_fattn_fits(dst)) failed",
           file=ASSERT_FILE, line=1898, condition="ggml_cuda_kv_stream_fattn_fits(dst)",
           backtrace=("ggml_print_backtrace", "ggml_abort", "ggml_cuda_kv_stream_fattn (inlined)",
                      "ggml_cuda_graph_evaluate_and_capture", "llama_context::decode",
                      "server_context::update_slots"))
    w.close("aborted")
    return path


def write_marks(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Format 1.1 ``mark`` events in the shared layout, 3 layers of which the plan streams 2.

    Slot 1 prefills cells 0-299 (global rows 1024-1323): mark_dirty_rows divides global rows by
    256, so the rows fall in global pages 4 and 5, beyond every layer's 2-page window: no key is
    marked and ``outside`` lists (-, 4) and (-, 5). The writes therefore dirty nothing, the pages
    are uploaded on the first miss, and the decode write at cell 300 (global page 5, outside
    again) leaves the resident copy of stream 1's page 1 one version behind: a stale read.
    """
    monkeypatch.setattr(writer_module.time, "monotonic_ns", FakeClock())
    w = TraceWriter.create(path, header(
        "marks", "slot 1 rows marked outside the window", layers=3, streamed_layers=2))
    w.emit(Step, 0, phase="prefill", streams=(1,), tokens=300, n_kv=512, slots=(1,))
    w.emit(Mark, 0, rows=((KV, KV + 300),), outside=((None, 4), (None, 5)))
    for layer in range(2):
        w.emit(Write, 0, layer=layer, stream=1, cells=(0, 300), rows=(KV, KV + 300),
               versions=((0, 1), (1, 1)))
        w.emit(Upload, 0, layer=layer, stream=1, pages=(0, 2), slot=RING + layer * WINDOW,
               target="resident", bytes=8192, reason="miss")
        w.emit(Read, 0, layer=layer, stream=1, pool=2, ring=0, host=0,
               ranges=(ReadRange(0, 2, "pool", 1, "exact"),),
               served=(Served(0, 2, "pool", RING + layer * WINDOW),))
    w.end_step()
    w.emit(Step, 1, phase="decode", streams=(1,), tokens=1, n_kv=512, slots=(1,))
    w.emit(Mark, 1, rows=((KV + 300, KV + 301),), outside=((None, 5),))
    for layer in range(2):
        w.emit(Write, 1, layer=layer, stream=1, cells=(300, 301), rows=(KV + 300, KV + 301),
               versions=((1, 2),))
        w.emit(Read, 1, layer=layer, stream=1, pool=2, ring=0, host=0,
               ranges=(ReadRange(0, 1, "pool", 1, "exact"),
                       ReadRange(1, 2, "pool", 1, "stale", 1)),
               served=(Served(0, 2, "pool", RING + layer * WINDOW),))
    w.end_step()
    w.close()
    return path


def write_samples(root: Path, **writers: Any) -> dict[str, Path]:
    """``{name: writer(root / "<name>.kvtrace", monkeypatch)}`` with one MonkeyPatch undone
    afterwards: the module-scoped sample fixtures of the TUI tests."""
    mp = pytest.MonkeyPatch()
    try:
        return {name: write(root / f"{name}.kvtrace", mp) for name, write in writers.items()}
    finally:
        mp.undo()
