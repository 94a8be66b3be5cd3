"""The fields the page judgement needs, taken out of decoded events as numpy columns.

:mod:`~kvdiag.analysis.judgement.batch` judges columns, never event objects. Taking the fields
out is a separate step so that ``kvdiag check`` can do it on a few hundred events at a time,
while the decoder has just made them, and judge the columns of many thousands together: holding
a judging chunk's decoded events alive until it is judged made the decoder and the deallocator
work in memory that had left the cache (measured on bench_check's 1M-event trace: decoding
alone took 1.8 s with the events of 256 at a time alive, 3.0 s with 2048 alive).

Per kind, one row per event (``pos`` is the event's index in the columns):

- ``w`` (write): pos, seq, layer, stream, cells begin, cells end; ``w_vlen``/``w_vers`` the
  model's annotated ``versions`` (a cross-check only);
- ``u`` (upload): pos, seq, layer, stream, pages begin, pages end, slot, bytes, target * 8 +
  reason (:data:`REASONS`; 5 for another reason);
- ``e`` (evict): pos, slot; ``inv`` (invalidate): pos;
- ``r`` (read): pos, seq, layer, stream, pool, ring, host (the read's own counts, taken only
  for a read without served runs: 0 otherwise), served runs; ``runs``: begin, end, source
  (:data:`~kvdiag.analysis.judgement.classes.SOURCES`), slot of every served run.

Integers beyond ±2^62 (a damaged or hostile trace's 64-bit values) are clipped
(:data:`BOUND`): beyond every believable page, slot or step anyway.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvdiag.analysis.judgement.classes import HOST, POOL, RING
from kvdiag.model import events as ev

WRITE, UPLOAD, EVICT, INVALIDATE, READ, OTHER = range(6)


class _Codes(dict[type, int]):
    def __missing__(self, key: type) -> int:
        return OTHER


CODE_OF = _Codes({ev.Write: WRITE, ev.Upload: UPLOAD, ev.Evict: EVICT,
                  ev.Invalidate: INVALIDATE, ev.Read: READ})
for _t in (ev.Step, ev.Learn, ev.Fits, ev.Mark, ev.Abort, ev.Warn, ev.Output, ev.Repartition,
           ev.Adapt, ev.Telemetry, ev.Kernel, ev.End, ev.Unknown, ev.Snapshot):
    CODE_OF[_t] = OTHER

REASONS: tuple[str, ...] = ("miss", "dirty", "wide-query", "last-chunk", "ring")
_TARGETS: tuple[str, ...] = ("resident", "ring")
_UPLOAD_KEY = {(t, r): i * 8 + j for i, t in enumerate(_TARGETS) for j, r in enumerate(REASONS)}


class _UploadKeys(dict[tuple[str, str], int]):
    def __missing__(self, key: tuple[str, str]) -> int:
        return _TARGETS.index(key[0]) * 8 + 5


_UKEY = _UploadKeys(_UPLOAD_KEY)
_SOURCE = {"pool": POOL, "ring": RING, "host": HOST}

BOUND = 1 << 62
"""Integers are clipped to ±2^62 for arithmetic (a trace's integers are 64-bit, signed or
not; values that large are beyond every believable page, slot or step anyway)."""

_g = operator.attrgetter
_chain = itertools.chain.from_iterable
_STEP = _g("step")
_W = _g("seq", "layer", "stream")
_CELLS, _PAGES, _SERVED, _RANGES, _VERSIONS = (
    _g("cells"), _g("pages"), _g("served"), _g("ranges"), _g("versions"))
_U = _g("seq", "layer", "stream", "slot", "bytes")
_UTR = _g("target", "reason")
_E = _g("slot")
_R = _g("seq", "layer", "stream")
_COUNTS = _g("pool", "ring", "host")
_RUN = _g("begin", "end", "slot")
_SRC = _g("source")


def clipped(values: Iterable[int]) -> Iterable[int]:
    return (min(max(v, -BOUND), BOUND) for v in values)


def column(make: Callable[[], Iterable[int]], count: int, width: int = 1) -> np.ndarray:
    """``count`` rows of ``width`` integers from a fresh iterable ``make()``."""
    try:
        flat = np.fromiter(make(), np.int64, count * width)
    except OverflowError:  # a damaged or hostile trace's 64-bit unsigned value
        flat = np.fromiter(clipped(make()), np.int64, count * width)
    return flat.reshape(count, width) if width > 1 else flat


def _empty(width: int) -> np.ndarray:
    return np.empty((0, width), np.int64)


@dataclass
class Cols:
    """The columns of a run of events (module docstring)."""

    n: int
    code: np.ndarray
    step: np.ndarray
    w: np.ndarray
    w_vlen: np.ndarray
    w_vers: np.ndarray
    u: np.ndarray
    e: np.ndarray
    inv: np.ndarray
    r: np.ndarray
    runs: np.ndarray
    ranges: list[Any]
    """Per read: its annotated ``ranges`` (the model's; ``()`` for most traces)."""
    served: list[Any] | None
    """Per read: its ``served`` runs as decoded, kept only where some read of the columns is
    annotated (the cross-check compares the annotation with them)."""
    reads: list[Any] | None
    """The read events themselves, where a caller will ask about them by identity."""
    rows0: int = 0
    """The Judge's row of the first event."""


def extract(events: Sequence[Any], types: list[type], keep_reads: bool) -> Cols:
    """The columns of ``events`` (``types``: the type of each)."""
    n = len(events)
    code = np.fromiter(map(CODE_OF.__getitem__, types), np.int8, n)
    step = column(lambda: map(_STEP, events), n)
    order = np.argsort(code, kind="stable")
    bounds = np.cumsum(np.bincount(code, minlength=OTHER + 1)).tolist()
    at = dict(zip(range(OTHER + 1), zip([0, *bounds[:-1]], bounds, strict=True), strict=True))

    def kind(k: int) -> tuple[np.ndarray, list[Any]]:
        lo, hi = at[k]
        pos = order[lo:hi]
        if hi - lo == 0:
            return pos.astype(np.int64), []
        if hi - lo == 1:
            return pos.astype(np.int64), [events[int(pos[0])]]
        return pos.astype(np.int64), list(operator.itemgetter(*pos.tolist())(events))

    wi, ws = kind(WRITE)
    nw = len(ws)
    if nw:
        w = np.concatenate([wi[:, None], column(lambda: _chain(map(_W, ws)), nw, 3),
                            column(lambda: _chain(map(_CELLS, ws)), nw, 2)], axis=1)
        vl = list(map(_VERSIONS, ws))
        if vl.count(()) == nw:  # no annotation (a native trace, most captures): one C pass
            w_vlen, w_vers = np.zeros(nw, np.int64), _empty(2)
        else:
            w_vlen = np.fromiter(map(len, vl), np.int64, nw)
            total = int(w_vlen.sum())
            w_vers = column(lambda: _chain(_chain(vl)), total, 2) if total else _empty(2)
    else:
        w, w_vlen, w_vers = _empty(6), np.empty(0, np.int64), _empty(2)
    ui, us = kind(UPLOAD)
    nu = len(us)
    if nu:
        u = np.concatenate([ui[:, None], column(lambda: _chain(map(_U, us)), nu, 5),
                            column(lambda: _chain(map(_PAGES, us)), nu, 2),
                            np.fromiter(map(_UKEY.__getitem__, map(_UTR, us)), np.int64,
                                        nu)[:, None]], axis=1)
        # columns: pos, seq, layer, stream, slot, bytes, p0, p1, key -> documented order
        u = u[:, [0, 1, 2, 3, 6, 7, 4, 5, 8]]
    else:
        u = _empty(9)
    ei, es = kind(EVICT)
    e = (np.stack([ei, column(lambda: map(_E, es), len(es))], axis=1) if es else _empty(2))
    inv, _ = kind(INVALIDATE)
    ri, rs = kind(READ)
    nr = len(rs)
    if nr:
        served = list(map(_SERVED, rs))
        lens = np.fromiter(map(len, served), np.int64, nr)
        runs_l = list(_chain(served))
        nrun = len(runs_l)
        # a read's own page counts matter only where it has no served runs (not judged)
        counts = np.zeros((nr, 3), np.int64)
        if not lens.all():
            bare = np.flatnonzero(lens == 0)
            counts[bare] = column(lambda: _chain(_COUNTS(rs[i]) for i in bare.tolist()),
                                  bare.size, 3)
        r = np.concatenate([ri[:, None], column(lambda: _chain(map(_R, rs)), nr, 3), counts,
                            lens[:, None]], axis=1)
        if nrun:
            bes = column(lambda: _chain(map(_RUN, runs_l)), nrun, 3)
            src = np.fromiter(map(_SOURCE.__getitem__, map(_SRC, runs_l)), np.int64, nrun)
            runs = np.stack([bes[:, 0], bes[:, 1], src, bes[:, 2]], axis=1)
        else:
            runs = _empty(4)
        ranges = list(map(_RANGES, rs))
        annotated = ranges.count(()) < nr
    else:
        r, runs, ranges, served, annotated = _empty(8), _empty(4), [], [], False
    return Cols(n, code, step, w, w_vlen, w_vers, u, e, inv, r, runs, ranges,
                served if annotated else None, list(rs) if keep_reads else None)


def concat(parts: list[Cols]) -> Cols:
    """The columns of consecutive runs of events as one (positions follow on)."""
    if len(parts) == 1:
        return parts[0]
    base = np.cumsum([0] + [p.n for p in parts[:-1]])

    def rows(name: str, shift: bool) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        if shift:
            arrays = [_shifted(a, int(b)) for a, b in zip(arrays, base, strict=True)]
        return np.concatenate(arrays)

    annotated = any(p.served is not None for p in parts)
    served: list[Any] | None = None
    if annotated:
        served = []
        for p in parts:
            served += p.served if p.served is not None else [()] * p.r.shape[0]
    keep = all(p.reads is not None for p in parts)
    return Cols(
        int(sum(p.n for p in parts)), rows("code", False), rows("step", False),
        rows("w", True), rows("w_vlen", False), rows("w_vers", False), rows("u", True),
        rows("e", True), rows("inv", True), rows("r", True), rows("runs", False),
        list(_chain(p.ranges for p in parts)), served,
        list(_chain(p.reads for p in parts if p.reads is not None)) if keep else None,
        parts[0].rows0)


def _shifted(a: np.ndarray, by: int) -> np.ndarray:
    """Rows whose first column is a position, moved ``by`` events on."""
    if not by or not a.size:
        return a
    out = a.copy()
    if out.ndim == 1:
        out += by
    else:
        out[:, 0] += by
    return out
