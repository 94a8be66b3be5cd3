"""Export a trace as Chrome trace-event JSON, which chrome://tracing and ui.perfetto.dev open.

Layout (trace-event format: "X" complete slices, "i" instants, "C" counters, "M" metadata and
"s"/"f" flow events):

- process 1 "runtime": threads ``ubatch`` (one slice per step), ``dispatch`` (fits
  decisions), ``cache`` (learn, mark, invalidate, repartition, adapt), ``aborts, warnings``
  (global instants and the End) and ``unknown kinds``; counters for telemetry and adapt;
- one process per KV stream ("stream S"), one thread per layer in it: the track of one
  (stream, layer) pair, holding that pair's writes, uploads, reads, evictions and kernels.

Every event kind is exported, with all its fields in ``args`` (fields a newer minor version
added, which the reader keeps, under ``args.unknown_fields``); nothing is cut. Each slice
lasts until the next event on its track (at most :data:`MAX_SLICE_US`), so it is visible.

Flow arrows (``"s"`` at a write, ``"f"`` with ``"bp": "e"`` at a read, same id) join a read
that was not served the current bytes of a page to the write it missed: the last write to
that (layer, stream, page). Which reads those are is derived as format 1.1 describes
(docs/trace-format.md, notes/format-1.1.md "Derivation"): host versions count the writes that
touch a page, uploads fill slots with (layer, stream, page, version), invalidate empties them,
and a read's ``served`` runs name the slot of each page; traces without ``served`` use the
model's ``ranges`` classes. Events are written as they are read: memory holds one pending
slice per track and the page and slot maps, not the events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import IO, Any

import msgspec

from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS

RUNTIME_PID = 1
STREAM_PID0 = 100
UBATCH_TID, DISPATCH_TID, CACHE_TID, GLOBAL_TID, UNKNOWN_TID = 0, 1, 2, 3, 4
REQUEST_TID0 = 10
"""``timing`` events: one track per server slot from here (a request is a slice from its
``new prompt`` to its ``eval time`` line)."""
MAX_SLICE_US = 1000.0
LAST_SLICE_US = 1.0
MAX_NAME = 1000
"""Characters of a message used as a slice name; the whole message is in ``args``."""
MAX_FLOW_PAGES = 4096
"""Pages of one read examined for flows (a bound on work per event, not on correctness of
the pages it covers; the read's own classes come from all of them)."""

Key = tuple[int, int, int]  # (layer, stream, page)
Track = tuple[int, int]  # (pid, tid)


def _us(t_ns: int) -> float:
    return t_ns / 1000.0


def _name(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    if len(line) > MAX_NAME:
        return f"{line[:MAX_NAME]}… ({len(text):,} characters; the whole text is in args)"
    return line


def _meta(pid: int, tid: int | None, what: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"ph": "M", "pid": pid, "name": what, "args": {"name": name}}
    if tid is not None:
        out["tid"] = tid
    return out


class ChromeExporter:
    """Turns events into trace-event dicts; ``write`` streams them into a JSON array.

    ``extras`` is the reader's ``{seq: {path: value}}`` of fields this version does not
    declare (newer minor versions), ``header_extras`` the same for the header.
    """

    def __init__(self, extras: Mapping[int, dict[str, Any]] | None = None,
                 header_extras: Mapping[str, Any] | None = None) -> None:
        self._extras = extras if extras is not None else {}
        self._header_extras = dict(header_extras or {})
        self._pending: dict[Track, dict[str, Any]] = {}
        self._named: set[Track] = set()
        self._streams: set[int] = set()
        self._last_t = 0
        self._version: dict[Key, int] = {}
        self._last_write: dict[Key, tuple[float, Track, int]] = {}
        self._slots: dict[int, tuple[int, int, int, int]] = {}
        self._flow_id = 0
        self.flows = 0
        self._request_end: dict[int, float] = {}

    # -- tracks ---------------------------------------------------------------------------

    def _track(self, stream: int | None, layer: int | None, tid: int,
               out: list[dict[str, Any]]) -> Track:
        """(stream, layer) pairs get their own track; everything else a runtime thread."""
        if stream is None or layer is None or stream < 0 or layer < 0:
            return RUNTIME_PID, tid
        pid, ltid = STREAM_PID0 + stream, layer + 1
        if stream not in self._streams:
            self._streams.add(stream)
            out.append(_meta(pid, None, "process_name", f"stream {stream}"))
            out.append({"ph": "M", "pid": pid, "name": "process_sort_index",
                        "args": {"sort_index": pid}})
        if (pid, ltid) not in self._named:
            self._named.add((pid, ltid))
            out.append(_meta(pid, ltid, "thread_name", f"layer {layer}"))
            out.append({"ph": "M", "pid": pid, "tid": ltid, "name": "thread_sort_index",
                        "args": {"sort_index": ltid}})
        return pid, ltid

    def _slice(self, track: Track, ts: float, name: str, cat: str, args: dict[str, Any],
               out: list[dict[str, Any]], *, cap: float = MAX_SLICE_US) -> float:
        """Open a slice on ``track``; the one it replaces ends where this one starts.

        Returns the slice's start: ``ts``, or where the track's previous slice ended when a
        damaged file goes back in time (slices of one track must not overlap; ``args`` keep
        the event's own ``t_ns``)."""
        end = self._close(track, ts, out, cap)
        ts = max(ts, end)
        self._pending[track] = {"ph": "X", "pid": track[0], "tid": track[1], "ts": ts,
                                "name": name, "cat": cat, "args": args}
        return ts

    def _close(self, track: Track, ts: float, out: list[dict[str, Any]],
               cap: float = MAX_SLICE_US) -> float:
        """End the track's open slice at ``ts`` (at most ``cap`` long); returns its end."""
        prev = self._pending.pop(track, None)
        if prev is None:
            return 0.0
        prev["dur"] = max(0.0, min(ts - prev["ts"], cap))
        out.append(prev)
        end: float = prev["ts"] + prev["dur"]
        return end

    # -- events ---------------------------------------------------------------------------

    def _args(self, event: ev.AnyEvent | ev.Unknown) -> dict[str, Any]:
        if isinstance(event, ev.Unknown):
            args: dict[str, Any] = {"kind": event.kind, "seq": event.seq, "step": event.step,
                                    **event.fields}
        else:
            args = msgspec.to_builtins(event)
        extra = self._extras.get(event.seq)
        if extra:
            args["unknown_fields"] = extra
        return args

    def convert(self, event: ev.AnyEvent | ev.Unknown) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self._last_t = max(self._last_t, event.t_ns)
        ts = _us(event.t_ns)
        args = self._args(event)
        runtime = (RUNTIME_PID, CACHE_TID)
        match event:
            case ev.Step():
                self._slice((RUNTIME_PID, UBATCH_TID), ts,
                            f"step {event.step} {event.phase} streams "
                            f"{','.join(map(str, event.streams))}", "step", args, out,
                            cap=float("inf"))
            case ev.Write():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                c0, c1 = event.cells
                start = self._slice(track, ts, f"write cells {c0}..{c1 - 1}", "write", args,
                                    out)
                self._written(event, start, track)
            case ev.Upload():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                p0, p1 = event.pages
                self._slice(track, ts, f"upload {event.target} pages {p0}..{p1 - 1} → slot "
                                       f"{event.slot} ({event.reason})", "upload", args, out)
                for i in range(max(0, min(p1 - p0, MAX_FLOW_PAGES))):
                    key = (event.layer, event.stream, p0 + i)
                    self._slots[event.slot + i] = (*key, self._version.get(key, 0))
            case ev.Read():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                classes, missed = self._served(event)
                bad = sorted(classes - {"exact"})
                name = f"read stream {event.stream}" + (f" ({', '.join(bad)})" if bad else "")
                start = self._slice(track, ts, name, "alias" if bad else "read", args, out)
                for write in missed:
                    if write[0] <= start:  # a damaged file's later write cannot be missed
                        out += self._flow(write, start, track)
            case ev.Evict():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                self._slice(track, ts, f"evict slot {event.slot}", "evict", args, out)
            case ev.Kernel():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                self._slice(track, ts, f"kernel {event.name}", "kernel", args, out)
            case ev.Fits():
                self._slice((RUNTIME_PID, DISPATCH_TID), ts,
                            f"fits {event.route}{'' if event.result else ' (false)'} "
                            f"layer {event.layer}", "fits", args, out)
            case ev.Learn():
                self._slice(runtime, ts, f"learn layer {event.layer}"
                            + (" (relearn)" if event.relearn else ""), "learn", args, out)
            case ev.Mark():
                self._slice(runtime, ts, f"mark {len(event.rows)} row run(s)"
                            + (" (all pages)" if event.all else ""), "mark", args, out)
            case ev.Invalidate():
                self._slots.clear()
                self._slice(runtime, ts, f"invalidate ({_name(event.reason)})", "invalidate",
                            args, out)
            case ev.Repartition():
                (a, b), (c, d) = event.resident, event.ring
                self._slice(runtime, ts, f"repartition resident {a}→{b}, ring {c}→{d}",
                            "repartition", args, out)
            case ev.Adapt():
                self._slice(runtime, ts, f"adapt resident {event.resident} ring {event.ring}",
                            "adapt", args, out)
                out.append({"ph": "C", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": ts,
                            "name": "adapt", "args": {"active": event.active,
                                                      "resident": event.resident,
                                                      "ring": event.ring}})
            case ev.Abort() | ev.Warn():
                out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": type(event).__name__.lower(),
                            "name": _name(event.message), "args": args})
            case ev.Output():
                out.append({"ph": "C", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": ts,
                            "name": f"max |delta| stream {event.stream}",
                            "args": {"max_abs_delta": event.max_abs_delta or 0.0}})
                out.append({"ph": "i", "s": "t", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "output", "name": f"output stream {event.stream}",
                            "args": args})
            case ev.Telemetry():
                out.append({"ph": "i", "s": "t", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "telemetry", "name": "telemetry", "args": args})
                for name, value in args.items():
                    if name not in ("kind", "seq", "t_ns", "step", "unknown_fields") and \
                            isinstance(value, int | float):
                        out.append({"ph": "C", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                                    "ts": ts, "name": name, "args": {name: value}})
            case ev.Records():
                out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "records",
                            "name": _name("records + " + ", ".join(event.kinds)), "args": args})
            case ev.Timing():
                tid = REQUEST_TID0 + max(event.slot or 0, 0)
                if (RUNTIME_PID, tid) not in self._named:
                    self._named.add((RUNTIME_PID, tid))
                    out.append(_meta(RUNTIME_PID, tid, "thread_name",
                                     f"requests, slot {event.slot if event.slot is not None else '?'}"))
                start = (_us(event.started_ns) if event.started_ns is not None
                         else ts - (event.prompt_ms + event.decode_ms) * 1000.0)
                # slices of one track must not overlap, nor start before the trace
                start = min(ts, max(start, 0.0, self._request_end.get(tid, 0.0)))
                self._request_end[tid] = ts
                rate = f"{event.decode_tps:.2f} tok/s" if event.decode_tps else "decode"
                out.append({"ph": "X", "pid": RUNTIME_PID, "tid": tid, "ts": start,
                            "dur": ts - start, "cat": "timing",
                            "name": f"task {event.task}: {rate} at depth {event.depth_start}",
                            "args": args})
            case ev.End():
                self._close((RUNTIME_PID, UBATCH_TID), ts, out, float("inf"))
                reason = f": {_name(event.reason)}" if event.reason else ""
                out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "end", "name": f"end {event.status}{reason}",
                            "args": args})
            case ev.Unknown():
                layer, stream = event.fields.get("layer"), event.fields.get("stream")
                track = self._track(stream if type(stream) is int else None,
                                    layer if type(layer) is int else None, UNKNOWN_TID, out)
                self._slice(track, ts, f"{_name(event.kind)} (unknown kind)", "unknown", args,
                            out)
        return out

    # -- derivation for flows -------------------------------------------------------------

    def _written(self, event: ev.Write, ts: float, track: Track) -> None:
        c0, c1 = event.cells
        if c1 <= c0:
            return
        first, last = c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS
        for page in range(first, min(last, first + MAX_FLOW_PAGES - 1) + 1):
            key = (event.layer, event.stream, page)
            self._version[key] = self._version.get(key, 0) + 1
            self._last_write[key] = (ts, track, event.seq)

    def _served(self, event: ev.Read) -> tuple[set[str], list[tuple[float, Track, int]]]:
        """The read's classes and the writes it missed (one per write, in page order)."""
        classes: set[str] = set()
        missed: dict[int, tuple[float, Track, int]] = {}

        def miss(page: int) -> None:
            write = self._last_write.get((event.layer, event.stream, page))
            if write is not None:
                missed.setdefault(write[2], write)

        if event.served:
            budget = MAX_FLOW_PAGES
            for run in event.served:
                if run.source == "host":
                    classes.add("exact")
                    continue
                for page in range(run.begin, min(run.end, run.begin + budget)):
                    key = (event.layer, event.stream, page)
                    holder = self._slots.get(run.slot + page - run.begin)
                    if holder is not None and holder[:3] == key:
                        if holder[3] >= self._version.get(key, 0):
                            classes.add("exact")
                            continue
                        classes.add("stale")
                    else:
                        classes.add("foreign")
                    miss(page)
                budget -= max(0, run.end - run.begin)
                if budget <= 0:
                    break
        else:
            for rng in event.ranges:
                classes.add(rng.cls)
                if rng.cls != "exact":
                    for page in range(rng.begin, min(rng.end, rng.begin + MAX_FLOW_PAGES)):
                        miss(page)
        return classes, list(missed.values())

    def _flow(self, write: tuple[float, Track, int], ts: float,
              track: Track) -> list[dict[str, Any]]:
        self._flow_id += 1
        self.flows += 1
        w_ts, (w_pid, w_tid), w_seq = write
        common = {"cat": "stale-read", "name": "write the read missed", "id": self._flow_id}
        return [{**common, "ph": "s", "pid": w_pid, "tid": w_tid, "ts": w_ts,
                 "args": {"write_seq": w_seq}},
                {**common, "ph": "f", "bp": "e", "pid": track[0], "tid": track[1], "ts": ts}]

    # -- output ---------------------------------------------------------------------------

    def finish(self) -> list[dict[str, Any]]:
        """End the slices still open (the last on each track; a step without an End)."""
        out: list[dict[str, Any]] = []
        end = _us(self._last_t)
        for track in list(self._pending):
            prev = self._pending[track]
            cap = LAST_SLICE_US if track != (RUNTIME_PID, UBATCH_TID) else float("inf")
            self._close(track, max(end, prev["ts"] + LAST_SLICE_US), out, cap)
        return out

    def write(self, events: Iterable[ev.AnyEvent | ev.Unknown], out: IO[bytes],
              title: str = "kvdiag") -> int:
        """Write a JSON array of trace events; returns how many were written."""
        enc = msgspec.json.Encoder()
        head: list[dict[str, Any]] = [
            _meta(RUNTIME_PID, None, "process_name", title),
            _meta(RUNTIME_PID, UBATCH_TID, "thread_name", "ubatch"),
            _meta(RUNTIME_PID, DISPATCH_TID, "thread_name", "dispatch (fits)"),
            _meta(RUNTIME_PID, CACHE_TID, "thread_name",
                  "cache (learn, mark, invalidate, repartition, adapt)"),
            _meta(RUNTIME_PID, GLOBAL_TID, "thread_name", "aborts, warnings, end, counters"),
            _meta(RUNTIME_PID, UNKNOWN_TID, "thread_name", "unknown kinds"),
        ]
        if self._header_extras:
            head.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": 0,
                         "cat": "header", "name": "header fields unknown to this version",
                         "args": {"unknown_fields": self._header_extras}})
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
