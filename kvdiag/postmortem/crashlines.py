"""Recognisers for the lines that say how a process died (already cleaned by ``lines.clean``):
ggml aborts in the current, legacy, MSVC and libc forms and GGML_ABORT's bare
``<file>:<line>: <message>`` (domain brief §6.1), GPU errors and their detail lines (§6.5),
fatal signals in every words a handler, shell or supervisor uses, uncaught C++ exceptions and
systemd-coredump's build-ids. ``grammar.classify`` tries them with the other lines' recognisers;
``crashblock`` reads a crash's lines with them.
"""

from __future__ import annotations

import re

from kvdiag.model.logrecords import Abort, GpuError, LogLine, SignalLine
from kvdiag.postmortem import deathlines

_EXT = r"(?:c|cc|cpp|cxx|cu|cuh|h|hh|hpp|m|mm|metal|comp|inc)"

# ggml_abort's "%s:%d: " with __FILE__: an absolute path at a line's start may hold spaces
# (MSVC's C:\Users\<First Last>\…, folders with spaces); glued to other output only a Windows
# one can (a POSIX one would take in the words before it)
_GGML_ASSERT_START = re.compile(
    rf"^((?:[A-Za-z]:[\\/]|/)[^:\n]*?\.{_EXT}|[^\s:]*?\.{_EXT}):(\d+): GGML_ASSERT\((.*)\) failed")
_GGML_ASSERT_ANY = re.compile(
    rf"((?:[A-Za-z]:[\\/][^:\n]*?|/[^\s:]*?)\.{_EXT}):(\d+): GGML_ASSERT\((.*?)\) failed")
_GGML_ASSERT_BARE = re.compile(r"([^\s:]+):(\d+): GGML_ASSERT\((.*?)\) failed")
# "GGML_ASSERT: %s:%d: %s\n" with __FILE__ (ggml.h before 2024-08): the path may hold spaces
# (MSVC's C:\Users\<name with spaces>\…), so a path ending in a source extension is tried first
_LEGACY_ASSERT = re.compile(
    rf"GGML_ASSERT: ((?:[A-Za-z]:[\\/])?[^:\n]*?\.{_EXT}):(\d+): (.*)$"
    r"|GGML_ASSERT: ([^\s]+?):(\d+): (.*)$")
_MSVC_ASSERT = re.compile(r"Assertion failed: (.*), file (.+), line (\d+)")
_LIBC_ASSERT = re.compile(r"(?:^|: )(?:(\S+?):(\d+): )?(?:[^:]*: )?Assertion [`'](.*)' failed\.?")
# GGML_ABORT (upstream ggml.c ggml_abort): fflush(stdout), then "<__FILE__>:<line>: <message>"
# on stderr, so the line may be glued to model output that had no newline. __FILE__ is the
# path the compiler was given: absolute in CMake builds, POSIX or Windows (with spaces at a
# line's start; glued to other output only a Windows one may hold them).
_SRC_PATH = rf"(?:(?:[A-Za-z]:[\\/]|/)[^:\n]*?|[^\s:]*?)\.{_EXT}"
_ABORT_AT_START = re.compile(rf"^({_SRC_PATH}):(\d+): (\S.*)$")
_ABORT_GLUED = re.compile(rf"((?:[A-Za-z]:[\\/][^:\n]*?|/[^\s:]*?)\.{_EXT}):(\d+): (\S.*)$")
# A location cited inside another message ("CUDA error 2 at <file>:<line>: …"), not glued to it.
_CITES = re.compile(r"(?:^|\W)(?:at|in|from|file|see|by)\s+$|[=(\[]\s*$")
# What compilers, linkers and make print after "file:line: " (gcc without columns, GNU ld,
# nvcc): never an abort, even for a ggml source file.
_DIAGNOSTIC = re.compile(
    r"^(?:(?:fatal |internal compiler )?error|warning|note|remark|sorry)\b[^:]{0,40}:|"
    r"^(?:In (?:member |static member )?function|In file included|In instantiation|"
    r"undefined reference|multiple definition|more undefined references|first defined here|"
    r"relocation |required from|instantiated from|recipe for target|\(Each undeclared)"
)
# Messages GGML_ABORT is called with across ggml's sources (bare file names need one of these).
_ABORT_WORDS = re.compile(
    r"^(?:fatal error|not implemented|unsupported|unreachable|invalid|unknown)\b|"
    r"\b(?:not (?:supported|implemented)|(?:CUDA|ROCm|HIP|SYCL|MUSA|CANN|Vulkan|Metal|"
    r"OpenCL|cuBLAS|CUBLAS) error)\b"
)


