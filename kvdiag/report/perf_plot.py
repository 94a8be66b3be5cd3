"""``kvdiag perf --plot``: decode tok/s against depth for each run, and below it, on the same
depth axis, the kv-stream partition the runs recorded (resident pages per layer against the
active pages, ring slots) and the deadline miss ratio; repartitions and fallbacks as marks."""

from __future__ import annotations

from collections.abc import Sequence

from kvdiag.analysis.perf import depth_bins, rows
from kvdiag.files.outputs import Output, open_output
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.model.perf import PerfRun
from kvdiag.report.sweep import plot_format


def save_plot(runs: Sequence[PerfRun], out: Output, width: int,
              baseline: str | None = None,
              predicted: Sequence[tuple[str, list[float], list[float], list[float]]] = ()
              ) -> None:
    """Write the figure (``.svg`` or ``.png``) as every output is written
    (:mod:`kvdiag.files.outputs`: a regular file replaced whole, never a link's target, a FIFO
    or a device); ``predicted`` adds the model's curves: (label, depths, tok/s, resident
    pages per layer)."""
    fmt = plot_format(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for run in runs:
        table = rows(run)
        pts = [(r.depth_mid, r.decode_tps) for r in table
               if r.depth_mid is not None and r.decode_tps is not None]
        label = run.name + (" (baseline)" if run.name == baseline else "")
        style = "--" if run.name == baseline else "-"
        bins = depth_bins(table, width)
        line = top.plot([(b.lo + b.hi) / 2 for b in bins], [b.decode_tps for b in bins],
                        style, label=label)[0]
        top.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color=line.get_color(),
                    alpha=0.6)
        pages = [p for p in run.adapt if p.boot == 0]
        if pages:
            depth = [p.page * PAGE_TOKENS for p in pages]
            bottom.plot(depth, [p.resident_min for p in pages], color=line.get_color(),
                        label=f"{run.name}: resident pages/layer")
            bottom.plot(depth, [p.ring_min for p in pages], ":", color=line.get_color(),
                        label=f"{run.name}: ring slots")
            miss = [(p.page * PAGE_TOKENS, 100.0 * p.misses / p.samples) for p in pages
                    if p.samples]
            if miss:
                twin = bottom.twinx()
                twin.plot([m[0] for m in miss], [m[1] for m in miss], ".",
                          color=line.get_color(), alpha=0.5)
                twin.set_ylabel("deadline miss %")
        for n in run.notes:
            if n.depth is not None and n.kind in ("repartition", "fallback", "fits-false"):
                bottom.axvline(n.depth, color=line.get_color(), alpha=0.25, lw=0.8)
    for label, depths, tps, resident in predicted:
        top.plot(depths, tps, "-.", label=label)
        bottom.plot(depths, resident, "-.", label=f"{label}: resident pages/layer")
    deepest = max((r.depth_end or 0 for run in runs for r in run.requests), default=0)
    if deepest:
        xs = [0, deepest]
        bottom.plot(xs, [0, deepest / PAGE_TOKENS], color="grey", lw=0.8,
                    label="active pages (depth / 256)")
    top.set_ylabel("decode tok/s")
    top.set_title("decode rate against context depth (dots: requests, lines: depth bins)")
    top.grid(alpha=0.3)
    if top.get_legend_handles_labels()[0]:  # a run without requests draws nothing to name
        top.legend(fontsize=8)
    bottom.set_xlabel("context depth (tokens)")
    bottom.set_ylabel("pages")
    bottom.set_title("kv-stream partition recorded (kv_stream_adapt); marks: repartitions, "
                     "fallbacks", fontsize=9)
    bottom.grid(alpha=0.3)
    if bottom.get_legend_handles_labels()[0]:  # nor without a partition or a depth
        bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    try:
        with open_output(out) as sink:
            fig.savefig(sink.file, format=fmt)
    finally:
        plt.close(fig)
