"""Which server slots were busy at a given point, from the slot lines before it (§7.3).

A slot is busy from ``processing task`` (launch) until ``stop processing``/``released``; the
server line ``all slots are idle`` ends every slot. Decode steps print nothing per token, so a
slot that launched and has not released is taken as still decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvdiag.model.logrecords import SlotEvent

_BUSY = frozenset({"launch", "new_prompt", "cache", "progress", "prompt_done"})


def active_slots(events: Sequence[SlotEvent]) -> tuple[int, ...]:
    """Slots whose last event (in time order) leaves them busy, in ascending order."""
    state: dict[int, bool] = {}
    for ev in events:
        if ev.kind == "idle":
            state = {slot: False for slot in state}
        elif ev.slot is not None:
            if ev.kind in _BUSY:
                state[ev.slot] = True
            elif ev.kind == "release":
                state[ev.slot] = False
    return tuple(sorted(slot for slot, busy in state.items() if busy))