# A runtime's own assert macro in ggml_abort's shape, from any source file: what a fork built
# without ggml prints (``<file>:<line>: KV_ASSERT(<condition>) failed``; kernels/kvtrace.h's
# KVTRACE_ABORT records the same text, docs/native-bridge.md).
_OWN_ASSERT = re.compile(r"^[A-Z][A-Z0-9_]*\((.*)\) failed$")


def _is_ggml_source(path: str) -> bool:
    """A path in ggml's or llama.cpp's source tree: a folder or file named for ggml, gguf or
    llama (``…/ggml/src/ggml-cuda/fattn.cu``, ``llama-model.cpp``, ``gguf.cpp``)."""
    for part in re.split(r"[\\/]", path.lower()):
        if "ggml" in part or "gguf" in part or part.startswith("llama"):
            return True
    return False

_GPU_ERROR = re.compile(r"\b(CUDA|ROCm|HIP|SYCL|MUSA|CANN|cuBLAS|CUBLAS) error: (.*)$")
_GPU_ERROR_OLD = re.compile(r"\b(CUDA|ROCm|HIP) error (\d+) at (\S+:\d+): (.*)$")
# the location may be a Windows path with spaces (C:\Users\Mia Chen\…\ggml-cuda.cu:2623)
_CURRENT_DEVICE = re.compile(r"current device: (-?\d+), in function (\S+) at (\S.*?:\d+)\s*$")
# ggml-cuda.cu's CUDA_CHECK before ggml_cuda_error (2023): "\nCUDA error %d at %s:%d: %s\n",
# then "current device: %d\n" alone, then exit(1) (upstream commit 3d68f36, 2023-11-13, as
# SJTU-IPADS/PowerInfer's history holds it)
_DEVICE_ALONE = re.compile(r"^current device: (-?\d+)\s*$")
_FAILED_OP = re.compile(r"^ggml_cuda_compute_forward: (\w+) failed")
# SYCL (ggml-sycl SYCL_CHECK): "SYCL error: CHECK_TRY_ERROR(<stmt>): <msg>", then
# "  in function <f> at <file:line>"; before them "Native API failed. Native API returns: <m>"
# and "Exception caught at file:<f>, line:<n>, func:<f>".
_IN_FUNCTION = re.compile(r"^\s+in function (\S+) at (\S.*:\d+)\s*$")
_NATIVE_API = re.compile(r"Native API (?:failed\. Native API )?returns: (.*)$")
_CHECK_TRY = re.compile(r"^CHECK_TRY_ERROR\((.*)\): (.*)$")

