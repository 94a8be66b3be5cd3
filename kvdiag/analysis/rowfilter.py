"""Row filters for indexed traces and logs: a small text syntax and a vectorised evaluation.

Syntax: whitespace-separated terms ``key:values``; ``values`` is a comma list of numbers or
inclusive ranges (``3``, ``2-5``, ``0,4-7``), or of names for ``kind``. A bare word that names
a kind is a kind term. Terms on different keys must all hold; values of one key are
alternatives. Keys: ``kind`` (``k``), ``layer`` (``l``), ``stream`` (``s``), ``slot``, ``step``
(``t``). For a trace, ``slot`` is the pool/ring slot of an upload (any slot of its page run) or
an eviction; for a log it is the server slot of a slot line.

Evaluation is a few numpy operations per column, a slice of :data:`CHUNK_ROWS` rows at a time:
tens of milliseconds for millions of rows, and temporaries of a few MiB whatever the trace's
length (whole-column temporaries were up to 100 MiB on 5M events, bench_tui). The rows are
returned as int32 (an index has fewer than 2**31 rows): half the memory of int64.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Ranges = tuple[tuple[int, int], ...]

ALIASES = {"k": "kind", "kind": "kind", "l": "layer", "layer": "layer", "s": "stream",
           "stream": "stream", "slot": "slot", "t": "step", "step": "step"}
_RANGE = re.compile(r"(-?\d+)(?:(?:-|\.\.)(-?\d+))?")
CHUNK_ROWS = 1 << 18
SlotSpan = Callable[[int, int], np.ndarray]
"""Slots covered per row of ``[lo, hi)`` (an upload of a page run covers several)."""


class FilterError(ValueError):
    """The filter text is not valid; the message says which term and why."""


@dataclass(frozen=True)
class RowFilter:
    kinds: frozenset[str] | None = None
    layer: Ranges | None = None
    stream: Ranges | None = None
    slot: Ranges | None = None
    step: Ranges | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.kinds, self.layer, self.stream, self.slot, self.step))

    def describe(self) -> str:
        parts: list[str] = []
        if self.kinds is not None:
            parts.append("kind:" + ",".join(sorted(self.kinds)))
        for name in ("layer", "stream", "slot", "step"):
            ranges: Ranges | None = getattr(self, name)
            if ranges is not None:
                parts.append(f"{name}:" + ",".join(
                    str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges))
        return " ".join(parts)


def parse_filter(text: str, kinds: Sequence[str]) -> RowFilter:
    """Parse ``text``; kind names must be among ``kinds``."""
    fields: dict[str, set[str] | list[tuple[int, int]]] = {}
    for term in text.split():
        key, sep, value = term.partition(":")
        if not sep:
            key, sep, value = term.partition("=")
        if not sep:
            if term in kinds:
                key, value = "kind", term
            else:
                raise FilterError(f"{term!r}: not a kind; terms look like layer:3 or kind:read")
        name = ALIASES.get(key.lower())
        if name is None:
            raise FilterError(f"{term!r}: unknown key {key!r} (kind, layer, stream, slot, step)")
        if not value:
            raise FilterError(f"{term!r}: no value")
        if name == "kind":
            names = fields.setdefault("kind", set())
            assert isinstance(names, set)
            for v in value.split(","):
                if v not in kinds:
                    raise FilterError(f"{term!r}: unknown kind {v!r} (one of {', '.join(kinds)})")
                names.add(v)
        else:
            ranges = fields.setdefault(name, [])
            assert isinstance(ranges, list)
            for v in value.split(","):
                m = _RANGE.fullmatch(v)
                if m is None:
                    raise FilterError(f"{term!r}: {v!r} is not a number or a range like 2-5")
                lo = int(m.group(1))
                hi = int(m.group(2)) if m.group(2) is not None else lo
                if hi < lo:
                    raise FilterError(f"{term!r}: range {v!r} runs backwards")
                ranges.append((lo, hi))
    kind_set = fields.get("kind")

    def ranges_of(name: str) -> Ranges | None:
        r = fields.get(name)
        return None if r is None else tuple(sorted(r))  # type: ignore[arg-type]

    return RowFilter(
        kinds=None if kind_set is None else frozenset(kind_set),  # type: ignore[arg-type]
        layer=ranges_of("layer"), stream=ranges_of("stream"), slot=ranges_of("slot"),
        step=ranges_of("step"),
    )


def _in_ranges(col: np.ndarray, ranges: Ranges) -> np.ndarray:
    mask = np.zeros(col.shape, bool)
    for lo, hi in ranges:
        mask |= (col >= lo) & (col <= hi)
    return mask


def apply_filter(flt: RowFilter, columns: Mapping[str, np.ndarray], kinds: Sequence[str],
                 slot_span: np.ndarray | SlotSpan | None = None) -> np.ndarray | None:
    """Row numbers that pass ``flt``, ascending (int32); None when the filter is empty (every
    row).

    ``columns`` needs ``kind`` (codes into ``kinds``) and the columns the filter names (a
    missing one matches nothing). ``slot_span`` gives, per row, how many consecutive slots
    from ``slot`` the row covers (an upload of a page run): an array, or a function of a row
    range; None means one.
    """
    if flt.empty:
        return None
    kind = columns["kind"]
    n = len(kind)
    wanted = None if flt.kinds is None else [i for i, k in enumerate(kinds) if k in flt.kinds]
    table = None
    if wanted is not None and kind.dtype.itemsize == 1:
        table = np.zeros(256, bool)  # a lookup by code: one gather instead of a compare per kind
        table[np.array(wanted, np.int64) % 256] = True
    ranged = [(columns.get(name), ranges) for name in ("layer", "stream", "step")
              if (ranges := getattr(flt, name)) is not None]
    if any(col is None for col, _ in ranged) or (flt.slot is not None and "slot" not in columns):
        return np.zeros(0, np.int32)
    out_type = np.int32 if n < 1 << 31 else np.int64
    parts: list[np.ndarray] = []
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        if table is not None:
            mask = table[kind[lo:hi].view(np.uint8)]
        elif wanted is not None:
            mask = np.isin(kind[lo:hi], np.array(wanted, dtype=kind.dtype))
        else:
            mask = np.ones(hi - lo, bool)
        for col, ranges in ranged:
            if not mask.any():
                break
            assert col is not None
            mask &= _in_ranges(col[lo:hi], ranges)
        if flt.slot is not None and mask.any():
            mask &= _slot_hit(columns["slot"][lo:hi], _span(slot_span, lo, hi), flt.slot)
        rows = np.flatnonzero(mask).astype(out_type)
        parts.append(np.add(rows, lo, out=rows))
    return np.concatenate(parts) if parts else np.zeros(0, out_type)


def _span(slot_span: np.ndarray | SlotSpan | None, lo: int, hi: int) -> np.ndarray | None:
    if slot_span is None or isinstance(slot_span, np.ndarray):
        return None if slot_span is None else slot_span[lo:hi]
    return slot_span(lo, hi)


def _slot_hit(slot: np.ndarray, span: np.ndarray | None, ranges: Ranges) -> np.ndarray:
    """Rows whose slots ``[slot, slot + span)`` meet one of ``ranges``."""
    first = slot.astype(np.int64)
    last = first + (np.maximum(span, 1) - 1 if span is not None else 0)
    hit = np.zeros(slot.shape, bool)
    for lo, hi in ranges:
        hit |= (first <= hi) & (last >= lo)
    return hit & (first >= 0)
