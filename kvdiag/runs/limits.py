"""Limits of the numeric flags of ``capture`` and ``sweep`` that are kvdiag's own, and of
what a capture can hold on this machine (the runtime's limits on the shape flags are in
:mod:`kvdiag.kvstream.limits`). Every refusal is one line naming the limit and its reason.
"""

from __future__ import annotations

import os
from typing import Final

from kvdiag.errors import UsageError
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.ggml_types import ggml_type
from kvdiag.kvstream.scenarios import Scenario
from kvdiag.model.pages import PAGE_TOKENS

#: ``--seed`` is recorded in the trace header, whose integers are 64-bit: the reader refuses
#: any outside [-2^63, 2^64 - 1] (docs/trace-format.md); NumPy's SeedSequence takes only
#: non-negative seeds.
MAX_SEED: Final = 2**64 - 1
#: ``--telemetry-ms``: one sample a day is already no telemetry; the sampler's wait must also
#: stay below threading.TIMEOUT_MAX.
MAX_TELEMETRY_MS: Final = 86_400_000
#: ``sweep``: points of one sweep (each a capture in a process of its own).
MAX_SWEEP_POINTS: Final = 10_000
#: Bytes per cell and stream of the runner's cell tables (request and position, int64 each).
CELL_TABLE_BYTES: Final = 16


def check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed {seed}: must be between 0 and {MAX_SEED:,} (the trace "
                         "header records it as a 64-bit integer; NumPy seeds are not negative)")


def check_telemetry_ms(ms: int) -> None:
    if not 0 <= ms <= MAX_TELEMETRY_MS:
        raise UsageError(f"--telemetry-ms {ms}: must be 0 (off) to {MAX_TELEMETRY_MS:,} (one "
                         "sample a day)")


def check_sweep_points(n: int) -> None:
    if n > MAX_SWEEP_POINTS:
        raise UsageError(f"the sweep has {n:,} points, more than {MAX_SWEEP_POINTS:,}: use a "
                         "larger STEP in --stage-mib or fewer --np values")


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (``MemAvailable`` of /proc/meminfo, else
    the physical memory); None when neither can be read."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def capture_bytes(cfg: RuntimeConfig, scenario: Scenario, executor: str) -> dict[str, int]:
    """Memory a capture of ``scenario`` takes here, at most, by what takes it: the runner's
    cell tables (every cell of every stream), and for a data plane the K/V pages the requests
    write (host copy and resident copy) with their float32 views; the CuPy executor also
    allocates the whole host buffer up front (pinned, brief §1.2)."""
    parts = {f"cell tables ({CELL_TABLE_BYTES} B × {cfg.kv_size:,} cells × {cfg.n_stream} "
             f"stream(s))": CELL_TABLE_BYTES * cfg.kv_size * cfg.n_stream}
    if executor == "decisions":
        return parts
    width = cfg.head_dim * cfg.n_head_kv
    row = ggml_type(cfg.type_k).row_bytes(width) + ggml_type(cfg.type_v).row_bytes(width)
    cells: dict[int, int] = {}
    for r in scenario.requests:
        stream = r.slot if cfg.n_stream > 1 else 0
        cells[stream] = cells.get(stream, 0) + r.prompt + r.decode
    used = sum(min(c, cfg.kv_size) for c in cells.values())
    pages = sum(-(-min(c, cfg.kv_size) // PAGE_TOKENS) for c in cells.values())
    parts[f"K/V pages written ({pages:,} pages × {cfg.n_streamed} layers, twice, with "
          f"float32 views)"] = (2 * pages * PAGE_TOKENS * row + used * width * 8) * cfg.n_streamed
    # one ubatch's float32 Q and output, and its attention scores (with a softmax copy)
    tokens = min(cfg.n_ubatch, max((r.prompt for r in scenario.requests), default=1))
    tokens *= cfg.n_stream
    n_kv = -(-min(max(cells.values(), default=1), cfg.kv_size) // PAGE_TOKENS) * PAGE_TOKENS
    parts[f"one ubatch ({tokens:,} tokens × {cfg.n_head:,} query heads: Q, output and "
          f"attention scores)"] = tokens * cfg.n_head * (2 * cfg.head_dim + 2 * n_kv) * 4
    if executor == "cupy":
        parts["the pinned host KV buffer"] = cfg.kv_size * cfg.n_stream * cfg.n_streamed * row
    return parts


def check_memory(cfg: RuntimeConfig, scenario: Scenario, executor: str, copies: int = 1) -> None:
    """Refuse a capture (``copies`` at once, for a sweep) that needs more memory than this
    machine has available, before anything is allocated."""
    parts = capture_bytes(cfg, scenario, executor)
    need = sum(parts.values()) * copies
    have = available_memory()
    if have is not None and need > have:
        many = f" ({copies} at once)" if copies > 1 else ""
        most = max(parts, key=lambda k: parts[k])
        raise UsageError(
            f"this capture{many} needs about {need / 2**30:,.1f} GiB of memory here, more than "
            f"the {have / 2**30:,.1f} GiB available (most of it: {most}); lower --ctx or the "
            "head geometry")
