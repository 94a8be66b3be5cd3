"""What ``kvdiag trace info`` shows: one pass over a trace reduced to a frozen summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from kvdiag.model.events import AnyEvent, End, Header, Unknown
from kvdiag.trace.problems import Problem
from kvdiag.trace.reader import TraceReader


class TraceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Counts, the time span and problems of one trace file (the span is None when it has no
    events). How many steps is the judgement's to say (``Judgement.steps``: ``trace info``
    shows it), not this summary's.

    ``extra_fields`` counts, per ``kind.path``, fields of known kinds that this version does not
    declare (newer minor versions only); ``header_extras`` the same for the header.
    """

    name: str
    header: Header
    version: str
    newer_minor: bool
    counts: dict[str, int]
    unknown_kinds: tuple[str, ...]
    events: int
    lines: int
    first_t_ns: int | None
    last_t_ns: int | None
    end: End | None
    truncated: bool
    problems: tuple[Problem, ...]
    extra_fields: dict[str, int]
    header_extras: dict[str, Any]
    segments: dict[str, Any] | None = None
    """A segment set read as one (kvdiag/trace/segments.py): ``text``, ``indices`` read,
    ``dropped_before`` (deleted by KVTRACE_KEEP), ``keep``, ``left_out``; None for one file."""

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def valid(self) -> bool:
        """No problems at all (which includes having an End event)."""
        return not self.problems

    @property
    def duration_ns(self) -> int | None:
        if self.first_t_ns is None or self.last_t_ns is None:
            return None
        return self.last_t_ns - self.first_t_ns

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``trace info --json``."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["complete"] = self.complete
        data["valid"] = self.valid
        data["duration_ns"] = self.duration_ns
        return data


def summarize(reader: TraceReader,
              observe: Callable[[AnyEvent | Unknown], object] | None = None) -> TraceSummary:
    """Read the rest of ``reader`` and summarise it; ``observe`` sees every event too (so
    that ``trace info`` judges the trace in the same pass)."""
    kinds: Counter[str] = Counter()
    unknown: set[str] = set()
    extra_fields: Counter[str] = Counter()
    extras = reader.extras  # filled only for files of a newer minor version
    n = 0
    first_t = last_t = None
    lo_t = hi_t = 0
    for event in reader:
        if observe is not None:
            observe(event)
        if isinstance(event, Unknown):
            kind = event.kind
            unknown.add(kind)
        else:
            kind = event.__struct_config__.tag  # type: ignore[assignment]
        kinds[kind] += 1
        if extras and event.seq in extras:
            extra_fields.update(f"{kind}.{path}" for path in extras[event.seq])
        t = event.t_ns
        if n == 0:
            lo_t = hi_t = t
        else:
            # Min and max, not first and last: a damaged file may be out of order.
            if t < lo_t:
                lo_t = t
            elif t > hi_t:
                hi_t = t
        n += 1
    if n:
        first_t, last_t = lo_t, hi_t
    return TraceSummary(
        name=reader.name,
        header=reader.header,
        version=reader.version_text,
        newer_minor=reader.newer_minor,
        counts=dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        unknown_kinds=tuple(sorted(unknown)),
        events=n,
        lines=reader.lines_read,
        first_t_ns=first_t,
        last_t_ns=last_t,
        end=reader.end,
        truncated=reader.truncated,
        problems=tuple(reader.problems),
        extra_fields=dict(sorted(extra_fields.items())),
        header_extras=dict(reader.header_extras),
        segments=None if reader.segments is None else {
            "text": reader.segments.text(), "indices": list(reader.segments.indices),
            "dropped_before": reader.segments.dropped_before, "keep": reader.segments.keep,
            "left_out": list(reader.segments.left_out)},
    )
