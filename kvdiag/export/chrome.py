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

Labels and flow arrows are the judgement's (:mod:`kvdiag.analysis.judgement`, fed the same
events as they are exported; design.md, "One judgement, every surface"), over every page of
every read:

- a read's slice is named by the classes of its pages that are not exact ("read stream 1
  (stale, foreign)", "(not judged)") and carries the verdict in ``args.verdict``: pages per
  class and the non-exact runs (source, slot, class, writes missed, whose copy the slot held);
- a flow (``"s"`` at a write, ``"f"`` with ``"bp": "e"`` at a read, same id, category
  ``stale-read`` or ``foreign-read``) joins a read to each write its stale or foreign pages
  missed: the ledger's ``flows`` rows;
- a fits slice of a bad decision names the judgement's outcome (mismatch, fallback) and the
  failed conditions;
- at the end, one global instant ``judgement`` with the page classes, flows and completeness,
  one ``not recorded: KIND`` instant per judged kind the trace lacks (what it hides), and one
  ``events-lost`` instant when events are missing between those the trace holds (gaps in
  seq: how many, the first gaps' seqs and steps; and those the End counts where no seq shows
  them, place unknown).

Events are written as they are read, a chunk at a time (judged together, then drawn): memory
holds one chunk, one pending slice per track, the Judge's page and slot tables, and the time and
track of the writes that are still some page's last write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import IO, Any

import msgspec

