"""Row filters for indexed traces and logs: a small text syntax and a vectorised evaluation.

Syntax: whitespace-separated terms ``key:values``; ``values`` is a comma list of numbers or
inclusive ranges (``3``, ``2-5``, ``0,4-7``), or of names for ``kind``. A bare word that names
a kind is a kind term. Terms on different keys must all hold; values of one key are
alternatives. Keys: ``kind`` (``k``), ``layer`` (``l``), ``stream`` (``s``), ``slot``, ``step``
(``t``). For a trace, ``slot`` is the pool/ring slot of an upload (any slot of its page run) or
an eviction; for a log it is the server slot of a slot line.

Evaluation is a few numpy comparisons over whole columns: milliseconds for millions of rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Ranges = tuple[tuple[int, int], ...]

ALIASES = {"k": "kind", "kind": "kind", "l": "layer", "layer": "layer", "s": "stream",
           "stream": "stream", "slot": "slot", "t": "step", "step": "step"}
_RANGE = re.compile(r"(-?\d+)(?:(?:-|\.\.)(-?\d+))?")


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
                 slot_span: np.ndarray | None = None) -> np.ndarray | None:
    """Row numbers that pass ``flt``, ascending; None when the filter is empty (every row).

    ``columns`` needs ``kind`` (codes into ``kinds``) and the columns the filter names (a
    missing one matches nothing). ``slot_span`` gives, per row, how many consecutive slots
    from ``slot`` the row covers (an upload of a page run); None means one.
    """
    if flt.empty:
        return None
    kind = columns["kind"]
    mask = np.ones(kind.shape, bool)
    if flt.kinds is not None:
        codes = [i for i, k in enumerate(kinds) if k in flt.kinds]
        mask &= np.isin(kind, np.array(codes, dtype=kind.dtype))
    for name in ("layer", "stream", "step"):
        ranges: Ranges | None = getattr(flt, name)
        if ranges is not None:
            col = columns.get(name)
            mask &= False if col is None else _in_ranges(col, ranges)
    if flt.slot is not None:
        col = columns.get("slot")
        if col is None:
            mask &= False
        else:
            first = col.astype(np.int64)
            last = first + (np.maximum(slot_span, 1) - 1 if slot_span is not None else 0)
            hit = np.zeros(kind.shape, bool)
            for lo, hi in flt.slot:
                hit |= (first <= hi) & (last >= lo) & (first >= 0)
            mask &= hit
    return np.flatnonzero(mask)
