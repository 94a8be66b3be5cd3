"""What the trace records, and for each judged kind it lacks, what cannot be judged.

A writer may **declare** what it records: the header's ``records`` (event kind names, maybe
``read.served``-style field entries) and later ``records`` events (``kinds``: more kinds
declared); kvtrace.h declares the macros the fork calls. When it declares, a kind it does not
list is not recorded, whatever else the trace shows. A trace without a declaration (the
model's, older native ones, imported logs) has its completeness **inferred** from what it
contains, and says so: a kind is missing when the activity it records visibly happened
(page reads without any ``upload``; attention without any ``read``), because an absent kind
and a run where it never happened look alike.

A missing kind is never judged as "nothing happened": the pages, decisions or outputs it would
have judged are *not judged*, and an ``info`` finding ``not-recorded`` names the kind and what
it hides (:data:`HIDES`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

JUDGED_KINDS: tuple[str, ...] = ("step", "fits", "write", "upload", "read", "output")
"""Kinds the judgement needs; ``mark``, ``learn``, ``evict`` and the rest may be absent because
nothing happened, so their absence is never reported (``invalidate``: :data:`DECLARED_ONLY`)."""

DECLARED_ONLY: tuple[str, ...] = ("invalidate",)
"""Kinds whose absence is said only under a declaration that leaves them out, and only when
the trace reads pages from slots: a run may never clear its cache, so an undeclared trace
without them is not taken to miss them."""

HIDES: dict[str, str] = {
    "invalidate": "wholesale clears of the resident cache (buffer clear, reconfigure, "
                  "repartition, resize): if the runtime clears it, a cleared slot still looks "
                  "loaded, and a read served from it without a new upload is judged from its "
                  "last copy",
    "step": "ubatch boundaries: steps are only the writer's numbering of its events",
    "fits": "dispatch decisions: fits-dispatch-mismatch and fallback are not judged",
    "write": "page versions: a slot holding the right page cannot be told current from old "
             "(exact vs stale not judged; foreign still is)",
    "upload": "slot contents: no page read from a pool or ring slot is judged",
    "read": "page reads: no stale or foreign page read is judged",
    "output": "outputs against a reference: stream divergence is not judged",
}

Source = Literal["declared", "inferred"]


class KindStatus(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: str
    events: int
    recorded: bool
    hides: str = ""
    """What its absence hides (empty when recorded)."""


class Completeness(msgspec.Struct, frozen=True):
    source: Source
    declared: tuple[str, ...]
    """The declaration as written (empty when inferred)."""
    kinds: tuple[KindStatus, ...]

    @property
    def missing(self) -> tuple[KindStatus, ...]:
        return tuple(k for k in self.kinds if not k.recorded)

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "declared": list(self.declared),
                "kinds": {k.kind: {"events": k.events, "recorded": k.recorded,
                                   **({"hides": k.hides} if k.hides else {})}
                          for k in self.kinds}}


def declared_kinds(entries: Iterable[object]) -> set[str]:
    """Kind names of a declaration: ``"read"`` and ``"read.served"`` both declare ``read``."""
    return {e.split(".", 1)[0] for e in entries if isinstance(e, str) and e}


class CompletenessTracker:
    """Fed by the Judge: the declaration, and the activity the inference looks at."""

    def __init__(self, declared: Iterable[str] | None = None) -> None:
        self.declared: list[str] | None = None if declared is None else [
            d for d in declared if isinstance(d, str)]
        self._kinds: set[str] = declared_kinds(self.declared or ())
        self.attention = 0
        """fits decisions routed to the streamed kernel or the fallback: a read followed."""
        self.aborts = 0
        """``abort`` events: a run without fits decisions that aborted may have died before
        any attention ran, so the inference does not expect reads of it (an imported log of
        a crash: its abort is all it shows)."""
        self.slot_pages = 0
        """Pages read from a pool or ring slot."""
        self.decided = 0
        """Events that say a fits decision was made: the fallback warning
        (``kv-stream-fallback``) and the abort of the streamed kernel's fits assert."""

    def declare(self, kinds: Iterable[object]) -> None:
        """A ``records`` event: more kinds declared."""
        entries = [k for k in kinds if isinstance(k, str)]
        self.declared = [*(self.declared or []), *entries]
        self._kinds |= declared_kinds(entries)

    def is_declared(self, kind: str) -> bool | None:
        """True/False under a declaration, None when the trace declares nothing."""
        return None if self.declared is None else kind in self._kinds

    def result(self, counts: dict[str, int]) -> Completeness:
        kinds: list[KindStatus] = []
        any_event = sum(n for k, n in counts.items() if k != "end") > 0
        for kind in JUDGED_KINDS:
            n = counts.get(kind, 0)
            if self.declared is not None:
                recorded = n > 0 or kind in self._kinds
            else:
                recorded = n > 0 or not self._expected(kind, counts, any_event)
            kinds.append(KindStatus(kind, n, recorded, "" if recorded else HIDES[kind]))
        if self.declared is not None and self.slot_pages > 0:
            for kind in DECLARED_ONLY:
                n = counts.get(kind, 0)
                recorded = n > 0 or kind in self._kinds
                kinds.append(KindStatus(kind, n, recorded, "" if recorded else HIDES[kind]))
        return Completeness("inferred" if self.declared is None else "declared",
                            tuple(self.declared or ()), tuple(kinds))

    def _expected(self, kind: str, counts: dict[str, int], any_event: bool) -> bool:
        """Inference: would this kind have events, from what else the trace shows?"""
        if not any_event:
            return True  # a header and an end: nothing is recorded
        reads = counts.get("read", 0)
        if kind == "step":
            return True
        if kind == "read":
            return self.attention > 0 or (counts.get("fits", 0) == 0 and self.aborts == 0)
        if kind in ("write", "upload"):
            return self.slot_pages > 0
        if kind == "fits":
            return reads > 0 or counts.get("write", 0) > 0 or self.decided > 0
        if kind == "output":
            return reads > 0
        return False
