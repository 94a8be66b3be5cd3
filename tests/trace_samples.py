"""Sample events and trace files shared by the tests/test_trace_*.py files."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import msgspec

from kvdiag.model.events import (
    Abort,
    Adapt,
    Device,
    Event,
    Evict,
    Fits,
    Header,
    HostVersions,
    Invalidate,
    Kernel,
    Learn,
    Mark,
    Output,
    Partition,
    Read,
    ReadRange,
    Records,
    Repartition,
    Served,
    SlotCopies,
    Snapshot,
    Step,
    Telemetry,
    Timing,
    Upload,
    Warn,
    Write,
)
from kvdiag.model.geometry import Tensor
from kvdiag.trace.version import FORMAT_MAJOR, FORMAT_MINOR
from kvdiag.trace.writer import TraceWriter, make_header

CREATED = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)


def header(**scenario: Any) -> Header:
    return make_header(
        "numpy",
        Device(
            "NVIDIA GeForce RTX 4090",
            memory_bytes=24 << 30,
            driver="560.35",
            pcie="Gen4 x16",
            compute_capability="8.9",
        ),
        scenario=scenario or {"model": "tiny-llama", "streams": 2, "layout": "shared"},
        plan={"pages": 16},
        created=CREATED,
    )


def _tensor(name: str, buffer: str, runtime: int | None = None) -> Tensor:
    return Tensor(
        name,
        "q8_0",
        (128, 256, 8, 2),
        (34, 136, 34816, 278528),
        data=0x7F0012340000,
        buffer=buffer,
        runtime=runtime,
        contiguous=False,
    )


# One of every kind, every optional field set to a non-default value, so that a round trip
# proves each field is written and read back.
ALL_KINDS: list[tuple[type[Event], dict[str, Any]]] = [
    (Step, {"phase": "prefill", "streams": (0, 1), "tokens": 7, "n_kv": 256, "slots": (3, 4)}),
    (Learn, {"layer": 5, "k_ptr": 0x7F00DEAD0000, "relearn": True}),
    (
        Fits,
        {
            "node": "__fattn__-5",
            "layer": 5,
            "q": _tensor("Qcur-5", "CUDA0"),
            "k": _tensor("cache_k_l5 (view)", "CUDA_KV_Stream_Host", 1),
            "v": _tensor("cache_v_l5 (view)", "CUDA_KV_Stream_Host", 1),
            "dst": _tensor("kqv_out-5", "CUDA0"),
            "stage_bytes": 1 << 22,
            "result": False,
            "route": "fallback",
            "failed": ("k_contiguous", "same_runtime"),
            "mask": _tensor("KQ_mask", "CUDA0"),
            "membership": True,
            "evaluated": False,
        },
    ),
    (
        Mark,
        {
            "rows": ((0, 3), (2048, 2050)),
            "keys": ((5, None, 0), (5, 1, 0)),
            "all": True,
            "outside": ((None, 8), (1, 9)),
        },
    ),
    (Invalidate, {"reason": "repartition", "generation": 7}),
    (
        Repartition,
        {"resident": (4, 3), "ring": (10, 14), "miss_pct": 2.5, "busy_pct": 41.0,
         "reason": "grow"},
    ),
    (
        Adapt,
        {"active": 9000, "resident": 3, "ring": 14, "samples": 40, "misses": 1,
         "busy_pct": 41.5, "peak": 9, "layout": 36, "skipped": 2, "resident_attended": 12,
         "eval_us": 812.5},
    ),
    (
        Write,
        {
            "layer": 5,
            "stream": 1,
            "cells": (16, 23),
            "rows": (272, 279),
            "dirty": ((5, None, 1), (5, 1, 1)),
            "versions": ((1, 3),),
        },
    ),
    (
        Upload,
        {
            "layer": 5,
            "stream": 1,
            "pages": (0, 2),
            "slot": 9,
            "target": "ring",
            "bytes": 69632,
            "reason": "wide-query",
            "key_stream": 0,
        },
    ),
    (Evict, {"slot": 9, "layer": 4, "page": 1, "stream": 0, "bytes": 34816, "reason": "lru"}),
    (
        Read,
        {
            "layer": 5,
            "stream": 1,
            "pool": 1,
            "ring": 1,
            "host": 0,
            "ranges": (
                ReadRange(0, 1, "pool", 0, "foreign", 2),
                ReadRange(1, 2, "ring", 1, "exact"),
            ),
            "served": (Served(0, 1, "pool", 11), Served(1, 2, "ring", 3)),
        },
    ),
    (
        Abort,
        {
            "message": "GGML_ASSERT(fits) failed",
            "file": "ggml-cuda/fattn.cu",
            "line": 412,
            "condition": "fits",
            "backtrace": ("ggml_abort", "ggml_cuda_flash_attn_ext"),
            "cuda_error": "cudaErrorIllegalAddress",
        },
    ),
    (Warn, {"message": "falling back to ordinary attention", "code": "fallback", "layer": 5}),
    (
        Output,
        {
            "stream": 1,
            "checksum": "deadbeef",
            "ref_checksum": "cafef00d",
            "max_abs_delta": 0.125,
            "tolerance": 0.001,
            "worst_layer": 5,
        },
    ),
    (Records, {"kinds": ("learn", "mark.outside")}),
    (
        Kernel,
        {
            "name": "fattn_streamed",
            "layer": 5,
            "stream": 1,
            "ranges": ((0, 2, "pool", 7), (2, 3, "host", -1)),
            "records": 12,
            "dropped": 1,
        },
    ),
    (
        Timing,
        {
            "prompt_tokens": 8000,
            "prompt_ms": 6400.5,
            "decode_tokens": 750,
            "decode_ms": 34567.25,
            "slot": 1,
            "task": 42,
            "prompt_tps": 1249.9,
            "decode_tps": 21.7,
            "ms_per_token": 46.09,
            "depth_start": 52000,
            "depth_end": 52750,
            "cached": 44000,
            "n_ctx_slot": 65536,
            "truncated": False,
            "graphs_reused": 12345,
            "boot": 1,
            "started_ns": 123_456_789,
        },
    ),
    (
        Telemetry,
        {
            "mem_used": 1 << 30,
            "mem_total": 24 << 30,
            "gpu_util": 97,
            "mem_util": 40,
            "pcie_rx_kbps": 1200,
            "pcie_tx_kbps": 800,
            "sm_clock_mhz": 2520,
            "mem_clock_mhz": 10501,
            "temperature_c": 66,
            "power_mw": 350000,
        },
    ),
    (
        Snapshot,
        {
            "reason": "rotate",
            "versions": (HostVersions(2, 1, 0, (3, 0, 1)),),
            "pool": (SlotCopies(5, 2, 1, 0, 7, 41, (3,)),),
            "ring": (SlotCopies(0, 2, 0, 4, 7, 42, (1, 1)),),
            "ring_pending": ((2, 0),),
            "partition": Partition(resident=4, ring=14),
        },
    ),
]


def write_steps(path: Path, steps: int, per_step: int = 3, *, close: bool = True) -> TraceWriter:
    """A small valid trace: per step one Step and ``per_step - 1`` Write events."""
    w = TraceWriter.create(path, header())
    for step in range(steps):
        w.emit(Step, step, phase="decode", streams=(0, 1), tokens=1, n_kv=64)
        for i in range(per_step - 1):
            w.emit(Write, step, layer=i, stream=0, cells=(step, step + 1), rows=(step, step + 1))
        w.end_step()
    if close:
        w.close()
    return w


def event_line(kind: str, seq: int, step: int = 0, **fields: Any) -> bytes:
    """One hand-made line (any kind, any fields) with a trailing newline."""
    obj = {"kind": kind, "seq": seq, "t_ns": seq * 100, "step": step, **fields}
    return msgspec.json.encode(obj) + b"\n"


#: A minor version newer than this kvdiag's (its readers keep what they do not know).
NEWER_MINOR = f"{FORMAT_MAJOR}.{FORMAT_MINOR + 1}"


def header_line(version: str = "1.0", **more: Any) -> bytes:
    obj = msgspec.to_builtins(header())
    obj["version"] = version
    obj.update(more)
    return msgspec.json.encode(obj) + b"\n"


def write_line(seq: int, step: int = 0) -> bytes:
    return event_line("write", seq, step, layer=0, stream=0, cells=[0, 1], rows=[0, 1])


def end_line(seq: int, events: int, steps: int = 1) -> bytes:
    return event_line("end", seq, steps - 1, status="completed", steps=steps, events=events)
