"""Inspect, validate and export .kvtrace files.

trace info FILE [--json] shows the header, event counts per kind, step and time spans,
problems, whether the capture ended, and the judgement's counts (steps, read pages by class,
what the trace does not record).

trace pages FILE [--json] prints every judged read page.

trace validate FILE prints one line per problem and exits 0 when the file is valid (no
problems, has an End event), 1 when it has problems, and 2 when it is not a readable trace;
events lost between those it holds (gaps in seq) are said in a line of their own, not a format
problem (a file with lines deleted fails on its End's event count).

trace export FILE -o OUT writes Chrome trace-event JSON for chrome://tracing or Perfetto, or
(--format llama-log) the llama-server log the modelled run would print; an existing OUT is
replaced only with --force, and '-' writes to standard output.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvdiag.errors import EXIT_FINDINGS, EXIT_OK
from kvdiag.report.text import cap, cap_value

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import RenderableType

    from kvdiag.analysis.judgement import Judgement
    from kvdiag.model.events import Abort, Device
    from kvdiag.trace.summary import TraceSummary

MAX_PROBLEMS_SHOWN = 50
#: Abort events whose stacks ``trace info`` shows (the rest are counted).
MAX_ABORTS_SHOWN = 10
_SCENARIO_VALUE_WIDTH = 60


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="trace_command", metavar="ACTION", required=True, parser_class=type(parser)
    )
    info = sub.add_parser("info", help="header, counts, spans, problems and end status",
                          description="Show a trace's header, event counts per kind, step and "
                                      "time spans, problems and whether the capture ended.")
    info.add_argument("file", metavar="FILE", help="a .kvtrace file")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    validate = sub.add_parser(
        "validate", help="exit 0 if the trace is complete and undamaged, 1 if not",
        description="Print one line per problem of a trace. Exit status: 0 valid (no "
                    "problems, has an End event), 1 problems, 2 not a readable trace."
    )
    validate.add_argument("file", metavar="FILE", help="a .kvtrace file")
    pages = sub.add_parser(
        "pages", help="every judged read page, one line each (--json: JSON Lines)")
    pages.add_argument("file", metavar="FILE", help="a .kvtrace file ('-' reads standard input)")
    pages.add_argument("--json", action="store_true", help="one JSON object per page")
    export = sub.add_parser(
        "export", help="write the trace as Chrome trace-event JSON (chrome://tracing, "
                       "Perfetto) or as the llama-server log the run would print",
        description="Write a trace as Chrome trace-event JSON for chrome://tracing or "
                    "ui.perfetto.dev (a track per stream and layer, flow arrows from a write "
                    "to the reads that missed it), or as the llama-server log the modelled "
                    "run would print, which kvdiag postmortem and kvdiag import read."
    )
    export.add_argument("file", metavar="FILE", help="a .kvtrace file")
    export.add_argument("-o", "--output", required=True,
                        help="file to write; '-' writes to standard output")
    export.add_argument("--force", action="store_true", help="replace OUT if it exists")
    export.add_argument("--format", default="chrome", choices=("chrome", "llama-log"),
                        help="chrome: trace-event JSON (default); llama-log: the llama-server "
                             "log the modelled run would print (for kvdiag postmortem)")


def run(args: argparse.Namespace) -> int:
    if args.trace_command == "validate":
        return _validate(args.file)
    if args.trace_command == "export":
        return _export(args.file, args.output, args.format, force=args.force)
    if args.trace_command == "pages":
        return _pages(args.file, as_json=args.json)
    return _info(args.file, as_json=args.json)


def _validate(path: str) -> int:
    from kvdiag.analysis.judgement.gaps import SeqGaps, lost_text
    from kvdiag.trace.reader import TraceReader

    with TraceReader.open(path) as reader:
        # events lost between those the file holds (gaps in seq) are no format error, yet
        # said: the judgement's own finder, which checks a block by its first and last seq
        gaps = SeqGaps(reader.header)
        events = 0
        for block in reader.blocks():
            events += len(block)
            gaps.split(block)
        if reader.end is not None:  # what its count says that no seq accounts for
            gaps.ended(reader.end)
        for problem in reader.problems:
            print(f"{path}:{problem.line}: {problem.kind}: {cap(problem.message)}")
        lost = lost_text(gaps.as_json() if gaps.any else None)
        if lost:
            print(f"{path}: {lost} (not a format problem: kvdiag check reports it as "
                  "events-lost)")
        if reader.problems:
            print(
                f"{path}: invalid: {_plural(len(reader.problems), 'problem')}, {events} events read"
            )
            return EXIT_FINDINGS
        end = reader.end
        ended = f"ended {end.status} after {_plural(end.steps, 'step')}" if end else "ended"
        if end is not None and end.status == "error":
            why = f": {_short(end.reason)}" if end.reason else " (no reason recorded)"
            print(f"{path}:{reader.lines_read}: error: the run did not complete: End status "
                  f"error at step {end.step}{why}")
            print(f"{path}: invalid: the run ended with an error, {events} events read")
            return EXIT_FINDINGS
        print(f"{path}: valid: format {reader.version_text}, {events} events, {ended}")
        return EXIT_OK


def _export(path: str, output: str, fmt: str, *, force: bool = False) -> int:
    import sys

    from kvdiag.files.outputs import open_output, plan_output
    from kvdiag.trace.reader import TraceReader

    target = plan_output(output, force=force)
    with TraceReader.open(path) as reader, open_output(target) as sink:
        out = sink.file
        if fmt == "llama-log":
            from kvdiag.export.llama_log import LogExporter

            log = LogExporter(reader.header, reader.extras)
            # streamed: a long trace's log need not be held in memory
            n = sum(1 for _ in map(out.write, (line.encode() + b"\n" for line in log.lines(reader))))
            what = f"log lines ({_plural(log.bad_fits, 'fits=false line')}: the decisions " \
                   f"the judgement finds bad)"
        else:
            from kvdiag.export.chrome import ChromeExporter

            title = f"kvdiag {reader.header.scenario.get('name', path)}"
            exporter = ChromeExporter(reader.header, reader.extras, reader.header_extras)
            n = exporter.write(reader, out, title=title)
            assert exporter.judgement is not None
            classes = exporter.judgement.residency["read_classes"]
            what = f"trace events ({_plural(exporter.flows, 'flow')} from writes to reads " \
                   f"that missed them; pages exact {classes['exact']:,}, stale " \
                   f"{classes['stale']:,}, foreign {classes['foreign']:,}, not judged " \
                   f"{classes['not_judged']:,})"
        problems = len(reader.problems)
    note = f" ({_plural(problems, 'problem')} in the input; see trace validate)" if problems else ""
    # with -o - standard output carries the export itself
    print(f"{target.display}: {n} {what}{note}",
          file=sys.stderr if target.to_stdout else sys.stdout)
    return EXIT_OK


def _pages(path: str, *, as_json: bool) -> int:
    import sys

    from kvdiag.analysis.judgement import trace_judge
    from kvdiag.report.pages import write_pages
    from kvdiag.trace.reader import TraceReader

    with TraceReader.open(path) as reader:
        write_pages(reader, trace_judge(reader, detail=True), sys.stdout.buffer, as_json)
    sys.stdout.flush()
    return EXIT_OK


def _info(path: str, *, as_json: bool) -> int:
    from kvdiag.analysis.judgement import CHUNK, trace_judge
    from kvdiag.trace.reader import TraceReader
    from kvdiag.trace.summary import summarize

    with TraceReader.open(path) as reader:
        judge = trace_judge(reader, name=path)
        pending: list[Any] = []

        def observe(event: Any) -> None:
            # the Judge judges a chunk with array operations: fed one event at a time it
            # took ~0.2 ms of CPU per event (minutes for a million)
            nonlocal pending
            pending.append(event)
            if len(pending) >= CHUNK:
                judge.feed_all(pending)
                pending = []

        summary = summarize(reader, observe=observe)
        judge.feed_all(pending)
    judgement = judge.snapshot()
    # the aborts the judgement holds (its abort findings'), not a second reading of the events
    every_abort = judge.groups.aborts
    aborts = every_abort[:MAX_ABORTS_SHOWN]
    if as_json:
        import msgspec

        doc = summary.to_dict()
        # the step span is the judgement's (End excluded: a header and an End have no steps)
        doc["first_step"], doc["last_step"] = judgement.steps.first, judgement.steps.last
        doc["judgement"] = {**judgement.summary(), "findings": {
            sev: sum(1 for f in judgement.findings if f.severity.label == sev)
            for sev in ("critical", "error", "warning", "info")}}
        doc["aborts"] = [_abort_json(a) for a in aborts]
        print(msgspec.json.format(msgspec.json.encode(doc), indent=2).decode())
        return EXIT_OK
    from kvdiag.report.console import print_renderables

    print_renderables(_info_renderables(summary, judgement, aborts, len(every_abort)))
    return EXIT_OK


def _abort_json(a: Abort) -> dict[str, Any]:
    from kvdiag.analysis.judgement.findings import python_stack_json

    return {"seq": a.seq, "step": a.step, "message": a.message, "file": a.file or None,
            "line": a.line or None, "condition": a.condition or None,
            "cuda_error": a.cuda_error, "backtrace": list(a.backtrace),
            "python_stacks": [python_stack_json(st) for st in a.python_stacks]}


def _info_renderables(s: TraceSummary, j: Judgement, aborts: Sequence[Abort],
                      n_aborts: int) -> list[RenderableType]:
    from rich.table import Table
    from rich.text import Text

    from kvdiag.postmortem.backtrace import frames_of_names
    from kvdiag.report.console import is_terminal
    from kvdiag.report.postmortem import abort_event_renderable

    h = s.header
    head = Table(title=f"trace {s.name}", show_header=False, title_justify="left")
    head.add_column("field", style="bold", no_wrap=True)
    head.add_column("value", overflow="fold")
    fmt = f"{h.format} {s.version}"
    if s.newer_minor:
        fmt += " (newer minor version: unknown kinds and fields kept)"
    head.add_row("format", fmt)
    head.add_row("kvdiag", cap(h.kvdiag_version))
    head.add_row("created", cap(h.created))
    head.add_row("backend", cap(h.backend))
    head.add_row("device", _device_text(h.device))
    for key, value in _flatten("scenario", h.scenario):
        head.add_row(key, value)
    if h.plan:
        head.add_row("plan", _count(h.plan))
    if s.segments is not None:
        head.add_row("segments", cap(s.segments["text"]))
    for key, value in s.header_extras.items():
        head.add_row(f"{cap(key)} (unknown)", _short(value))
    parts: list[RenderableType] = [head]

    counts = Table(title="events", title_justify="left")
    counts.add_column("kind", no_wrap=True)
    counts.add_column("count", justify="right")
    counts.add_column("share", justify="right")
    for kind, n in s.counts.items():
        label = f"{cap(kind)} (unknown kind)" if kind in s.unknown_kinds else kind
        counts.add_row(label, f"{n:,}", f"{n / s.events:.1%}" if s.events else "-")
    counts.add_row(Text("total", style="bold"), f"{s.events:,}", "")
    parts.append(counts)

    span = Table(show_header=False, title="span", title_justify="left")
    span.add_column("field", style="bold", no_wrap=True)
    span.add_column("value")
    steps = j.steps
    if steps.first is None or steps.last is None:
        span.add_row("steps", "no steps" if s.events else "no events")
    else:
        span.add_row("steps", f"{steps.first} – {steps.last} ({steps.text()})")
    if s.duration_ns is not None:
        span.add_row("time", f"{s.first_t_ns:,} – {s.last_t_ns:,} ns ({_duration(s.duration_ns)})")
    span.add_row("lines", f"{s.lines:,}")
    if s.end is not None:
        span.add_row(
            "end",
            Text(
                f"{s.end.status} (End: {_plural(s.end.steps, 'step')}, {s.end.events:,} events)",
                style="green" if s.end.status == "completed" else "yellow",
            ),
        )
    else:
        span.add_row("end", Text("no End event: the capture did not finish", style="red"))
    if s.truncated:
        span.add_row("truncated", Text(f"yes: last line {s.lines} is cut short", style="red"))
    parts.append(span)

    parts.append(_judgement_table(j))
    full = not is_terminal()
    for a in aborts:
        parts.append(abort_event_renderable(a, frames_of_names(a.backtrace), full_paths=full))
    if n_aborts > len(aborts):
        parts.append(Text(f"… and {n_aborts - len(aborts)} more abort(s): kvdiag check lists "
                          "them all", style="dim"))

    if s.extra_fields:
        extra = Table(title="fields unknown to this version (kept)", title_justify="left")
        extra.add_column("kind.field", overflow="fold")
        extra.add_column("events", justify="right")
        for path, n in s.extra_fields.items():
            extra.add_row(cap(path), f"{n:,}")
        parts.append(extra)

    if s.problems:
        problems = Table(title=_plural(len(s.problems), "problem"), title_justify="left")
        problems.add_column("line", justify="right", no_wrap=True)
        problems.add_column("kind", no_wrap=True)
        problems.add_column("message", overflow="fold")
        for p in s.problems[:MAX_PROBLEMS_SHOWN]:
            problems.add_row(str(p.line), Text(p.kind, style="red"), cap(p.message))
        if len(s.problems) > MAX_PROBLEMS_SHOWN:
            problems.add_row("", "", f"… and {len(s.problems) - MAX_PROBLEMS_SHOWN} more")
        parts.append(problems)
    else:
        parts.append(Text("no problems", style="green"))
    return parts


def _judgement_table(j: Judgement) -> RenderableType:
    """What the judgement counted (``kvdiag check`` lists the findings)."""
    from rich.table import Table

    from kvdiag.analysis.judgement.gaps import lost_text, recorded_text

    t = Table(show_header=False, title="judgement (kvdiag check lists the findings)",
              title_justify="left")
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value")
    rc = j.residency["read_classes"]
    t.add_row("read pages", f"exact {rc['exact']:,}, stale {rc['stale']:,}, foreign "
                            f"{rc['foreign']:,}, not judged {rc['not_judged']:,}")
    by_severity = [f"{sum(1 for f in j.findings if f.severity.label == sev)} {sev}"
                   for sev in ("critical", "error", "warning", "info")]
    t.add_row("findings", ", ".join(by_severity))
    missing = [k.kind for k in j.completeness.missing]
    t.add_row(f"recorded ({j.completeness.source})", recorded_text(missing, j.lost))
    lost = lost_text(j.lost)
    if lost:
        t.add_row("events lost", lost)
    return t


def _device_text(device: Device) -> str:
    parts = [cap(device.name)]
    if device.memory_bytes is not None:
        parts.append(f"{device.memory_bytes / 2**30:.1f} GiB")
    for label, value in (
        ("driver", device.driver),
        ("PCIe", device.pcie),
        ("cc", device.compute_capability),
    ):
        if value is not None:
            parts.append(f"{label} {cap(value)}")
    return ", ".join(parts)


def _duration(ns: int) -> str:
    if ns >= 10**9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 10**6:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e3:.1f} µs"


def _flatten(prefix: str, mapping: dict[str, object]) -> list[tuple[str, str]]:
    """Scalars as they are, one level of nested mappings spelt out, larger values counted."""
    rows: list[tuple[str, str]] = []
    for key, value in mapping.items():
        name = f"{prefix}.{cap(key)}"
        if isinstance(value, dict) and prefix.count(".") == 0:
            rows.extend(_flatten(name, value))
        elif isinstance(value, dict | list):
            small = len(value) <= 40 and len(repr(value)) <= 40
            rows.append((name, _short(value) if small else _count(value)))
        else:
            rows.append((name, _short(value)))
    return rows


def _count(value: dict[str, Any] | list[Any]) -> str:
    n = len(value)
    if isinstance(value, dict):
        return f"{n:,} entry" if n == 1 else f"{n:,} entries"
    return _plural(n, "item")


def _short(value: object) -> str:
    """A header value in the info table: short ones whole, long ones capped with their
    length (a string from input can be megabytes long)."""
    return cap_value(value, _SCENARIO_VALUE_WIDTH)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
