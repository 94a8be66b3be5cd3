"""What the Perf screen draws, computed from the runs (no textual import): per run the decode
rate of each request and of each depth bin against depth, the partition the run recorded at
each depth, and the text about the request under the cursor against the baseline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from kvdiag.analysis.perf import DEFAULT_BIN_TOKENS, RequestRow, depth_bins, rows
from kvdiag.analysis.perf_compare import Comparison, compare
from kvdiag.analysis.perf_evidence import NOT_EXPLAINED
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.model.perf import PerfRun
from kvdiag.report.perf import run_summary, state_text


@dataclass(frozen=True)
class ModelCurve:
    """The runtime model's play of a run's own requests, as ``kvdiag perf --predict`` computes
    it (``kvdiag.judged.perf.Prediction``): its decode tok/s at each request's depth, and the text
    ``perf`` prints about it (the GPU profile, the calibration, every request it disagrees with
    by more than 15 % and what would have to change)."""

    label: str
    depths: list[float]
    tps: list[float]
    lines: list[str]


Predictor = Callable[[str, str | None], ModelCurve]
"""(run's path, baseline's path or None) -> the model's curve; raises a ``KvdiagError`` with a
one-line reason when the model cannot play the run."""


@dataclass(frozen=True, eq=False)
class RunView:
    run: PerfRun
    width: int = DEFAULT_BIN_TOKENS

    @cached_property
    def table(self) -> list[RequestRow]:
        """Requests with a depth and a rate, in the order they began (the cursor's order)."""
        return sorted((r for r in rows(self.run) if r.depth_mid is not None
                       and r.decode_tps is not None), key=lambda r: r.order)

    def requests(self) -> tuple[list[float], list[float]]:
        return ([r.depth_mid or 0.0 for r in self.table],
                [r.decode_tps or 0.0 for r in self.table])

    def bins(self) -> tuple[list[float], list[float]]:
        """The depth bins of the uncapped requests (as the comparison bins them)."""
        bs = [b for b in depth_bins(self.table, self.width, include_capped=False)
              if b.decode_tps is not None]
        return [(b.lo + b.hi) / 2 for b in bs], [b.decode_tps or 0.0 for b in bs]

    def partition(self) -> dict[str, tuple[list[float], list[float]]]:
        """By depth (tokens): resident pages/layer and ring slots the kv_stream_adapt lines
        recorded (first boot), the active pages of the requests' depths, the miss %."""
        pages = [p for p in self.run.adapt if p.boot == 0]
        out: dict[str, tuple[list[float], list[float]]] = {}
        if pages:
            depth = [float(p.page * PAGE_TOKENS) for p in pages]
            out["resident pages/layer"] = (depth, [float(p.resident_min) for p in pages])
            out["ring slots"] = (depth, [float(p.ring_min) for p in pages])
            miss = [(float(p.page * PAGE_TOKENS), 100.0 * p.misses / p.samples)
                    for p in pages if p.samples]
            if miss:
                out["miss %"] = ([m[0] for m in miss], [m[1] for m in miss])
        if self.table:
            ends = [float(r.depth_end or r.depth_start or 0) for r in self.table]
            starts = [float(r.depth_start or 0) for r in self.table]
            xs = sorted({*starts, *ends})
            out["active pages"] = (xs, [-(-x // PAGE_TOKENS) for x in xs])
        return out

    def repartitions(self) -> list[float]:
        return [float(n.depth) for n in self.run.notes
                if n.depth is not None and n.kind in ("repartition", "fallback", "fits-false")]


def describe(view: RunView, index: int, comparison: Comparison | None,
             baseline: str | None) -> list[str]:
    """Lines about request ``index`` of ``view`` (cursor order) and its depth bin."""
    if not view.table:
        return [f"{run_summary(view.run)}", "no request with a depth and a decode rate"]
    row = view.table[max(0, min(index, len(view.table) - 1))]
    r = row.request
    prompt = f"{r.prompt_tps:.1f}" if r.prompt_tps else "–"
    out = [f"request {index + 1} of {len(view.table)} · slot {r.slot} task {r.task} · depth "
           f"{row.depth_start}→{row.depth_end} · decode {row.decode_tps or 0:.2f} tok/s "
           f"({row.ms_per_token or 0:.2f} ms/token) · prompt {prompt} tok/s"
           + (" · truncated" if r.truncated else "")
           + (f" · graphs reused {row.graphs_delta}" if row.graphs_delta is not None else "")
           + f" · {'line' if view.run.kind == 'log' else 'event'} {r.line}"]
    if comparison is None:
        out.append("no baseline open: open the baseline's log or trace too "
                   "(kvdiag tui RUN BASE), b picks it")
        return out
    mid = row.depth_mid or 0.0
    b = next((b for b in comparison.bins if b.lo <= mid < b.hi), None)
    if b is None or b.ratio is None:
        out.append(f"against {baseline}: no uncapped baseline request at this depth")
    else:
        out.append(f"bin {b.label} against {baseline}: {b.ratio:.2f} "
                   f"({(b.ratio - 1) * 100:+.1f} %) · partition: {state_text(b.state)}")
        if b.slow:
            out.append("cause: " + ("; ".join(c.name for c in b.causes) or NOT_EXPLAINED))
            out += [f"  {e}" for c in b.causes for e in c.evidence]
    if comparison.cost is not None:
        parity = comparison.parity
        out.append(f"whole run: mean cost {comparison.cost * 100:+.1f} % over "
                   f"{len(comparison.uncapped)} uncapped pairs · turn-1 "
                   f"{'parity' if parity else 'no parity' if parity is not None else '–'}"
                   + (f" · worst bin {comparison.worst.label}" if comparison.worst else ""))
    return out


def comparison_of(run: PerfRun, base: PerfRun | None) -> Comparison | None:
    return compare(run, base) if base is not None else None
