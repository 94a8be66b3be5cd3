"""A request in flight on one slot while ``kvdiag perf`` reads a log: the state its lines
build up until its timing and release are read (:mod:`kvdiag.postmortem.perfscan`, the
late-2023 form's pairing in :mod:`kvdiag.postmortem.perflate`)."""

from __future__ import annotations

import msgspec

from kvdiag.postmortem.timinglines import Figures


class Pending(msgspec.Struct, gc=False):
    """A request in flight on one slot (a msgspec Struct: made once per request, in C; not
    tracked by the cyclic garbage collector, as :class:`~kvdiag.model.perf.RequestTiming`:
    numbers, figures and a list of ints, in no cycle)."""

    task: int | None
    started: int | None = None
    depth_start: int | None = None
    n_ctx_slot: int | None = None
    cached: int | None = None
    prompt: Figures | None = None
    decode: Figures | None = None
    line: int = 0
    graphs: int | None = None
    notes: list[int] = msgspec.field(default_factory=list)
    orphan: bool = False
    """Began before the part of the log this scanner reads (:mod:`perfsplit`)."""
    stopped: tuple[int, bool | None] | None = None
    """``(depth at end, truncated)`` of a release line read before the timing: the servers of
    late 2024 logged ``stop processing`` first (:mod:`kvdiag.postmortem.perfscan`)."""
    stopped_notes: int = 0
    """How many notes had been logged at that release: the later ones are not its own."""
