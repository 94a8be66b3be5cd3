"""The classification rule: what one page read is, given what its slot held.

A page read from the **host** store is *exact*: zero-copy from the authoritative store itself.
A page read from a pool or ring slot is judged by the copy the slot held
(:mod:`~kvdiag.analysis.judgement.slots` says which copy that is):

- *exact*: a copy of the same (layer, stream, page) at the host page's current version;
- *stale*: a copy of the same page at an older version (``lag`` = writes it missed);
- *foreign*: a copy of another layer's, stream's or page's bytes, or nothing (never uploaded,
  or emptied by ``evict`` / ``invalidate``);
- *not judged*: a fact the verdict needs is not recorded — the read has no ``served`` runs,
  no upload into that kind of slot is recorded (what a slot holds is unknown), no write is
  recorded (a slot holding the right page cannot be told current from old), events were lost
  from the trace since the slot's last known copy (a gap in ``seq``), or the page or slot is
  out of any believable range. The reason is kept with the verdict (:data:`WHY`).

Classes are small integers so that verdicts can be stored in compact columns
(:mod:`~kvdiag.analysis.judgement.ledger`).
"""

from __future__ import annotations

from typing import Final, Literal

EXACT: Final = 0
STALE: Final = 1
FOREIGN: Final = 2
NOT_JUDGED: Final = 3
CLASSES: tuple[str, ...] = ("exact", "stale", "foreign", "not judged")
"""Class names by code."""
ClassName = Literal["exact", "stale", "foreign", "not judged"]

POOL: Final = 0
RING: Final = 1
HOST: Final = 2
SOURCES: tuple[str, ...] = ("pool", "ring", "host")
SOURCE_CODE: dict[str, int] = {s: i for i, s in enumerate(SOURCES)}

# why a page is not judged (codes stored beside NOT_JUDGED verdicts)
NO_SERVED: Final = 1
NO_UPLOAD: Final = 2
NO_WRITE: Final = 3
OUT_OF_RANGE: Final = 4
RING_HISTORY: Final = 5
BEFORE_SNAPSHOT: Final = 6
NO_DISPATCH: Final = 7
LOST_EVENTS: Final = 8
WHY: dict[int, str] = {
    0: "",
    NO_SERVED: "read.served not recorded: where each page came from is unknown",
    NO_UPLOAD: "no upload into this kind of slot recorded: what the slot held is unknown",
    NO_WRITE: "write not recorded: the slot holds the right page, current or old is unknown",
    OUT_OF_RANGE: "page or slot out of any believable range (damaged or hostile trace)",
    RING_HISTORY: "the ring slot's copies go back further than kvdiag keeps",
    BEFORE_SNAPSHOT: "the ring copy the read consumed was made before this segment's snapshot "
                     "(an earlier segment)",
    NO_DISPATCH: "no fits decision of this layer recorded before the read: whether the ring "
                 "copy that replaced the page in its slot waited for the read is unknown",
    LOST_EVENTS: "events are lost from the trace (a gap in seq) since the slot's last known "
                 "copy: a lost upload, evict or invalidate may have changed what it held, or "
                 "made the ring copy the read consumed (or held its layer's dispatch)",
}
WHY_KEY: dict[int, str] = {NO_SERVED: "read.served", NO_UPLOAD: "upload", NO_WRITE: "write",
                           OUT_OF_RANGE: "out-of-range", RING_HISTORY: "ring-history",
                           BEFORE_SNAPSHOT: "before-snapshot", NO_DISPATCH: "fits",
                           LOST_EVENTS: "lost-events"}
"""Short keys of the reasons, for JSON summaries."""

MAX_PAGE: Final = 1 << 20
"""Pages per view beyond which an event is not believed (a 268M-token context): a damaged or
hostile trace must not make the judgement allocate or loop without bound."""
MAX_SLOT: Final = 1 << 22


def classify(same_page: bool, copy_version: int, current: int) -> tuple[int, int]:
    """(class, lag) of a page whose slot held a copy: ``same_page`` when the copy is of the
    read's own (layer, stream, page)."""
    if not same_page:
        return FOREIGN, 0
    if copy_version == current:
        return EXACT, 0
    return STALE, current - copy_version
