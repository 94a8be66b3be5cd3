"""Where a jump goes: a screen and a position in it (pure data; no textual import)."""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.model.findings import Evidence

SCREENS: tuple[str, ...] = ("overview", "timeline", "fits", "pages", "backtrace", "telemetry",
                            "findings", "perf")
TITLES = {"overview": "Overview", "timeline": "Timeline", "fits": "Fits", "pages": "Pages",
          "backtrace": "Backtrace", "telemetry": "Telemetry", "findings": "Findings",
          "perf": "Perf"}


@dataclass(frozen=True)
class Target:
    """A screen of one document, and what to select there (any field may be None)."""

    screen: str
    doc: int
    row: int | None = None
    """Timeline/Fits: an index row (trace) or a line row (log, line - 1)."""
    step: int | None = None
    layer: int | None = None
    stream: int | None = None
    page: int | None = None
    crash: int | None = None
    """Backtrace: index into the log's crashes (or the trace's aborts)."""
    finding: int | None = None


def evidence_target(doc: int, kind: str | None, row: int | None, evidence: Evidence,
                    crash: int | None = None) -> Target:
    """The best screen for one piece of evidence.

    ``kind`` is the event kind at ``row`` (trace evidence cites an event by ``seq``); log
    evidence cites a line, which the Backtrace shows when it belongs to a crash (``crash``).
    """
    if crash is not None:
        return Target("backtrace", doc, row=row, crash=crash)
    if kind == "fits":
        return Target("fits", doc, row=row, step=evidence.step, layer=evidence.layer)
    if kind == "abort":
        return Target("backtrace", doc, row=row, step=evidence.step)
    if kind in ("read", "write", "upload", "evict", "mark") or evidence.page is not None:
        return Target("pages", doc, row=row, step=evidence.step, layer=evidence.layer,
                      stream=evidence.stream, page=evidence.page)
    return Target("timeline", doc, row=row, step=evidence.step)
