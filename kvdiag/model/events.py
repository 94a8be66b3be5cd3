"""Trace events (format v1): the contract between capture and everything after it.

Every event carries ``seq`` (1-based, strictly increasing in a file), ``t_ns`` (monotonic
nanoseconds since capture start) and ``step`` (decode/ubatch step, 0-based). On disk each is one
JSON object per line with a ``kind`` tag; see docs/trace-format.md for the field reference.

Page ranges are half-open ``[begin, end)`` so a read of 512 pages costs one range, not 512
events.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from kvdiag.model.conditions import canonical_all
from kvdiag.model.frames import Frame
from kvdiag.model.geometry import Tensor

Route = Literal["streamed", "fallback", "abort", "ordinary"]
Source = Literal["pool", "ring", "host"]
ReadClass = Literal["exact", "stale", "foreign"]


class Event(msgspec.Struct, frozen=True, tag_field="kind", omit_defaults=True, gc=False):
    """Common header of every event.

    Events are not tracked by Python's cyclic garbage collector (``gc=False``): they hold only
    numbers, strings and tuples of other such structs, so they cannot form a reference cycle,
    and a reader holding thousands of them (the judgement judges chunks of events) would
    otherwise have the collector walk them over and over."""

    seq: int
    t_ns: int
    step: int


class Step(Event, tag="step", frozen=True):
    """A ubatch begins. ``tokens`` is the number of query tokens per stream in the ubatch."""

    phase: Literal["prefill", "decode"]
    streams: tuple[int, ...]
    tokens: int
    n_kv: int
    slots: tuple[int, ...] = ()


class Learn(Event, tag="learn", frozen=True):
    """The resident cache assigned a layer number to a K view pointer (or cleared its maps)."""

    layer: int
    k_ptr: int
    relearn: bool = False


class Fits(Event, tag="fits", frozen=True):
    """One ``ggml_cuda_kv_stream_fattn_fits(dst)`` decision and the route the dispatcher took."""

    node: str
    layer: int
    q: Tensor
    k: Tensor
    v: Tensor
    dst: Tensor
    stage_bytes: int
    result: bool
    route: Route
    failed: tuple[str, ...] = ()
    mask: Tensor | None = None
    membership: bool = False
    evaluated: bool = True
    """False when the writer (a fork through kvtrace.h) did not compute the failed conditions:
    ``failed`` is then empty and kvdiag evaluates them from the logged geometry (1.1)."""

    def __post_init__(self) -> None:
        # A fork names the conditions in its own spelling ("Q->ne[3] == 1"); every reader of
        # the event sees the canonical names (kvdiag.model.conditions.canonical). msgspec
        # calls this after decoding too, so the trace reader and the TUI's indexer get it.
        if self.failed:
            names = canonical_all(self.failed)
            if names is not self.failed:
                msgspec.structs.force_setattr(self, "failed", names)


class Write(Event, tag="write", frozen=True):
    """SET_ROWS of one ubatch into one layer and stream of the host store.

    ``cells`` is the stream-local cell range written, ``rows`` the global row range
    (stream × kv_size + cell) that the runtime hands to mark_dirty_rows, and ``dirty`` the
    bookkeeping keys that *this write's rows* marked: ``[layer, stream, page]`` with stream
    None for the shared (layer, page) layout. ``versions`` is the model's annotation of each
    page's host version after the write; analysis derives versions without it.
    """

    layer: int
    stream: int
    cells: tuple[int, int]
    rows: tuple[int, int]
    dirty: tuple[tuple[int, int | None, int], ...] = ()
    versions: tuple[tuple[int, int], ...] = ()


class Mark(Event, tag="mark", frozen=True):
    """One mark_dirty_rows call (once per ubatch, before its writes; brief §4.3), 1.1.

    ``rows`` are the global row runs as given, ``keys`` the bookkeeping keys marked,
    ``all`` that a negative row made every page dirty, and ``outside`` the ``[stream, page]``
    pairs the rows fell in that lie outside every layer's resident window: their resident
    copies are not refreshed by this mark.
    """

    rows: tuple[tuple[int, int], ...]
    keys: tuple[tuple[int, int | None, int], ...] = ()
    all: bool = False
    outside: tuple[tuple[int | None, int], ...] = ()


class Upload(Event, tag="upload", frozen=True):
    """Host → device copy of consecutive pages of one layer view (one batched copy)."""

    layer: int
    stream: int
    pages: tuple[int, int]
    slot: int
    target: Literal["resident", "ring"]
    bytes: int | None
    """Bytes copied; null — or negative, a writer's "unknown" — when the writer does not know
    (kernels/kvtrace.h writes a negative count as null, as it does every unknown count)."""
    reason: Literal["miss", "dirty", "wide-query", "last-chunk", "ring"]
    key_stream: int | None = None


class Evict(Event, tag="evict", frozen=True):
    """A resident slot lost the content it held (replaced or invalidated)."""

    slot: int
    layer: int
    page: int
    stream: int
    bytes: int
    reason: str


class Invalidate(Event, tag="invalidate", frozen=True):
    """The resident cache was cleared wholesale: loaded/dirty flags, pointer maps, next_layer
    (reconfigure, repartition, layout change, resize, buffer clear; brief §1.5), 1.1."""

    reason: str
    generation: int | None = None


class ReadRange(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Pages ``[begin, end)`` read from one source whose bytes were written by ``holder``."""

    begin: int
    end: int
    source: Source
    holder: int
    cls: ReadClass
    version_lag: int = 0


