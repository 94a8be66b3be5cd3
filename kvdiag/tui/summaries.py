"""The Overview's content and every screen's status line (rich only; no textual import).

Reuses the renderables of ``kvdiag check`` and ``kvdiag postmortem`` (kvdiag/report/) so the
viewer and the headless reports say the same things in the same words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvdiag.analysis.judgement import Completeness
from kvdiag.analysis.judgement.gaps import lost_text, recorded_text
from kvdiag.model.findings import Finding, Severity
from kvdiag.report.check import header_table, residency_table, steps_text, verdict
from kvdiag.report.findings import SEVERITY_STYLE
from kvdiag.report.postmortem import binary_line, boot_for, config_table
from kvdiag.tui.document import Document, ErrorDoc, LogDoc, PendingDoc, TraceDoc


def status_text(doc: Document, index: int, total: int, width: int | None = None) -> str:
    """What the status line says about ``doc``; within ``width`` characters when given: the
    counts stay, the file hint shortens to ``i/n`` and the file name loses its middle (the
    Overview shows it whole)."""
    facts = _status_facts(doc)
    long = f"{doc.name}{f' ({index + 1}/{total}, o: other file)' if total > 1 else ''}"
    text = " · ".join([long, *facts])
    if width is None or len(text) <= width:
        return text
    where = f" {index + 1}/{total}" if total > 1 else ""
    rest = " · ".join(["", *facts]) if facts else ""
    room = max(8, width - len(where) - len(rest))
    return f"{middle_cut(doc.name, room)}{where}{rest}"


QUIET_SAY_S = 5.0
"""A followed file quiet this long: the marker says for how long (its writer may be gone
without a word: only an End, an abort or a crash says so)."""


def live_marker(doc: Document, paused: bool, now: float) -> tuple[str, str]:
    """The marker of a followed file (``kvdiag tui --follow``) and its state — ``live``,
    ``paused`` or ``ended`` (the stylesheet colours the status line by it)."""
    live = doc.live if isinstance(doc, TraceDoc | LogDoc) else None
    if paused:
        return "⏸ PAUSED (s: resume)", "paused"
    if live is not None and live.ended:
        return f"■ ENDED: {live.ended}", "ended"
    text = "● LIVE"
    if live is None:
        return text + (" · waiting" if isinstance(doc, PendingDoc) else ""), "live"
    quiet = now - live.grown_at
    if quiet >= QUIET_SAY_S:
        text += f" · quiet {_duration(quiet)}"
    if live.files > 1:
        text += f" · file {live.files} under this name"
    return text, "live"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def _status_facts(doc: Document) -> list[str]:
    if isinstance(doc, PendingDoc):
        return [doc.message]
    if isinstance(doc, ErrorDoc):
        return ["error"]
    if isinstance(doc, LogDoc):
        return ["log", f"{doc.index.n:,} lines", f"{len(doc.scan.crashes)} crash(es)",
                f"{len(doc.findings)} finding(s)"]
    return ["trace", *trace_facts(doc)]


def trace_facts(doc: TraceDoc) -> list[str]:
    """Events, steps and findings of a trace: the judgement's counts and steps rule, of the
    judged prefix while the judgement runs."""
    d = doc.digest
    judged = f"judged {_judged(doc):.0%}"
    if doc.stage == "indexing":
        return [f"indexing {doc.progress:.0%} ({doc.index.n:,} events so far)", judged]
    if d is None or not d.done:
        so_far = "" if d is None else f" ({len(d.findings)} finding(s) so far)"
        return [f"{doc.index.n:,} events", f"judging {_judged(doc):.0%}{so_far}"]
    j = d.judgement
    events = sum(j.counts.values())
    return [f"{events:,} events, {j.steps.count:,} steps", f"{len(d.findings)} finding(s)"]


def _judged(doc: TraceDoc) -> float:
    d = doc.digest
    return 0.0 if d is None else d.position / max(doc.source.size, 1)


def middle_cut(text: str, width: int) -> str:
    """``text`` in ``width`` characters, its middle replaced by ``…`` when it is longer (the
    start and the end of a file name or a path say the most)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return f"{text[:head]}…{text[len(text) - (width - 1 - head):]}"


def unavailable(doc: Document) -> str | None:
    """Why a screen has nothing of this file to show yet (None: it has)."""
    if isinstance(doc, PendingDoc):
        return f"{doc.message} — this screen fills in as soon as the file has been read"
    if isinstance(doc, ErrorDoc):
        return "nothing to show: this file could not be read (1: Overview says why)"
    return None


def severity_counts(findings: Sequence[Finding]) -> Text:
    counts = Counter(f.severity for f in findings)
    text = Text()
    for sev in sorted(Severity, reverse=True):
        if text:
            text.append("  ·  ")
        text.append(f"{sev.label} {counts.get(sev, 0)}",
                    style=SEVERITY_STYLE[sev] if counts.get(sev) else "dim")
    return text


def findings_list(findings: Sequence[Finding], limit: int = 12) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, expand=True)
    table.add_column("severity", no_wrap=True, width=9)
    table.add_column("rule", no_wrap=True, width=32)
    table.add_column("title", ratio=1, overflow="fold")  # a long assert text wraps, uncut
    for f in sorted(findings, key=lambda f: -int(f.severity))[:limit]:
        table.add_row(Text(f.severity.label, style=SEVERITY_STYLE[f.severity]), f.rule, f.title)
    if len(findings) > limit:
        table.add_row("", "", Text(f"… and {len(findings) - limit} more (7: Findings)",
                                   style="dim"))
    return table


