"""``kvdiag perf`` as text (rich tables and summary lines) and JSON (docs/perf.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from kvdiag.analysis.perf import DepthBin, RequestRow
from kvdiag.analysis.perf_compare import PARITY, SLOW, Comparison
from kvdiag.analysis.perf_evidence import NOT_EXPLAINED, PartitionState
from kvdiag.model.perf import PerfRun


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.1f} %"


def _depth(row: RequestRow) -> str:
    if row.depth_start is None:
        return "?"
    text = f"{row.depth_start}→{row.depth_end if row.depth_end is not None else '?'}"
    return text + ("*" if row.depth_derived else "")


def run_summary(run: PerfRun) -> str:
    """One line: what the run is and how much of it was read."""
    capped = sum(1 for r in run.requests if r.truncated)
    parts = [f"{run.name} ({run.kind}): {len(run.requests)} requests"]
    if capped:
        parts.append(f"{capped} capped by the context")
    if run.unfinished:
        parts.append(f"{run.unfinished} without timing (never finished)")
    boots = run.boots
    if boots:
        b = boots[0]
        stream = (f"KV streaming pool {b.kv_stream_pool_mib:g} MiB" if b.kv_stream_pool_mib
                  else "KV streaming" if b.kv_stream else "no KV streaming")
        parts.append(f"{len(boots)} boot{'s' if len(boots) > 1 else ''} ({stream}"
                     + (f", {b.n_layer} layers" if b.n_layer else "")
                     + (f", ctx {b.n_ctx}" if b.n_ctx else "") + ")")
    if run.notes or run.adapt:
        parts.append(f"{len(run.notes)} kv-stream lines, "
                     f"{sum(p.evaluations for p in run.adapt)} kv_stream_adapt evaluations")
    return ", ".join(parts)


def requests_table(run: PerfRun, table: Sequence[RequestRow], max_rows: int = 50) -> Table:
    t = Table(title=f"requests of {run.name}", title_justify="left")
    for col in ("#", "slot", "task", "depth start→end", "cached", "prompt tok/s",
                "decode tok/s", "ms/token", "truncated", "graphs reused"):
        t.add_column(col, justify="right", no_wrap=True)
    shown = table if max_rows <= 0 else table[:max_rows]
    for row in shown:
        r = row.request
        t.add_row(str(row.index + 1), _f(r.slot, "d") if r.slot is not None else "?",
                  str(r.task) if r.task is not None else "?", _depth(row),
                  str(r.cached) if r.cached is not None else "–", _f(r.prompt_tps),
                  _f(row.decode_tps), _f(row.ms_per_token),
                  {True: "yes", False: "no", None: "?"}[r.truncated],
                  str(row.graphs_delta) if row.graphs_delta is not None else "–")
    if len(shown) < len(table):
        t.caption = (f"… and {len(table) - len(shown)} more (--max-rows 0 shows all; --json has "
                     "every one)")
    elif any(row.depth_derived for row in table):
        t.caption = "* depth from the release line and the decoded tokens"
    return t


def state_text(state: PartitionState | None) -> str:
    """The partition recorded in a depth range, in one line."""
    if state is None:
        return ""
    parts: list[str] = []
    active = state.active_pages
    if state.resident is not None:
        lo, hi = state.resident
        res = f"{lo}" if lo == hi else f"{lo}–{hi}"
        act = "" if active is None else (f" vs {active[0]}" if active[0] == active[1]
                                        else f" vs {active[0]}–{active[1]}") + " active pages"
        parts.append(f"resident {res} pages/layer{act}")
        r0, r1 = state.ring or (0, 0)
        parts.append(f"ring {r0}" if r0 == r1 else f"ring {r0}–{r1}")
        if state.samples:
            parts.append(f"misses {state.misses}/{state.samples} "
                         f"({(state.miss_ratio or 0) * 100:.1f} %)")
        if state.busy_max is not None:
            parts.append(f"copy busy ≤ {state.busy_max:g} %")
    counts = {k: len(state.of(k)) for k in ("repartition", "fallback", "fits-false",
                                             "feedback")}
    for kind, n in counts.items():
        if n:
            parts.append(f"{n} {kind}{'s' if n > 1 else ''}")
    if state.graphs_per_token is not None:
        parts.append(f"graphs reused {state.graphs_per_token:.2f}/token")
    if not parts:
        text = "no kv-stream line recorded here"
        if state.carried is not None and state.carried.resident is not None:
            text += (f" (last repartition before it: {state.unit} {state.carried.line}, "
                     f"{state.carried.resident[1]} resident pages/layer)")
        elif active is not None:
            text += f" ({active[0]}–{active[1]} active pages)"
        return text
    return ", ".join(parts)


def bins_table(run: PerfRun, bins: Sequence[DepthBin],
               states: Sequence[PartitionState]) -> Table:
    t = Table(title=f"{run.name} by depth (bins of {bins[0].hi - bins[0].lo if bins else 0} "
                    "tokens; requests the context capped are listed above, not binned)",
              title_justify="left")
    for col, just in (("depth", "left"), ("requests", "right"), ("decode tok/s", "right"),
                      ("partition recorded", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for b, s in zip(bins, states, strict=True):
        t.add_row(b.label, str(len(b.requests)), _f(b.decode_tps), state_text(s))
    return t


def comparison_table(comp: Comparison, run: str, base: str) -> Table:
    t = Table(title=f"{run} against {base}, aligned on depth (bins of {comp.width} tokens; "
                    "uncapped requests)", title_justify="left")
    for col, just in (("depth", "left"), ("run tok/s", "right"), ("baseline tok/s", "right"),
                      ("ratio", "right"), ("partition recorded (run)", "left"),
                      ("cause", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    worst = comp.worst
    for b in comp.bins:
        cause = ""
        if b.slow:
            cause = "; ".join(c.name for c in b.causes) or NOT_EXPLAINED
        mark = " ◀ worst" if worst is not None and b is worst else ""
        t.add_row(b.label, _f(b.run.decode_tps if b.run else None),
                  _f(b.base.decode_tps if b.base else None),
                  ("–" if b.ratio is None else f"{b.ratio:.2f}") + mark,
                  state_text(b.state), cause, style="bold" if b.slow else None)
    return t


def comparison_lines(comp: Comparison) -> list[str]:
    n = len(comp.uncapped)
    capped = len(comp.pairs) - n
    lines = []
    if comp.cost is None:
        lines.append("mean cost: no request completed uncapped in both runs at the same depth")
    else:
        lines.append(f"mean cost: {comp.cost * 100:+.1f} % ({_f(comp.mean_run)} against "
                     f"{_f(comp.mean_base)} tok/s, mean decode rate over the {n} requests both "
                     "runs completed uncapped"
                     + (f"; {capped} capped pair(s) left out" if capped else "") + ")")
    first = comp.first
    if first is not None and first.ratio is not None:
        verdict = "parity" if comp.parity else "no parity"
        lines.append(f"turn-1 parity: {_f(first.run.decode_tps)} against "
                     f"{_f(first.base.decode_tps)} tok/s at depth {first.run.depth_start} "
                     f"({_pct(first.ratio - 1)}): {verdict} (within ±{PARITY:.0%})")
    worst = comp.worst
    if worst is not None and worst.ratio is not None:
        lines.append(f"worst bin: {worst.label} tokens, {_f(worst.run.decode_tps if worst.run else None)}"
                     f" against {_f(worst.base.decode_tps if worst.base else None)} tok/s "
                     f"({_pct(worst.ratio - 1)})")
    slow = comp.slow_bins
    if slow:
        lines.append(f"bins more than {1 - SLOW:.0%} below the baseline:")
        for b in slow:
            lines.append(f"  {b.label}: {_pct((b.ratio or 0) - 1)}; {state_text(b.state)}")
            if not b.causes:
                lines.append(f"    cause: {NOT_EXPLAINED}")
            for c in b.causes:
                lines.append(f"    cause: {c.name}")
                lines += [f"      {e}" for e in c.evidence]
    elif comp.worst is not None:
        lines.append(f"no bin is more than {1 - SLOW:.0%} below the baseline")
    if comp.unpaired_run or comp.unpaired_base:
        lines.append(f"unpaired: {len(comp.unpaired_run)} run request(s), "
                     f"{len(comp.unpaired_base)} baseline request(s) had no counterpart at their "
                     "depth")
    return lines


# -- JSON -------------------------------------------------------------------------------------

def _row_json(row: RequestRow) -> dict[str, Any]:
    r = row.request
    return {"index": row.index, "line": r.line, "boot": r.boot, "slot": r.slot, "task": r.task,
            "depth_start": row.depth_start, "depth_end": row.depth_end,
            "depth_derived": row.depth_derived, "cached": r.cached,
            "prompt_tokens": r.prompt_tokens, "prompt_ms": r.prompt_ms,
            "prompt_tps": r.prompt_tps, "decode_tokens": r.decode_tokens,
            "decode_ms": r.decode_ms, "decode_tps": row.decode_tps,
            "ms_per_token": row.ms_per_token, "truncated": r.truncated,
            "graphs_reused": row.graphs_delta, "kv_stream_lines": len(r.notes)}


def state_json(state: PartitionState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {"active_pages": state.active_pages, "evaluations": state.evaluations,
            "resident_pages": state.resident, "ring_slots": state.ring,
            "below_active": state.below, "samples": state.samples, "misses": state.misses,
            "starved_evaluations": state.starved, "copy_busy_max_pct": state.busy_max,
            "ring_peak_max": state.peak_max,
            "repartitions": len(state.of("repartition")),
            "fallbacks": len(state.of("fallback")), "fits_false": len(state.of("fits-false")),
            "feedback_errors": len(state.of("feedback")),
            "graphs_reused_per_token": state.graphs_per_token,
            "lines": [n.line for n in state.notes][:50],
            "carried_from": state.carried.line if state.carried is not None else None}


def run_json(run: PerfRun, table: Sequence[RequestRow], bins: Sequence[DepthBin],
             states: Sequence[PartitionState]) -> dict[str, Any]:
    return {
        "name": run.name, "source": run.source, "kind": run.kind, "lines": run.lines,
        "unfinished": run.unfinished, "boots": len(run.boots),
        "problems": [p.message for p in run.problems],
        "requests": [_row_json(r) for r in table],
        "bins": [{"lo": b.lo, "hi": b.hi, "requests": len(b.requests),
                  "decode_tokens": b.decode_tokens, "decode_ms": b.decode_ms,
                  "decode_tps": b.decode_tps, "partition": state_json(s)}
                 for b, s in zip(bins, states, strict=True)],
    }


def comparison_json(comp: Comparison) -> dict[str, Any]:
    first = comp.first
    worst = comp.worst
    return {
        "bin_tokens": comp.width,
        "pairs": len(comp.pairs), "uncapped_pairs": len(comp.uncapped),
        "mean_run_tps": comp.mean_run, "mean_base_tps": comp.mean_base,
        "mean_cost": comp.cost,
        "turn1": None if first is None else {
            "run_tps": first.run.decode_tps, "base_tps": first.base.decode_tps,
            "ratio": first.ratio, "parity": comp.parity, "depth": first.run.depth_start},
        "worst_bin": None if worst is None else {"lo": worst.lo, "hi": worst.hi,
                                                  "ratio": worst.ratio},
        "bins": [{"lo": b.lo, "hi": b.hi,
                  "run_tps": b.run.decode_tps if b.run else None,
                  "base_tps": b.base.decode_tps if b.base else None, "ratio": b.ratio,
                  "slow": b.slow, "partition": state_json(b.state),
                  "causes": ([{"name": c.name, "evidence": list(c.evidence)} for c in b.causes]
                             or ([{"name": NOT_EXPLAINED, "evidence": []}] if b.slow else []))}
                 for b in comp.bins],
        "unpaired_run": [r.index for r in comp.unpaired_run],
        "unpaired_base": [r.index for r in comp.unpaired_base],
    }


# -- prediction -------------------------------------------------------------------------------

def prediction_table(name: str, predicted: Sequence[Any], calibrated: bool) -> Table:
    """The model beside the measurement, per request (``Predicted`` records)."""
    t = Table(title=f"{name}: the model beside the measurement", title_justify="left")
    for col in ("#", "depth", "measured tok/s", "predicted tok/s", "gap", "modelled attention",
                "resident/layer vs active", "ring", "misses"):
        t.add_column(col, justify="right", no_wrap=True)
    for p in predicted:
        m = p.model
        res = (f"{m.resident_pages[0]}" if m.resident_pages[0] == m.resident_pages[1]
               else f"{m.resident_pages[0]}–{m.resident_pages[1]}")
        if p.row.capped or m.rejected or not m.decode_steps:
            t.add_row(str(p.row.index + 1), _depth(p.row), _f(p.row.decode_tps),
                      "capped" if p.row.capped else "not modelled", "", "", "", "", "")
            continue
        t.add_row(str(p.row.index + 1), _depth(p.row), _f(p.row.decode_tps),
                  _f(p.predicted_tps) if calibrated else "–",
                  (_pct(p.gap) + (" !" if p.disagrees else "")) if p.gap is not None else "–",
                  f"{p.attention_ms:.2f} ms", f"{res} vs {m.active_pages[1]}",
                  f"{m.ring_slots[0]}" if m.ring_slots[0] == m.ring_slots[1]
                  else f"{m.ring_slots[0]}–{m.ring_slots[1]}",
                  f"{m.misses}/{m.samples}" if m.samples else "0")
    return t


def prediction_lines(pred: Any) -> list[str]:
    """Where the model stands and, for each request it disagrees with by more than 15 %, what
    would have to change (``kvdiag.judged.perf.Prediction``)."""
    cfg = pred.config
    pool = pred.pool
    lines = [f"GPU: {pred.profile_why}",
             f"profile {pred.profile.name}: {pred.profile.hbm_read_gbps:g} GB/s device read, "
             f"{pred.profile.h2d_gbps:g} GB/s host→device, {pred.profile.zero_copy_read_gbps:g} "
             f"GB/s zero-copy ({pred.profile.source})",
             f"model: {cfg.n_streamed} of {cfg.layers} layers streamed, ctx {cfg.ctx}, "
             f"{cfg.type_k}/{cfg.type_v}, stage {cfg.stage_mib} MiB = {pool['pool_pages']} pages "
             f"of {pool['page_bytes']} B: {pool['resident_pages_per_layer']} resident "
             f"pages/layer + {pool['ring_slots']} ring slots at boot, adaptive controller on"]
    if pred.calibration is None:
        lines.append("no baseline: the time per token that is not attention is unknown, so "
                     "only the modelled attention is shown (give --baseline to predict tok/s)")
        return lines
    lines.append(f"calibration: the baseline's time per token that is not attention at "
                 f"{len(pred.calibration.points)} depths (measured ms/token minus the modelled "
                 "resident attention)")
    off = [p for p in pred.predicted if p.disagrees]
    if not off:
        lines.append("the model is within 15 % of every measured request")
    for p in off:
        lines.append(f"request {p.row.index + 1} at depth {_depth(p.row)}: measured "
                     f"{_f(p.row.decode_tps)} tok/s, predicted {_f(p.predicted_tps)} "
                     f"({_pct(p.gap)}); what would have to change:")
        lines += [f"  - {m}" for m in p.mechanisms]
    return lines


def prediction_json(pred: Any) -> dict[str, Any]:
    return {
        "profile": {"name": pred.profile.name, "why": pred.profile_why,
                    "source": pred.profile.source},
        "config": {"layers": pred.config.layers, "streamed_layers": pred.config.n_streamed,
                   "ctx": pred.config.ctx, "type_k": pred.config.type_k,
                   "type_v": pred.config.type_v, "stage_mib": pred.config.stage_mib,
                   **pred.pool},
        "calibrated": pred.calibration is not None,
        "requests": [{"index": p.row.index, "depth_start": p.row.depth_start,
                      "measured_tps": p.row.decode_tps, "predicted_tps": p.predicted_tps,
                      "gap": p.gap, "disagrees": p.disagrees,
                      "attention_ms": p.attention_ms, "other_ms": p.other_ms,
                      "resident_pages": p.model.resident_pages,
                      "active_pages": p.model.active_pages, "ring_slots": p.model.ring_slots,
                      "samples": p.model.samples, "misses": p.model.misses,
                      "repartitions": p.model.repartitions,
                      "mechanisms": list(p.mechanisms)} for p in pred.predicted],
    }
