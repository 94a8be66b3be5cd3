"""A trace file judged: read it (tolerantly, a segment set as one), feed the one judgement
(:mod:`kvdiag.analysis.judgement`) in chunks, and keep what the reader found wrong beside it.

``check`` (kvdiag/commands/check.py), ``import``'s summary and ``sql`` render this result; the
verdicts, findings and counts are the judgement's, not this module's.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvdiag.analysis.judgement import Judgement, trace_judge
from kvdiag.model.events import Header
from kvdiag.model.findings import Finding
from kvdiag.trace.problems import Problem
from kvdiag.trace.reader import TraceReader


@dataclass(frozen=True)
class CheckResult:
    header: Header
    findings: list[Finding]
    summary: dict[str, Any]
    problems: list[Problem]
    judgement: Judgement


def analyse_file(path: str | Path) -> CheckResult:
    # The cyclic collector is paused while the trace is judged: decoded events and the
    # judgement's arrays hold no reference cycles, and a chunk of events kept alive while it is
    # judged would otherwise be walked by the collector again and again (measured: a sixth of
    # check's time on a 1M-event model trace). Nothing is leaked: it runs again afterwards.
    paused = gc.isenabled()
    gc.disable()
    try:
        with TraceReader.open(path) as reader:
            # the name goes into the command that lists every judged page
            name = "FILE" if str(path) == "-" else str(path)
            judgement = trace_judge(reader, name=name).feed_all(reader).snapshot()
            problems = list(reader.problems)
            header = reader.header
            segments = reader.segments
    finally:
        if paused:
            gc.enable()
    summary = judgement.summary()
    if segments is not None:  # a rotated trace read as one set (kvdiag/trace/segments.py)
        summary["segments"] = {"text": segments.text(), "indices": list(segments.indices),
                               "dropped_before": segments.dropped_before}
    summary["problems"] = [
        {"line": p.line, "kind": p.kind, "message": p.message} for p in problems
    ]
    return CheckResult(header, list(judgement.findings), summary, problems, judgement)
