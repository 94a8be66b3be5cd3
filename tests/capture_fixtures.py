"""Recorded captures of the NumPy executor, to prove that a faster executor decides and computes
exactly what the recorded one did.

``tests/data/capture_baseline/<case>.json.gz`` holds, for each case below, the decision and output
events of a capture made at commit 1e6fb9e (before the executor caches of project issue 12),
with ``seq`` and ``t_ns`` removed. Regenerate only on purpose (a change of the model's
decisions or of the arithmetic), with ``python tests/capture_fixtures.py``.

The comparison is meant to survive additions to the trace format: kinds that the recording
did not have (1.1's ``mark``, ``invalidate``) are skipped, and of each recorded event only the
recorded fields are compared, so a new optional field (``read.served``) is ignored. Two fields
are left out because format 1.1 changes what the model puts there, not what it decides:
``write.dirty`` (1.1: only this write's keys) and ``end.events`` (the count of those events).

Outputs are CRC-32s of float32 attention results. Their prefill parts come from BLAS GEMM,
whose rounding depends on the CPU kernel and thread count OpenBLAS picks; each recording
therefore carries a fingerprint of the GEMM shapes it ran, and a machine whose fingerprint
differs skips the output comparison with that reason (the cached-versus-uncached comparison
of tests/test_capture_cache.py still runs there).
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data" / "capture_baseline"

# name -> capture arguments (small preset: 4 layers, head dim 256, 24/4 heads)
CASES: dict[str, list[str]] = {
    # np 2, slot 1 first: stale and foreign pool reads, so the reference is computed apart
    "slot1-first": ["--scenario", "slot1-first", "--prompt-tokens", "300", "--steps", "5"],
    "slot1-first-per-stream-fits": ["--scenario", "slot1-first", "--prompt-tokens", "300",
                                    "--steps", "4", "--layout", "per-stream",
                                    "--dispatch", "fits"],
    # a unified cache with two sequences in one stream: the explicit KQ mask
    "late-join-unified": ["--scenario", "late-join", "--kv-unified", "--prompt-tokens", "260",
                          "--steps", "6"],
    # most pages through the ring
    "pool-pressure": ["--scenario", "pool-pressure", "--prompt-tokens", "1100", "--steps", "10",
                      "--ctx", "8192", "--stage-mib", "4"],
    # F16 attention mode over the nibble types
    "single-slot-f16-mode": ["--scenario", "single-slot", "--prompt-tokens", "300",
                             "--steps", "5", "--type-k", "q4_0", "--type-v", "q4_1",
                             "--no-native-quants"],
    "single-slot-q5_0-f16": ["--scenario", "single-slot", "--prompt-tokens", "270",
                             "--steps", "5", "--type-k", "q5_0", "--type-v", "f16"],
    # the membership dispatcher's abort on a two-stream ubatch
    "two-slot-abort": ["--scenario", "two-slot-concurrent", "--prompt-tokens", "200",
                       "--steps", "3"],
}

SKIPPED_KINDS = frozenset({"mark", "invalidate", "telemetry", "kernel", "repartition", "adapt"})
SKIPPED_FIELDS = {"write": ("dirty",), "end": ("events",)}


def decisions(path: Path) -> list[dict[str, Any]]:
    """The events of a trace as the recordings keep them (see the module docstring)."""
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        next(f)  # header: time of day and version strings
        for line in f:
            event = json.loads(line)
            if event["kind"] in SKIPPED_KINDS:
                continue
            for name in ("seq", "t_ns", *SKIPPED_FIELDS.get(event["kind"], ())):
                event.pop(name, None)
            out.append(event)
    return out


def gemm_fingerprint() -> str:
    """CRC-32 of float32 GEMMs of the shapes prefill attention runs (query chunks of 256
    tokens × 6 heads per KV head, head dim 256): equal fingerprints, equal roundings."""
    rng = np.random.default_rng(12)
    crc = 0
    for rows, cols in ((1536, 256), (1536, 512), (1536, 1280), (600, 768)):
        a = rng.standard_normal((4, rows, 256), dtype=np.float32)
        b = rng.standard_normal((4, 256, cols), dtype=np.float32)
        s = np.matmul(a, b)
        crc = zlib.crc32(s, crc)
        crc = zlib.crc32(np.matmul(s, rng.standard_normal((4, cols, 256), dtype=np.float32)), crc)
    return f"{crc:08x}"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))
    return doc


def capture_case(name: str, out: Path, extra: tuple[str, ...] = ()) -> int:
    """Run the case through the CLI in this process; returns the exit code."""
    from kvdiag.cli import main

    return main(["capture", *CASES[name], "--executor", "numpy", "-q", "-o", str(out), *extra])


def record(names: list[str]) -> None:
    import tempfile

    DATA.mkdir(parents=True, exist_ok=True)
    fingerprint = gemm_fingerprint()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / f"{name}.kvtrace"
            code = capture_case(name, trace)
            doc = {"case": name, "args": CASES[name], "exit": code,
                   "gemm_fingerprint": fingerprint, "events": decisions(trace)}
        text = json.dumps(doc, separators=(",", ":")) + "\n"
        # mtime 0: the same recording gives the same bytes
        (DATA / f"{name}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        print(f"{name}: exit {code}, {len(doc['events'])} events")


if __name__ == "__main__":
    record(sys.argv[1:] or list(CASES))
