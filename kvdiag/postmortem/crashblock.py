"""Assembling the lines around one process death into ``Crash`` records.

A crash block starts at the first crash line (an abort, a GPU error, a fatal signal, an uncaught
exception or a backtrace frame) and takes every following line until the log goes quiet. Inside
it the order of lines is not fixed: the CUDA error lines travel through llama-server's async
log thread while the abort line is written straight to stderr, so either may come first
(domain brief §6.5, [I-23469]); several threads may assert at once; gdb prints notes
(``ptrace: Operation not permitted``) instead of frames.
"""

from __future__ import annotations

import msgspec

from kvdiag.model.logrecords import (
    Abort,
    Backtrace,
    Crash,
    CrashKind,
    GpuError,
    LogLine,
    SignalLine,
)
from kvdiag.postmortem import crashlines, grammar
from kvdiag.postmortem.backtrace import BacktraceBuilder, base_name, is_noise
from kvdiag.postmortem.fingerprint import fingerprint
from kvdiag.postmortem.pystack import PythonStackBuilder

MAX_ITEMS = 64


class CrashBlock:
    """Collects one block's records; ``crashes()`` turns them into ``Crash`` values."""

    def __init__(self, start: LogLine) -> None:
        self.start = start
        self.aborts: list[Abort] = []
        self.errors: list[GpuError] = []
        self.signals: list[SignalLine] = []
        self.exceptions: list[tuple[LogLine, str, str | None]] = []
        self.backtraces: list[Backtrace] = []
        self.notes: list[str] = []
        self._bt = BacktraceBuilder()
        # a Python embedding's faulthandler stacks: read beside the native ones, since both
        # may be printed for one death (ggml's gdb backtrace, then abort() and faulthandler)
        self._py = PythonStackBuilder()
        self._want_statement = False
        self._failed_op: str | None = None
        self._native: str | None = None

    def feed(self, where: LogLine, text: str) -> bool:
        """One line of the block; True when it was crash-related (keeps the block open)."""
        if "signal SIG" in text and len(self.signals) < MAX_ITEMS:
            sig = crashlines.parse_signal(where, text)
            if sig is not None:
                self.signals.append(sig)
        if self._py.feed(where, text):
            return True
        if self._bt.feed(where, text):
            self._collect_backtraces()
            return True
        if self._want_statement:
            self._want_statement = False
            stmt = text.strip()
            if stmt and self.errors and not grammar.classify(where, text):
                self.errors[-1] = msgspec.structs.replace(self.errors[-1], statement=stmt[:500])
                return True
        detail = crashlines.parse_current_device(text)
        if detail is not None:
            self._attach_detail(where, *detail)
            self._want_statement = True
            return True
        device = crashlines.parse_device_alone(text)
        if device is not None and self.errors and self.errors[-1].device is None:
            self.errors[-1] = msgspec.structs.replace(self.errors[-1], device=device)
            return True
        op = crashlines.parse_failed_op(text)
        if op is not None:
            self._failed_op = op
            return True
        infn = crashlines.parse_in_function(text)
        if infn is not None and self.errors:
            self._attach_detail(where, None, *infn)
            return True
        native = crashlines.parse_native_api(text)
        if native is not None:
            self._native = native[:300]
            return True
        if text.startswith("Exception caught at file:"):
            return True
        exc = crashlines.parse_terminate(text)
        if exc is not None:
            self.exceptions.append((where, exc, None))
            return True
        if text.lstrip().startswith("what():") and self.exceptions:
            w, e, _ = self.exceptions[-1]
            self.exceptions[-1] = (w, e, text.split("what():", 1)[1].strip()[:500])
            return True
        hit = False
        for rec in grammar.classify(where, text):
            if isinstance(rec, Abort) and len(self.aborts) < MAX_ITEMS:
                self.aborts.append(rec)
                hit = True
            elif isinstance(rec, GpuError) and len(self.errors) < MAX_ITEMS:
                if self._failed_op is not None:
                    rec = msgspec.structs.replace(rec, failed_op=self._failed_op)
                if self._native is not None and rec.backend == "SYCL":
                    # the generic "Meet error in this line code!" says less than the runtime
                    rec = msgspec.structs.replace(rec, message=self._native)
                self.errors.append(rec)
                hit = True
            elif isinstance(rec, SignalLine) and len(self.signals) < MAX_ITEMS:
                self.signals.append(rec)
                hit = True
        if hit:
            self._bt.flush()
            self._collect_backtraces()
            return True
        return is_noise(text) and self._bt.active

    def _attach_detail(self, where: LogLine, device: int | None, function: str,
                       location: str) -> None:
        for i in range(len(self.errors) - 1, -1, -1):
            if self.errors[i].function is None:
                self.errors[i] = msgspec.structs.replace(
                    self.errors[i], device=device, function=function, location=location
                )
                return
        # The detail line arrived before its message line (interleaved async logging).
        self.errors.append(GpuError(where=where, backend="CUDA", message="", device=device,
                                    function=function, location=location))

    def _collect_backtraces(self) -> None:
        if self._bt.done:
            self.backtraces.extend(self._bt.done[: MAX_ITEMS - len(self.backtraces)])
            self._bt.done.clear()

    def close(self) -> None:
        self._bt.flush()
        self._collect_backtraces()
        self.notes.extend(self._bt.take_notes())

    def crashes(self) -> list[Crash]:
        """One crash per abort (threads that asserted together each get one); a GPU error,
        signal or exception without an abort is a crash of its own kind."""
        self.close()
        errors = _merge_errors(self.errors)
        traces = list(self.backtraces)
        out: list[Crash] = []
        seen: set[tuple[str | None, int | None, str]] = set()
        for ab in self.aborts:
            key = (ab.file, ab.line, ab.message)
            if key in seen:
                continue  # another thread hit the same abort in the same process death
            seen.add(key)
            err = None
            if errors and (ab.form == "message" or "error" in ab.message.lower()):
                err = errors.pop(0)
            kind: CrashKind = "assert" if ab.condition is not None else (
                "cuda_error" if err is not None else
                "ggml_abort" if ab.form == "message" else "abort")
            out.append(Crash(where=ab.where, kind=kind, abort=ab, error=err))
        for err in errors:
            out.append(Crash(where=err.where, kind="cuda_error", error=err))
        for where, exc, what in self.exceptions:
            if not out:
                out.append(Crash(where=where, kind="exception", error=GpuError(
                    where=where, backend="C++", message=f"{exc}: {what}" if what else exc)))
        fatal = [s for s in self.signals if s.signal != "SIGABRT"]
        if not out:
            sig = fatal[0] if fatal else (self.signals[0] if self.signals else None)
            if sig is not None:
                kind = "segfault" if sig.signal == "SIGSEGV" else "signal"
                out.append(Crash(where=sig.where, kind=kind, signal=sig))
            elif traces:
                names = {base_name(f.function or "") for f in traces[0].frames}
                # frames through abort() say how it died; any other stack says only that it
                # did (a handler may print one for any signal): the cause is not guessed
                kind = "abort" if names & {"abort", "raise", "ggml_abort", "__GI_abort"} else (
                    "unknown")
                out.append(Crash(where=traces[0].where, kind=kind))
        elif self.signals:
            out[0] = msgspec.structs.replace(out[0], signal=self.signals[0])
        python = self._py.stacks()
        if out and python:
            # faulthandler runs once per death, in the signal's handler: its stacks go with
            # the crash that carries the signal
            out[0] = msgspec.structs.replace(out[0], python=python)
        for i, crash in enumerate(out):
            bt = traces[i] if i < len(traces) else None
            if bt is not None and self.notes:
                bt = msgspec.structs.replace(bt, notes=bt.notes + tuple(self.notes))
            crash = msgspec.structs.replace(crash, backtrace=bt)
            out[i] = msgspec.structs.replace(crash, fingerprint=fingerprint(crash))
        return out


def _merge_errors(errors: list[GpuError]) -> list[GpuError]:
    """A detail-only record (device/function before message) merges into its message."""
    out: list[GpuError] = []
    for err in errors:
        if out and not err.message and out[-1].function is None:
            out[-1] = msgspec.structs.replace(out[-1], device=err.device, function=err.function,
                                              location=err.location)
        elif out and err.function is None and not out[-1].message and out[-1].function:
            out[-1] = msgspec.structs.replace(err, device=out[-1].device,
                                              function=out[-1].function,
                                              location=out[-1].location,
                                              statement=out[-1].statement or err.statement)
        else:
            out.append(err)
    return out
