"""The model's decode rate beside the measured one (``kvdiag perf --predict``, docs/perf.md
"Prediction").

A decode step's time is its attention over the streamed layers — what the runtime model models
(:mod:`kvdiag.kvstream.session`: the adaptive controller and the device profile's costs) — plus
everything else: the other layers, the matmuls, sampling, the host. The baseline run measures
the second part: at each of its requests, the measured ms per token minus the modelled
attention with every page resident is the **time per token that is not attention** at that
depth (the calibration, interpolated linearly between the baseline's depths). The prediction for
a request of the run is that time plus the attention the model plays for it.

Where prediction and measurement differ by more than ``GAP`` (15 %), the gap is set against
each modelled mechanism that could close it, with the model's own costs
(:class:`CostModel`): the resident window (how small it would have to be), the dispatch route
(how many streamed layers would have to fall back to zero-copy host reads), and the time that
is not attention (by how much it would have to differ from the baseline's). The model is never
adjusted to fit: the statement is what would have to change for it to.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvdiag.analysis.perf import RequestRow
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.model.perf import ModelledRequest

GAP = 0.15


class CostModel(Protocol):
    """What one decode step's modelled attention (µs, streamed layers) costs under other
    mechanisms (:class:`kvdiag.kvstream.session.AttentionCost`)."""

    @property
    def layers(self) -> int: ...

    def resident_us(self, active: int) -> float: ...

    def window_us(self, active: int, resident: int) -> float: ...

    def host_us(self, active: int, layers_on_host: int) -> float: ...


def resident_ms(cost: CostModel, start: int, end: int) -> float:
    """Mean modelled attention per decode step, every page resident, over a decode from
    ``start`` to ``end`` tokens: the step that writes cell ``d`` attends ceil((d + 1) / 256)
    pages (the view of the model's runner and session)."""
    end = max(end, start + 1)
    total = 0.0
    page = start // PAGE_TOKENS + 1
    while (page - 1) * PAGE_TOKENS < end:
        lo, hi = max(start, (page - 1) * PAGE_TOKENS), min(end, page * PAGE_TOKENS)
        total += (hi - lo) * cost.resident_us(page)
        page += 1
    return total / (end - start) / 1000.0


@dataclass(frozen=True)
class Calibration:
    """The baseline's time per token that is not attention, at its requests' depths."""

    points: tuple[tuple[float, float], ...]
    """(depth, ms per token), by depth."""

    def at(self, depth: float) -> float | None:
        """Linear between the baseline's depths, the nearest value outside them."""
        if not self.points:
            return None
        xs = [p[0] for p in self.points]
        i = bisect.bisect_left(xs, depth)
        if i == 0:
            return self.points[0][1]
        if i == len(xs):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 if x1 == x0 else y0 + (y1 - y0) * (depth - x0) / (x1 - x0)


def calibrate(base: Sequence[RequestRow], cost: CostModel) -> Calibration:
    points = []
    for row in base:
        mspt, mid = row.ms_per_token, row.depth_mid
        if mspt is None or mid is None or row.capped or row.depth_start is None:
            continue
        attention = resident_ms(cost, row.depth_start, row.depth_end or row.depth_start)
        points.append((mid, mspt - attention))
    return Calibration(tuple(sorted(points)))


@dataclass(frozen=True)
class Predicted:
    row: RequestRow
    model: ModelledRequest
    other_ms: float | None
    """The calibration's time per token that is not attention at this depth."""
    mechanisms: tuple[str, ...] = ()

    @property
    def attention_ms(self) -> float:
        return self.model.attention_us / 1000.0

    @property
    def predicted_ms(self) -> float | None:
        return None if self.other_ms is None else self.other_ms + self.attention_ms

    @property
    def predicted_tps(self) -> float | None:
        ms = self.predicted_ms
        return 1000.0 / ms if ms else None

    @property
    def gap(self) -> float | None:
        """Measured rate over predicted, minus one (−0.4: measured 40 % slower)."""
        measured, predicted = self.row.decode_tps, self.predicted_tps
        return measured / predicted - 1 if measured and predicted else None

    @property
    def disagrees(self) -> bool:
        return self.gap is not None and abs(self.gap) > GAP


def _largest(lo: int, hi: int, enough: Callable[[int], bool]) -> int | None:
    """The largest r in [lo, hi] for which ``enough(r)`` holds, assuming it holds for every
    r below one that does (attention grows as the window shrinks); None if none does."""
    if not enough(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if enough(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def mechanisms(p: Predicted, cost: CostModel) -> tuple[str, ...]:
    """What would have to change in the model for it to give the measured rate."""
    measured_ms = p.row.ms_per_token
    predicted = p.predicted_ms
    if measured_ms is None or predicted is None:
        return ()
    gap_ms = measured_ms - predicted
    m = p.model
    active = max(m.active_pages[1], 1)
    resident = m.resident_pages[0]
    layers = cost.layers
    now = m.attention_us
    out: list[str] = []
    if gap_ms > 0:
        need = gap_ms * 1000.0
        # the resident window (pool sizing, brief §1.4, and the controller, §1.10)
        everything = cost.window_us(active, 0) - now
        where = (f"the model keeps {resident} resident pages/layer against {active} active "
                 + ("(nothing streams here)" if resident >= active else
                    f"({active - resident} pages/layer stream through a ring of "
                    f"{m.ring_slots[0]}–{m.ring_slots[1]} slots)"))
        if everything < need:
            out.append(f"resident window: {where}; even with no page resident (every page "
                       f"through the ring) the modelled attention grows by only "
                       f"{everything / 1000:.1f} ms/token, not the {gap_ms:.1f} ms/token "
                       "measured: the window alone cannot explain it")
        else:
            r = _largest(0, min(resident, active),
                          lambda r: cost.window_us(active, r) - now >= need)
            out.append(f"resident window: {where}; it would have to be at most {r} pages/layer "
                       f"for the modelled attention to grow by the {gap_ms:.1f} ms/token "
                       "measured")
        # the dispatch route (brief §3): ordinary attention over the host buffer, zero-copy
        per_layer = [cost.host_us(active, k) - cost.resident_us(active)
                     for k in range(layers + 1)]
        k = next((k for k in range(1, layers + 1) if per_layer[k] >= need), None)
        if k is None:
            out.append(f"dispatch route: even all {layers} streamed layers falling back to "
                       f"zero-copy host reads add only {per_layer[layers] / 1000:.1f} ms/token "
                       f"over resident attention: fallback alone cannot explain it")
        else:
            out.append(f"dispatch route: {k} of the {layers} streamed layers falling back to "
                       f"zero-copy host reads would add {per_layer[k] / 1000:.1f} ms/token "
                       "(fallback warnings or fits=false lines would show it)")
        other = p.other_ms or 0.0
        out.append(f"time that is not attention: it would have to be {gap_ms:.1f} ms/token "
                   f"({gap_ms / other:+.0%}) more than the baseline's at this depth "
                   if other > 0 else
                   f"time that is not attention: {gap_ms:.1f} ms/token more than the "
                   "baseline's at this depth")
        out[-1] = out[-1].rstrip() + (" — costs the model does not model: CUDA graphs not "
                                      "captured (brief §1.11), host-side work, contention")
    else:
        out.append(f"the model predicts {-gap_ms:.1f} ms/token more than measured: the "
                   "calibrated time that is not attention would have to be smaller at this "
                   "depth, or the profile's costs slower than this GPU (name yours with "
                   "--profile)")
    return tuple(out)


def predict(run: Sequence[RequestRow], models: Sequence[ModelledRequest],
            calibration: Calibration | None, cost: CostModel) -> list[Predicted]:
    """``models[i]`` is the model's play of ``run[i]`` (the run's own requests replayed)."""
    out = []
    for row, model in zip(run, models, strict=True):
        other = None
        # a request the context capped (or the model could not fit) is not predicted: its
        # decode stopped early, as the comparison leaves it out
        if (calibration is not None and row.depth_mid is not None and not row.capped
                and not model.rejected and model.decode_steps):
            other = calibration.at(row.depth_mid)
        p = Predicted(row, model, other)
        if p.disagrees:
            p = Predicted(row, model, other, mechanisms(p, cost))
        out.append(p)
    return out
