"""The fields the page judgement needs, taken out of decoded events as numpy columns.

:mod:`~kvdiag.analysis.judgement.batch` judges columns, never event objects. Taking the fields
out is a separate step so that ``kvdiag check`` can do it on a few hundred events at a time,
while the decoder has just made them, and judge the columns of many thousands together: holding
a judging chunk's decoded events alive until it is judged made the decoder and the deallocator
work in memory that had left the cache (measured on bench_check's 1M-event trace: decoding
alone took 1.8 s with the events of 256 at a time alive, 3.0 s with 2048 alive).

Per kind, one row per event (``pos`` is the event's position in the columns):

- ``w`` (write): pos, seq, layer, stream, cells begin, cells end; ``w_vlen``/``w_vers`` the
  model's annotated ``versions`` (a cross-check only);
- ``u`` (upload): pos, seq, layer, stream, pages begin, pages end, slot, bytes (-1 for null:
  unknown), target * 8 + reason (:data:`REASONS`; 5 for another reason);
- ``e`` (evict): pos, slot; ``inv`` (invalidate): pos;
- ``r`` (read): pos, seq, layer, stream, pool, ring, host (the read's own counts, taken only
  for a read without served runs: 0 otherwise), served runs; ``runs``: begin, end, source
  (:data:`~kvdiag.analysis.judgement.classes.SOURCES`), slot of every served run.

Integers beyond ±2^62 (a damaged or hostile trace's 64-bit values) are clipped
(:data:`BOUND`): beyond every believable page, slot or step anyway.

:func:`extract` takes the columns out in C where a C compiler is at hand (``columns.c`` beside
this module, built by :mod:`kvdiag.compiled`): ~0.2 µs per event against ~1.2 µs for the Python
below, which stays the reference (and the path without a compiler, or for a run of events the
C pass declines: an integer beyond ±2^62, a field of an unexpected type).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvdiag import compiled
from kvdiag.analysis.judgement.classes import CLASSES, HOST, POOL, RING, SOURCES
from kvdiag.analysis.judgement.fits import route_codes
from kvdiag.model import events as ev

WRITE, UPLOAD, EVICT, INVALIDATE, READ, OTHER, FITS, OUTPUT, STEP, MARK = range(10)
"""Codes of the kinds (:data:`CODE_OF`): the page kinds, then the others — a few common ones
apart, so that their events are found without a Python loop over the rest."""


class _Codes(dict[type, int]):
    def __missing__(self, key: type) -> int:
        return OTHER


CODE_OF = _Codes({ev.Write: WRITE, ev.Upload: UPLOAD, ev.Evict: EVICT,
                  ev.Invalidate: INVALIDATE, ev.Read: READ})
for _t in (ev.Learn, ev.Abort, ev.Warn, ev.Repartition, ev.Adapt, ev.Telemetry, ev.Kernel,
           ev.End, ev.Unknown, ev.Snapshot):
    CODE_OF[_t] = OTHER
CODE_OF.update({ev.Fits: FITS, ev.Output: OUTPUT, ev.Step: STEP, ev.Mark: MARK})
TYPE_OF: dict[int, type] = {c: t for t, c in CODE_OF.items() if c != OTHER}
"""The one kind of each code but :data:`OTHER`."""
_KINDS = MARK + 1

REASONS: tuple[str, ...] = ("miss", "dirty", "wide-query", "last-chunk", "ring")
_TARGETS: tuple[str, ...] = ("resident", "ring")
_UPLOAD_KEY = {(t, r): i * 8 + j for i, t in enumerate(_TARGETS) for j, r in enumerate(REASONS)}


class _UploadKeys(dict[tuple[str, str], int]):
    def __missing__(self, key: tuple[str, str]) -> int:
        return _TARGETS.index(key[0]) * 8 + 5


_UKEY = _UploadKeys(_UPLOAD_KEY)
_SOURCE = {"pool": POOL, "ring": RING, "host": HOST}


class _Names(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return -1


SOURCE_CODE = _Names({s: i for i, s in enumerate(SOURCES)})

CLASS_CODE = _Names({c: i for i, c in enumerate(CLASSES)})
"""Codes of an annotated range's source and class (-1: a name the judgement does not use)."""

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
_LAYER = _g("layer")
_SEQ, _ROUTE, _RESULT, _STREAM = _g("seq"), _g("route"), _g("result"), _g("stream")
_DIVERGED = _g("diverged")
_R = _g("seq", "layer", "stream")
_COUNTS = _g("pool", "ring", "host")
_RUN = _g("begin", "end", "slot")
_SRC = _g("source")
_ANN = _g("begin", "end", "holder", "version_lag")
_CLS = _g("cls")