_SIGNAL = re.compile(
    r"\b(SIGSEGV|SIGBUS|SIGILL|SIGFPE|SIGABRT|SIGTRAP)\b|(Segmentation fault|Bus error|"
    r"Illegal instruction|Floating point exception)|"
    r"status=(11/SEGV|7/BUS|4/ILL|8/FPE|6/ABRT|5/TRAP|31/SYS|9/KILL)|"
    # how shells and IDEs report an abort(): bash/sh "Aborted (core dumped)" or
    # "<pid> Aborted  <cmd>", zsh "zsh: abort", macOS "Abort trap: 6", exit status 134
    # Python's faulthandler (llama-cpp-python's server) "Fatal Python error: Aborted"
    r"(Aborted \(core dumped\)|^Aborted$|\b\d+ Aborted\b|^zsh: abort\b|Abort trap: 6|"
    r"Fatal Python error: Aborted|"
    r"exit code 134\b)|"
    # the shell's words for the other fatal signals (bash's strsignal text, alone or after a
    # job's pid)
    r"(Trace/breakpoint trap|Bad system call|^Killed$|\b\d+ Killed(?: {2,}|$))"
)
# systemd-coredump's module list before its stacks: "Module <path> with build-id <hex>",
# newer versions with the package in between ("Module libc.so.6 from rpm glibc-2.38 with …").
_BUILD_ID = re.compile(r"^\s*Module (\S+) (?:from .{1,200}? )?with build-id ([0-9a-fA-F]{8,80})\b")
_PY_FATAL = "Fatal Python error: "
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']*)'")


def parse_abort(where: LogLine, text: str) -> list[Abort]:
    """Every abort in the line (two threads' aborts can be glued onto one line)."""
    out: list[Abort] = []
    if text.startswith(_PY_FATAL):
        # CPython's Py_FatalError (Python/pylifecycle.c fatal_error): "Fatal Python error:
        # <function>: <message>", the threads' stacks, then abort(); faulthandler's line for
        # a signal has the same start and is a signal, not an abort
        message = text[len(_PY_FATAL):].strip()
        if not message or parse_signal(where, text) is not None:
            return out
        return [Abort(where=where, form="python", message=message[:500])]
    if "GGML_ASSERT" in text:
        m = _GGML_ASSERT_START.match(text)
        if m is not None and ") failed" not in m.group(3):
            out.append(Abort(where=where, form="ggml", file=m.group(1), line=int(m.group(2)),
                             condition=m.group(3), message=f"GGML_ASSERT({m.group(3)}) failed"))
            return out
        for rx in (_GGML_ASSERT_ANY, _GGML_ASSERT_BARE):
            found = [
                Abort(where=where, form="ggml", file=g.group(1), line=int(g.group(2)),
                      condition=g.group(3), message=f"GGML_ASSERT({g.group(3)}) failed")
                for g in rx.finditer(text)
            ]
            if found:
                return found
        m = _LEGACY_ASSERT.search(text)
        if m is not None:
            file, num, cond = m.groups()[:3] if m.group(1) is not None else m.groups()[3:]
            out.append(Abort(where=where, form="legacy", file=file, line=int(num),
                             condition=cond.strip(), message=cond.strip()))
            return out
    if "ssert" in text:
        m = _MSVC_ASSERT.search(text)
        if m is not None:
            out.append(Abort(where=where, form="msvc", file=m.group(2), line=int(m.group(3)),
                             condition=m.group(1), message=f"Assertion failed: {m.group(1)}"))
            return out
        m = _LIBC_ASSERT.search(text)
        if m is not None:
            out.append(Abort(
                where=where, form="libc", file=m.group(1),
                line=int(m.group(2)) if m.group(2) else None,
                condition=m.group(3), message=f"Assertion `{m.group(3)}' failed",
            ))
            return out
    lf = deathlines.parse_libc_fatal(where, text)
    if lf is not None:
        return [lf]
    m = _ABORT_AT_START.match(text)
    if m is None or not _is_ggml_source(m.group(1)):
        glued = _ABORT_GLUED.search(text)
        if (glued is not None and _is_ggml_source(glued.group(1))
                and not _CITES.search(text, 0, glued.start())):
            m = glued
    if m is not None:
        msg = m.group(3).strip()
        own = _OWN_ASSERT.match(msg)
        if not _DIAGNOSTIC.match(msg) and (_is_ggml_source(m.group(1)) or own is not None
                                          or _ABORT_WORDS.search(msg)):
            out.append(Abort(where=where, form="message", file=m.group(1), line=int(m.group(2)),
                             message=msg[:500],
                             condition=None if own is None else own.group(1)[:500]))
    return out


