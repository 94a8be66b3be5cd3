"""Events lost from a trace: jumps in ``seq`` (docs/trace-format.md, "Lost events").

Every writer numbers its events 1, 2, 3, ... in file order and never skips a number on purpose
while it writes on: docs/trace-format.md (``seq``: "+1 for each next event in the file");
kvdiag's ``TraceWriter.emit`` (``self._seq += 1`` per event it buffers); kernels/kvtrace.h
(``seq = ++S->seq`` stamped and written under one mutex, the segment's snapshot numbered
``S->seq + 1`` before ``S->seq++``; a failed ``write()`` turns tracing off, so nothing follows
it). So a seq that jumps means events were written and are not here: lines deleted from the
file (``grep -v``, an edit), a copy cut in the middle, a damaged line the reader skipped
(its ``corrupt`` problem), or a flight recorder that could not keep them — kvtrace.h's
``KVTRACE_RING_MB`` after a snapshot that did not fit drops the events that no longer fit and
counts them in the header's ``extra.segment.dropped``: a loss the writer declares, still a loss.

Three jumps are no loss of this kind:

- onto the first event when it is a ``snapshot`` (a segment read alone, a flight recorder's
  window): the events before it are summarised by it;
- onto a ``snapshot`` inside a rotated set (``extra.segment.mode`` ``rotate``): a segment
  boundary, checked by the set's reader (its ``gap`` problem names the files and the seqs
  lost; kvdiag/trace/segments.py), and the state goes on from the snapshot;
- a seq not greater than the previous one: the reader's ``sequence`` problem.

The check costs a comparison of a block's seqs with a range (its first and last seq against
the count, and the seqs between rising one by one); only a block that fails it is looked at
event by event.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvdiag.model import events as ev

_SEQ = operator.attrgetter("seq")

MAX_GAPS = 20
"""Gaps listed one by one (each counted beyond that)."""


class Gap(NamedTuple):
    """Seqs ``first`` .. ``last`` are missing between the event before them (``step_before``)
    and the one after (``seq_after`` at ``step_after``)."""

    first: int
    last: int
    step_before: int | None
    step_after: int
    onto_snapshot: bool
    """The event after the gap is a snapshot: the page state goes on from it; what else the
    lost events held (decisions, aborts, outputs) is lost."""

    @property
    def events(self) -> int:
        return self.last - self.first + 1


class SeqGaps:
    """Finds the gaps in the seqs of the events fed, in file order (:meth:`split`)."""

    def __init__(self, header: ev.Header | None) -> None:
        segment = getattr(header, "extra", {}).get("segment") if header is not None else None
        segment = segment if isinstance(segment, dict) else {}
        self.rotated = segment.get("mode") == "rotate"
        dropped = segment.get("dropped")
        self.declared_dropped = dropped if type(dropped) is int and dropped > 0 else 0
        """Events kvtrace.h's flight recorder says it dropped (header ``extra.segment``)."""
        self.next: int | None = None
        """The seq the next event should have (None: no event yet)."""
        self.step: int | None = None
        """The step of the last event."""
        self.gaps: list[Gap] = []
        """The first :data:`MAX_GAPS` gaps."""
        self.count = 0
        self.lost = 0

    def split(self, events: Sequence[Any]) -> list[tuple[Gap, int]]:
        """Where ``events`` (the next ones in file order) lose events: ``(gap, i)`` for each
        gap found before ``events[i]``, in order. An empty list when their seqs go on one by
        one (the usual case, decided from the first and last event alone)."""
        n = len(events)
        if not n:
            return []
        first, last = events[0].seq, events[-1].seq
        # First and last settle it only where the seqs in between rise one by one: a block the
        # reader found out of order (its "sequence" problem: a line repeated) can hide a lost
        # seq behind the repeated one (compared with a range: C speed).
        if ((first == self.next or (self.next is None and first == 1)) and last - first == n - 1
                and (n < 3 or list(map(_SEQ, events)) == list(range(first, last + 1)))):
            self.next = last + 1
            self.step = events[-1].step
            return []
        out: list[tuple[Gap, int]] = []
        for i, e in enumerate(events):
            seq = e.seq
            expect = self.next
            if expect is None:
                if seq > 1 and type(e) is not ev.Snapshot:
                    out.append((self._gap(1, seq - 1, e, False), i))
            elif seq > expect:
                snap = type(e) is ev.Snapshot
                if not (snap and self.rotated):
                    out.append((self._gap(expect, seq - 1, e, snap), i))
            if expect is None or seq >= expect:
                self.next = seq + 1
            self.step = e.step
        return out

    def went_on(self, count: int, step: int) -> None:
        """``count`` more events came, numbered on from :attr:`next` one by one (checked by the
        pass that read them: :meth:`Judge.scan <kvdiag.analysis.judgement.judge.Judge.scan>`),
        the last at ``step``."""
        assert self.next is not None
        self.next += count
        self.step = step

    def _gap(self, first: int, last: int, after: Any, snap: bool) -> Gap:
        g = Gap(first, last, self.step, after.step, snap)
        self.count += 1
        self.lost += g.events
        if len(self.gaps) < MAX_GAPS:
            self.gaps.append(g)
        return g

    def as_json(self) -> dict[str, Any]:
        """The summary's ``lost_events`` (empty gaps: none lost)."""
        return {"events": self.lost, "gaps": self.count,
                "declared_dropped": self.declared_dropped,
                "first": [{"first_seq": g.first, "last_seq": g.last, "events": g.events,
                           "step_before": g.step_before, "step_after": g.step_after,
                           "onto_snapshot": g.onto_snapshot} for g in self.gaps]}


def between(step_before: int | None, step_after: int) -> str:
    """Where a gap lies, by the steps of the events on either side of it."""
    if step_before is None:
        return f"before the first event (step {step_after})"
    if step_before == step_after:
        return f"in step {step_after}"
    return f"between step {step_before} and step {step_after}"


def lost_where(lost: dict[str, Any]) -> str:
    """The events a trace lost (its ``lost_events`` summary, some lost), in a few words: how
    many, the first gap's seqs and steps, how many more gaps, what the writer declares."""
    first = lost["first"][0]
    seqs = (f"seq {first['first_seq']}" if first["events"] == 1
            else f"seq {first['first_seq']}–{first['last_seq']}")
    more = f", and {lost['gaps'] - 1} more gap(s)" if lost["gaps"] > 1 else ""
    said = (f"; its writer declares {lost['declared_dropped']} event(s) dropped"
            if lost.get("declared_dropped") else "")
    return (f"{lost['events']} event(s) ({seqs} "
            f"{between(first['step_before'], first['step_after'])}{more}{said})")


def lost_text(lost: dict[str, Any] | None) -> str | None:
    """One line for the events a trace lost (the judgement's ``lost_events`` summary: gaps in
    seq), or None when it lost none."""
    if not lost or not lost.get("events"):
        return None
    first = lost["first"][0]
    seqs = (f"seq {first['first_seq']}" if first["events"] == 1
            else f"seq {first['first_seq']}–{first['last_seq']}")
    more = f" and {lost['gaps'] - 1} more gap(s)" if lost["gaps"] > 1 else ""
    return (f"{lost['events']} event(s) lost from the trace (gaps in seq: {seqs}{more}); "
            f"every verdict from seq {first['first_seq']} on rests on an incomplete record")
