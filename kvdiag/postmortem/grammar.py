"""Recognisers for single non-backtrace log lines (already cleaned by ``lines.clean``).

Each recogniser is a compiled regex plus a small function that builds one record; ``classify``
tries them in order of how cheap and how specific they are. Shapes and their sources:
boot and kv-stream lines (domain brief §5.1–§5.4, §7.2), slot lines (§7.3), the instrumented
``fits=false`` line (§4.5), ggml aborts in the current, legacy, MSVC and libc forms and
GGML_ABORT's bare ``<file>:<line>: <message>`` (§6.1),
GPU errors (§6.5).
"""

from __future__ import annotations

import re

from kvdiag.model.logrecords import (
    Abort,
    ConfigItem,
    FitsLine,
    GpuError,
    LogLine,
    SignalLine,
    SlotEvent,
    SlotEventKind,
    StreamEvent,
)
from kvdiag.postmortem import deathlines, serverlog

Record = ConfigItem | SlotEvent | StreamEvent | FitsLine | Abort | GpuError | SignalLine

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
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']*)'")

_SLOT = re.compile(r"^slot +([^:]{0,24}): +id +(\d+) \| task +(-?\d+) \| ?(.*)$")
# 2023 (server.cpp's LOG_TEE, before the SLT_* lines; the form kvdiag perf reads too:
# postmortem/timinglines.py): "slot 0 is processing [task id: 5]", "slot 0 released (412
# tokens in cache)"
_SLOT_2023 = re.compile(r"^slot (\d+) (?:is processing \[task id: (\d+)\]|released \((\d+) tokens)")
_SRV = re.compile(r"^srv +([^:]{0,24}): +(.*)$")

_CONFIG_EQ = re.compile(
    r"^(?:llama_context|llama_new_context_with_model|llama_init_from_model): +"
    r"(n_seq_max|n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|flash_attn|kv_unified|"
    r"causal_attn) *= *(\S+)"
)
_KV_BUFFER = re.compile(r"^llama_kv_cache\w*: +(\S+) KV buffer size = +([\d.]+) MiB")
_KV_SIZE = re.compile(
    r"^llama_kv_cache\w*: +size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +"
    r"(\d+)/(\d+) seqs\)(?:, K \((\w+)\)[^,]*, V \((\w+)\))?"
)
_KV_OLD = re.compile(
    r"^llama_kv_cache\w*: kv_size = (\d+), type_k = '(\w+)', type_v = '(\w+)', n_layer = (\d+)"
)
_STREAM_POOL = re.compile(r"KV streaming enabled, (pool|arena) = ([\d.]+) MiB")
_STREAM_VALIDATED = re.compile(r"KV streaming config validated, pool = ([\d.]+) MiB")
_STREAM_POOL_CREATED = re.compile(r"pool created: ([\d.]+) MiB, (\d+) layer")
_STREAM_G2 = re.compile(r"KV stream bootstrap pool ([\d.]+) MiB")
_STREAM_FILTER = re.compile(r"KV streaming device filter = (\S+) \((\d+) layers?\)")
_STREAM_ARENA_SKIP = re.compile(r"skipping device-memory auto-fit because a shared KV")
_MULTISEQ = re.compile(r"LLAMA_KV_STREAM_ALLOW_MULTISEQ")
_N_PARALLEL = re.compile(r"using n_parallel = (\d+) and kv_unified = (true|false)")
_MODEL_LOAD = re.compile(r"loading model '([^']+)'")
_MODEL_META = re.compile(r"^llama_model_loader: loaded meta data with .* from (.+?) \(version")
_CONSTRUCT = re.compile(r"^llama_context: constructing llama_context")
_LISTENING = re.compile(r"server is listening on|all slots are idle|model loaded")
# 2023's LOG_TEE "\nllama server listening at http://%s:%d\n\n", printed in main after the model
# loaded (examples/server/server.cpp in SJTU-IPADS/PowerInfer's December 2023 copy)
_READY_2023 = "llama server listening at "