class Served(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Pages ``[begin, end)`` served from ``source``; ``slot`` is the pool or ring slot of
    ``begin`` (consecutive pages in consecutive slots), -1 for the host store (1.1)."""

    begin: int
    end: int
    source: Source
    slot: int


class Read(Event, tag="read", frozen=True):
    """What one streamed attention read for one layer and stream.

    ``served`` is the raw fact (where each page came from, 1.1); ``ranges`` the model's
    provenance annotation, absent from native traces. Analysis derives provenance from
    ``served`` and the write/upload/invalidate events."""

    layer: int
    stream: int
    pool: int
    ring: int
    host: int
    ranges: tuple[ReadRange, ...] = ()
    served: tuple[Served, ...] = ()


class PyFrame(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One Python frame as CPython's faulthandler printed it (``File "f", line N in func``;
    ``???`` is null). ``in_app``: false for CPython's own library and frozen modules, decided
    where the stack was read (kvdiag.postmortem.pystack.is_in_app)."""

    function: str | None = None
    file: str | None = None
    line: int | None = None
    in_app: bool = True


class PyStack(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One thread's Python stack of an abort (1.3): a Python embedding's faulthandler dump
    (``Current thread 0x… (most recent call first):``), frames innermost first."""

    #: the thread id as printed (``0x00007f3b8a242740``); null for faulthandler's one-thread
    #: ``Stack (most recent call first):``
    thread: str | None = None
    #: the thread's name (3.14 prints it after the id)
    name: str | None = None
    #: the thread the signal hit (``Current thread``)
    current: bool = False
    frames: tuple[PyFrame, ...] = ()
    #: what faulthandler said instead of or beside frames, in words
    notes: tuple[str, ...] = ()

    def as_frames(self) -> tuple[Frame, ...]:
        """The frames as :class:`~kvdiag.model.frames.Frame` (numbered from 0), the shape every
        stack view draws."""
        return tuple(Frame(index=i, function=f.function, file=f.file, line=f.line,
                           in_app=f.in_app) for i, f in enumerate(self.frames))


class Abort(Event, tag="abort", frozen=True):
    """A modelled or real abort: ggml_abort text, or a CUDA error. ``python_stacks`` (1.3):
    the Python threads' stacks of the same death, the thread the signal hit first."""

    message: str
    file: str = ""
    line: int = 0
    condition: str = ""
    backtrace: tuple[str, ...] = ()
    cuda_error: str | None = None
    python_stacks: tuple[PyStack, ...] = ()


class Warn(Event, tag="warn", frozen=True):
    message: str
    code: str = ""
    layer: int | None = None


class Output(Event, tag="output", frozen=True):
    """Attention output of one stream at one step (all layers), against the resident reference.

    ``checksum``/``ref_checksum`` are CRC-32 of the float32 outputs of every layer in graph
    order; ``worst_layer`` is the layer with the largest ``max_abs_delta``. A native trace
    may record only ``checksum`` (1.1): no reference, so divergence is "not recorded".
    """

    stream: int
    checksum: str
    ref_checksum: str = ""
    max_abs_delta: float | None = None
    tolerance: float | None = None
    worst_layer: int | None = None

    @property
    def diverged(self) -> bool | None:
        """max |Δ| above the tolerance; None when the writer recorded no reference."""
        if self.max_abs_delta is None or self.tolerance is None:
            return None
        return self.max_abs_delta > self.tolerance


class Repartition(Event, tag="repartition", frozen=True):
    """kv_stream_adapt moved the resident/ring boundary (brief §1.10, §5.3), 1.1:
    resident pages per layer and ring slots before and after."""

    resident: tuple[int, int]
    ring: tuple[int, int]
    miss_pct: float | None = None
    busy_pct: float | None = None
    reason: str = ""


class Adapt(Event, tag="adapt", frozen=True):
    """One kv_stream_adapt trace line (``LLAMA_KV_STREAM_TRACE``; brief §5.3), 1.1."""

    active: int
    resident: int
    ring: int
    samples: int | None = None
    misses: int | None = None
    busy_pct: float | None = None
    peak: int | None = None
    layout: int | None = None
    skipped: int | None = None
    resident_attended: int | None = None
    eval_us: float | None = None
    """The evaluation's attention time, measured or modelled (kvdiag's addition)."""


class Telemetry(Event, tag="telemetry", frozen=True):
    """One NVML sample. Fields NVML could not provide are absent."""

    mem_used: int | None = None
    mem_total: int | None = None
    gpu_util: int | None = None
    mem_util: int | None = None
    pcie_rx_kbps: int | None = None
    pcie_tx_kbps: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None


class Kernel(Event, tag="kernel", frozen=True):
    """Device-side records of one kernel for one layer and stream, drained from the GPU event
    ring after a step (CuPy executor only): the pages its blocks read (attention) or wrote
    (set_rows), as ranges ``[begin, end, source, slot]`` where ``slot`` is the pool slot of
    ``begin`` (consecutive pages in consecutive slots share a range) or -1 for the host store.
    ``records`` counts the raw records behind the event; ``dropped`` the records a full ring
    lost in the same drain."""

    name: str
    layer: int
    stream: int
    ranges: tuple[tuple[int, int, str, int], ...] = ()
    records: int = 0
    dropped: int = 0


class Records(Event, tag="records", frozen=True):
    """More kinds the process can write from now on (1.2): a native writer's shared object
    loaded after the header line, or a late ``KVTRACE_DECLARE``. They add to the header's
    ``records`` (kernels/kvtrace.h, kvtrace_12_add_records)."""

    kinds: tuple[str, ...]


class Timing(Event, tag="timing", frozen=True):
    """One request a server slot completed: its ``print_timing`` figures and its depth
    (brief §7.3), 1.2. ``kvdiag import`` writes one per request of a llama-server log at the
    time of its ``eval time`` line; ``started_ns`` is the time of its ``new prompt`` line, so
    that the kv-stream events in between are known to have happened while it was in flight.
    ``graphs_reused`` is the printed cumulative count of the context (per request: the
    difference to the previous timing of the same ``boot``)."""

    prompt_tokens: int
    prompt_ms: float
    decode_tokens: int
    decode_ms: float
    slot: int | None = None
    task: int | None = None
    prompt_tps: float | None = None
    decode_tps: float | None = None
    ms_per_token: float | None = None
    depth_start: int | None = None
    depth_end: int | None = None
    cached: int | None = None
    n_ctx_slot: int | None = None
    truncated: bool | None = None
    graphs_reused: int | None = None
    boot: int = 0
    started_ns: int | None = None


class HostVersions(msgspec.Struct, frozen=True, array_like=True):
    """``[layer, stream, page, [version, ...]]``: the host versions of pages ``page``,
    ``page + 1``, ... of one view (pages never written are 0 and may be left out)."""

    layer: int
    stream: int
    page: int
    versions: tuple[int, ...]


class SlotCopies(msgspec.Struct, frozen=True, array_like=True):
    """``[slot, layer, stream, page, step, seq, [version, ...]]``: slot ``slot + i`` holds page
    ``page + i`` of (layer, stream) at host version ``versions[i]``, copied by the upload event
    ``seq`` at ``step``."""

    slot: int
    layer: int
    stream: int
    page: int
    step: int
    seq: int
    versions: tuple[int, ...]


class Partition(msgspec.Struct, frozen=True):
    """Resident pages per layer and ring slots after the last repartition (null: unknown)."""

    resident: int | None = None
    ring: int | None = None


class Snapshot(Event, tag="snapshot", frozen=True):
    """The state a trace segment starts from (1.2): written by kernels/kvtrace.h at the start of
    every segment of a rotated trace and of a flight recorder's window, so that the segment can
    be judged alone. It holds what the judgement derives from earlier events: what every pool
    (``resident``) and ring slot holds, every written host page's version, the views whose ring
    copies wait for their read (``ring_pending``), and the partition."""

    reason: str = ""
    """``rotate`` (a new segment) or ``flight-recorder`` (a window's start)."""
    versions: tuple[HostVersions, ...] = ()
    pool: tuple[SlotCopies, ...] = ()
    ring: tuple[SlotCopies, ...] = ()
    ring_pending: tuple[tuple[int, int], ...] = ()
    """(layer, stream) of views with ring copies made since their last read."""
    partition: Partition | None = None


class End(Event, tag="end", frozen=True):
    """The capture finished (``status`` completed or aborted); absent if the process died."""

    status: Literal["completed", "aborted", "error"]
    steps: int
    events: int
    reason: str = ""
    """Why a run did not complete, where known ("interrupted by SIGINT"), 1.1."""


class Unknown(msgspec.Struct, frozen=True):
    """An event of a kind this version does not know (from a newer minor version): kept."""

    kind: str
    seq: int
    t_ns: int
    step: int
    fields: dict[str, Any] = msgspec.field(default_factory=dict)


AnyEvent = (
    Step | Learn | Fits | Write | Mark | Upload | Evict | Invalidate | Read | Abort | Warn
    | Output | Repartition | Adapt | Telemetry | Kernel | Records | Timing | Snapshot | End
)
KNOWN_KINDS: tuple[str, ...] = (
    "step",
    "learn",
    "fits",
    "write",
    "mark",
    "upload",
    "evict",
    "invalidate",
    "read",
    "abort",
    "warn",
    "output",
    "repartition",
    "adapt",
    "telemetry",
    "kernel",
    "records",
    "timing",
    "snapshot",
    "end",
)


class Device(msgspec.Struct, frozen=True, omit_defaults=True):
    """The machine a capture ran on (NVML's words where a GPU exists)."""

    name: str
    memory_bytes: int | None = None
    driver: str | None = None
    pcie: str | None = None
    compute_capability: str | None = None


class Header(msgspec.Struct, frozen=True, omit_defaults=True):
    """First line of a trace file."""

    format: str
    version: str
    kvdiag_version: str
    created: str
    backend: str
    device: Device
    scenario: dict[str, Any] = msgspec.field(default_factory=dict)
    plan: dict[str, Any] = msgspec.field(default_factory=dict)
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    records: tuple[str, ...] | None = None
    """What the writer declares it can record (1.2): event kinds, plus ``"kind.field"`` for an
    optional raw field a kind may carry (``"mark.outside"``). None: not declared (a 1.0/1.1
    trace, or a writer that does not say), so what is recorded can only be inferred."""