def clipped(values: Iterable[int]) -> Iterable[int]:
    return (min(max(v, -BOUND), BOUND) for v in values)


def column(make: Callable[[], Iterable[int]], count: int, width: int = 1) -> np.ndarray:
    """``count`` rows of ``width`` integers from a fresh iterable ``make()``."""
    try:
        flat = np.fromiter(make(), np.int64, count * width)
    except OverflowError:  # a damaged or hostile trace's 64-bit unsigned value
        flat = np.fromiter(clipped(make()), np.int64, count * width)
    except TypeError:  # a null where the schema allows one (an upload's unknown bytes): -1
        flat = np.fromiter(clipped(-1 if v is None else v for v in make()), np.int64,
                           count * width)
    return flat.reshape(count, width) if width > 1 else flat


@dataclass
class Cols:
    """The columns of a run of events (module docstring)."""

    n: int
    code: np.ndarray
    step: np.ndarray
    w_pos: np.ndarray
    w: np.ndarray
    """Per write: seq, layer, stream."""
    w_cells: np.ndarray
    w_vlen: np.ndarray
    w_vers: np.ndarray
    u_pos: np.ndarray
    u: np.ndarray
    """Per upload: seq, layer, stream, slot, bytes."""
    u_pages: np.ndarray
    u_key: np.ndarray
    e_pos: np.ndarray
    e_slot: np.ndarray
    inv: np.ndarray
    r_pos: np.ndarray
    r: np.ndarray
    """Per read: seq, layer, stream."""
    r_runs: np.ndarray
    """Per read: how many served runs it has."""
    r_counts: np.ndarray | None
    """Per read: its own pool, ring, host page counts — taken only where a read has no served
    runs (None: every read has some; rows of reads that have are 0)."""
    runs: np.ndarray
    """Per served run: begin, end, slot."""
    run_src: np.ndarray
    r_ann: np.ndarray
    """Per read: how many annotated ranges it has."""
    ann: np.ndarray
    """Per annotated range: begin, end, holder, version lag, source and class codes
    (:data:`SOURCE_CODE`, :data:`CLASS_CODE`)."""
    reads: list[Any] | None
    """The read events themselves, where a caller will ask about them by identity."""
    rows0: int = 0
    """The Judge's row of the first event."""
    order: np.ndarray | None = None
    """Indices of the events (of the run given to :func:`extract`) by kind code, stably."""
    bounds: list[tuple[int, int]] | None = None
    """Per kind code: where its events are in :attr:`order`."""
    f_pos: np.ndarray = field(default_factory=lambda: _none())
    """Positions of the fits events (the FA nodes' dispatches: the ring's rule 3)."""
    f_layer: np.ndarray = field(default_factory=lambda: _none())
    """Per fits event: its layer."""
    f_seq: np.ndarray = field(default_factory=lambda: _none())
    f_route: np.ndarray = field(default_factory=lambda: _none())
    """Per fits event: its route's code (:data:`ROUTE_CODE`)."""
    f_result: np.ndarray = field(default_factory=lambda: _none())
    """Per fits event: 1 where fits() returned true."""
    o_pos: np.ndarray = field(default_factory=lambda: _none())
    """Positions of the output events."""
    o_seq: np.ndarray = field(default_factory=lambda: _none())
    o_stream: np.ndarray = field(default_factory=lambda: _none())
    o_div: np.ndarray = field(default_factory=lambda: _none())
    """Per output: ``diverged`` (1, 0; -1 without a reference)."""
    lose: np.ndarray = field(default_factory=lambda: _none())
    """Positions of the events that follow events lost from the trace (gaps in seq, found by
    the Judge: :mod:`.gaps`), ascending: every slot's content is unknown from just before
    each."""

    def count(self, code: int) -> int:
        """Events of one kind code."""
        assert self.bounds is not None
        lo, hi = self.bounds[code]
        return hi - lo

    def first(self, code: int) -> int:
        """Index of the first event of one kind code (it has one)."""
        assert self.order is not None and self.bounds is not None
        return int(self.order[self.bounds[code][0]])

    def of_kind(self, code: int) -> list[int]:
        """Indices of the events of one kind code (of the run given to :func:`extract`)."""
        assert self.order is not None and self.bounds is not None
        lo, hi = self.bounds[code]
        out: list[int] = self.order[lo:hi].tolist()
        return out


