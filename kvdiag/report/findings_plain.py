"""Findings as plain text and JSON-ready dicts, without rich: what ``--format json`` and the CI
formats need, so that they do not import the terminal renderer (:mod:`.findings`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from kvdiag.model.findings import Evidence, Finding
from kvdiag.report.text import cap


def evidence_text(ev: Evidence) -> str:
    """A short human form: ``#123 step 4 layer 2 stream 1 page 0`` or ``log:12``."""
    parts: list[str] = []
    if ev.seq is not None:
        parts.append(f"#{ev.seq}")
    if ev.source is not None:
        parts.append(f"{ev.source}:{ev.line}" if ev.line is not None else ev.source)
    elif ev.line is not None:
        parts.append(f"line {ev.line}")
    for name in ("step", "layer", "stream", "page"):
        value = getattr(ev, name)
        if value is not None:
            parts.append(f"{name} {value}")
    text = " ".join(parts)
    if ev.text:
        shown = cap(ev.text)
        text = f"{text}: {shown}" if text else shown
    return text


def finding_to_json(f: Finding) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(f)
    out["severity"] = f.severity.label
    return out


def findings_to_json(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [finding_to_json(f) for f in findings]
