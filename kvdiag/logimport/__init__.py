"""``kvdiag import``: a llama-server log (the lines instrumented forks already print) → a trace.

Two passes over the log: the post-mortem scanner (:class:`kvdiag.postmortem.parse.LogParser`:
boots, crashes with their backtraces, damage) while :class:`~kvdiag.logimport.header.BootSniffer`
picks the model's head geometry out of the same bytes; then the header is written and
:class:`~kvdiag.logimport.convert.Converter` turns the lines into events. The trace is written
to a temporary file beside the output and renamed when complete, so an existing file is
replaced only when the import succeeded (and only with ``force``). The rules — what each line
becomes, how routes and steps are inferred, how unknown geometry is marked — are in
docs/log-import.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from kvdiag.errors import InputError, UsageError
from kvdiag.files.inputs import Tapped
from kvdiag.files.outputs import Output, open_output, plan_output
from kvdiag.logimport.convert import UNKNOWN_FIELDS, Converter, Counts
from kvdiag.logimport.header import BootSniffer, build_header, chosen_boot
from kvdiag.logimport.source import Breaks, LogInput, iter_lines
from kvdiag.model.events import End
from kvdiag.model.logrecords import LogScan, Replaced
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem.parse import LogParser
from kvdiag.postmortem.perfscan import PerfScanner
from kvdiag.trace.writer import EndStatus, TraceWriter


class NothingToImport(InputError):
    """The log was read but holds no line that becomes an event."""

    exit_code = 1


@dataclass(frozen=True)
class ImportResult:
    output: str
    counts: Counts
    end: End
    breaks: Breaks
    lines: int
    replaced: tuple[Replaced, ...] = ()
    """Stray bytes replaced while reading the log (kvdiag.files.text)."""


def default_output(log: str) -> Path:
    """``server.log`` → ``server.kvtrace`` (``.gz`` dropped too), beside the log."""
    p = Path(log)
    name = p.name
    for suffix in (".gz", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return p.with_name(name + ".kvtrace")


def _scan(log: LogInput, sniffer: BootSniffer) -> tuple[LogScan, PerfRun]:
    """The first pass: the post-mortem scanner, with every block it reads shown to the boot
    sniffer and to the request reader of ``kvdiag perf`` (the requests' timing lines)."""
    parser = LogParser()
    requests = PerfScanner(log.display)

    def hook(data: bytes) -> None:
        sniffer.feed(data)
        requests.feed(data)

    with log.open() as opened:
        parser.feed(log.display, cast(BinaryIO, Tapped(opened.stream, hook)),
                    leading_nuls=opened.leading_nuls)
    return parser.result(), requests.finish()


def import_log(path: str, output: str | None = None, *, force: bool = False) -> ImportResult:
    """Read ``path`` (``-`` = stdin) and write its trace; raise :class:`InputError` (exit 2)
    for input that is not a readable text log, :class:`NothingToImport` (exit 1) for a log
    without any importable line, :class:`~kvdiag.files.outputs.OutputError` (exit 2) for an
    output that exists without ``force`` or is not a regular file."""
    if output is None:
        if path == "-":
            raise UsageError("reading stdin needs -o OUT.kvtrace (or -o - for standard output)")
        output = str(default_output(path))
    out = plan_output(output, force=force)
    log = LogInput(path)
    try:
        return _convert(log, out)
    finally:
        log.close()


def _convert(log: LogInput, out: Output) -> ImportResult:
    sniffer = BootSniffer()
    scan, perf = _scan(log, sniffer)
    boot = chosen_boot(scan.boots)
    header = build_header(log.display, scan.boots, sniffer, scan.lines, UNKNOWN_FIELDS)
    stage = int(header.plan.get("stage_bytes", 0))
    breaks = Breaks()
    with open_output(out) as sink:
        writer = TraceWriter.create_on(sink.fileno(), out.display, header)
        try:
            conv = Converter(writer, log.display, scan.boots, scan.crashes, boot, stage,
                             perf.requests)
            with log.open() as opened:
                for raw in iter_lines(opened.stream, breaks):
                    conv.line(breaks.line, raw.rstrip(b"\r"))
            conv.finish()
            status, reason = _end_status(conv.counts, breaks, log.display)
            end = writer.close(status, reason=reason, t_ns=conv.time_ns)
            assert end is not None
        finally:
            writer.abandon()
        if conv.counts.imported == 0 and breaks.error is not None:
            raise InputError(f"{log.display}: breaks after line {breaks.line}: {breaks.error}; "
                             "nothing to import before the break")
        if conv.counts.imported == 0:
            raise NothingToImport(
                f"{log.display}: nothing to import ({breaks.line} lines, none of them a "
                "fits=false, kv_stream_adapt, fallback, abort, crash or print_timing line)")
    return ImportResult(out.display, conv.counts, end, breaks, breaks.line, scan.replaced)


def _end_status(counts: Counts, breaks: Breaks, name: str) -> tuple[EndStatus, str]:
    """``aborted`` when the log shows an abort; else ``error`` when it breaks off (a read
    error, or a last line without a line end); else ``completed``."""
    notes: list[str] = []
    if breaks.error is not None:
        notes.append(f"{name} breaks after line {breaks.line}: {breaks.error}")
    if breaks.no_newline:
        notes.append(f"{name} ends inside line {breaks.line + 1} (no line end: cut short?); "
                     "that line is not imported")
    if counts.aborts:
        return "aborted", "; ".join([f"the log shows {counts.aborts} abort(s)", *notes])
    if notes:
        return "error", "; ".join(notes)
    return "completed", ""