_ARRAYS = ("code", "step", "w_pos", "w", "w_cells", "w_vlen", "w_vers", "u_pos", "u",
           "u_pages", "u_key", "e_pos", "e_slot", "inv", "r_pos", "r", "r_runs", "runs",
           "run_src", "r_ann", "ann")


_TAIL_ARRAYS = ("f_pos", "f_layer", "f_seq", "f_route", "f_result", "o_pos", "o_seq",
                "o_stream", "o_div")


def _none(width: int = 0) -> np.ndarray:
    return np.empty((0, width) if width else 0, np.int64)


_C_TYPES = tuple(TYPE_OF[c] for c in sorted(TYPE_OF))
"""The kinds of columns.c's types tuple, in its order (its TYPE_CODES: the codes but OTHER)."""
assert sorted(TYPE_OF) == [WRITE, UPLOAD, EVICT, INVALIDATE, READ, FITS, OUTPUT, STEP, MARK]
_C_MODULE = f"{__package__}._columns"
_C_SOURCE = Path(__file__).with_name("columns.c")


def compiled_module() -> Any:
    """``columns.c`` built and loaded, or None (no C pass here)."""
    return compiled.load(_C_SOURCE, _C_MODULE)


_compiled = compiled_module


def accumulator(stop: tuple[type, ...]) -> Any | None:
    """A C accumulator of columns (``columns.c``'s ``Accumulator``), or None without the C
    pass. ``acc.add(events, base)`` takes out the columns of a list of decoded events
    (positions from ``base``) and returns the indices of those Python must see itself (steps,
    outputs, fits decisions whose outcome is bad or whose route is none of
    :data:`~.fits.ROUTES`, kinds the columns do not hold), or None
    without adding anything where one is of a ``stop`` type; it raises as :func:`extract`'s C
    pass does (nothing added). :func:`taken` hands over what was added since the last time."""
    c = _compiled()
    return None if c is None else c.Accumulator(_C_TYPES, stop)


def taken(acc: Any) -> Cols:
    """The columns added to ``acc`` since the last call, as :func:`extract` gives them (its
    indices local to them, its positions as added)."""
    return _from_c(acc.take())


def extract(events: Sequence[Any], types: list[type], keep_reads: bool, base: int = 0) -> Cols:
    """The columns of ``events`` (``types``: the type of each; ``base``: the position of the
    first, where these columns will follow others)."""
    c = _compiled()
    if c is not None and type(events) is list:
        try:
            out = c.extract(events, _C_TYPES, base, keep_reads)
        except (TypeError, ValueError, OverflowError):
            pass  # an event the C pass declines: the reference below
        else:
            return _from_c(out)
    return extract_py(events, types, keep_reads, base)


