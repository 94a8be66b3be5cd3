"""``kvdiag check``'s rich report: what ran, what it found, how the pages were served (rich on a
terminal, a readable width elsewhere: ``report.console``); every format is written by
:mod:`.check_formats`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvdiag.analysis.judgement.gaps import lost_text, recorded_text
from kvdiag.model.events import Header
from kvdiag.model.findings import Finding, Severity
from kvdiag.report.check_formats import steps_text, verdict_line
from kvdiag.report.findings import SEVERITY_STYLE, findings_table
from kvdiag.report.text import cap, cap_value


def verdict(findings: Sequence[Finding]) -> Text:
    """One line saying what went wrong, if anything."""
    worst = max((f.severity for f in findings), default=None)
    text = verdict_line(findings)
    if worst is None:
        return Text(text, style="bold green")
    return Text(text, style=SEVERITY_STYLE[worst])


def header_table(path: str, header: Header) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    sc = header.scenario
    cfg: dict[str, Any] = sc.get("config", {})
    t.add_row("trace", path)
    t.add_row("scenario", f"{cap_value(sc.get('name', '?'))} — "
                          f"{cap_value(sc.get('description', ''))}")
    t.add_row("executor", f"{cap(header.backend)} on {cap(header.device.name)}")
    cfg = cfg if isinstance(cfg, dict) else {}
    plan = header.plan if isinstance(header.plan, dict) else {}

    def known(*keys: str) -> Any:
        """The first of ``keys`` the config or the plan holds (a native trace's header has
        most of the shape in its plan, a model trace's in its config)."""
        for key in keys:
            for src in (cfg, plan):
                if src.get(key) is not None and src.get(key) != "":
                    return cap_value(src[key], 100)
        return None

    stage = known("stage_mib")
    if stage is None and isinstance(plan.get("stage_bytes"), int):
        stage = f"{plan['stage_bytes'] / 2**20:.3g}"
    parts = [
        f"np {known('np')}" + (" (kv unified)" if cfg.get("kv_unified") is True else "")
        if known("np") is not None else None,
        f"ctx {known('ctx', 'n_ctx')}" if known("ctx", "n_ctx") is not None else None,
        f"{known('layers')} layers" if known("layers") is not None else None,
        f"{plan['streamed_layers']} streamed" if plan.get("streamed_layers") not in (
            None, cfg.get("layers", plan.get("layers"))) else None,
        f"K {known('type_k')} / V {known('type_v')}" if known("type_k") is not None else None,
        f"stage {stage} MiB" if stage is not None else None,
        f"layout {known('layout')}" if known("layout") is not None else None,
        f"dispatch {known('dispatch')}" if known("dispatch") is not None else None,
    ]
    runtime = ", ".join(p for p in parts if p)
    if runtime:
        t.add_row("runtime", runtime)
    pages, page_bytes = known("pool_pages"), known("page_bytes")
    pool = [f"{pages} pages" if pages is not None else None,
            (f"of {page_bytes} B" if pages is not None else f"page {page_bytes} B")
            if page_bytes is not None else None]
    split = [_resident_text(cfg, plan) if known("resident_pages_per_layer") is not None
             else None,
             f"{known('ring_slots')} ring slots" if known("ring_slots") is not None else None]
    if any(pool + split):
        head = " ".join(p for p in pool if p)
        tail = " + ".join(p for p in split if p)
        t.add_row("pool", (f"{head}: {tail}" if head and tail else head or tail)
                  + _pool_mismatch(cfg, plan))
    return t


def _int(cfg: dict[str, Any], plan: dict[str, Any], key: str) -> int | None:
    for src in (plan, cfg):
        value = src.get(key)
        if type(value) is int:
            return value
    return None


def _resident_text(cfg: dict[str, Any], plan: dict[str, Any]) -> str:
    """``resident_pages_per_layer`` is the pool slots one streamed layer owns, every stream's
    together (the constructor's step 4, brief §1.4); the per-stream layout splits them evenly,
    so each (layer, stream) view has a window of that / n_stream pages (brief §1.5;
    kvdiag/kvstream/resident.py ``window``; docs/trace-format.md, "Header")."""
    value = plan.get("resident_pages_per_layer", cfg.get("resident_pages_per_layer"))
    text = f"{cap_value(value, 100)} resident/layer"
    per, n_stream = _int(cfg, plan, "resident_pages_per_layer"), _int(cfg, plan, "n_stream")
    layout = cfg.get("layout", plan.get("layout"))
    if layout == "per-stream" and per is not None and n_stream is not None and n_stream > 1:
        text += f" ({per // n_stream} per stream)"
    return text


def _pool_mismatch(cfg: dict[str, Any], plan: dict[str, Any]) -> str:
    """Says when the plan's pool numbers do not add up: pool_pages = streamed layers ×
    resident_pages_per_layer + ring_slots (brief §1.4, step 5), e.g. a writer that gave the
    per-stream window as resident_pages_per_layer."""
    pool, per = _int(cfg, plan, "pool_pages"), _int(cfg, plan, "resident_pages_per_layer")
    ring = _int(cfg, plan, "ring_slots")
    layers = _int(cfg, plan, "streamed_layers") or _int(cfg, plan, "layers")
    if pool is None or per is None or ring is None or layers is None or \
            layers * per + ring == pool:
        return ""
    return (f" (does not add up: {layers} layers × {per} + {ring} = {layers * per + ring} ≠ "
            f"{pool} pool pages; resident_pages_per_layer counts the slots of all streams of a "
            "layer)")


def _classes(c: dict[str, int]) -> str:
    text = f"exact {c['exact']}, stale {c['stale']}, foreign {c['foreign']}"
    return text + (f", not judged {c['not_judged']}" if c.get("not_judged") else "")


def residency_table(summary: dict[str, Any]) -> Table:
    r = summary["residency"]
    t = Table(title="Residency", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    pr, rc = r["pages_read"], r["read_classes"]
    up, ub = r["upload_pages"], r["upload_bytes"]
    rate = r["resident_hit_rate"]
    t.add_row("pages read", f"pool {pr['pool']}, ring {pr['ring']}, host (zero-copy) {pr['host']}")
    t.add_row("read classes (pages)", (
        _classes(rc) + f"; resident hits {r['resident_hits']}"
        + (f" ({rate:.0%})" if rate is not None else "")))
    by = r.get("read_classes_by_source", {})
    if by.get("ring") and any(by["ring"].values()):
        t.add_row("by source (pages)", "; ".join(
            f"{src} {_classes(c)}" for src, c in by.items() if any(c.values())))
    if r.get("not_judged"):
        t.add_row("not judged (pages)", ", ".join(f"{k} {v}" for k, v in r["not_judged"].items()))
    reads = r.get("reads")
    if reads:
        cross = r.get("cross_check", {})
        t.add_row("reads", (
            f"judged from served pages {reads['judged']}, without served pages "
            f"{reads['without_served']}"
            + (f"; the model's annotation disagrees in {cross['annotation_disagrees']}"
               if cross.get("annotation_disagrees") else "")
            + (f"; {r['out_of_range']} event(s) with impossible pages or slots ignored"
               if r.get("out_of_range") else "")))
    unknown = r.get("upload_bytes_unknown", {})
    t.add_row("uploads", ", ".join(
        f"{tgt} {up.get(tgt, 0)} pages ({ub.get(tgt, 0) / 2**20:.1f} MiB"
        + (f"; bytes unknown in {unknown[tgt]} upload(s)" if unknown.get(tgt) else "") + ")"
        for tgt in ("resident", "ring")))
    if r["upload_reasons"]:
        t.add_row("upload reasons", ", ".join(f"{k} {v}" for k, v in sorted(r["upload_reasons"].items())))
    t.add_row("evictions", str(r["evictions"]) + (
        f", invalidations {r['invalidations']}" if r.get("invalidations") else ""))
    t.add_row("FA routes", ", ".join(f"{k} {v}" for k, v in sorted(r["routes"].items())) or "none")
    comp = summary.get("completeness")
    if comp:
        missing = [k for k, v in comp["kinds"].items() if not v["recorded"]]
        t.add_row(f"recorded ({comp['source']})",
                  recorded_text(missing, summary.get("lost_events")))
    return t


def check_report(
    path: str, header: Header, findings: Sequence[Finding], summary: dict[str, Any]
) -> list[RenderableType]:
    parts: list[RenderableType] = [header_table(path, header), Text()]
    if summary.get("segments"):
        parts.append(Text(cap(summary["segments"]["text"]), style="dim"))
    counts = ", ".join(f"{cap(k, 100)} {v}" for k, v in sorted(summary["counts"].items()))
    parts.append(Text(f"{summary['events']} events over {steps_text(summary)} "
                      f"[{summary['status']}]: {counts}", style="dim"))
    for p in summary.get("problems", []):
        parts.append(Text(f"trace problem at line {p['line']}: {cap(p['message'])}",
                          style="yellow"))
    lost = lost_text(summary.get("lost_events"))
    if lost:
        parts.append(Text(lost, style="yellow"))
    parts.append(residency_table(summary))
    if findings:  # without findings the verdict alone says so (once)
        parts.append(findings_table(findings))
    parts.append(verdict(findings))
    return parts


__all__ = ["Severity", "check_report", "lost_text", "steps_text", "verdict", "verdict_line"]