_ADAPT = re.compile(
    r"adaptive KV partition: resident pages/layer (\d+) -> (\d+), ring slots (\d+) -> (\d+)"
    r"(?:, miss ([\d.]+)%)?(?:, copy busy ([\d.]+)%)?"
)
_ADAPT_TRACE = re.compile(r"^kv_stream_adapt: active \d+")
_LAYOUT_REV = re.compile(r"KV layout revision (\d+)")
_FEEDBACK = re.compile(r"ignoring invalid (?:CUDA|partition) feedback: (.*)$")
_PUBLISH = re.compile(r"failed to publish CUDA KV decode layout")
_LATENCY = re.compile(r"transfer_ring_observe_decode_latency: selected (\w+)")
_INIT_FAIL = re.compile(r"failed to initialize the context: (.*)$")
_ALLOC_FAIL = re.compile(
    r"(kv_stream\w*|phase_arena\w*): allocating ([\d.]+) MiB .*failed: (.*)$"
)
_STREAM_WARN = re.compile(r"phase arena (?:currently supports TG1|decode batch too wide).*")
_NUM_PAIR = re.compile(r"([a-z][a-z /_-]*?) (-?[\d.]+)%?(?=,|$)")

# A fallback warning of the dispatcher: a line in kv-stream's own words (a generic flash-attention
# fallback at boot is not the dispatcher's) that says it falls back; the port's text is not
# public (brief §3, §9), so the words are matched loosely.
_FALLBACK = re.compile(r"fall(?:ing|s)?[ -]?back", re.IGNORECASE)
_FALLBACK_CONTEXT = re.compile(r"kv.?stream|\bfits\b", re.IGNORECASE)
_LAYER = re.compile(r"\blayer (\d+)\b")

_FITS = re.compile(r"\bfits=false\b:?(.*)$")
_FITS_NE = re.compile(r"\bne=\[([-\d, ]+)\]")
_FITS_KV = re.compile(r"\b(dst|type|k|kbuf|v|kr|vr)=(\"[^\"]*\"|\S+)")


def _slot_kind(msg: str) -> SlotEventKind | None:
    if "processing task" in msg or "is processing" in msg:
        return "launch"
    if msg.startswith("new prompt"):
        return "new_prompt"
    if "stop processing" in msg or "released" in msg:
        return "release"
    if "prompt done" in msg:
        return "prompt_done"
    if "prompt processing" in msg:
        return "progress"
    if msg.startswith("selected slot"):
        return "select"
    if "n_past =" in msg or "memory_seq_rm" in msg or "kv cache rm" in msg:
        return "cache"
    if "time =" in msg or msg.strip() == "":
        return "timing"
    return None


_INT_FIELD = re.compile(r"(?<![\w.])(task\.n_tokens|n_tokens|n_past|n_prompt_tokens) = (\d+)")
_PROGRESS = re.compile(r"progress = ([\d.]+)")


def parse_slot(where: LogLine, text: str) -> SlotEvent | None:
    """A ``slot <func>: id <n> | task <t> | <msg>`` line, 2023's ``slot <n> is processing``
    form, or 2024's ``server_log`` form (text or JSON: :mod:`kvdiag.postmortem.serverlog`)."""
    task: int | None
    logged: serverlog.ServerLogSlot | None = None
    m = _SLOT.match(text)
    old = None if m is not None else _SLOT_2023.match(text)
    if m is not None:
        slot, task, msg = int(m.group(2)), int(m.group(3)), m.group(4)
    elif old is not None:
        slot, msg = int(old.group(1)), text[old.end(1) + 1:]
        task = int(old.group(2)) if old.group(2) is not None else None
    else:
        logged = serverlog.parse(text)
        if logged is None:
            return None
        slot, task, msg = logged.slot, logged.task, logged.message
    kind = _slot_kind(msg)
    if kind is None:
        return None
    fields = {k: int(v) for k, v in _INT_FIELD.findall(msg)}
    if logged is not None:
        # the 2024 form keeps its figures in keys: "kv cache rm" p0 is what the cache kept,
        # "slot released" n_past the depth reached
        fields.update(logged.ints)
        if "p0" in fields:
            fields.setdefault("n_past", fields["p0"])
    n_tokens = fields.get("task.n_tokens", fields.get("n_prompt_tokens", fields.get("n_tokens")))
    n_past = fields.get("n_past")
    if old is not None and old.group(3) is not None:
        n_past = int(old.group(3))  # the tokens in cache at the release: the depth reached
    if kind == "cache" and n_past is None:
        n_past = fields.get("n_tokens")
    pm = _PROGRESS.search(msg)
    return SlotEvent(
        where=where,
        kind=kind,
        slot=slot,
        task=task if task is None or task >= 0 else None,
        n_tokens=n_tokens,
        n_past=n_past,
        progress=float(pm.group(1)) if pm else None,
        message=msg.strip()[:200],
    )


