"""What a stage-size sweep found: each point's figures and, per slot count, the best rate,
the smallest stage that keeps ≥ 90 % of it and the cliff (``kvdiag sweep``; the points are
produced by :mod:`kvdiag.runs.sweep`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

KEEP = 0.90
"""The share of the best rate a stage must keep to count as enough."""


@dataclass(frozen=True)
class SweepPoint:
    stage_mib: int
    np: int
    status: str
    """completed / aborted / refused (the runtime would not boot this pool)."""
    error: str | None = None
    pool_pages: int = 0
    resident_start: int = 0
    ring_start: int = 0
    resident_end: int = 0
    ring_end: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    pool_pages_read: int = 0
    ring_pages_read: int = 0
    host_pages_read: int = 0
    samples: int = 0
    misses: int = 0
    upload_bytes: int = 0
    repartitions: int = 0
    invalidations: int = 0
    eval_us: float = 0.0
    feedback: str = "modelled"
    """``modelled``: attention time from the device profile; ``measured``: the executor's own
    evaluation time on the device (the CuPy executor: the whole step as it runs it)."""

    @property
    def resident_share(self) -> float | None:
        total = self.pool_pages_read + self.ring_pages_read + self.host_pages_read
        return self.pool_pages_read / total if total else None

    @property
    def miss_ratio(self) -> float | None:
        return self.misses / self.samples if self.samples else None

    @property
    def bytes_per_token(self) -> float | None:
        return self.upload_bytes / self.decode_tokens if self.decode_tokens else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.eval_us * 1e6 if self.eval_us > 0 else None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "resident_share": self.resident_share,
                "miss_ratio": self.miss_ratio, "bytes_per_token": self.bytes_per_token,
                "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class Summary:
    np: int
    best: SweepPoint | None
    enough: SweepPoint | None
    """The smallest stage keeping ≥ 90 % of the best rate."""
    cliff: tuple[SweepPoint, SweepPoint] | None
    """(smaller, larger) neighbours across which the rate falls the most."""

    def as_json(self) -> dict[str, Any]:
        return {"np": self.np,
                "best_stage_mib": self.best.stage_mib if self.best else None,
                "best_tokens_per_s": self.best.tokens_per_s if self.best else None,
                "enough_stage_mib": self.enough.stage_mib if self.enough else None,
                "cliff_mib": [self.cliff[0].stage_mib, self.cliff[1].stage_mib]
                if self.cliff else None}


def summarise(points: Iterable[SweepPoint]) -> list[Summary]:
    by_np: dict[int, list[SweepPoint]] = {}
    for p in points:
        by_np.setdefault(p.np, []).append(p)
    out = []
    for np_, pts in sorted(by_np.items()):
        rated = sorted((p for p in pts if p.tokens_per_s), key=lambda p: p.stage_mib)
        if not rated:
            out.append(Summary(np_, None, None, None))
            continue
        best = max(rated, key=lambda p: (p.tokens_per_s or 0.0, -p.stage_mib))
        top = best.tokens_per_s or 0.0
        enough = next(p for p in rated if (p.tokens_per_s or 0.0) >= KEEP * top)
        cliff = None
        worst = 1.0
        for small, large in itertools.pairwise(rated):
            ratio = (small.tokens_per_s or 0.0) / (large.tokens_per_s or 1.0)
            if ratio < worst:
                worst, cliff = ratio, (small, large)
        out.append(Summary(np_, best, enough, cliff if worst < KEEP else None))
    return out


