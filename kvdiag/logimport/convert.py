"""Log lines → trace events, in log order (the rules are in docs/log-import.md).

What becomes an event:

- the instrumented ``fits=false`` line (domain brief §4.5) → ``fits`` with ``result`` false and
  ``evaluated`` false: the line does not say which condition failed. Its route is decided by
  what follows it (:class:`Converter` docstring);
- ``kv_stream_adapt`` lines (§5.3): the partition change → ``repartition``; the
  ``LLAMA_KV_STREAM_TRACE`` line (with ``layout``, ``skipped``/``resident attended`` and CPU
  page variants) → ``adapt``; the G2 ``KV layout revision`` line → ``repartition``; invalid
  feedback, failed layout publication, decode-span choice, allocation failures and context
  init failures → ``warn``;
- a fallback warning (a line naming kv-stream or fits that says it falls back) → ``warn``
  with code ``kv-stream-fallback``, as the model writes it;
- each crash the post-mortem scanner found (abort, GPU error, fatal signal) → ``abort`` with the
  backtrace frames it printed and the Python threads' stacks (faulthandler's, 1.3);
- a second boot in the same log → ``warn`` with code ``import-boot``;
- each request a slot completed (its ``print_timing`` block, depth and release lines, brief
  §7.3, read by :mod:`kvdiag.postmortem.perfscan`) → ``timing`` at its ``eval time`` line.

Lines are parsed with the post-mortem grammar (:mod:`kvdiag.postmortem.grammar`,
:func:`kvdiag.postmortem.lines.clean`); nothing here re-parses what it already reads.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvdiag.model import events as ev
from kvdiag.model.geometry import Tensor
from kvdiag.model.logrecords import (
    BootConfig,
    Crash,
    FitsLine,
    LogLine,
    SlotEvent,
    StreamEvent,
)
from kvdiag.model.perf import RequestTiming
from kvdiag.postmortem import grammar
from kvdiag.postmortem.lines import clean

#: A fits=false line waits this many lines at most for the abort or warning that decides its
#: route (the runtime prints them next to each other: the assert fires in the same dispatch).
WINDOW_LINES = 1000

#: Bytes without which a line cannot yield an event (crash and boot lines are known by number):
#: kv-stream's words as the grammar reads them, in every case it reads them in (the fits=false
#: line, kv_stream_adapt lines, a fallback warning: ``grammar.KV_STREAM_WORDS``, the anchors of
#: ``kvdiag perf`` too), "KV " (the G2 ``KV layout revision`` line, ``adaptive KV partition``),
#: the phase arena's lines, a context that failed, and a fallback warning's verb (``falling
#: back`` with ``fits`` or kv-stream in another case than those words).
ANCHORS: tuple[bytes, ...] = (*grammar.KV_STREAM_WORDS, b"KV ", b"arena",
                              b"initialize the context", b"back")
_ANCHOR = re.compile(b"|".join(re.escape(a) for a in ANCHORS))
#: Slot lines (brief §7.3) only end a step, which matters only once the step holds an event.
_SLOT = re.compile(rb"\bslot |id_slot=")

INT64_MIN = -(1 << 63)
UNKNOWN = (0, 0, 0, 0)
"""``ne``/``nb`` of an operand the log did not describe: no ggml tensor has ``nb[0] == 0``."""

UNKNOWN_FIELDS: list[str] = [
    "fits.node", "fits.layer (-1 unless a fallback warning names it)", "fits.q",
    "fits.k.name/ne/nb", "fits.v.name/ne/nb/data", "fits.dst.name/nb/buffer", "fits.mask",
    "fits.failed (evaluated=false)",
]
"""What a fits=false line does not give (listed in the header's ``extra.import.unknown``)."""

_STAMP = re.compile(
    r"(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d)(?:\x1b\[[0-9;]*m)* (?:\x1b\[[0-9;]*m)*[IWEDN] ")
_STAMP_SCAN = 240
_RESTART_NS = 1_000_000_000
_NIL = frozenset({"(nil)", "(null)", "nil", "null", "0", "0x0", "NULL", "nullptr"})
_BOUNDARY_SLOT_KINDS = frozenset({"launch", "progress", "prompt_done", "release"})
_STREAM_WARN_CODE = {
    "feedback_error": "kv-stream-feedback", "layout_error": "kv-stream-layout",
    "latency": "kv-stream-decode-span", "alloc_failure": "kv-stream-alloc",
    "warning": "kv-stream", "config_failure": "kv-stream-config",
}
_ADAPT_INT = ("samples", "misses", "peak", "layout", "skipped", "resident_attended")


def pointer(text: str | None) -> int | None:
    """A printed pointer as an int; None for a null or unparsable one, or one wider than 64
    bits (no pointer is: a damaged line)."""
    if text is None or text.strip() in _NIL:
        return None
    try:
        value = int(text.strip(), 16) if text.strip().lower().startswith("0x") else int(text, 0)
    except ValueError:
        return None
    return value if 0 < value < 1 << 64 else None


def beyond_64_bits(value: object) -> bool:
    """Whether ``value`` holds an integer a trace cannot: the format's integers are 64-bit
    (its reader refuses a wider one as a corrupt line, docs/trace-format.md), and a log's line
    can print any digits."""
    if type(value) is int:
        return not INT64_MIN <= value < 1 << 64
    if isinstance(value, tuple | list):
        return any(beyond_64_bits(v) for v in value)
    return False


def stamp_ns(raw: bytes) -> int | None:
    """llama.cpp's ``<min>.<ss>.<ms>.<us> <L>`` prefix (brief §7.1) as ns since the process
    started; None when the line has none."""
    head = raw[:_STAMP_SCAN].decode("utf-8", errors="replace")
    m = _STAMP.search(head)
    if m is None:
        return None
    minutes, seconds, ms, us = (int(g) for g in m.groups())
    return (((minutes * 60 + seconds) * 1000 + ms) * 1000 + us) * 1000


def is_fits_abort(crash: Crash) -> bool:
    """The crash is the streamed kernel's ``GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst))``."""
    ab = crash.abort
    text = f"{ab.condition or ''} {ab.message}" if ab is not None else ""
    return "fits" in text and "kv_stream" in text


def abort_fields(crash: Crash) -> dict[str, Any]:
    ab, err = crash.abort, crash.error
    frames: list[str] = []
    if crash.backtrace is not None:
        for f in crash.backtrace.frames:
            if f.function:
                name = f.function + (" (inlined)" if f.inlined else "")
            elif f.module:
                name = f"{f.module}+{f.offset:#x}" if f.offset is not None else f.module
            else:
                name = f"{f.address:#x}" if f.address is not None else "?"
            frames.append(name)
    fields: dict[str, Any] = {"backtrace": tuple(frames)}
    if crash.python:
        fields["python_stacks"] = python_stacks(crash)
    if ab is not None:
        where = f"{ab.file}:{ab.line}: " if ab.file and ab.line is not None else ""
        fields.update(message=where + ab.message, file=ab.file or "", line=ab.line or 0,
                      condition=ab.condition or "")
    if err is not None:
        fields["cuda_error"] = err.message if err.backend == "CUDA" else (
            f"{err.backend}: {err.message}")
        fields.setdefault("message", f"{err.backend} error: {err.message}")
    if "message" not in fields:
        sig = crash.signal
        fields["message"] = crash.kind if sig is None else sig.signal + (
            f" (Windows fatal exception: {sig.exception})" if sig.exception else "")
    return fields


def python_stacks(crash: Crash) -> tuple[ev.PyStack, ...]:
    """The crash's faulthandler stacks (``postmortem.pystack``) as the abort event carries
    them (format 1.3): everything the scan read but the log line each stack began on."""
    return tuple(
        ev.PyStack(thread=st.thread, name=st.name, current=st.current, notes=st.notes,
                   frames=tuple(ev.PyFrame(function=f.function, file=f.file, line=f.line,
                                           in_app=f.in_app) for f in st.frames))
        for st in crash.python)


class Emitter(Protocol):
    """Where the events go: a :class:`~kvdiag.trace.writer.TraceWriter` (``kvdiag import``),
    or a Judge's feed (``kvdiag check --follow`` on a log)."""

    def emit(self, cls: type[ev.Event], step: int, *, t_ns: int | None = None,
             **fields: Any) -> Any: ...


@dataclass
class _Item:
    line: int
    step: int
    t_ns: int
    cls: type[ev.Event]
    fields: dict[str, Any]
    fits: FitsLine | None = None
    """Set while a fits event waits for its route."""


@dataclass
class Counts:
    by_kind: dict[str, int] = field(default_factory=dict)
    inferred_routes: int = 0
    aborts: int = 0
    #: lines not imported because a number on them is wider than 64 bits
    out_of_range: int = 0

    @property
    def imported(self) -> int:
        """Events that came from the log's own lines (not the importer's notes)."""
        return sum(self.by_kind.values())


class Converter:
    """Fed each line in order (``line``), writes events through ``writer``; ``finish`` ends.

    Route of a fits=false line: decided by the first of these after it, within
    ``WINDOW_LINES`` lines and before the next fits=false or kv_stream_adapt trace line:
    a crash whose assert names ``kv_stream…fits`` → ``abort``; a fallback warning →
    ``fallback`` (and its ``layer <n>`` gives the layer). K and V runtimes both null → always
    ``ordinary`` (the node is not in a kv-stream buffer, so the dispatcher cannot reach the
    streamed kernel or its assert). Nothing decisive: ``fallback``, with a ``warn``
    (code ``import-route-inferred``): the process went on, so the node neither aborted nor,
    fits() being false, ran the streamed kernel.

    Steps: an ``adapt`` line ends its step (kv_stream_adapt runs after each evaluation, brief
    §1.10); a slot line that launches a task, reports prompt progress, finishes a prompt or
    releases a slot (§7.3), and a new boot, start a new step when the current one holds an
    event. So steps number the stretches of log between visible batch boundaries that hold
    something, from 0.
    """

    def __init__(self, writer: Emitter, name: str, boots: tuple[BootConfig, ...],
                 crashes: tuple[Crash, ...], boot: BootConfig | None,
                 stage_bytes: int, requests: tuple[RequestTiming, ...] = ()) -> None:
        self.writer = writer
        self.name = name
        self.counts = Counts()
        self.step = 0
        self._step_used = False
        self._queue: deque[_Item] = deque()
        self._open: _Item | None = None
        self._crashes = sorted((c for c in crashes if c.where.source == name),
                               key=lambda c: c.where.line)
        self._ci = 0
        self._boots = [b for b in boots if b.source == name]
        self._boot_lines = {b.line: i for i, b in enumerate(self._boots) if i > 0}
        self._types = (boot.type_k, boot.type_v) if boot is not None else (None, None)
        self._stage_bytes = stage_bytes
        self._t = 0
        self._base = 0
        self._last_raw: int | None = None
        self._partition: tuple[int, int] | None = None
        # requests by the line of their timing and of their start (the new prompt line)
        self._timings: dict[int, list[RequestTiming]] = {}
        self._starts: dict[int, None] = {}
        self._started: dict[int, int] = {}
        for r in requests:
            if r.source == name:
                self._timings.setdefault(r.line, []).append(r)
                if r.started is not None:
                    self._starts[r.started] = None

    def add_crashes(self, crashes: tuple[Crash, ...] | list[Crash]) -> None:
        """Crashes found since construction (a log read while it grows: the scanner finishes a
        crash only once its backtrace has ended)."""
        self._crashes.extend(c for c in crashes if c.where.source == self.name)
        self._crashes[self._ci:] = sorted(self._crashes[self._ci:], key=lambda c: c.where.line)

    # -- time and steps ---------------------------------------------------------------------

    @property
    def time_ns(self) -> int:
        """The time of the last timestamped line read (the End event's time)."""
        return self._t

    def _time(self, raw: bytes) -> int:
        """Non-decreasing ns: the log's own clock, carried over restarts (which reset it)."""
        value = stamp_ns(raw)
        if value is not None:
            if self._last_raw is not None and value + _RESTART_NS < self._last_raw:
                self._base = self._t - value
            self._last_raw = value
            self._t = max(self._t, self._base + value)
        return self._t

    def _boundary(self) -> None:
        if self._step_used:
            self.step += 1
            self._step_used = False

    # -- emitting ---------------------------------------------------------------------------

    def _add(self, lineno: int, t: int, cls: type[ev.Event], /,
             pending: FitsLine | None = None, **fields: Any) -> _Item:
        wide = [k for k, v in fields.items() if beyond_64_bits(v)]
        if wide:
            # the line is not imported, and the trace says so: written, the event would be a
            # line the reader refuses (the fits line's own numbers are checked where read)
            self.counts.out_of_range += 1
            cls, fields = ev.Warn, {"code": "import-out-of-range", "message": (
                f"{self.name}:{lineno}: {', '.join(wide)} wider than 64 bits; the line is not "
                "imported")}
        item = _Item(lineno, self.step, t, cls, fields, pending)
        self._step_used = True
        self._queue.append(item)
        self._flush()
        return item

    def _flush(self) -> None:
        q = self._queue
        while q and q[0].fits is None:
            item = q.popleft()
            self.writer.emit(item.cls, item.step, t_ns=item.t_ns, **item.fields)
            tag = item.cls.__struct_config__.tag
            if isinstance(tag, str) and not item.fields.get("code", "").startswith("import-"):
                self.counts.by_kind[tag] = self.counts.by_kind.get(tag, 0) + 1

    def _decide(self, route: ev.Route, layer: int | None = None) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        item.fields["route"] = route
        if layer is not None:
            item.fields["layer"] = layer
        item.fits = None
        self._flush()

    def _decide_default(self) -> None:
        item = self._open
        if item is None:
            return
        self._decide("fallback")
        self.counts.inferred_routes += 1
        self._add(item.line, item.t_ns, ev.Warn, code="import-route-inferred", message=(
            f"{self.name}:{item.line}: fits=false on a kv-stream node with no abort and no "
            "fallback warning after it; route taken as fallback (the process went on)"))

    # -- lines ------------------------------------------------------------------------------

    def line(self, lineno: int, raw: bytes) -> None:
        if self._open is not None and lineno - self._open.line > WINDOW_LINES:
            self._decide_default()
        if lineno in self._starts:
            self._started[lineno] = self._time(raw)
        if lineno in self._timings:
            self._timing(lineno, self._time(raw))
        crash_here = self._ci < len(self._crashes) and self._crashes[self._ci].where.line <= lineno
        boot_here = lineno in self._boot_lines
        if not (crash_here or boot_here) and _ANCHOR.search(raw) is None:
            if self._step_used and _SLOT.search(raw) is not None:
                text, _level = clean(raw)
                slot = grammar.parse_slot(LogLine(self.name, lineno, text), text)
                if slot is not None and slot.kind in _BOUNDARY_SLOT_KINDS:
                    self._boundary()
            return
        t = self._time(raw)
        text, _level = clean(raw)
        where = LogLine(self.name, lineno, text)
        if boot_here:
            self._new_boot(lineno, t)
        if crash_here:
            self._crash_lines(lineno, t)
            return
        if "fits=false" in text:
            fl = grammar.parse_fits(where, text)
            if fl is not None:
                self._fits(fl, t)
                return
        for rec in grammar.classify(where, text):
            if isinstance(rec, StreamEvent):
                self._stream(rec, t)
                return
            if isinstance(rec, SlotEvent):
                if rec.kind in _BOUNDARY_SLOT_KINDS:
                    self._boundary()
                return
        if grammar.is_fallback_warning(text):
            layer = grammar.layer_of(text)
            self._decide("fallback", layer)
            self._add(lineno, t, ev.Warn, message=text, code="kv-stream-fallback", layer=layer)

    def _new_boot(self, lineno: int, t: int) -> None:
        self._decide_default()
        self._boundary()
        index = self._boot_lines[lineno]
        self._add(lineno, t, ev.Warn, code="import-boot", message=(
            f"{self.name}:{lineno}: the server booted again (boot {index + 1} of "
            f"{len(self._boots)}); the header's plan describes one boot"))

    def _crash_lines(self, lineno: int, t: int) -> None:
        while self._ci < len(self._crashes) and self._crashes[self._ci].where.line <= lineno:
            crash = self._crashes[self._ci]
            self._ci += 1
            if self._open is not None:
                if is_fits_abort(crash):
                    self._decide("abort")
                else:
                    self._decide_default()
            self.counts.aborts += 1
            self._add(lineno, t, ev.Abort, **abort_fields(crash))

    def _timing(self, lineno: int, t: int) -> None:
        for r in self._timings.pop(lineno):
            fields: dict[str, Any] = dict(
                prompt_tokens=r.prompt_tokens or 0, prompt_ms=r.prompt_ms or 0.0,
                decode_tokens=r.decode_tokens or 0, decode_ms=r.decode_ms or 0.0, slot=r.slot,
                task=r.task, prompt_tps=r.prompt_tps, decode_tps=r.decode_tps,
                ms_per_token=r.ms_per_token, depth_start=r.depth_start,
                depth_end=r.depth_end, cached=r.cached, n_ctx_slot=r.n_ctx_slot,
                truncated=r.truncated, graphs_reused=r.graphs_reused, boot=r.boot,
                started_ns=None if r.started is None else self._started.pop(r.started, None))
            self._add(lineno, t, ev.Timing, **fields)

    def _tensor(self, type_: str, buffer: str | None, ptr: int | None, runtime: str | None,
                cache_type: str | None) -> Tensor:
        # The K/V view has the cache's type (brief §4.1): known when this view is in the
        # streamed KV buffer the boot's size line describes.
        if not type_ and cache_type and buffer and "KV_Stream" in buffer:
            type_ = cache_type
        return Tensor(name="", type=type_, ne=UNKNOWN, nb=UNKNOWN, data=ptr or 0,
                      buffer=buffer or "", runtime=pointer(runtime))

    def _fits(self, fl: FitsLine, t: int) -> None:
        self._decide_default()
        # a shape wider than 64 bits is a damaged line's: unknown, as an absent one
        ne = fl.ne if len(fl.ne) == 4 and not beyond_64_bits(fl.ne) else UNKNOWN
        dst = Tensor(name="", type=fl.type or "", ne=(ne[0], ne[1], ne[2], ne[3]), nb=UNKNOWN,
                     data=pointer(fl.dst) or 0)
        k = self._tensor("", fl.kbuf, pointer(fl.k), fl.kr, self._types[0])
        v = self._tensor("", fl.vbuf, None, fl.vr, self._types[1])
        q = Tensor(name="", type="", ne=UNKNOWN, nb=UNKNOWN)
        membership = k.runtime is not None or v.runtime is not None
        fields: dict[str, Any] = dict(
            node="", layer=-1, q=q, k=k, v=v, dst=dst, stage_bytes=self._stage_bytes,
            result=False, route="ordinary", membership=membership, evaluated=False)
        if not membership:
            self._add(fl.where.line, t, ev.Fits, **fields)
            return
        self._open = self._add(fl.where.line, t, ev.Fits, pending=fl, **fields)

    def _stream(self, rec: StreamEvent, t: int) -> None:
        line = rec.where.line
        vals = rec.values
        if rec.kind == "repartition":
            self._partition = (int(vals["resident_to"]), int(vals["ring_to"]))
            self._add(line, t, ev.Repartition,
                      resident=(int(vals["resident_from"]), int(vals["resident_to"])),
                      ring=(int(vals["ring_from"]), int(vals["ring_to"])),
                      miss_pct=vals.get("miss_pct"), busy_pct=vals.get("copy_busy_pct"))
        elif rec.kind == "trace" and {"active", "resident", "ring"} <= vals.keys():
            self._decide_default()
            fields: dict[str, Any] = {"active": int(vals["active"]),
                                      "resident": int(vals["resident"]),
                                      "ring": int(vals["ring"]),
                                      "busy_pct": vals.get("copy_busy")}
            for key in _ADAPT_INT:
                if key in vals:
                    fields[key] = int(vals[key])
            self._partition = (fields["resident"], fields["ring"])
            self._add(line, t, ev.Adapt, **fields)
            self._boundary()
        elif rec.kind == "trace" and "resident_pages/layer" in vals and "ring_slots" in vals:
            now = (int(vals["resident_pages/layer"]), int(vals["ring_slots"]))
            before = self._partition or now
            self._partition = now
            reason = rec.message.split(": ", 1)[-1]
            self._add(line, t, ev.Repartition, resident=(before[0], now[0]),
                      ring=(before[1], now[1]), reason=reason[:200])
        elif rec.kind in _STREAM_WARN_CODE:
            self._add(line, t, ev.Warn, message=rec.where.text, code=_STREAM_WARN_CODE[rec.kind])

    def finish(self) -> None:
        """End of the complete lines. A crash the scanner read on a last line without a line
        end is still an abort: losing the abort would be worse than a cut message."""
        if self._ci < len(self._crashes):
            self._crash_lines(self._crashes[-1].where.line, self._t)
        self._decide_default()
        self._flush()