def _counts_line(counts: dict[str, int]) -> Text:
    return Text("  ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))


def _section(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


def overview(doc: Document) -> RenderableType:
    if isinstance(doc, PendingDoc):
        return Text(f"{doc.path}: {doc.message}", style="dim")
    if isinstance(doc, ErrorDoc):
        return Group(Text("This file cannot be shown", style="bold red"),
                     Text(doc.message, style="red"),
                     Text("\nkvdiag tui reads kvtrace files (kvdiag capture) and llama-server "
                          "logs (plain or gzip). Other files given on the command line are "
                          "still available: press o.", style="dim"))
    if isinstance(doc, LogDoc):
        return _log_overview(doc)
    return _trace_overview(doc)


def _trace_overview(doc: TraceDoc) -> RenderableType:
    parts: list[RenderableType] = []
    d = doc.digest
    if doc.judge_error is not None:
        parts.append(Text(f"the judgement stopped: {doc.judge_error} — what is shown is the "
                          f"judgement of the first {d.rows if d else 0:,} events only",
                          style="bold red"))
    parts += [Text(note, style="yellow") for note in doc.notes]
    if d is not None and d.done:
        parts.append(verdict(list(d.findings)))
    else:
        what = "indexing" if doc.stage == "indexing" else "judging"
        parts.append(Text(f"{what} … judged {_judged(doc):.0%} (the findings below are of the "
                          "events judged so far)", style="yellow"))
    parts.append(header_table(doc.path, doc.header))
    dev = doc.header.device
    extras = [x for x in (f"{dev.memory_bytes / (1 << 30):.0f} GiB" if dev.memory_bytes else None,
                          dev.driver and f"driver {dev.driver}", dev.pcie,
                          dev.compute_capability and f"sm {dev.compute_capability}") if x]
    parts.append(Text(f"device: {dev.name}" + (f" ({', '.join(extras)})" if extras else "") +
                      f" · created {doc.header.created} · kvdiag {doc.header.kvdiag_version}",
                      style="dim"))
    if d is None:
        parts.append(_section("Events by kind (indexed so far)"))
        parts.append(_counts_line(doc.index.kind_counts()))
        return Group(*parts)
    j = d.judgement
    parts.append(_section("Events by kind" + ("" if d.done else " (judged so far)")))
    parts.append(_counts_line(j.counts))
    parts.append(Text(f"{steps_text(j.summary())} · capture status: {j.status}",
                      style="dim" if j.status == "completed" else "yellow"))
    parts.append(_section("Recorded"))
    parts += recorded_lines(j.completeness, j.lost)
    lost = lost_text(j.lost)
    if lost:  # events missing between those the trace holds (the judgement's gaps in seq)
        parts.append(Text(lost, style="yellow"))
    parts.append(_section("Findings"))
    parts.append(severity_counts(d.findings))
    parts.append(findings_list(d.findings))
    parts.append(residency_table(d.summary))
    if d.problems:
        parts.append(_section("Problems in the file"))
        for p in d.problems[:20]:
            parts.append(Text(f"line {p.line}: {p.kind}: {p.message}", style="yellow"))
        if d.problems_total > 20:
            parts.append(Text(f"… and {d.problems_total - 20:,} more", style="yellow"))
    return Group(*parts)


def recorded_lines(c: Completeness, lost: dict[str, Any] | None = None) -> list[Text]:
    """What the trace records and, for each judged kind it lacks, what cannot be judged;
    qualified when events are lost (the judgement's ``lost_events``)."""
    how = ("as its writer declares" if c.source == "declared" else
           "inferred from what the trace contains; its writer does not declare it")
    missing = c.missing
    head = recorded_text([k.kind for k in missing], lost, verb=" is recorded", how=how)
    out = [Text(head, style="yellow" if missing or (lost or {}).get("events") else "dim")]
    for k in missing:
        out.append(Text(f"  {k.kind} not recorded — {k.hides}", style="yellow"))
    return out


def _log_overview(doc: LogDoc) -> RenderableType:
    scan = doc.scan
    parts: list[RenderableType] = [verdict(list(doc.findings))]
    parts += [Text(note, style="yellow") for note in doc.notes]
    groups = {c.fingerprint for c in scan.crashes}
    parts.append(Text(f"{doc.path}: server log, {scan.lines:,} lines, {len(scan.crashes)} "
                      f"crash(es) in {len(groups)} group(s), {len(scan.boots)} boot(s)",
                      style="bold"))
    last = scan.crashes[-1] if scan.crashes else None
    boot = boot_for(scan, last)
    if boot is not None:
        parts.append(config_table(boot))
    else:
        parts.append(Text("no boot configuration lines in this log", style="dim"))
    if scan.crashes:
        parts.append(_section("Crashes (5: Backtrace)"))
        for c in scan.crashes[:10]:
            what = (c.abort.condition or c.abort.message) if c.abort else (
                c.error.message if c.error else (c.signal.signal if c.signal else ""))
            parts.append(Text(f"line {c.where.line}: {c.kind}: {what}  [{c.fingerprint}]",
                              style="red"))
    for b in scan.binaries:
        parts.append(Text(binary_line(b), style="yellow" if b.checked_by == "unchecked"
                          else "dim"))
    parts.append(_section("Findings"))
    parts.append(severity_counts(doc.findings))
    parts.append(findings_list(doc.findings))
    parts.append(_section("Lines by kind"))
    parts.append(_counts_line(doc.index.kind_counts()))
    if scan.problems:
        parts.append(_section("Problems in the input"))
        for p in scan.problems[:20]:
            loc = f"{p.source}:{p.line}" if p.line is not None else p.source
            parts.append(Text(f"{loc}: {p.message}", style="yellow"))
        if len(scan.problems) > 20:
            parts.append(Text(f"… and {len(scan.problems) - 20} more", style="yellow"))
    return Group(*parts)
