"""A sweep as a table, a terminal plot (plotext) and an image (matplotlib, SVG or PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from kvdiag.analysis.sweep import Summary, SweepPoint
from kvdiag.errors import UsageError
from kvdiag.files.outputs import Output, open_output


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.2f}"


def sweep_table(points: list[SweepPoint], summaries: list[Summary], title: str) -> Table:
    marks: dict[tuple[int, int], list[str]] = {}
    for s in summaries:
        if s.best:
            marks.setdefault((s.np, s.best.stage_mib), []).append("best")
        if s.enough:
            marks.setdefault((s.np, s.enough.stage_mib), []).append("≥90%")
        if s.cliff:
            marks.setdefault((s.np, s.cliff[0].stage_mib), []).append("cliff below")
    t = Table(title=title)
    rate = _rate_label(points)
    for col in ("np", "stage MiB", "pool pages", "resident/layer", "ring", "resident share",
                "miss ratio", "MiB/token", "repartitions", rate, ""):
        t.add_column(col, justify="left" if col in ("", ) else "right", no_wrap=True)
    for p in points:
        if p.status == "refused":
            t.add_row(str(p.np), str(p.stage_mib), "", "", "", "", "", "", "", "", "refused")
            continue
        partition = (f"{p.resident_start}→{p.resident_end}" if p.resident_end != p.resident_start
                     else str(p.resident_start))
        ring = f"{p.ring_start}→{p.ring_end}" if p.ring_end != p.ring_start else str(p.ring_start)
        tps = p.tokens_per_s
        t.add_row(str(p.np), str(p.stage_mib), str(p.pool_pages), partition, ring,
                  _pct(p.resident_share), _pct(p.miss_ratio), _mib(p.bytes_per_token),
                  str(p.repartitions), "n/a" if tps is None else f"{tps:,.0f}",
                  ", ".join(marks.get((p.np, p.stage_mib), [])
                            + ([] if p.status == "completed" else [p.status])))
    return t


def _rate_label(points: list[SweepPoint]) -> str:
    """What the rate column is: modelled attention time, or the device's measured steps."""
    measured = any(p.feedback == "measured" for p in points)
    return "tok/s (measured steps)" if measured else "tok/s (modelled attn)"


def summary_lines(points: list[SweepPoint], summaries: list[Summary]) -> list[str]:
    lines = [f"np {p.np}, {p.stage_mib} MiB {p.status}: {p.error}" for p in points
             if p.error]
    for s in summaries:
        if s.best is None:
            lines.append(f"np {s.np}: no point decoded; nothing to compare")
            continue
        line = (f"np {s.np}: best {s.best.tokens_per_s:,.0f} tok/s at {s.best.stage_mib} MiB; "
                f"{s.enough.stage_mib if s.enough else '?'} MiB is the smallest stage keeping "
                "≥ 90% of it")
        if s.cliff:
            small, large = s.cliff
            line += (f"; cliff between {small.stage_mib} and {large.stage_mib} MiB "
                     f"({large.tokens_per_s:,.0f} → {small.tokens_per_s:,.0f} tok/s)")
        lines.append(line)
    return lines


def terminal_plot(points: list[SweepPoint], width: int = 100, height: int = 20,
                  color: bool = True) -> str:
    """tokens/s against stage MiB, one line per np, as text."""
    import plotext as plt

    plt.clear_figure()
    if not color:
        plt.clear_color()
    plt.plotsize(width, height)
    for np_ in sorted({p.np for p in points}):
        pts = [p for p in points if p.np == np_ and p.tokens_per_s]
        if pts:
            plt.plot([p.stage_mib for p in pts], [p.tokens_per_s or 0.0 for p in pts],
                     label=f"np {np_}", marker="braille")
    plt.title(f"{_rate_label(points)} vs stage MiB")
    plt.xlabel("stage MiB")
    if color:
        plt.theme("clear")
    out: str = plt.build()
    return out if color else Text.from_ansi(out).plain


def plot_format(out: Output) -> str:
    """``svg`` or ``png`` from the --plot file's name (``/dev/null`` takes either), checked
    with matplotlib's presence before a sweep runs."""
    suffix = Path(out.given).suffix.lower()
    if out.kind == "null":
        suffix = suffix or ".svg"
    if suffix not in (".svg", ".png"):
        raise UsageError(f"--plot {out.given}: write .svg or .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'kvdiag[plot]'") from None
    return suffix[1:]


def save_plot(points: list[SweepPoint], summaries: list[Summary], out: Output,
              title: str) -> None:
    """Four panels against stage MiB: tok/s, resident share, miss ratio, MiB per token;
    written as every output is (kvdiag.files.outputs)."""
    fmt = plot_format(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels: list[tuple[Any, str, Any]] = [
        (axes[0][0], _rate_label(points), lambda p: p.tokens_per_s),
        (axes[0][1], "resident share of pages read", lambda p: p.resident_share),
        (axes[1][0], "deadline miss ratio", lambda p: p.miss_ratio),
        (axes[1][1], "MiB over PCIe per token",
         lambda p: None if p.bytes_per_token is None else p.bytes_per_token / 2**20),
    ]
    for ax, label, get in panels:
        for np_ in sorted({p.np for p in points}):
            pts = [p for p in points if p.np == np_ and get(p) is not None]
            ax.plot([p.stage_mib for p in pts], [get(p) for p in pts], marker="o",
                    label=f"np {np_}")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    for s in summaries:
        if s.cliff:
            for ax in axes.flat:
                ax.axvspan(s.cliff[0].stage_mib, s.cliff[1].stage_mib, color="red", alpha=0.08)
        if s.enough:
            axes[0][0].axvline(s.enough.stage_mib, color="green", ls="--", lw=1,
                               label=f"≥90% from {s.enough.stage_mib} MiB (np {s.np})")
    axes[0][0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("stage MiB")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        with open_output(out) as sink:
            fig.savefig(sink.file, format=fmt)
    finally:
        plt.close(fig)
