"""Modelled timing feedback for the adaptive controller when no GPU measures it.

The runtime feeds ``kv_stream_adapt`` with what the device saw during an evaluation (brief
§1.6, §1.10): deadline samples and misses (a one-thread kernel finds a streamed page's ready
flag still 0 when the attention reaches it), the copy stream's busy ratio and the ring's peak
occupancy. Without a GPU, kvdiag derives the same quantities from a :class:`DeviceProfile` —
HBM read, zero-copy read and pinned host→device bandwidth and the kernel launch latency —
by playing one decode evaluation through a small discrete model:

- layers run in order; layer ``l`` reads all its active pages from VRAM (resident pool or
  ring) at HBM speed after one launch; its first ``resident`` pages come from the pool, the
  others from the ring;
- the copy stream copies streamed pages in the order they are consumed (layer by layer,
  page by page), one page at a time at the pinned H2D rate, into the ring's slots in turn
  (first in, first out); a slot can be reused once the attention has consumed its page, so
  the copies run ahead of the attention by at most the ring's size, across layers;
- a streamed page is one deadline sample; a miss when its copy is not finished when the
  attention reaches it (the attention then waits for it).

Evaluations of the same shape cost the same, so results are cached by shape.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

import msgspec


class DeviceProfile(msgspec.Struct, frozen=True):
    """Bandwidths (GB/s, 1e9 bytes) and launch latency (µs) of one GPU, and where they came
    from. ``kvdiag devices --profile`` measures one."""

    name: str
    hbm_read_gbps: float
    zero_copy_read_gbps: float
    h2d_gbps: float
    launch_us: float
    source: str = ""


H200 = DeviceProfile(
    name="NVIDIA H200",
    hbm_read_gbps=4545.7,
    zero_copy_read_gbps=51.4,
    h2d_gbps=55.49,
    launch_us=4.29,
    source=("kvdiag devices --profile on an NVIDIA H200, 2026-12-01 03:35 UTC (4 GiB device "
            "read, 1 GiB pinned mapped read, 1 GiB pinned memcpyAsync, empty-kernel launches); "
            "benchmarks/results/device_profile_h200.json"),
)
"""The default profile (an H200 measured on the device by kvdiag's own kernels)."""


@dataclass(frozen=True)
class EvalTiming:
    """One modelled decode evaluation."""

    eval_us: float
    copy_busy: float
    """Copy-stream busy time / evaluation time, in [0, 1]."""
    samples: int
    misses: int
    peak_slots: int
    h2d_bytes: int

    @property
    def tokens_per_s(self) -> float:
        """Attention-only decode rate this evaluation time allows (one token per step)."""
        return 1e6 / self.eval_us if self.eval_us > 0 else 0.0


def evaluation(profile: DeviceProfile, page_bytes: int, active: int,
               resident: tuple[int, ...], ring: int) -> EvalTiming:
    """Model one decode evaluation over ``len(resident)`` streamed layers, each attending
    ``active`` pages of which the first ``resident[l]`` are resident."""
    return _evaluation(profile, page_bytes, active, resident, ring)


@lru_cache(maxsize=4096)
def _evaluation(profile: DeviceProfile, page_bytes: int, active: int,
                resident: tuple[int, ...], ring: int) -> EvalTiming:
    read_us = page_bytes / (profile.hbm_read_gbps * 1e3)
    copy_us = page_bytes / (profile.h2d_gbps * 1e3)
    streamed = sum(max(0, active - r) for r in resident)
    if streamed and ring <= 0:
        raise ValueError("pages must stream but the ring has no slots")
    # streamed pages are numbered k = 0, 1, ... in consumption order; the ring is used
    # first-in first-out, so copy k reuses the slot of copy k - ring and may start once that
    # page was consumed and the copy engine is free
    consumed: list[float] = []
    engine = 0.0
    t = 0.0
    misses = peak = 0
    for r in resident:
        t += profile.launch_us + min(active, r) * read_us
        for _ in range(max(0, active - r)):
            k = len(consumed)
            start = max(engine, consumed[k - ring] if k >= ring else 0.0)
            engine = start + copy_us
            # slots in use when copy k starts: itself and the copied pages not yet consumed
            peak = max(peak, k - bisect.bisect_right(consumed, start) + 1)
            if engine > t:  # the ready flag is still 0 when the attention gets here
                misses += 1
                t = engine
            t += read_us
            consumed.append(t)
    eval_us = max(t, engine)
    busy = streamed * copy_us / eval_us if eval_us else 0.0
    return EvalTiming(eval_us=eval_us, copy_busy=min(1.0, busy), samples=streamed,
                      misses=misses, peak_slots=peak, h2d_bytes=streamed * page_bytes)
