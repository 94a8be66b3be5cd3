"""Records parsed from llama-server style logs, for post-mortem analysis.

Every record keeps where it came from (``LogLine``: source name, 1-based line number and the
cleaned text, capped) so that findings can cite their evidence. The shapes these records are
read from are listed in the kv-stream domain brief, §5 (runtime lines), §6 (aborts, backtraces,
CUDA errors) and §7 (server lines).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kvdiag.model.frames import Frame

SlotEventKind = Literal[
    "select",
    "launch",
    "new_prompt",
    "cache",
    "progress",
    "prompt_done",
    "timing",
    "release",
    "idle",
    "request_done",
]
AbortForm = Literal["ggml", "legacy", "msvc", "libc", "message", "python"]
CrashKind = Literal["assert", "abort", "ggml_abort", "cuda_error", "segfault", "signal",
                    "exception", "unknown"]
"""``unknown``: a process death the log shows only by a backtrace (no signal, abort, error or
exception line, and no frame of the abort machinery): its cause is not in the log."""
BacktraceForm = Literal["gdb", "glibc", "lldb", "macos", "coredump", "android"]
StreamEventKind = Literal[
    "repartition", "trace", "feedback_error", "layout_error", "latency", "config_failure",
    "alloc_failure", "warning",
]


class LogLine(msgspec.Struct, frozen=True):
    """One physical line of a log: where it is and what it said (prefixes removed)."""

    source: str
    line: int
    text: str


class ConfigItem(msgspec.Struct, frozen=True, omit_defaults=True):
    """One boot-time fact, e.g. ``n_ctx = 8192``; folded into ``BootConfig`` by the driver."""

    where: LogLine
    key: str
    value: str | int | float | bool


class BootConfig(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the server reported while it started (§5.1, §7.2).

    ``n_stream`` comes from the ``<n_seq_max>/<n_stream> seqs`` field of the KV size line;
    ``kv_buffers`` maps buffer type name (``CUDA0``, ``CUDA_KV_Stream_Host``) to MiB.
    """

    source: str
    line: int
    model: str | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_seq_max: int | None = None
    n_stream: int | None = None
    n_parallel: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn: str | None = None
    kv_unified: bool | None = None
    type_k: str | None = None
    type_v: str | None = None
    kv_cells: int | None = None
    n_layer: int | None = None
    kv_buffers: dict[str, float] = msgspec.field(default_factory=dict)
    kv_stream: bool = False
    kv_stream_pool_mib: float | None = None
    kv_stream_arena_mib: float | None = None
    kv_stream_device: str | None = None
    kv_stream_layers: int | None = None
    multiseq_optin: bool = False
    evidence: tuple[LogLine, ...] = ()


class SlotEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """A server slot line (§7.3). ``slot``/``task`` are None for server-wide lines."""

    where: LogLine
    kind: SlotEventKind
    slot: int | None = None
    task: int | None = None
    n_tokens: int | None = None
    n_past: int | None = None
    progress: float | None = None
    message: str = ""


class StreamEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """A kv-stream runtime line: repartition/trace (§5.3), config or allocation failure (§5.2)."""

    where: LogLine
    kind: StreamEventKind
    message: str
    values: dict[str, float] = msgspec.field(default_factory=dict)


class FitsLine(msgspec.Struct, frozen=True, omit_defaults=True):
    """The instrumented ``fits=false`` line (§4.5); ``ne`` is the FA result shape."""

    where: LogLine
    ne: tuple[int, ...] = ()
    type: str | None = None
    dst: str | None = None
    k: str | None = None
    kbuf: str | None = None
    vbuf: str | None = None
    kr: str | None = None
    vr: str | None = None


class Abort(msgspec.Struct, frozen=True, omit_defaults=True):
    """An assert or abort line (§6.1). ``condition`` is set for assert forms."""

    where: LogLine
    form: AbortForm
    file: str | None = None
    line: int | None = None
    message: str = ""
    condition: str | None = None


class GpuError(msgspec.Struct, frozen=True, omit_defaults=True):
    """A CUDA/ROCm/SYCL error (§6.5): the message, then device/function/location, statement."""

    where: LogLine
    backend: str
    message: str
    device: int | None = None
    function: str | None = None
    location: str | None = None
    statement: str | None = None
    failed_op: str | None = None

    def place(self) -> str:
        """``device <id>, in <function> at <file:line>``, of what the log gave (2023's
        ``CUDA_CHECK`` named no function; ``""`` when none)."""
        where = " ".join(x for x in (None if self.function is None else f"in {self.function}",
                                     None if self.location is None else f"at {self.location}")
                         if x)
        return ", ".join(x for x in (
            None if self.device is None else f"device {self.device}", where) if x)


class SignalLine(msgspec.Struct, frozen=True, omit_defaults=True):
    """A fatal signal reported without an abort line (segfault and friends)."""

    where: LogLine
    signal: str
    #: the Windows exception CPython's faulthandler named (``access violation``, ``code
    #: 0xc0000409``) when the death was one; ``signal`` is then its POSIX equivalent
    exception: str | None = None


