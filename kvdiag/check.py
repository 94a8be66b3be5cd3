"""``kvdiag check``: read a trace (tolerantly), run the trace rules, report, pick the exit code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from kvdiag.analysis.trace_rules import FitsEvaluator, TraceAnalyzer
from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, UsageError
from kvdiag.model.events import Fits, Header
from kvdiag.model.findings import Finding, Severity
from kvdiag.trace.problems import Problem
from kvdiag.trace.reader import TraceReader


@dataclass(frozen=True)
class CheckResult:
    header: Header
    findings: list[Finding]
    summary: dict[str, Any]
    problems: list[Problem]


def fits_evaluator(header: Header) -> FitsEvaluator:
    """The model's predicate (kvdiag.kvstream.fits) over a ``fits`` event's logged geometry,
    for writers that recorded only the bool (``evaluated: false``, format 1.1). It lives here,
    not in analysis, because analysis does not import kvstream (design.md, "Components").
    ``native_quants`` (GGML_CUDA_FA_ALL_QUANTS) comes from the header's config where recorded;
    a native header does not say, and the runtime's default build has it on."""
    from kvdiag.kvstream.fits import fits_tensors

    config = header.scenario.get("config")
    native = config.get("native_quants", True) if isinstance(config, dict) else True

    def evaluate(e: Fits) -> tuple[str, ...] | None:
        operands = (e.q, e.k, e.v, *((e.mask,) if e.mask else ()))
        if any(not t.type or not any(t.nb) for t in operands):
            return None  # geometry not recorded (an imported log line): nothing to evaluate
        try:
            return fits_tensors(e.q, e.k, e.v, e.mask, e.stage_bytes, bool(native)).failed
        except ValueError as exc:  # a type kvdiag's model does not know
            return (f"not evaluated: {exc}",)

    return evaluate


def analyse_file(path: str | Path) -> CheckResult:
    with TraceReader.open(path) as reader:
        analyzer = TraceAnalyzer(fits_evaluator(reader.header)).feed_all(reader)
        problems = list(reader.problems)
        header = reader.header
    summary = analyzer.summary()
    summary["problems"] = [
        {"line": p.line, "kind": p.kind, "message": p.message} for p in problems
    ]
    return CheckResult(header, analyzer.findings(), summary, problems)


def _allow_incomplete(result: CheckResult) -> CheckResult:
    """``--allow-incomplete``: a run that did not complete is a warning, not an error."""
    findings = [msgspec.structs.replace(f, severity=Severity.WARNING)
                if f.rule == "trace-incomplete" else f for f in result.findings]
    return CheckResult(result.header, findings, result.summary, result.problems)


def check_file(path: str, json_out: bool = False, fail_on: str = "error",
               allow_incomplete: bool = False, fmt: str | None = None) -> int:
    try:
        threshold = Severity.parse(fail_on)
    except ValueError as exc:
        raise UsageError(f"--fail-on: {exc}") from None
    result = analyse_file(path)
    if allow_incomplete:
        result = _allow_incomplete(result)
    failing = [f for f in result.findings if f.severity >= threshold]
    code = EXIT_FINDINGS if failing else EXIT_OK
    from kvdiag.report.check_output import write_check

    name = "<stdin>" if path == "-" else str(path)
    write_check(fmt or ("json" if json_out else "text"), name, result.header, result.findings,
                result.summary, threshold, code)
    return code
