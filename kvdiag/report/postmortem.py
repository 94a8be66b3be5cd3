"""The post-mortem report: rich renderables for people, plain dicts for ``--json``.

The JSON shape is documented in docs/postmortem-json.md; ``postmortem_to_json`` is the only
place that builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvdiag.model import events as trace_events
from kvdiag.model import frames as frames_model
from kvdiag.model.findings import Finding
from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import (
    BinaryUse,
    BootConfig,
    Crash,
    LogScan,
    PythonStack,
    SlotEvent,
)
from kvdiag.report.findings import findings_table
from kvdiag.report.findings_plain import findings_to_json
from kvdiag.report.text import cap

_CONFIG_ROWS: tuple[tuple[str, str], ...] = (
    ("model", "model"), ("n_ctx", "n_ctx"), ("n_ctx_seq", "n_ctx_seq"),
    ("n_seq_max", "n_seq_max (slots)"), ("n_stream", "KV streams"), ("kv_unified", "kv_unified"),
    ("n_batch", "n_batch"), ("n_ubatch", "n_ubatch"), ("flash_attn", "flash_attn"),
    ("type_k", "K type"), ("type_v", "V type"), ("kv_stream", "kv streaming"),
    ("kv_stream_pool_mib", "stream pool MiB"), ("kv_stream_arena_mib", "stream arena MiB"),
    ("kv_stream_device", "stream device filter"), ("kv_stream_layers", "streamed layers"),
    ("multiseq_optin", "multi-seq opt-in"),
)


def _hex(value: int | None) -> str | None:
    return None if value is None else f"0x{value:x}"


def boot_for(scan: LogScan, crash: Crash | None) -> BootConfig | None:
    """The boot a crash happened under, else the last boot seen."""
    if crash is not None and crash.boot_index is not None and (
        0 <= crash.boot_index < len(scan.boots)
    ):
        return scan.boots[crash.boot_index]
    return scan.boots[-1] if scan.boots else None


# -- JSON ----------------------------------------------------------------------------------


def frame_to_json(fr: Frame) -> dict[str, Any]:
    return {
        "index": fr.index, "module": fr.module, "offset": _hex(fr.offset),
        "address": _hex(fr.address), "function": fr.function, "file": fr.file,
        "line": fr.line, "inlined": fr.inlined, "in_app": fr.in_app,
        "unverified": fr.unverified,
    }


def crash_to_json(crash: Crash) -> dict[str, Any]:
    ab = crash.abort
    err = crash.error
    frames = crash.backtrace.frames if crash.backtrace is not None else ()
    sig = crash.signal
    return {
        "kind": crash.kind,
        "source": crash.where.source,
        "line": crash.where.line,
        "signal": None if sig is None else {
            "source": sig.where.source, "line": sig.where.line, "signal": sig.signal,
            "exception": sig.exception,
        },
        "assert": None if ab is None else {
            "file": ab.file, "line": ab.line,
            "condition": ab.condition if ab.condition is not None else ab.message,
        },
        "error": None if err is None else {
            "message": err.message, "function": err.function, "location": err.location,
            "statement": err.statement,
        },
        "frames": [frame_to_json(f) for f in frames],
        "python_stacks": [python_stack_to_json(st) for st in crash.python],
        "fingerprint": crash.fingerprint,
    }


def python_stack_to_json(st: PythonStack) -> dict[str, Any]:
    return {
        "source": st.where.source, "line": st.where.line, "thread": st.thread,
        "name": st.name, "current": st.current, "notes": list(st.notes),
        "frames": [{"index": fr.index, "function": fr.function, "file": fr.file,
                    "line": fr.line, "in_app": fr.in_app} for fr in st.frames],
    }


def config_to_json(boot: BootConfig | None) -> dict[str, Any]:
    if boot is None:
        return {}
    out: dict[str, Any] = msgspec.to_builtins(boot)
    out.pop("evidence", None)
    return out


def slot_to_json(ev: SlotEvent) -> dict[str, Any]:
    return {
        "source": ev.where.source, "line": ev.where.line, "event": ev.kind, "slot": ev.slot,
        "task": ev.task, "n_tokens": ev.n_tokens, "n_past": ev.n_past,
        "progress": ev.progress,
    }


def postmortem_to_json(scan: LogScan, findings: Sequence[Finding]) -> dict[str, Any]:
    last = scan.crashes[-1] if scan.crashes else None
    return {
        "crashes": [crash_to_json(c) for c in scan.crashes],
        "config": config_to_json(boot_for(scan, last)),
        "slots": [slot_to_json(e) for e in scan.slot_events_tail],
        "findings": findings_to_json(findings),
        "problems": [msgspec.to_builtins(p) for p in scan.problems],
        "binaries": [{"path": b.path, "origin": b.origin, "checked_by": b.checked_by,
                      "evidence": b.evidence} for b in scan.binaries],
        # stray bytes replaced while reading, per log that had any (kvdiag.files.text)
        "replaced": [msgspec.to_builtins(r) for r in scan.replaced],
    }


# -- rich ----------------------------------------------------------------------------------


def config_table(boot: BootConfig) -> Table:
    table = Table(title=f"Configuration ({boot.source}:{boot.line})", show_header=False,
                  expand=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for attr, label in _CONFIG_ROWS:
        value = getattr(boot, attr)
        if value is None or (value is False and attr == "multiseq_optin"):
            continue
        table.add_row(label, str(value))
    for buft, mib in boot.kv_buffers.items():
        style = "magenta" if "KV_Stream" in buft else ""
        table.add_row(f"KV buffer {buft}", Text(f"{mib:g} MiB", style=style))
    return table


def timeline_table(events: Sequence[SlotEvent], active: Sequence[int]) -> Table:
    title = "Slot activity before the crash"
    if active:
        title += f" (busy at the crash: {', '.join(map(str, active))})"
    table = Table(title=title, expand=True)
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("slot", justify="right")
    table.add_column("task", justify="right")
    table.add_column("event", no_wrap=True)
    table.add_column("detail", ratio=1)
    for ev in events:
        detail = []
        if ev.n_tokens is not None:
            detail.append(f"n_tokens {ev.n_tokens}")
        if ev.n_past is not None:
            detail.append(f"n_past {ev.n_past}")
        if ev.progress is not None:
            detail.append(f"progress {ev.progress:.2f}")
        table.add_row(str(ev.where.line), "" if ev.slot is None else str(ev.slot),
                      "" if ev.task is None else str(ev.task), ev.kind,
                      ", ".join(detail) or cap(ev.message))
    return table


def _short_path(path: str, keep: int = 2) -> str:
    parts = path.replace("\\", "/").split("/")
    return path if len(parts) <= keep + 1 else "…/" + "/".join(parts[-keep:])


def backtrace_table(frames: Sequence[Frame], *, full_paths: bool = False) -> Table:
    """``full_paths``: source files whole (output that is not a terminal); otherwise the last
    directory and the file name."""
    table = Table(title="Backtrace (in-app frames bold)", expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("function", ratio=4, overflow="fold")
    table.add_column("source", ratio=2, overflow="fold")
    table.add_column("module / address", ratio=2, overflow="fold")
    for fr in frames:
        style = "bold" if fr.in_app else "dim"
        name = frame_name(fr)
        src = (fr.file if full_paths else _short_path(fr.file, 1)) if fr.file else ""
        if src and fr.line is not None:
            src += f":{fr.line}"
        where = fr.module.replace("\\", "/").rsplit("/", 1)[-1] if fr.module else ""
        if fr.offset is not None:
            where += f"+0x{fr.offset:x}"
        elif fr.address is not None:
            where = f"{where} 0x{fr.address:x}".strip()
        table.add_row(str(fr.index), Text(name, style=style), Text(src, style=style),
                      Text(where, style="dim"))
    return table


def crash_renderable(crash: Crash, number: int, count: int, total: int, *,
                     full_paths: bool = False) -> RenderableType:
    parts: list[RenderableType] = []
    head = Text(f"Crash {number} of {total}: {crash.kind}", style="bold red")
    if count > 1:
        head.append(f"  (x{count} with this fingerprint)", style="yellow")
    head.append(f"  fingerprint {crash.fingerprint}", style="dim")
    parts.append(head)
    parts.append(Text(f"  at {crash.where.source}:{crash.where.line}", style="dim"))
    if crash.abort is not None:
        ab = crash.abort
        file = cap(ab.file) if ab.file else ""
        parts.append(Text(f"  {file}:{ab.line}: {cap(ab.message)}", style="red"))
    if crash.error is not None:
        err = crash.error
        parts.append(Text(f"  {err.backend} error: {cap(err.message)}", style="red"))
        if err.place():
            parts.append(Text(f"    {err.place()}"))
        if err.statement:
            parts.append(Text(f"    {cap(err.statement)}", style="italic"))
    if crash.signal is not None:
        windows = (f", Windows fatal exception: {crash.signal.exception}"
                   if crash.signal.exception else "")
        parts.append(Text(f"  signal: {crash.signal.signal} (line {crash.signal.where.line}"
                          f"{windows})", style="red"))
    elif crash.kind == "unknown":
        parts.append(Text("  cause not in the log: a backtrace, then the output ends (no "
                          "signal, abort, error or exception line)", style="red"))
    if crash.timeline:
        parts.append(timeline_table(crash.timeline, crash.active_slots))
    if crash.backtrace is not None and crash.backtrace.frames:
        parts.append(backtrace_table(crash.backtrace.frames, full_paths=full_paths))
        for note in crash.backtrace.notes:
            parts.append(Text(f"  note: {note}", style="yellow"))
    elif crash.backtrace is None:
        parts.append(Text("  no native backtrace in the log" if crash.python else
                          "  no backtrace in the log", style="dim"))
    parts.extend(python_stacks_renderables(crash.python, full_paths=full_paths))
    return Group(*parts)


def abort_event_renderable(abort: trace_events.Abort, native: Sequence[Frame], *,
                           full_paths: bool = False) -> RenderableType:
    """An abort event of a trace as ``kvdiag postmortem`` shows a crash of a log: its message,
    the native frames (``native``: the event's backtrace made frames by the caller, who may
    judge them in-app), the Python stacks (format 1.3)."""
    parts: list[RenderableType] = [
        Text(f"Abort at event #{abort.seq}, step {abort.step}", style="bold red"),
        Text(f"  {cap(abort.message)}", style="red")]
    if abort.cuda_error:
        parts.append(Text(f"  CUDA error {cap(abort.cuda_error)}", style="red"))
    if native:
        parts.append(backtrace_table(native, full_paths=full_paths))
    else:
        parts.append(Text("  no native backtrace in the trace" if abort.python_stacks else
                          "  no backtrace in the trace", style="dim"))
    parts.extend(python_stacks_renderables(abort.python_stacks, full_paths=full_paths))
    return Group(*parts)


def python_stack_title(st: PythonStack | trace_events.PyStack) -> str:
    """``Python stack, thread 0x… (the thread the signal hit)``."""
    return frames_model.python_stack_title(st.thread, st.name, st.current)


def python_stacks_renderables(stacks: Sequence[PythonStack] | Sequence[trace_events.PyStack], *,
                              full_paths: bool = False) -> list[RenderableType]:
    """The stack of the thread the signal hit as a table; the other threads one line each
    (their innermost frame), all of them whole in ``--json``."""
    parts: list[RenderableType] = []
    for st in stacks:
        frames = st.frames if isinstance(st, PythonStack) else st.as_frames()
        if st.current and frames:
            table = backtrace_table(frames, full_paths=full_paths)
            table.title = f"{python_stack_title(st)}; in-app frames bold"
            parts.append(table)
        else:
            top = frames[0] if frames else None
            at = (f": {top.function or '??'} ({top.file or '???'}:{top.line or '???'}), "
                  f"{len(frames)} frame(s)" if top is not None else "")
            parts.append(Text(f"  {python_stack_title(st)}{at}", style="dim"))
        for note in st.notes:
            parts.append(Text(f"    {note}", style="yellow"))
    return parts


def frame_name(fr: Frame) -> str:
    """The function column: ``??`` when unknown, ``(inlined)`` before an inlined one, and
    ``[unverified]`` after a name a binary gave that the log could not check."""
    name = fr.function or "??"
    if fr.inlined:
        name = f"(inlined) {name}"
    if fr.unverified:
        name += " [unverified]"
    return name


def binary_line(use: BinaryUse) -> str:
    """One line saying which file the frames were symbolized with and why it was trusted."""
    where = "found at the logged path" if use.origin == "logged-path" else "(--binary)"
    if use.checked_by == "unchecked":
        said = f" ({use.evidence})" if use.evidence else ""
        return (f"UNVERIFIED: symbolized with {use.path} {where}, but nothing in the log could "
                f"check that it is the build that ran{said}; the names marked [unverified] "
                "may be another build's")
    why = {"build-id": "build-id matches the log",
           "frames": "the log's frames match it"}[use.checked_by]
    said = f" ({use.evidence})" if use.evidence else ""
    return f"symbolized with {use.path} {where}; {why}{said}"


def postmortem_renderable(scan: LogScan, findings: Sequence[Finding], *,
                          full_paths: bool = False) -> RenderableType:
    parts: list[RenderableType] = []
    groups: dict[str, list[Crash]] = {}
    for c in scan.crashes:
        groups.setdefault(c.fingerprint, []).append(c)
    parts.append(Text(
        f"{len(scan.sources)} log(s), {scan.lines} lines, {len(scan.crashes)} crash(es) in "
        f"{len(groups)} group(s), {len(scan.boots)} boot(s)", style="bold"))
    last = scan.crashes[-1] if scan.crashes else None
    boot = boot_for(scan, last)
    if boot is not None:
        parts.append(config_table(boot))
    for i, group in enumerate(groups.values(), 1):
        parts.append(crash_renderable(group[-1], i, len(group), len(groups),
                                      full_paths=full_paths))
    for b in scan.binaries:
        parts.append(Text(binary_line(b), style="yellow" if b.checked_by == "unchecked"
                          else "dim"))
    parts.append(findings_table(findings))
    for p in scan.problems:
        loc = f"{p.source}:{p.line}" if p.line is not None else p.source
        parts.append(Text(f"problem: {loc}: {cap(p.message)}", style="yellow"))
    return Group(*parts)
