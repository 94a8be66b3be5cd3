"""Known crash and risk signatures in parsed server logs: ``LogScan`` in, findings out.

Each rule is a pure function registered with an id, a title and a fix; it returns findings whose
evidence cites the log lines it matched. Facts behind the kv-stream rules are in the domain
brief §8: the fits-dispatch abort needs K/V in ``CUDA_KV_Stream_Host``, more than one KV stream
(``2/2 seqs``), a ubatch holding both slots and membership-only dispatch; the aliasing risk
needs streaming on, non-unified KV with ≥ 2 streams (only reachable through the
``LLAMA_KV_STREAM_ALLOW_MULTISEQ`` opt-in in the G1 lineage) and shows on a first request that
lands in slot ≥ 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvdiag.model.findings import Evidence, Finding, Severity
from kvdiag.model.frames import python_frame_text
from kvdiag.model.logrecords import BootConfig, Crash, LogLine, LogScan

Rule = Callable[[LogScan], Iterable[Finding]]


@dataclass(frozen=True)
class RuleInfo:
    id: str
    title: str
    fix: str
    func: Rule


REGISTRY: dict[str, RuleInfo] = {}


def rule(rule_id: str, title: str, fix: str) -> Callable[[Rule], Rule]:
    def deco(func: Rule) -> Rule:
        REGISTRY[rule_id] = RuleInfo(rule_id, title, fix, func)
        return func

    return deco


def evaluate(scan: LogScan) -> list[Finding]:
    """Every registered rule over ``scan``, in registry order."""
    out: list[Finding] = []
    for info in REGISTRY.values():
        out.extend(info.func(scan))
    return out


# -- helpers -------------------------------------------------------------------------------


def _ev(where: LogLine, text: str | None = None) -> Evidence:
    return Evidence(source=where.source, line=where.line, text=(text or where.text)[:300])


def _boot_for(scan: LogScan, crash: Crash) -> BootConfig | None:
    if crash.boot_index is not None and 0 <= crash.boot_index < len(scan.boots):
        boot = scan.boots[crash.boot_index]
        if boot.source == crash.where.source:
            return boot
    return None


def _boot_line(boot: BootConfig, *needles: str) -> Evidence | None:
    for where in boot.evidence:
        if all(n in where.text for n in needles):
            return _ev(where)
    return None


def _groups(crashes: Iterable[Crash]) -> list[list[Crash]]:
    """Crashes grouped by fingerprint, in order of first appearance."""
    groups: dict[str, list[Crash]] = {}
    for c in crashes:
        groups.setdefault(c.fingerprint or f"#{id(c)}", []).append(c)
    return list(groups.values())


def _first_app_frame(crash: Crash) -> str | None:
    """``function file:line`` of the first in-app frame (file without folders), e.g.
    ``ggml_compute_forward_dup ggml.c:4531``: the frame to blame, past libc and the abort
    machinery (``postmortem.backtrace.is_in_app`` sets ``in_app``)."""
    for fr in crash.backtrace.frames if crash.backtrace is not None else ():
        if fr.in_app and fr.function:
            loc = f" {_short(fr.file)}:{fr.line}" if fr.file else ""
            unverified = " [unverified]" if fr.unverified else ""
            return f"{fr.function}{loc}{unverified}"
    return None


def _first_python_frame(crash: Crash) -> str | None:
    """The same from the Python stack of the thread the signal hit (``postmortem.pystack``),
    for a Python embedding's death that printed no native in-app frame."""
    stack = crash.python[0] if crash.python and crash.python[0].current else None
    for fr in stack.frames if stack is not None else ():
        if fr.in_app and fr.function:
            return python_frame_text(fr)
    return None


