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

Events can also be lost where no seq shows it: lines deleted and the rest numbered again (a
hand edit, a tool that re-sequences, the lines of one kind taken out). The End event still
says how many events were written before it (``events``: kvdiag's ``TraceWriter.close``
``events=self._seq``; kvtrace.h ``"events", S->seq`` beside ``"seq", S->seq + 1``), so where
it counts more than its own seq accounts for, the difference is lost and **where** is not
recorded (:meth:`SeqGaps.ended`). Seq gaps, events before a first snapshot and a rotated set's
skipped seqs are all below the End's seq, so nothing is counted twice; an End that counts
fewer events than its seq says is the reader's ``count`` problem, not a loss.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvdiag.model import events as ev

_SEQ = operator.attrgetter("seq")

MAX_GAPS = 20
"""Gaps listed one by one (each counted beyond that)."""


def one_by_one(events: Sequence[Any]) -> bool:
    """Whether the seqs of ``events`` (at least one) rise one by one: its first and last seq
    against the count, and the seqs between compared with a range (C speed) — a block out of
    order (a line repeated) can have the count of a whole run and hide a lost seq."""
    first, last, n = events[0].seq, events[-1].seq, len(events)
    return last - first == n - 1 and (n < 3 or list(map(_SEQ, events)) == list(range(first,
                                                                                    last + 1)))


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
        """Events lost in gaps in seq."""
        self.skipped = 0
        """Seqs before a first snapshot, and a rotated set's jumps onto a segment's snapshot:
        summarised by the snapshot, not lost."""
        self.unplaced = 0
        """Events the End counts that no seq accounts for: lost, place unknown (:meth:`ended`)."""
        self.end_count: int | None = None
        """The End event's ``events`` (None: no End yet)."""
        self.end_seq = 0
        self.end_step = 0
        self.accounted = 0
        """What the seqs account for before the End (events here, in gaps, skipped)."""

    @property
    def any(self) -> bool:
        """Events are lost: in gaps in seq, or counted by the End where no seq shows them."""
        return bool(self.count or self.unplaced)

    @property
    def events(self) -> int:
        """Every event lost: in gaps and unplaced."""
        return self.lost + self.unplaced

    def ended(self, end: ev.End) -> None:
        """The End event, after :meth:`split` has seen it: the events it counts that neither
        the events here nor the seqs' gaps account for are lost, where is unknown. The seqs
        account for ``end.seq - 1`` when the End's seq is the highest seen (the writers number
        it ``events + 1``: module docstring); else for the highest seq seen (a seq after the
        End's, or before it and above it: the reader's ``sequence`` and ``after-end``
        problems)."""
        if self.end_count is not None:
            return
        top = (self.next or 1) - 1
        accounted = end.seq - 1 if top == end.seq else top
        self.end_count, self.end_seq, self.end_step = end.events, end.seq, end.step
        self.accounted = max(accounted, 0)
        self.unplaced = max(end.events - self.accounted, 0)

    @property
    def here(self) -> int:
        """Events before the End that the trace holds, as the seqs count them: what they
        account for less what is lost in gaps and what a snapshot summarises."""
        return max(self.accounted - self.lost - self.skipped, 0)

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
        if (first == self.next or (self.next is None and first == 1)) and one_by_one(events):
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
                elif seq > 1:
                    self.skipped += seq - 1
            elif seq > expect:
                snap = type(e) is ev.Snapshot
                if not (snap and self.rotated):
                    out.append((self._gap(expect, seq - 1, e, snap), i))
                else:
                    self.skipped += seq - expect
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
        """The summary's ``lost_events``: ``events`` every event lost (in gaps and unplaced),
        ``gaps`` and ``first`` the gaps in seq, and ``unplaced`` (only when some are) the
        events the End counts that no seq accounts for, ``place`` ``unknown``."""
        out: dict[str, Any] = {
            "events": self.events, "gaps": self.count, "declared_dropped": self.declared_dropped,
            "first": [{"first_seq": g.first, "last_seq": g.last, "events": g.events,
                       "step_before": g.step_before, "step_after": g.step_after,
                       "onto_snapshot": g.onto_snapshot} for g in self.gaps]}
        if self.unplaced:
            out["unplaced"] = {"events": self.unplaced, "end_count": self.end_count,
                               "accounted": self.accounted, "here": self.here,
                               "end_seq": self.end_seq, "end_step": self.end_step,
                               "place": "unknown"}
        return out