def _from_c(out: tuple[Any, ...]) -> Cols:
    code_b, data_b, lens, ends, all_runs, reads = out
    code = np.frombuffer(code_b, np.int8)
    n = code.size
    data = np.frombuffer(data_b, np.int64)
    cuts = list(itertools.accumulate(lens, initial=n))
    (step, w_pos, w, w_cells, w_vlen, w_vers, u_pos, u, u_pages, u_key, e_pos, e_slot, inv,
     r_pos, r, r_runs, r_counts, runs, run_src, f_pos, f_layer, r_ann, ann, f_seq, f_route,
     f_result, o_pos, o_seq, o_stream, o_div) = (
        data[lo:hi] for lo, hi in itertools.pairwise(cuts))
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    return Cols(n, code, step, w_pos, w.reshape(-1, 3), w_cells.reshape(-1, 2), w_vlen,
                w_vers.reshape(-1, 2), u_pos, u.reshape(-1, 5), u_pages.reshape(-1, 2), u_key,
                e_pos, e_slot, inv, r_pos, r.reshape(-1, 3), r_runs,
                None if all_runs else r_counts.reshape(-1, 3), runs.reshape(-1, 3), run_src,
                r_ann, ann.reshape(-1, 6), reads, 0, data[:n], bounds, f_pos, f_layer, f_seq,
                f_route, f_result, o_pos, o_seq, o_stream, o_div)


def extract_py(events: Sequence[Any], types: list[type], keep_reads: bool, base: int = 0
               ) -> Cols:
    """:func:`extract` in Python (the reference the C pass is held to)."""
    n = len(events)
    code = np.fromiter(map(CODE_OF.__getitem__, types), np.int8, n)
    step = column(lambda: map(_STEP, events), n)
    order = np.argsort(code, kind="stable")
    ends = np.cumsum(np.bincount(code, minlength=_KINDS)).tolist()
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    # the page kinds' events, kind after kind: one pass in C, then a slice per kind
    grouped = list(map(events.__getitem__, order[:bounds[READ][1]].tolist()))

    def kind(k: int) -> tuple[np.ndarray, list[Any]]:
        lo, hi = bounds[k]
        if hi == lo:
            return _none(), []
        return order[lo:hi] + base, grouped[lo:hi]

    w_pos, ws = kind(WRITE)
    nw = len(ws)
    if nw:
        w = column(lambda: _chain(map(_W, ws)), nw, 3)
        w_cells = column(lambda: _chain(map(_CELLS, ws)), nw, 2)
        vl = list(map(_VERSIONS, ws))
        if vl.count(()) == nw:  # no annotation (a native trace, most captures): one C pass
            w_vlen, w_vers = np.zeros(nw, np.int64), _none(2)
        else:
            w_vlen = np.fromiter(map(len, vl), np.int64, nw)
            total = int(w_vlen.sum())
            w_vers = column(lambda: _chain(_chain(vl)), total, 2) if total else _none(2)
    else:
        w, w_cells, w_vlen, w_vers = _none(3), _none(2), _none(), _none(2)
    u_pos, us = kind(UPLOAD)
    nu = len(us)
    if nu:
        u = column(lambda: _chain(map(_U, us)), nu, 5)
        u_pages = column(lambda: _chain(map(_PAGES, us)), nu, 2)
        u_key = np.fromiter(map(_UKEY.__getitem__, map(_UTR, us)), np.int64, nu)
    else:
        u, u_pages, u_key = _none(5), _none(2), _none()
    e_pos, es = kind(EVICT)
    e_slot = column(lambda: map(_E, es), len(es)) if es else _none()
    inv, _ = kind(INVALIDATE)
    r_pos, rs = kind(READ)
    nr = len(rs)
    r_counts = None
    if nr:
        served = list(map(_SERVED, rs))
        r_runs = np.fromiter(map(len, served), np.int64, nr)
        runs_l = list(_chain(served))
        nrun = len(runs_l)
        r = column(lambda: _chain(map(_R, rs)), nr, 3)
        if not r_runs.all():
            # a read's own page counts matter only where it has no served runs (not judged)
            r_counts = np.zeros((nr, 3), np.int64)
            bare = np.flatnonzero(r_runs == 0)
            r_counts[bare] = column(lambda: _chain(_COUNTS(rs[i]) for i in bare.tolist()),
                                    bare.size, 3)
        runs = column(lambda: _chain(map(_RUN, runs_l)), nrun, 3) if nrun else _none(3)
        run_src = np.fromiter(map(_SOURCE.__getitem__, map(_SRC, runs_l)), np.int64, nrun)
        ranges = list(map(_RANGES, rs))
        annotated = ranges.count(()) < nr
    else:
        r, r_runs, runs, run_src = _none(3), _none(), _none(3), _none()
        ranges, annotated = [], False
    r_ann, ann = annotation(ranges) if annotated else (np.zeros(nr, np.int64), _none(6))

    def others(k: int) -> tuple[np.ndarray, list[Any]]:
        lo, hi = bounds[k]
        idx = order[lo:hi]
        return idx, list(map(events.__getitem__, idx.tolist()))

    f_idx, fs = others(FITS)
    nf = len(fs)
    f_layer = column(lambda: map(_LAYER, fs), nf)
    f_seq = column(lambda: map(_SEQ, fs), nf)
    f_route = route_codes(list(map(_ROUTE, fs)))
    f_result = np.fromiter(map(bool, map(_RESULT, fs)), np.int64, nf)
    o_idx, outs = others(OUTPUT)
    no = len(outs)
    o_seq = column(lambda: map(_SEQ, outs), no)
    o_stream = column(lambda: map(_STREAM, outs), no)
    o_div = np.fromiter((-1 if d is None else int(d) for d in map(_DIVERGED, outs)), np.int64,
                        no)
    return Cols(n, code, step, w_pos, w, w_cells, w_vlen, w_vers, u_pos, u, u_pages, u_key,
                e_pos, e_slot, inv, r_pos, r, r_runs, r_counts, runs, run_src, r_ann, ann,
                list(rs) if keep_reads else None, 0, order,
                bounds, f_idx.astype(np.int64) + base, f_layer, f_seq, f_route, f_result,
                o_idx.astype(np.int64) + base, o_seq, o_stream, o_div)