def _parse_srv(where: LogLine, text: str) -> SlotEvent | None:
    m = _SRV.match(text)
    if m is None:
        return None
    msg = m.group(2)
    if "all slots are idle" in msg:
        return SlotEvent(where=where, kind="idle", message=msg.strip())
    if msg.startswith("done request:") or msg.startswith("request:"):
        return SlotEvent(where=where, kind="request_done", message=msg.strip()[:200])
    return None


def _num(text: str) -> int | float:
    return float(text) if "." in text else int(text)


def _parse_config(where: LogLine, text: str) -> list[ConfigItem]:
    out: list[ConfigItem] = []

    def item(key: str, value: str | int | float | bool) -> None:
        out.append(ConfigItem(where=where, key=key, value=value))

    if text.startswith("llama_"):
        m = _CONFIG_EQ.match(text)
        if m is not None:
            key, raw = m.group(1), m.group(2)
            key = "n_ctx_seq" if key == "n_ctx_per_seq" else key
            if key == "kv_unified":
                item(key, raw == "true" or raw == "1")
            elif key == "flash_attn":
                item(key, {"0": "disabled", "1": "enabled"}.get(raw, raw))
            elif raw.lstrip("-").isdigit():
                item(key, int(raw))
            return out
        if _CONSTRUCT.match(text):
            item("construct", True)
            return out
        m = _KV_BUFFER.match(text)
        if m is not None:
            item(f"kv_buffer:{m.group(1)}", float(m.group(2)))
            if "KV_Stream" in m.group(1):
                item("kv_stream", True)
            return out
        m = _KV_SIZE.match(text)
        if m is not None:
            item("kv_cells", int(m.group(2)))
            item("n_layer", int(m.group(3)))
            item("n_seq_max", int(m.group(4)))
            item("n_stream", int(m.group(5)))
            if m.group(6):
                item("type_k", m.group(6))
                item("type_v", m.group(7))
            return out
        m = _KV_OLD.match(text)
        if m is not None:
            item("kv_cells", int(m.group(1)))
            item("type_k", m.group(2))
            item("type_v", m.group(3))
            item("n_layer", int(m.group(4)))
            return out
        m = _MODEL_META.match(text)
        if m is not None:
            item("model", m.group(1))
    m = _STREAM_POOL.search(text)
    if m is not None:
        item("kv_stream", True)
        item(f"kv_stream_{m.group(1)}_mib", float(m.group(2)))
        return out
    m = _STREAM_VALIDATED.search(text) or _STREAM_G2.search(text)
    if m is not None:
        item("kv_stream", True)
        item("kv_stream_pool_mib", float(m.group(1)))
        return out
    m = _STREAM_POOL_CREATED.search(text)
    if m is not None:
        item("kv_stream", True)
        item("kv_stream_pool_mib", float(m.group(1)))
        item("kv_stream_layers", int(m.group(2)))
        return out
    m = _STREAM_FILTER.search(text)
    if m is not None:
        item("kv_stream_device", m.group(1))
        item("kv_stream_layers", int(m.group(2)))
        return out
    if _STREAM_ARENA_SKIP.search(text):
        item("kv_stream", True)
        return out
    if _MULTISEQ.search(text) and "fail" not in text:
        item("multiseq_optin", True)
        return out
    m = _N_PARALLEL.search(text)
    if m is not None:
        item("n_parallel", int(m.group(1)))
        item("kv_unified", m.group(2) == "true")
        return out
    m = _MODEL_LOAD.search(text)
    if m is not None:
        item("model", m.group(1))
        return out
    if ((_LISTENING.search(text) and text.startswith(("srv", "main:", "llama_server")))
            or text.startswith(_READY_2023) or serverlog.is_ready(text)):
        item("ready", True)
    return out


