"""``kvdiag sweep``: the same scenario captured at many stage sizes, side by side.

Each point runs the runtime model with the adaptive controller (``--adaptive``) in its own
process and keeps only what the sweep reports, from the events the runner emits (no trace
file): how much of what the decode steps read was resident, how often the ring missed a
deadline, bytes moved over PCIe per decoded token, how many repartitions there were, and the
modelled attention rate (decoded tokens over the summed evaluation time the device profile
gives, :mod:`kvdiag.kvstream.timing`). The summary names the best rate, the smallest stage that
keeps ≥ 90 % of it, and the cliff: the step between neighbouring stage sizes that loses the
largest share of the rate.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from kvdiag.analysis.sweep import SweepPoint
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.scenarios import Scenario
from kvdiag.kvstream.timing import DeviceProfile
from kvdiag.model import events as ev
from kvdiag.runs.limits import check_sweep_points


@dataclass(frozen=True)
class PointSpec:
    cfg: RuntimeConfig
    scenario: Scenario
    executor: str
    profile: DeviceProfile
    seed: int = 0


@dataclass
class _Tally:
    """An event sink that keeps the sweep's sums instead of writing a trace."""

    decode: bool = False
    tokens: int = 0
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys((
        "decode_steps", "decode_tokens", "pool_pages_read", "ring_pages_read",
        "host_pages_read", "samples", "misses", "upload_bytes", "repartitions",
        "invalidations", "eval_us"), 0))
    last_partition: tuple[int, int] | None = None

    def emit(self, cls: type[Any], step: int, **f: Any) -> Any:
        c = self.counts
        if cls is ev.Step:
            self.decode = f["phase"] == "decode"
            if self.decode:
                c["decode_steps"] += 1
                c["decode_tokens"] += f["tokens"] * len(f["streams"])
        elif cls is ev.Repartition:
            c["repartitions"] += 1
        elif cls is ev.Invalidate:
            c["invalidations"] += 1
        elif cls is ev.Adapt:
            self.last_partition = (f["resident"], f["ring"])
            if self.decode:
                c["samples"] += f.get("samples") or 0
                c["misses"] += f.get("misses") or 0
                c["eval_us"] += f.get("eval_us") or 0.0
        elif self.decode and cls is ev.Read:
            c["pool_pages_read"] += f["pool"]
            c["ring_pages_read"] += f["ring"]
            c["host_pages_read"] += f["host"]
        elif self.decode and cls is ev.Upload:
            c["upload_bytes"] += f["bytes"]
        if cls is ev.Abort:
            return ev.Abort(seq=0, t_ns=0, step=step, **f)
        return None

    def end_step(self) -> None:
        pass


def run_point(spec: PointSpec) -> SweepPoint:
    """One capture of the sweep (runs in a worker process)."""
    from kvdiag.executors.decisions_exec import DecisionsOnlyExecutor
    from kvdiag.kvstream.runner import ConfigError, Runner
    from kvdiag.runs.capture import make_executor

    cfg = spec.cfg
    base = SweepPoint(stage_mib=cfg.stage_mib, np=cfg.np, status="refused")
    executor = (DecisionsOnlyExecutor() if spec.executor == "decisions"
                else make_executor(spec.executor)[0])
    try:
        try:
            runner = Runner(cfg, spec.scenario, executor, seed=spec.seed, profile=spec.profile)
        except ConfigError as exc:
            return replace(base, error=str(exc))
        pool = runner.plan.pool
        assert pool is not None
        tally = _Tally()
        result = runner.run(tally)
        c = tally.counts
        end = tally.last_partition or (pool.resident_pages_per_layer, pool.ring_slots)
        return SweepPoint(
            stage_mib=cfg.stage_mib, np=cfg.np, status=result.status,
            error=result.abort.message if result.abort else None,
            pool_pages=pool.pool_pages, resident_start=pool.resident_pages_per_layer,
            ring_start=pool.ring_slots, resident_end=end[0], ring_end=end[1],
            eval_us=float(c.pop("eval_us")), **{k: int(v) for k, v in c.items()},
            feedback="measured" if hasattr(executor, "end_evaluation") else "modelled")
    finally:
        executor.close()


def run_sweep(specs: list[PointSpec], workers: int | None = None,
              progress: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
    """Run every point, ``workers`` processes at a time (default: every core)."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(specs)))
    points: list[SweepPoint] = []
    if workers == 1:
        for spec in specs:
            points.append(run_point(spec))
            if progress:
                progress(points[-1])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for fut in as_completed([pool.submit(run_point, s) for s in specs]):
                points.append(fut.result())
                if progress:
                    progress(points[-1])
    return sorted(points, key=lambda p: (p.np, p.stage_mib))


def stage_range(text: str) -> list[int]:
    """``256:4096:256`` (start:stop:step, stop included), ``512,1024`` or ``2048``."""
    try:
        if ":" in text:
            parts = [int(x) for x in text.split(":")]
            if len(parts) != 3 or parts[2] <= 0 or parts[0] <= 0 or parts[1] < parts[0]:
                raise ValueError
            stages = range(parts[0], parts[1] + 1, parts[2])
            check_sweep_points(len(stages))  # before the list is made: it could be huge
            return list(stages)
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--stage-mib {text!r}: want START:STOP:STEP or a comma list of "
                         "positive MiB values") from None
    if not values or min(values) <= 0:
        raise ValueError(f"--stage-mib {text!r}: values must be positive")
    return values