def annotation(ranges: Sequence[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Per read of ``ranges`` (each read's annotated ranges) how many it has; per range its
    begin, end, holder, version lag, source and class codes (:attr:`Cols.ann`)."""
    r_ann = np.fromiter(map(len, ranges), np.int64, len(ranges))
    flat = list(_chain(ranges))
    n = len(flat)
    ann = np.empty((n, 6), np.int64)
    ann[:, :4] = column(lambda: _chain(map(_ANN, flat)), n, 4)
    ann[:, 4] = np.fromiter(map(SOURCE_CODE.__getitem__, map(_SRC, flat)), np.int64, n)
    ann[:, 5] = np.fromiter(map(CLASS_CODE.__getitem__, map(_CLS, flat)), np.int64, n)
    return r_ann, ann


def concat(parts: list[Cols]) -> Cols:
    """The columns of consecutive runs of events as one (each extracted with the ``base`` of
    its first event among them)."""
    if len(parts) == 1:
        return parts[0]
    arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ARRAYS}
    counts: np.ndarray | None = None
    if any(p.r_counts is not None for p in parts):
        counts = np.concatenate([p.r_counts if p.r_counts is not None
                                 else np.zeros((p.r.shape[0], 3), np.int64) for p in parts])
    keep = all(p.reads is not None for p in parts)
    a = arrays
    f = {name: np.concatenate([getattr(p, name) for p in parts])
         for name in (*_TAIL_ARRAYS, "lose")}
    return Cols(
        int(sum(p.n for p in parts)), a["code"], a["step"], a["w_pos"], a["w"], a["w_cells"],
        a["w_vlen"], a["w_vers"], a["u_pos"], a["u"], a["u_pages"], a["u_key"], a["e_pos"],
        a["e_slot"], a["inv"], a["r_pos"], a["r"], a["r_runs"], counts, a["runs"],
        a["run_src"], a["r_ann"], a["ann"],
        list(_chain(p.reads for p in parts if p.reads is not None)) if keep else None,
        parts[0].rows0, f_pos=f["f_pos"], f_layer=f["f_layer"], f_seq=f["f_seq"],
        f_route=f["f_route"], f_result=f["f_result"], o_pos=f["o_pos"], o_seq=f["o_seq"],
        o_stream=f["o_stream"], o_div=f["o_div"], lose=f["lose"])
