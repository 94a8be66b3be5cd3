"""A trace's ``timing`` events and the kv-stream events around them as a
:class:`~kvdiag.model.perf.PerfRun` (``kvdiag perf`` on a trace; format 1.2).

The same record the log reader builds (:mod:`kvdiag.postmortem.perfscan`), from events instead
of lines: ``line`` is an event's ``seq``. An event belongs to every request in flight when it
was written: those whose ``started_ns`` … ``t_ns`` span holds its time (without ``started_ns``,
from the slot's previous timing). Boots are counted by the importer's ``import-boot`` warnings.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from kvdiag.model import events as ev
from kvdiag.model.perf import AdaptPages, NoteKind, PerfRun, RequestTiming, StreamNote

_WARN_NOTES: dict[str, NoteKind] = {
    "kv-stream-fallback": "fallback", "fallback": "fallback", "kv-stream-feedback": "feedback",
    "kv-stream-layout": "layout",
}


def run_from_events(name: str, source: str,
                    events: Iterable[ev.AnyEvent | ev.Unknown]) -> PerfRun:
    requests: list[RequestTiming] = []
    notes: list[StreamNote] = []
    times: list[int] = []
    adapt = AdaptPages()
    boot = 0
    last_active: int | None = None
    slot_end: dict[tuple[int, int | None], int] = {}

    def note(e: ev.Event, kind: NoteKind, **fields: object) -> None:
        notes.append(StreamNote(source, e.seq, boot, kind, depth=last_active,
                                **fields))  # type: ignore[arg-type]
        times.append(e.t_ns)

    for e in events:
        if isinstance(e, ev.Timing):
            begin = e.started_ns
            if begin is None:
                begin = slot_end.get((e.boot, e.slot), 0)
            slot_end[(e.boot, e.slot)] = e.t_ns
            first = bisect.bisect_left(times, begin)
            inside = tuple(i for i in range(first, len(notes)) if times[i] <= e.t_ns)
            requests.append(RequestTiming(
                source=source, line=e.seq, boot=e.boot, slot=e.slot, task=e.task,
                prompt_tokens=e.prompt_tokens, prompt_ms=e.prompt_ms, prompt_tps=e.prompt_tps,
                decode_tokens=e.decode_tokens, decode_ms=e.decode_ms, decode_tps=e.decode_tps,
                ms_per_token=e.ms_per_token, depth_start=e.depth_start, depth_end=e.depth_end,
                cached=e.cached, n_ctx_slot=e.n_ctx_slot, truncated=e.truncated,
                graphs_reused=e.graphs_reused, notes=inside))
        elif isinstance(e, ev.Adapt):
            last_active = e.active
            adapt.add(boot, e.seq, e.active, e.resident, e.ring, e.samples, e.misses,
                      e.busy_pct, e.peak, e.layout)
        elif isinstance(e, ev.Repartition):
            note(e, "repartition", resident=e.resident, ring=e.ring, miss_pct=e.miss_pct,
                 busy_pct=e.busy_pct, message=e.reason)
        elif isinstance(e, ev.Warn):
            if e.code == "import-boot":
                boot += 1
                last_active = None
            elif e.code in _WARN_NOTES:
                note(e, _WARN_NOTES[e.code], message=e.message[:200], layer=e.layer)
        elif isinstance(e, ev.Fits) and not e.result and e.membership:
            note(e, "fits-false", message=f"fits() false on layer {e.layer}, route {e.route}",
                 layer=e.layer if e.layer >= 0 else None)
    return PerfRun(name=name, source=source, kind="trace", requests=tuple(requests),
                   notes=tuple(notes), adapt=adapt.result())