def _parse_stream(where: LogLine, text: str) -> StreamEvent | None:
    if "stream" in text or "KV" in text or "arena" in text:
        m = _ADAPT.search(text)
        if m is not None:
            values: dict[str, float] = {
                "resident_from": float(m.group(1)),
                "resident_to": float(m.group(2)),
                "ring_from": float(m.group(3)),
                "ring_to": float(m.group(4)),
            }
            if m.group(5):
                values["miss_pct"] = float(m.group(5))
            if m.group(6):
                values["copy_busy_pct"] = float(m.group(6))
            return StreamEvent(where=where, kind="repartition", message=text, values=values)
        if _ADAPT_TRACE.match(text) or _LAYOUT_REV.search(text):
            body = text.split(":", 1)[1]
            vals = {k.strip().replace(" ", "_"): float(v) for k, v in _NUM_PAIR.findall(body)}
            return StreamEvent(where=where, kind="trace", message=text, values=vals)
        m = _FEEDBACK.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="feedback_error", message=m.group(1))
        if _PUBLISH.search(text):
            return StreamEvent(where=where, kind="layout_error", message=text)
        m = _LATENCY.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="latency", message=m.group(1))
        m = _ALLOC_FAIL.search(text)
        if m is not None:
            return StreamEvent(
                where=where, kind="alloc_failure", message=text,
                values={"mib": float(m.group(2))},
            )
        m = _STREAM_WARN.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="warning", message=m.group(0))
    m = _INIT_FAIL.search(text)
    if m is not None:
        return StreamEvent(where=where, kind="config_failure", message=m.group(1).strip())
    return None


def parse_abort(where: LogLine, text: str) -> list[Abort]:
    """Every abort in the line (two threads' aborts can be glued onto one line)."""
    out: list[Abort] = []
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


def is_fallback_warning(text: str) -> bool:
    """A kv-stream line that says the dispatcher falls back (to ordinary flash attention over
    the host buffer, brief §3)."""
    return _FALLBACK.search(text) is not None and _FALLBACK_CONTEXT.search(text) is not None


def layer_of(text: str) -> int | None:
    """The ``layer <n>`` a line names, if any."""
    m = _LAYER.search(text)
    return int(m.group(1)) if m else None


def parse_fits(where: LogLine, text: str) -> FitsLine | None:
    m = _FITS.search(text)
    if m is None:
        return None
    body = m.group(1)
    ne_m = _FITS_NE.search(body)
    ne: tuple[int, ...] = ()
    if ne_m is not None:
        try:
            ne = tuple(int(x) for x in ne_m.group(1).replace(" ", "").split(",") if x)
        except ValueError:
            ne = ()
    kv = {k: v.strip('"') for k, v in _FITS_KV.findall(body)}
    return FitsLine(where=where, ne=ne, type=kv.get("type"), dst=kv.get("dst"), k=kv.get("k"),
                    kbuf=kv.get("kbuf"), vbuf=kv.get("v"), kr=kv.get("kr"), vr=kv.get("vr"))


def classify(where: LogLine, text: str) -> list[Record]:
    """All records one cleaned line yields (usually zero or one)."""
    out: list[Record] = []
    if text.startswith("slot ") or serverlog.mentions(text):
        ev = parse_slot(where, text)
        if ev is not None:
            return [ev]
    if text.startswith("srv "):
        ev = _parse_srv(where, text)
        if ev is not None:
            return [ev]
    if "fits=false" in text:
        fl = parse_fits(where, text)
        if fl is not None:
            return [fl]
    aborts = parse_abort(where, text)
    if aborts:
        out.extend(aborts)
    err = parse_gpu_error(where, text)
    if err is not None:
        out.append(err)
    if out:
        return out
    st = _parse_stream(where, text)
    if st is not None:
        return [st]
    items = _parse_config(where, text)
    if items:
        return list(items)
    sig = parse_signal(where, text)
    if sig is not None:
        return [sig]
    return out
