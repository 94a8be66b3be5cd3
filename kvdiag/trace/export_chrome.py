"""Export a trace as Chrome trace-event JSON, which chrome://tracing and ui.perfetto.dev open.

Layout: one process; a ``ubatch`` thread with one slice per step (begin/end pairs); one thread
per layer with instant events for fits decisions, uploads, reads and evictions; counters for
each stream's output error and for every telemetry field; aborts and warnings as global
instants. Times are the trace's ``t_ns`` in microseconds. Events are written as they are read,
so memory stays flat for any trace size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

import msgspec

from kvdiag.model import events as ev

_UBATCH_TID = 0
_GLOBAL_TID = 1
_LAYER_TID0 = 10


def _us(t_ns: int) -> float:
    return t_ns / 1000.0


def _meta(tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}


class ChromeExporter:
    """Turns events into trace-event dicts; ``write`` streams them into a JSON array."""

    def __init__(self) -> None:
        self._open_step: ev.Step | None = None
        self._layers: set[int] = set()
        self._last_t = 0

    def convert(self, event: ev.AnyEvent | ev.Unknown) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self._last_t = max(self._last_t, event.t_ns)
        layer = getattr(event, "layer", None)
        if isinstance(layer, int) and layer >= 0 and layer not in self._layers:
            self._layers.add(layer)
            out.append(_meta(_LAYER_TID0 + layer, f"layer {layer}"))
        base = {"pid": 1, "ts": _us(event.t_ns)}
        match event:
            case ev.Step():
                out += self._close_step(event.t_ns)
                self._open_step = event
                out.append({**base, "ph": "B", "tid": _UBATCH_TID, "cat": "step",
                            "name": f"step {event.step} {event.phase} streams "
                                    f"{','.join(map(str, event.streams))}",
                            "args": {"tokens": event.tokens, "n_kv": event.n_kv,
                                     "slots": list(event.slots)}})
            case ev.Fits():
                out.append({**base, "ph": "i", "s": "t", "tid": _LAYER_TID0 + event.layer,
                            "cat": "fits", "name": f"fits {event.route}",
                            "args": {"result": event.result, "failed": list(event.failed),
                                     "k_ne": list(event.k.ne), "k_buffer": event.k.buffer}})
            case ev.Upload():
                out.append({**base, "ph": "i", "s": "t", "tid": _LAYER_TID0 + event.layer,
                            "cat": "upload", "name": f"upload {event.target} {event.reason}",
                            "args": {"stream": event.stream, "pages": list(event.pages),
                                     "slot": event.slot, "bytes": event.bytes}})
            case ev.Read():
                bad = [r for r in event.ranges if r.cls != "exact"]
                out.append({**base, "ph": "i", "s": "t", "tid": _LAYER_TID0 + event.layer,
                            "cat": "alias" if bad else "read",
                            "name": f"read stream {event.stream}"
                                    + (f" ({', '.join(sorted({r.cls for r in bad}))})" if bad else ""),
                            "args": {"pool": event.pool, "ring": event.ring, "host": event.host,
                                     "ranges": msgspec.to_builtins(event.ranges)}})
            case ev.Evict():
                out.append({**base, "ph": "i", "s": "t", "tid": _LAYER_TID0 + event.layer,
                            "cat": "evict", "name": f"evict slot {event.slot}",
                            "args": {"stream": event.stream, "page": event.page,
                                     "reason": event.reason}})
            case ev.Abort() | ev.Warn():
                out.append({**base, "ph": "i", "s": "g", "tid": _GLOBAL_TID,
                            "cat": type(event).__name__.lower(), "name": event.message[:120],
                            "args": msgspec.to_builtins(event)})
            case ev.Output():
                out.append({**base, "ph": "C", "tid": _GLOBAL_TID,
                            "name": f"max |delta| stream {event.stream}",
                            "args": {"max_abs_delta": event.max_abs_delta}})
            case ev.Telemetry():
                fields = {k: v for k, v in msgspec.to_builtins(event).items()
                          if k not in ("seq", "t_ns", "step", "kind") and v is not None}
                for name, value in fields.items():
                    out.append({**base, "ph": "C", "tid": _GLOBAL_TID, "name": name,
                                "args": {name: value}})
            case ev.End():
                out += self._close_step(event.t_ns)
            case _:
                pass
        return out

    def _close_step(self, t_ns: int) -> list[dict[str, Any]]:
        if self._open_step is None:
            return []
        self._open_step = None
        return [{"pid": 1, "tid": _UBATCH_TID, "ph": "E", "ts": _us(t_ns)}]

    def finish(self) -> list[dict[str, Any]]:
        """Close a step left open by a trace that ends without an End event."""
        return self._close_step(self._last_t)

    def write(self, events: Iterable[ev.AnyEvent | ev.Unknown], out: IO[bytes],
              title: str = "kvdiag") -> int:
        """Write a JSON array of trace events; returns how many were written."""
        enc = msgspec.json.Encoder()
        head = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": title}},
                _meta(_UBATCH_TID, "ubatch"), _meta(_GLOBAL_TID, "aborts, warnings, counters")]
        out.write(b"[\n")
        n = 0
        first = True

        def emit(items: list[dict[str, Any]]) -> None:
            nonlocal first, n
            for item in items:
                if not first:
                    out.write(b",\n")
                out.write(enc.encode(item))
                first = False
                n += 1

        emit(head)
        for event in events:
            emit(self.convert(event))
        emit(self.finish())
        out.write(b"\n]\n")
        return n