class Backtrace(msgspec.Struct, frozen=True, omit_defaults=True):
    """One thread's stack as printed by gdb, glibc, lldb or macOS (§6.2–§6.4)."""

    where: LogLine
    form: BacktraceForm
    frames: tuple[Frame, ...] = ()
    thread: str | None = None
    notes: tuple[str, ...] = ()
    #: Per frame, the raw ``(symbol, offset)`` of a glibc ``module(symbol+0xOFF)`` frame.
    symrefs: tuple[tuple[str, int] | None, ...] = ()


class PythonStack(msgspec.Struct, frozen=True, omit_defaults=True):
    """One thread's Python stack as CPython's faulthandler prints it on a fatal signal
    (``postmortem.pystack``): ``frames`` innermost first, each with ``file``, ``line`` and
    ``function`` and no module or address (nothing to symbolize)."""

    where: LogLine
    #: the thread id as printed (``0x00007f3b8a242740``); None for ``Stack (most recent call
    #: first):``, faulthandler's form for one thread
    thread: str | None = None
    #: ``Current thread`` (or the one-thread ``Stack``): the thread the signal hit
    current: bool = False
    #: the thread's name, which 3.14 prints after the id (``Thread 0x… [Thread-8]``)
    name: str | None = None
    frames: tuple[Frame, ...] = ()
    #: what faulthandler said instead of or beside frames (``Garbage-collecting``, ``<no Python
    #: frame>``, a cut after 100 frames)
    notes: tuple[str, ...] = ()


class Crash(msgspec.Struct, frozen=True, omit_defaults=True):
    """One process death: the abort and/or error and/or signal, and the stack it printed."""

    where: LogLine
    kind: CrashKind
    abort: Abort | None = None
    error: GpuError | None = None
    signal: SignalLine | None = None
    backtrace: Backtrace | None = None
    fingerprint: str = ""
    boot_index: int | None = None
    active_slots: tuple[int, ...] = ()
    timeline: tuple[SlotEvent, ...] = ()
    fits: tuple[FitsLine, ...] = ()
    #: the Python threads' stacks of the same death (an embedding such as llama-cpp-python
    #: with faulthandler on), the thread the signal hit first
    python: tuple[PythonStack, ...] = ()


class Problem(msgspec.Struct, frozen=True, omit_defaults=True):
    """Something in the input that could not be read as it should (reported, not fatal)."""

    source: str
    message: str
    line: int | None = None
    #: a stable name for the kind of problem where tools may act on it (``binary-mismatch``)
    code: str | None = None


class Replaced(msgspec.Struct, frozen=True, omit_defaults=True):
    """Stray bytes a log reader replaced in one source (kvdiag.files.text): NUL bytes dropped,
    bytes that are not UTF-8 turned into U+FFFD, how many lines held either, the first one."""

    source: str
    nul_bytes: int = 0
    invalid_bytes: int = 0
    lines: int = 0
    first_line: int | None = None

    @property
    def bytes(self) -> int:
        return self.nul_bytes + self.invalid_bytes


class BinaryUse(msgspec.Struct, frozen=True, omit_defaults=True):
    """A binary the symbolizer used: given with ``--binary`` (``origin`` "option") or found on
    this machine at the path the log printed for a module (``origin`` "logged-path")."""

    path: str
    origin: Literal["option", "logged-path"]
    #: why it was trusted: "build-id" (matches the log's), "frames" (the log's frames of its
    #: module pass the checks of ``postmortem.binaries``), or "unchecked" (nothing in the log
    #: could be checked: the frames it symbolized are ``unverified``)
    checked_by: Literal["build-id", "frames", "unchecked"] = "unchecked"
    #: what was checked and what could not be, in words
    evidence: str = ""


class FirstRequest(msgspec.Struct, frozen=True):
    """The first task a boot launched: which slot took it (the aliasing rule needs slot ≥ 1)."""

    where: LogLine
    slot: int
    task: int | None
    boot_index: int


class LogScan(msgspec.Struct, frozen=True, omit_defaults=True):
    """Everything the post-mortem driver kept from one or more logs (bounded in size)."""

    sources: tuple[str, ...] = ()
    boots: tuple[BootConfig, ...] = ()
    first_requests: tuple[FirstRequest, ...] = ()
    crashes: tuple[Crash, ...] = ()
    stream_events: tuple[StreamEvent, ...] = ()
    stream_event_count: int = 0
    fits: tuple[FitsLine, ...] = ()
    config_failures: tuple[StreamEvent, ...] = ()
    slot_events_tail: tuple[SlotEvent, ...] = ()
    problems: tuple[Problem, ...] = ()
    lines: int = 0
    bytes: int = 0
    #: ``(module as printed, build-id hex)`` pairs the log states (systemd-coredump's
    #: "Module <m> with build-id <id>")
    build_ids: tuple[tuple[str, str], ...] = ()
    #: binaries the frames were symbolized with
    binaries: tuple[BinaryUse, ...] = ()
    #: stray bytes replaced while reading, per source that had any
    replaced: tuple[Replaced, ...] = ()