def _crash_evidence(crash: Crash) -> list[Evidence]:
    out = [_ev(crash.where)]
    if crash.error is not None and crash.error.where != crash.where:
        out.append(_ev(crash.error.where))
    frame = _first_app_frame(crash)
    if frame is not None and crash.backtrace is not None:
        out.append(Evidence(source=crash.backtrace.where.source,
                            line=crash.backtrace.where.line, text=f"first in-app frame: {frame}"))
    py_frame = _first_python_frame(crash) if frame is None else None
    if py_frame is not None:
        where = crash.python[0].where
        out.append(Evidence(source=where.source, line=where.line,
                            text=f"first in-app Python frame: {py_frame}"))
    return out


def _short(path: str | None) -> str:
    return re.sub(r"^.*[\\/]", "", path) if path else "?"


_FITS_COND = re.compile(r"kv_stream_fattn_fits|streamed_supported|kv_stream\w*fits")
_OOM = re.compile(r"out of memory|OutOfMemory|cudaErrorMemoryAllocation|hipErrorOutOfMemory",
                  re.IGNORECASE)


def _is_fits_abort(crash: Crash) -> bool:
    cond = crash.abort.condition if crash.abort is not None else None
    return bool(cond and _FITS_COND.search(cond))


def _is_oom(crash: Crash) -> bool:
    return crash.error is not None and bool(_OOM.search(crash.error.message))


# -- rules ---------------------------------------------------------------------------------

FITS_FIX = (
    "dispatch FLASH_ATTN_EXT on the full ggml_cuda_kv_stream_fattn_fits(dst), not on buffer "
    "membership; when it is false run the ordinary flash attention on the same host-mapped "
    "tensors (zero-copy) and warn. Until then: run with --kv-unified (one stream) or -np 1."
)


@rule("kvstream-fits-dispatch-abort", "kv-stream fits/dispatch mismatch abort", FITS_FIX)
def fits_dispatch_abort(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if _is_fits_abort(c)):
        crash = group[0]
        ev = _crash_evidence(crash)
        details: dict[str, object] = {"crashes": len(group), "fingerprint": crash.fingerprint}
        boot = _boot_for(scan, crash)
        conds: list[str] = []
        if boot is not None:
            details["n_stream"] = boot.n_stream
            details["kv_unified"] = boot.kv_unified
            if boot.kv_stream:
                conds.append("streaming on")
                e = _boot_line(boot, "KV_Stream") or _boot_line(boot, "KV streaming")
                if e is not None:
                    ev.append(e)
            if boot.n_stream is not None and boot.n_stream >= 2:
                conds.append(f"{boot.n_stream} KV streams")
                e = _boot_line(boot, "seqs)")
                if e is not None:
                    ev.append(e)
        if len(crash.active_slots) >= 2:
            conds.append(f"slots {', '.join(map(str, crash.active_slots))} active together")
            details["active_slots"] = list(crash.active_slots)
            for slot in crash.active_slots:
                launches = [e for e in crash.timeline if e.slot == slot and e.kind == "launch"]
                if launches:
                    ev.append(_ev(launches[-1].where))
        geometry = [f for f in crash.fits if len(f.ne) == 4 and f.ne[3] > 1]
        identity = [f for f in crash.fits if f.kr in ("(nil)", "0x0", None) or f.kr != f.vr]
        if geometry:
            details["class"] = "geometry"
            details["fits_ne"] = list(geometry[-1].ne)
            ev.append(_ev(geometry[-1].where))
            conds.append(f"FA view ne[3] = {geometry[-1].ne[3]} (streamed kernel needs 1)")
        elif identity:
            details["class"] = "runtime identity"
            ev.append(_ev(identity[-1].where))
        details["conditions"] = conds
        title = "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) aborted the server"
        if conds:
            title += ": " + "; ".join(conds)
        yield Finding(rule="kvstream-fits-dispatch-abort", severity=Severity.CRITICAL,
                      title=title, evidence=tuple(ev), fix=FITS_FIX, details=details)


