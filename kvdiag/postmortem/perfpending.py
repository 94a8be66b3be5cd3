"""A request in flight on one slot while ``kvdiag perf`` reads a log: the state its lines
build up until its timing and release are read (:mod:`kvdiag.postmortem.perfscan`, the
late-2023 form's pairing in :mod:`kvdiag.postmortem.perflate`), and what a scanner of a later
part of the log hands back of one begun before its part (:class:`Orphan`)."""

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


class Orphan(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a scanner that starts mid-log (:mod:`kvdiag.postmortem.perfsplit`) read of a request
    begun before its part: handed back to be joined with the request's start."""

    slot: int
    task: int | None = None
    cached: int | None = None
    prompt: tuple[float | None, int, float | None, float | None] | None = None
    decode: tuple[float | None, int, float | None, float | None] | None = None
    line: int = 0
    graphs: int | None = None
    notes_until: int | None = None
    """How many notes of this part were logged before it ended (None: still in flight at the
    end): those were logged while it was in flight."""
    ended: str = "end"
    """``stop`` (its release line, ``depth_end``/``truncated`` below), ``next`` (a new request
    on its slot), ``boot`` (the server restarted) or ``end`` (still in flight at the end)."""
    depth_end: int | None = None
    truncated: bool | None = None
    started: int | None = None
    """The line of its first line in this part, for the 2024 form (where a task's first line
    opens its request): its start, if the part before did not hold one."""
    notes: tuple[int, ...] = ()
    """The notes of this part logged while it was in flight here: its notes, if the part
    before did not hold its start."""