from kvdiag.analysis.judgement import CLASSES, SOURCES, WHY, Judge, Judgement
from kvdiag.analysis.judgement.fits import BAD
from kvdiag.analysis.judgement.gaps import lost_text
from kvdiag.analysis.judgement.judge import batches
from kvdiag.model import events as ev

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
PRUNE_WRITES = 4096
"""Remembered writes beyond which, between chunks, those no longer any page's last write are
forgotten."""

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

    ``header`` is what the Judge needs (declared record kinds, the config for fits
    conditions); ``extras`` the reader's ``{seq: {path: value}}`` of fields this version does
    not declare (newer minor versions), ``header_extras`` the same for the header.
    """

    def __init__(self, header: ev.Header | None = None,
                 extras: Mapping[int, dict[str, Any]] | None = None,
                 header_extras: Mapping[str, Any] | None = None) -> None:
        self._extras = extras if extras is not None else {}
        self._header_extras = dict(header_extras or {})
        self._pending: dict[Track, dict[str, Any]] = {}
        self._named: set[Track] = set()
        self._streams: set[int] = set()
        self._last_t = 0
        self.judge = Judge(header, flows=True)
        self._writes: dict[int, tuple[float, Track]] = {}
        """Slice start and track of each write still some page's last write, by seq."""
        self._flow_id = 0
        self.flows = 0
        self._request_end: dict[int, float] = {}
        self.judgement: Judgement | None = None
        """The judgement of everything exported, once :meth:`finish` ran."""

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
                self._written(event.seq, start, track)
            case ev.Upload():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                p0, p1 = event.pages
                self._slice(track, ts, f"upload {event.target} pages {p0}..{p1 - 1} → slot "
                                       f"{event.slot} ({event.reason})", "upload", args, out)
            case ev.Read():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                name, cat = self._read(event, args)
                start = self._slice(track, ts, name, cat, args, out)
                for seq, cls in self.judge.missed(event):
                    write = self._writes.get(seq)
                    if write is not None and write[0] <= start:
                        # (a damaged file's write stamped later than the read is not drawn
                        # backwards in time)
                        out += self._flow(seq, cls, write, start, track)
            case ev.Evict():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                self._slice(track, ts, f"evict slot {event.slot}", "evict", args, out)
            case ev.Kernel():
                track = self._track(event.stream, event.layer, CACHE_TID, out)
                self._slice(track, ts, f"kernel {event.name}", "kernel", args, out)
            case ev.Fits():
                self._slice((RUNTIME_PID, DISPATCH_TID), ts, self._fits(event, args), "fits",
                            args, out)
            case ev.Learn():
                self._slice(runtime, ts, f"learn layer {event.layer}"
                            + (" (relearn)" if event.relearn else ""), "learn", args, out)
            case ev.Mark():
                self._slice(runtime, ts, f"mark {len(event.rows)} row run(s)"
                            + (" (all pages)" if event.all else ""), "mark", args, out)
            case ev.Invalidate():
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
                verdict = ("no reference" if event.diverged is None else
                           "diverged" if event.diverged else "")
                out.append({"ph": "i", "s": "t", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "output", "name": f"output stream {event.stream}"
                            + (f" ({verdict})" if verdict else ""), "args": args})
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
            case ev.Snapshot():
                out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID,
                            "ts": ts, "cat": "snapshot",
                            "name": _name(f"segment starts ({event.reason or 'snapshot'})"),
                            # counts only: a snapshot holds every pool and ring slot
                            "args": {"kind": "snapshot", "seq": event.seq, "step": event.step,
                                     "reason": event.reason,
                                     "pool_slots": sum(len(c.versions) for c in event.pool),
                                     "ring_slots": sum(len(c.versions) for c in event.ring),
                                     "host_views": len(event.versions),
                                     "ring_pending": len(event.ring_pending)}})
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

    # -- the judgement's verdicts -----------------------------------------------------------

    def _written(self, seq: int, ts: float, track: Track) -> None:
        self._writes[seq] = (ts, track)

    def _forget_writes(self) -> None:
        """Between chunks: forget the writes no page has as its last write any more (a read
        of a later chunk cannot have missed them)."""
        if len(self._writes) >= PRUNE_WRITES:
            live = self.judge.live_writes()
            self._writes = {s: w for s, w in self._writes.items() if s in live}

    def _read(self, event: ev.Read, args: dict[str, Any]) -> tuple[str, str]:
        """The read's slice name and category, and its verdict into ``args``."""
        v = self.judge.verdict(event)
        assert v is not None, "a read is drawn while its chunk is the judge's last"
        counts = dict(zip(("exact", "stale", "foreign", "not_judged"), v.counts, strict=True))
        verdict: dict[str, Any] = dict(counts)
        if event.served:
            verdict["runs"] = [_run(p) for p in v.pieces]
        elif sum(v.counts):
            verdict["why"] = WHY[v.pieces[0][12]] if v.pieces else ""
        args["verdict"] = verdict
        bad = [CLASSES[c] for c in (1, 2, 3) if v.counts[c]]
        name = f"read stream {event.stream}" + (f" ({', '.join(bad)})" if bad else "")
        cat = "alias" if v.counts[1] or v.counts[2] else "not-judged" if v.counts[3] else "read"
        return name, cat

    def _fits(self, event: ev.Fits, args: dict[str, Any]) -> str:
        name = f"fits {event.route}{'' if event.result else ' (false)'} layer {event.layer}"
        v = self.judge.fits_verdict(event)
        if v.outcome not in BAD:
            return name
        args["verdict"] = {"outcome": v.outcome, "failed": list(v.failed), "by": v.by,
                           **({"note": v.note} if v.note else {})}
        return f"{name}: {v.outcome}" + (f" ({v.shown()})" if v.failed else "")

    def _flow(self, seq: int, cls: str, write: tuple[float, Track], ts: float,
              track: Track) -> list[dict[str, Any]]:
        self._flow_id += 1
        self.flows += 1
        w_ts, (w_pid, w_tid) = write
        common = {"cat": f"{cls}-read", "name": f"write the read missed ({cls} page)",
                  "id": self._flow_id}
        return [{**common, "ph": "s", "pid": w_pid, "tid": w_tid, "ts": w_ts,
                 "args": {"write_seq": seq}},
                {**common, "ph": "f", "bp": "e", "pid": track[0], "tid": track[1], "ts": ts}]

    def _conclusion(self, ts: float) -> list[dict[str, Any]]:
        """The judgement of the whole trace, and what it could not judge, as instants."""
        j = self.judgement = self.judge.snapshot()
        out: list[dict[str, Any]] = [{
            "ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": ts,
            "cat": "judgement", "name": "judgement: " + ", ".join(
                f"{k.replace('_', ' ')} {n}" for k, n in j.residency["read_classes"].items())
            + f" page(s); {self.flows} flow(s); {j.steps.text()}",
            "args": {"read_classes": j.residency["read_classes"], "flows": self.flows,
                     "steps": j.steps.count, "status": j.status,
                     "completeness": j.completeness.as_json(),
                     "lost_events": j.summary()["lost_events"],
                     "findings": [f.rule for f in j.findings]}}]
        if j.lost:
            out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": ts,
                        "cat": "events-lost", "name": lost_text(j.lost), "args": j.lost})
        for k in j.completeness.missing:
            out.append({"ph": "i", "s": "g", "pid": RUNTIME_PID, "tid": GLOBAL_TID, "ts": ts,
                        "cat": "not-recorded", "name": f"not recorded: {k.kind}",
                        "args": {"kind": k.kind, "hides": k.hides,
                                 "source": j.completeness.source}})
        return out

    # -- output ---------------------------------------------------------------------------

    def finish(self) -> list[dict[str, Any]]:
        """End the slices still open (the last on each track; a step without an End)."""
        out: list[dict[str, Any]] = []
        end = _us(self._last_t)
        for track in list(self._pending):
            prev = self._pending[track]
            cap = LAST_SLICE_US if track != (RUNTIME_PID, UBATCH_TID) else float("inf")
            self._close(track, max(end, prev["ts"] + LAST_SLICE_US), out, cap)
        return out + self._conclusion(end)

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
        for chunk in batches(events):
            self.judge.feed_all(chunk)
            for event in chunk:
                emit(self.convert(event))
            self._forget_writes()
        emit(self.finish())
        out.write(b"\n]\n")
        return n


def _run(p: tuple[int, ...]) -> dict[str, Any]:
    """One non-exact run of a read's verdict (a ``slots.Piece``) as JSON."""
    out: dict[str, Any] = {"pages": [p[0], p[1]], "source": SOURCES[p[2]], "slot": p[3],
                           "class": CLASSES[p[4]]}
    if p[5]:
        out["writes_missed"] = p[5]
    if p[6] >= 0:
        out["holder"] = {"layer": p[6], "stream": p[7], "page": p[8], "version": p[9],
                         "upload_seq": p[11]}
    if p[12]:
        out["why"] = WHY[p[12]]
    return out