ALIAS_FIX = (
    "key resident-page bookkeeping (slots, loaded, dirty) by (layer, stream, page) instead of "
    "(layer, page); until then run streamed caches with --kv-unified or -np 1, and compare "
    "slot >= 1 outputs against a streaming-off run."
)


@rule("kvstream-multislot-aliasing-risk", "multi-slot resident page aliasing risk", ALIAS_FIX)
def multislot_aliasing(scan: LogScan) -> Iterable[Finding]:
    for first in scan.first_requests:
        if first.slot < 1 or not (0 <= first.boot_index < len(scan.boots)):
            continue
        boot = scan.boots[first.boot_index]
        streams = boot.n_stream
        if not boot.kv_stream or streams is None or streams < 2 or boot.kv_unified is True:
            continue
        ev: list[Evidence] = []
        for needles in (("KV_Stream",), ("KV streaming",), ("seqs)",), ("kv_unified",),
                        ("MULTISEQ",)):
            e = _boot_line(boot, *needles)
            if e is not None and e not in ev:
                ev.append(e)
        ev.append(_ev(first.where))
        title = (f"first request after boot ran on slot {first.slot} with {streams} KV streams "
                 "and streaming on: its reads may return slot 0's resident pages")
        # The opt-in warning's exact text is not public (domain brief §9): without it the
        # finding stays, one level lower.
        severity = Severity.ERROR if boot.multiseq_optin else Severity.WARNING
        if not boot.multiseq_optin:
            title += " (no multi-sequence opt-in line seen)"
        yield Finding(
            rule="kvstream-multislot-aliasing-risk", severity=severity, title=title,
            evidence=tuple(ev), fix=ALIAS_FIX,
            details={"slot": first.slot, "n_stream": streams, "optin": boot.multiseq_optin},
        )


OOM_FIX = (
    "reduce device memory: smaller -c/--ctx-size or -ub, fewer offloaded layers (-ngl), a "
    "smaller kv-stream pool/arena, or free the GPU from other processes"
)


@rule("cuda-oom", "GPU out of memory", OOM_FIX)
def cuda_oom(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if _is_oom(c)):
        crash = group[0]
        err = crash.error
        assert err is not None
        where = f" in {err.function}" if err.function else ""
        dev = f" on device {err.device}" if err.device is not None else ""
        yield Finding(
            rule="cuda-oom", severity=Severity.ERROR,
            title=f"{err.backend} out of memory{where}{dev}"
                  + (f" ({err.statement})" if err.statement else ""),
            evidence=tuple(_crash_evidence(crash)), fix=OOM_FIX,
            details={"crashes": len(group), "fingerprint": crash.fingerprint,
                     "function": err.function, "device": err.device},
        )
    for ev in scan.stream_events:
        if ev.kind == "alloc_failure":
            yield Finding(rule="cuda-oom", severity=Severity.ERROR,
                          title=f"kv-stream allocation failed: {ev.message[:160]}",
                          evidence=(_ev(ev.where),), fix=OOM_FIX)


def _cuda_fix(message: str) -> str:
    low = message.lower()
    if "illegal memory access" in low or "misaligned" in low or "launch failure" in low:
        return ("a kernel faulted: rerun with CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) "
                "to find the op; the named function is where the error surfaced, not "
                "necessarily where it happened")
    if "no kernel image" in low or "invalid device function" in low:
        return "rebuild for this GPU's architecture (CMAKE_CUDA_ARCHITECTURES)"
    if "unsupported" in low or "invalid argument" in low or "invalid value" in low:
        return ("the failed call got parameters the device or library rejects: check the "
                "tensor shapes/types of the op and the driver/library versions")
    return "look up the error in the CUDA runtime docs; the statement shows the failed call"