def parse_gpu_error(where: LogLine, text: str) -> GpuError | None:
    m = _GPU_ERROR.search(text)
    if m is not None:
        message = m.group(2).strip()
        statement = None
        ct = _CHECK_TRY.match(message)
        if ct is not None:
            statement, message = f"CHECK_TRY_ERROR({ct.group(1)})", ct.group(2).strip()
        return GpuError(where=where, backend=m.group(1).replace("HIP", "ROCm"),
                        message=message, statement=statement)
    m = _GPU_ERROR_OLD.search(text)
    if m is not None:
        return GpuError(where=where, backend=m.group(1), message=m.group(4).strip(),
                        location=m.group(3))
    return None


def parse_current_device(text: str) -> tuple[int, str, str] | None:
    """The ``current device: <id>, in function <f> at <file:line>`` detail line (§6.5)."""
    m = _CURRENT_DEVICE.search(text)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), m.group(3)


def parse_device_alone(text: str) -> int | None:
    """2023's ``current device: <id>`` line after ``CUDA error <n> at <file:line>: <msg>``."""
    m = _DEVICE_ALONE.match(text)
    return int(m.group(1)) if m else None


def parse_in_function(text: str) -> tuple[str, str] | None:
    """SYCL's ``  in function <f> at <file:line>`` detail line."""
    m = _IN_FUNCTION.match(text)
    return (m.group(1), m.group(2)) if m else None


def parse_native_api(text: str) -> str | None:
    """SYCL's ``Native API failed. Native API returns: <code (name)>`` line."""
    m = _NATIVE_API.search(text)
    return m.group(1).strip() if m else None


def parse_failed_op(text: str) -> str | None:
    m = _FAILED_OP.match(text)
    return m.group(1) if m else None


def parse_signal(where: LogLine, text: str) -> SignalLine | None:
    """A line that says the process died of a signal, in any of the words above; an OOM kill
    only when the killed process is the server's (:func:`deathlines.parse_oom_kill`)."""
    m = _SIGNAL.search(text)
    if m is None:
        windows = deathlines.parse_windows_exception(text)
        if windows is not None:
            return SignalLine(where=where, signal=windows[0], exception=windows[1])
        number = deathlines.signal_number(text)
        if number is not None:
            name = deathlines.FATAL_NUMBERS.get(number)
            return SignalLine(where=where, signal=name) if name is not None else None
        oom = deathlines.parse_oom_kill(text)
        if oom is not None and deathlines.is_server_process(oom[1]):
            return SignalLine(where=where, signal="SIGKILL")
        return None
    if m.group(4):
        return SignalLine(where=where, signal="SIGABRT")
    name = m.group(1) or m.group(2) or m.group(3) or m.group(5)
    canon = {
        "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Illegal instruction": "SIGILL",
        "Floating point exception": "SIGFPE", "11/SEGV": "SIGSEGV", "7/BUS": "SIGBUS",
        "4/ILL": "SIGILL", "8/FPE": "SIGFPE", "6/ABRT": "SIGABRT",
        "Trace/breakpoint trap": "SIGTRAP", "Bad system call": "SIGSYS", "5/TRAP": "SIGTRAP",
        "31/SYS": "SIGSYS", "9/KILL": "SIGKILL",
    }.get(name, "SIGKILL" if "Killed" in name else name)
    return SignalLine(where=where, signal=canon)


def parse_build_id(text: str) -> tuple[str, str] | None:
    """``(module, build-id)`` from a systemd-coredump module line."""
    m = _BUILD_ID.match(text)
    return (m.group(1), m.group(2).lower()) if m else None


def parse_terminate(text: str) -> str | None:
    m = _TERMINATE.search(text)
    return m.group(1) if m else None
