"""One full read of a trace for the viewer: findings, problems, per-step marks, telemetry.

The index (:mod:`kvdiag.analysis.trace_index`) is for navigation; this pass is the analysis
:class:`kvdiag.trace.reader.TraceReader` (which reports damage line by line) feeding
:class:`kvdiag.analysis.judgement.Judge` (the same judgement as ``kvdiag check``), plus what
the viewer marks on its step scrubber — steps with stale or foreign reads, diverged outputs,
fallbacks and aborts, all from the judgement's verdicts — the telemetry samples and the abort
events for the backtrace view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from kvdiag.analysis.judgement import Judge, LedgerSnapshot
from kvdiag.analysis.judgement.judge import chunks
from kvdiag.model import events as ev
from kvdiag.model.findings import Finding
from kvdiag.trace.problems import Problem
from kvdiag.trace.reader import TraceReader
from kvdiag.trace.segments import open_trace
from kvdiag.tui.clip import clip_deep

TELEMETRY_FIELDS: tuple[str, ...] = (
    "mem_used", "mem_total", "gpu_util", "mem_util", "pcie_rx_kbps", "pcie_tx_kbps",
    "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_mw",
)


PARTITION_FIELDS: tuple[str, ...] = ("resident", "ring", "miss_pct", "busy_pct", "active", "peak")
"""kv_stream_adapt's partition (``adapt`` and ``repartition`` events, 1.1)."""


@dataclass(frozen=True, eq=False)
class TelemetrySeries:
    """Samples in file order: ``step`` and ``t_ns`` per sample and one float array per field
    (NaN where the sample has no value)."""

    step: np.ndarray
    t_ns: np.ndarray
    values: dict[str, np.ndarray] = field(default_factory=dict)
    fields: tuple[str, ...] = TELEMETRY_FIELDS

    @property
    def n(self) -> int:
        return len(self.step)

    def present(self) -> list[str]:
        """Fields with at least one sample."""
        return [k for k in self.fields if k in self.values
                and bool(np.any(~np.isnan(self.values[k])))]

    def sample_at_step(self, step: int) -> int | None:
        """The last sample taken at or before ``step`` (the first one before any)."""
        if self.n == 0:
            return None
        i = int(np.searchsorted(self.step, step, side="right")) - 1
        return max(i, 0)


def telemetry_series(samples: list[ev.Telemetry]) -> TelemetrySeries:
    step = np.array([s.step for s in samples], dtype=np.int64)
    t_ns = np.array([s.t_ns for s in samples], dtype=np.int64)
    values = {
        name: np.array([np.nan if getattr(s, name) is None else float(getattr(s, name))
                        for s in samples], dtype=np.float64)
        for name in TELEMETRY_FIELDS
    }
    return TelemetrySeries(step, t_ns, values)


def _nan(v: float | None) -> float:
    return np.nan if v is None else float(v)


def partition_series(samples: list[ev.Adapt | ev.Repartition]) -> TelemetrySeries:
    """One sample per adapt line (the partition it ran with) and per repartition (the
    partition after it). An adapt line's miss % is misses / samples: the deadline miss ratio
    the controller compares with its 1 % threshold (brief §1.10)."""
    rows: list[tuple[float, ...]] = []
    for e in samples:
        if isinstance(e, ev.Adapt):
            miss = (100.0 * e.misses / e.samples if e.misses is not None and e.samples
                    else np.nan)
            rows.append((e.resident, e.ring, miss, _nan(e.busy_pct), e.active, _nan(e.peak)))
        else:
            rows.append((e.resident[1], e.ring[1], _nan(e.miss_pct), _nan(e.busy_pct),
                         np.nan, np.nan))
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(PARTITION_FIELDS))
    return TelemetrySeries(
        np.array([e.step for e in samples], dtype=np.int64),
        np.array([e.t_ns for e in samples], dtype=np.int64),
        {name: table[:, i] for i, name in enumerate(PARTITION_FIELDS)},
        PARTITION_FIELDS,
    )


@dataclass(frozen=True, eq=False)
class TraceDigest:
    findings: tuple[Finding, ...]
    summary: dict[str, Any]
    problems: tuple[Problem, ...]
    marks: dict[str, np.ndarray]
    """Sorted unique steps per mark: ``stale``, ``foreign``, ``diverged``, ``abort``,
    ``fallback``."""
    telemetry: TelemetrySeries
    aborts: tuple[ev.Abort, ...]
    complete: bool
    truncated: bool
    partition: TelemetrySeries = field(default_factory=lambda: partition_series([]))
    """Resident pages/layer, ring slots, miss and copy-busy % from kv_stream_adapt (1.1)."""
    ledger: LedgerSnapshot | None = None
    """The judgement's per-read tables (the Pages screen's read classes)."""


class _Counting:
    """A binary stream wrapper that counts the bytes read (for progress)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readline(self, n: int = -1) -> bytes:
        data = self.raw.readline(n)
        self.count += len(data)
        return data

    def close(self) -> None:
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        # what a joined segment set tells its reader (problems, locate, skipped_seqs)
        return getattr(self.raw, name)


def digest_trace(path: str | Path, progress: Callable[[float], None] | None = None,
                 every: int = 1 << 16) -> TraceDigest:
    """Read ``path`` once; ``progress(fraction)`` is called every ``every`` events."""
    p = Path(path)
    opened = open_trace(p)  # a plain file, a compressed one, or a segment set (one stream)
    size = max(int(getattr(opened.stream, "size", 0)) or (p.stat().st_size if p.is_file()
                                                          else 0), 1)
    stream = _Counting(opened.stream)
    marks: dict[str, set[int]] = {k: set() for k in ("stale", "foreign", "diverged", "abort",
                                                      "fallback")}
    samples: list[ev.Telemetry] = []
    aborts: list[ev.Abort] = []
    partition: list[ev.Adapt | ev.Repartition] = []
    try:
        reader = TraceReader(stream, opened.name, close_stream=True)  # type: ignore[arg-type]
        judge = Judge(reader.header, name=str(p), ledger=True)
        n = 0
        for chunk in chunks(reader):
            judge.feed_all(chunk)
            for event in chunk:
                n += 1
                t = type(event)
                # type() is, not isinstance: this loop runs per event of traces of millions.
                if t is ev.Telemetry:
                    samples.append(cast(ev.Telemetry, event))
                elif t is ev.Abort:
                    aborts.append(cast(ev.Abort, event))
                    marks["abort"].add(event.step)
                elif t is ev.Adapt or t is ev.Repartition:
                    partition.append(cast(ev.Adapt | ev.Repartition, event))
                if progress is not None and n % every == 0:
                    progress(min(stream.count / size, 1.0))
    finally:
        stream.close()
    judgement = judge.snapshot()
    assert judgement.ledger is not None
    for what in ("stale", "foreign", "fallback", "diverged"):
        marks[what].update(judgement.ledger.steps_with(what).tolist())
    summary = judgement.summary()
    summary["problems"] = [{"line": pr.line, "kind": pr.kind, "message": pr.message}
                           for pr in reader.problems]
    # every string here can come from the file: clipped for display (kvdiag.tui.clip)
    return TraceDigest(
        findings=clip_deep(judgement.findings),
        summary=clip_deep(summary),
        problems=clip_deep(tuple(reader.problems)),
        marks={k: np.array(sorted(v), dtype=np.int64) for k, v in marks.items()},
        telemetry=telemetry_series(samples),
        aborts=clip_deep(tuple(aborts)),
        complete=reader.complete,
        truncated=reader.truncated,
        partition=partition_series(partition),
        ledger=judgement.ledger,
    )