@rule("cuda-error", "GPU error in a named op", "see the finding")
def cuda_error(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if c.error is not None and not _is_oom(c)
                         and c.kind != "exception"):
        crash = group[0]
        err = crash.error
        assert err is not None
        op = f" ({err.failed_op} failed)" if err.failed_op else ""
        where = f" in {err.function}" if err.function else ""
        yield Finding(
            rule="cuda-error", severity=Severity.ERROR,
            title=f"{err.backend} error{where}: {err.message or '?'}{op}",
            evidence=tuple(_crash_evidence(crash)), fix=_cuda_fix(err.message),
            details={"crashes": len(group), "fingerprint": crash.fingerprint,
                     "function": err.function, "location": err.location,
                     "statement": err.statement, "device": err.device},
        )


@rule("ggml-assert", "ggml assert or abort", "see the condition and the first in-app frame")
def ggml_assert(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if c.abort is not None and c.error is None
                         and not _is_fits_abort(c)):
        crash = group[0]
        ab = crash.abort
        assert ab is not None
        if ab.file is None and ab.form == "libc" and ab.condition is None:
            # glibc's own fatal message: it names the cause, there is no source line
            what = f"glibc aborted: {ab.message}"
        elif ab.form == "python":
            what = f"Fatal Python error: {ab.message}"
        elif ab.condition is not None:
            what = f"assert {ab.condition} failed at {_short(ab.file)}:{ab.line}"
        elif crash.kind == "ggml_abort":
            what = f"GGML_ABORT: {ab.message} at {_short(ab.file)}:{ab.line}"
        else:
            what = f"{ab.message} failed at {_short(ab.file)}:{ab.line}"
        frame = _first_app_frame(crash)
        if frame is None and ab.form == "python":
            py_frame = _first_python_frame(crash)
            frame = f"{py_frame} (Python)" if py_frame is not None else None
        yield Finding(
            rule="ggml-assert", severity=Severity.ERROR,
            title=what + (f" (in {frame})" if frame else ""),
            evidence=tuple(_crash_evidence(crash)),
            fix=("glibc found the heap or stack corrupted (or a _FORTIFY_SOURCE overflow) "
                 "where the frames show, which is not where it was corrupted: run the server "
                 "under AddressSanitizer or valgrind to find the write"
                 if ab.file is None and ab.form == "libc" and ab.condition is None else
                 # CPython stops a process so when the C API is misused (Py_FatalError)
                 "CPython stopped the process (Py_FatalError, then abort()): most often an "
                 "extension module calling the C API wrongly (without holding the GIL, a "
                 "reference count gone wrong); the Python stack shows the call that was "
                 "running, the native backtrace where" if ab.form == "python" else
                 "unknown signature: read the condition at that line and the in-app frames; "
                 "report it upstream with this fingerprint if it is not yours"),
            details={"crashes": len(group), "fingerprint": crash.fingerprint,
                     "file": ab.file, "line": ab.line, "condition": ab.condition},
        )


@rule("segfault", "fatal signal without an assert (or a death of unknown cause)",
      "see the first in-app frame")