def between(step_before: int | None, step_after: int) -> str:
    """Where a gap lies, by the steps of the events on either side of it."""
    if step_before is None:
        return f"before the first event (step {step_after})"
    if step_before == step_after:
        return f"in step {step_after}"
    return f"between step {step_before} and step {step_after}"


def counted(u: dict[str, Any]) -> str:
    """What the End counts against what the trace holds (an ``unplaced`` summary)."""
    if u["accounted"] == u["here"]:
        return f"the End line counts {u['end_count']}, {u['here']} are here"
    return (f"the End line counts {u['end_count']}, the seqs account for {u['accounted']} "
            f"({u['here']} here)")


def _first(lost: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The first gap of a ``lost_events`` summary, and its seqs in words."""
    first = lost["first"][0]
    return first, (f"seq {first['first_seq']}" if first["events"] == 1
                   else f"seq {first['first_seq']}–{first['last_seq']}")


def lost_where(lost: dict[str, Any]) -> str:
    """The events a trace lost (its ``lost_events`` summary, some lost), in a few words: how
    many, the first gap's seqs and steps, how many more gaps, what the writer declares, and
    those whose place is unknown."""
    u = lost.get("unplaced")
    unknown = (f"{u['events']} event(s) where no seq shows it (place unknown: {counted(u)})"
               if u else "")
    if not lost["gaps"]:
        return unknown
    first, seqs = _first(lost)
    more = f", and {lost['gaps'] - 1} more gap(s)" if lost["gaps"] > 1 else ""
    said = (f"; its writer declares {lost['declared_dropped']} event(s) dropped"
            if lost.get("declared_dropped") else "")
    in_gaps = lost["events"] - (u["events"] if u else 0)
    return (f"{in_gaps} event(s) ({seqs} "
            f"{between(first['step_before'], first['step_after'])}{more}{said})"
            + (f", and {unknown}" if unknown else ""))


def lost_text(lost: dict[str, Any] | None) -> str | None:
    """One line for the events a trace lost (the judgement's ``lost_events`` summary: gaps in
    seq, and events the End counts where no seq shows them), or None when it lost none."""
    if not lost or not lost.get("events"):
        return None
    u = lost.get("unplaced")
    unknown = (f"{u['events']} event(s) lost from the trace where no seq shows it "
               f"({counted(u)}); where they were lost is not recorded, so every page class "
               "may rest on an incomplete record" if u else "")
    if not lost["gaps"]:
        return unknown
    first, seqs = _first(lost)
    more = f" and {lost['gaps'] - 1} more gap(s)" if lost["gaps"] > 1 else ""
    in_gaps = lost["events"] - (u["events"] if u else 0)
    return (f"{in_gaps} event(s) lost from the trace (gaps in seq: {seqs}{more}); "
            f"every verdict from seq {first['first_seq']} on rests on an incomplete record"
            + (f"; and {unknown}" if unknown else ""))


def recorded_text(missing: list[str], lost: dict[str, Any] | None, *,
                  verb: str = "", how: str = "") -> str:
    """What the trace records, in a few words, for every surface's completeness line: the
    judged kinds it lacks, or every one — qualified when events are lost (the judgement's
    ``lost_events``): a kind recorded may have lost events of its own, and where no seq shows
    the loss (``unplaced``) any kind may be among them. ``verb``: " is recorded" where the
    surface words it as a sentence; ``how``: how that is known (declared or inferred), said
    right after it."""
    head = (f"not recorded: {', '.join(missing)}" if missing
            else f"every judged kind{verb}") + (f" ({how})" if how else "")
    if not lost or not lost.get("events"):
        return head
    place = ("where is not recorded" if lost.get("unplaced") and not lost["gaps"]
             else "in gaps in seq" if not lost.get("unplaced") else "in gaps in seq and "
             "where is not recorded")
    return (f"{head}, yet {lost['events']} event(s) written are not in the trace ({place}): "
            "events of any kind may be among them")