def segfault(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if c.kind in ("segfault", "signal", "unknown")):
        crash = group[0]
        sig = crash.signal.signal if crash.signal is not None else "fatal signal"
        windows = crash.signal.exception if crash.signal is not None else None
        frame = _first_app_frame(crash)
        has_frames = crash.backtrace is not None and bool(crash.backtrace.frames)
        py_frame = _first_python_frame(crash) if frame is None else None
        if py_frame is not None:
            frame = f"{py_frame} (Python)"
        if crash.kind == "unknown":
            # only a stack was printed before the output ended: the cause is not in the log
            title = "a death of unknown cause (a backtrace; no signal, abort or error line)"
        else:
            title = f"{sig} without an assert" if windows is None else (
                f"{sig} (Windows fatal exception: {windows}) without an assert")
        if sig == "SIGKILL":
            # SIGKILL cannot be caught: no process prints its own stack for it
            fix = ("the process was killed from outside (the kernel's OOM killer: journalctl "
                   "-k; a supervisor's timeout; a user): see what killed it and how much "
                   "memory the host had")
        else:
            fix = ("symbolize the backtrace (--binary) and inspect the first in-app frame"
                   if has_frames else
                   # nothing to symbolize: say how to get the frames the log lacks
                   f"the log holds no {'native ' if crash.python else ''}backtrace: get one "
                   + ("(the core dump: coredumpctl gdb, then bt; or the server run under gdb) "
                      "and read it with kvdiag postmortem --binary" if windows is None else
                      # Windows keeps no core: a crash dump is asked for before the crash
                      "(a crash dump: Windows Error Reporting's LocalDumps or procdump -e, "
                      "opened in WinDbg or Visual Studio with the build's .pdb)") + (
                       "; the Python stack shows only the call that entered native code"
                       if py_frame is not None else "")) + (
                "; a crash inside a GPU library usually means a bad pointer or size passed to "
                "it")
        yield Finding(
            rule="segfault", severity=Severity.ERROR,
            title=title + (f" in {frame}" if frame else ""),
            evidence=tuple(_crash_evidence(crash)),
            fix=fix,
            details={"crashes": len(group), "fingerprint": crash.fingerprint},
        )


@rule("uncaught-exception", "uncaught C++ exception", "see the exception and the first frame")
def uncaught_exception(scan: LogScan) -> Iterable[Finding]:
    for group in _groups(c for c in scan.crashes if c.kind == "exception"):
        crash = group[0]
        what = crash.error.message if crash.error is not None else "exception"
        frame = _first_app_frame(crash)
        yield Finding(
            rule="uncaught-exception", severity=Severity.ERROR,
            title=f"terminate called after throwing {what}" + (f" (in {frame})" if frame else ""),
            evidence=tuple(_crash_evidence(crash)),
            fix="catch the exception where the request is handled, or fix its cause",
            details={"crashes": len(group), "fingerprint": crash.fingerprint},
        )


@rule("kvstream-config-rejected", "kv-stream configuration rejected at boot",
      "see the message")
def config_rejected(scan: LogScan) -> Iterable[Finding]:
    for ev in scan.config_failures:
        msg = ev.message
        fix = "fix the configuration named in the message"
        if "-np 1" in msg or "sequence" in msg:
            fix = "use -np 1, or --kv-unified where the build accepts several sequences"
        elif "Flash Attention" in msg:
            fix = "enable flash attention (-fa on)"
        elif "CUDA backend" in msg:
            fix = "keep every attention layer on one CUDA device (try --fit off)"
        yield Finding(rule="kvstream-config-rejected", severity=Severity.ERROR,
                      title=f"context creation failed: {msg[:200]}",
                      evidence=(_ev(ev.where),), fix=fix)



@rule("log-bytes-replaced", "stray bytes in the log were replaced",
      "none needed; the lines are read with the bytes replaced")
def bytes_replaced(scan: LogScan) -> Iterable[Finding]:
    """NUL bytes dropped and bytes that are not UTF-8 replaced while reading (kvdiag.files.text):
    an ``info`` result in every report, so that no format hides that the text was altered."""
    for r in scan.replaced:
        yield Finding(
            rule="log-bytes-replaced", severity=Severity.INFO,
            title=f"{r.bytes:,} stray bytes replaced in {r.lines:,} line(s) of {r.source}: "
                  f"{r.nul_bytes:,} NUL dropped, {r.invalid_bytes:,} not UTF-8 replaced by "
                  f"U+FFFD",
            evidence=(Evidence(source=r.source, line=r.first_line,
                               text="first line with a replaced byte"),),
            fix="none needed: the lines are read with the bytes replaced; a NUL-filled start "
                "usually comes from logrotate's copytruncate, stray NULs from a crash mid-write",
            details={"nul_bytes": r.nul_bytes, "invalid_bytes": r.invalid_bytes,
                     "lines": r.lines, "first_line": r.first_line})
