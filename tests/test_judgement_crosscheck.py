"""The annotation cross-check's shortcut (``crosscheck.agreeing``: in C, and with arrays)
against the per-read comparison it spares (``crosscheck.disagrees``): a read it calls agreeing must be one
``disagrees`` finds agreeing, on random reads — served runs, judged pieces and annotations that
agree, are split, reordered, overlapping, empty or wrong in one field — and it must call the
ordinary agreeing reads so (else it spares nothing)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvdiag.analysis.judgement import columns, crosscheck
from kvdiag.analysis.judgement.classes import CLASSES, NOT_JUDGED, SOURCES
from kvdiag.model import events as ev


class _Read:
    def __init__(self, stream: int, served: tuple[ev.Served, ...],
                 ranges: tuple[ev.ReadRange, ...]) -> None:
        self.stream, self.served, self.ranges = stream, served, ranges


def _runs(rng: random.Random, hostile: bool) -> list[tuple[int, int, int]]:
    """(begin, end, source) served runs, disjoint unless ``hostile``."""
    out, at = [], rng.randrange(0, 4)
    for _ in range(rng.randrange(1, 4)):
        width = rng.randrange(0 if hostile else 1, 12)
        out.append((at, at + width, rng.randrange(3)))
        at += width + rng.randrange(0, 3)
    if hostile and rng.random() < 0.5:  # a run overlapping another
        b, e, s = out[0]
        out.append((b + 1, e + 3, s))
    return out


def _pieces(rng: random.Random, read: int, runs: list[tuple[int, int, int]],
            hostile: bool) -> list[list[int]]:
    """Judged pieces (batch.PIECE_COLUMNS) inside the runs, disjoint unless ``hostile``."""
    out: list[list[int]] = []
    for b, e, s in runs:
        at = b
        while at < e and rng.random() < 0.6:
            pb = rng.randrange(at, e)
            pe = rng.randrange(pb + 1, e + 1)
            if hostile and rng.random() < 0.3:
                pe += rng.randrange(1, 4)  # beyond its run
            cls = rng.choice((1, 2, 2, 1, 0) + ((NOT_JUDGED,) if rng.random() < 0.1 else ()))
            h_layer = rng.choice((-1, 0, 3))
            out.append([read, pb, pe, s, 0, cls, rng.randrange(0, 3) if cls == 1 else 0,
                        h_layer, rng.randrange(0, 3), pb, 1, 0, 0, 0])
            at = pe
    return out


def _mutate(rng: random.Random, ranges: list[ev.ReadRange]) -> list[ev.ReadRange]:
    """An annotation that may or may not still agree."""
    if not ranges:
        return ranges
    out = list(ranges)
    i = rng.randrange(len(out))
    r = out[i]
    how = rng.randrange(7)
    if how == 0 and r.end - r.begin > 1:  # split: still agrees after merging
        m = rng.randrange(r.begin + 1, r.end)
        out[i:i + 1] = [ev.ReadRange(r.begin, m, r.source, r.holder, r.cls, r.version_lag),
                        ev.ReadRange(m, r.end, r.source, r.holder, r.cls, r.version_lag)]
    elif how == 1:
        out[i] = ev.ReadRange(r.begin, r.end, r.source, r.holder, "stale"  # type: ignore[arg-type]
                              if r.cls != "stale" else "exact", r.version_lag)
    elif how == 2:
        out[i] = ev.ReadRange(r.begin, r.end, r.source, r.holder + 1, r.cls, r.version_lag)
    elif how == 3:
        out[i] = ev.ReadRange(r.begin, r.end, r.source, r.holder, r.cls, r.version_lag + 1)
    elif how == 4:
        out[i] = ev.ReadRange(r.begin, r.end + 1, r.source, r.holder, r.cls, r.version_lag)
    elif how == 5:
        rng.shuffle(out)
    else:
        out[i] = ev.ReadRange(r.begin, r.begin, r.source, r.holder, r.cls, r.version_lag)
    return out


@pytest.mark.parametrize("how", ["c", "arrays"])
@pytest.mark.parametrize("hostile", [False, True])
def test_agreeing_only_where_disagrees_finds_agreement(hostile: bool, how: str) -> None:
    rng = random.Random(20261201 + hostile)
    spared = ordinary = 0
    for _ in range(60):  # chunks
        nr = rng.randrange(1, 12)
        streams, served, pieces, annotations, plain = [], [], [], [], []
        for k in range(nr):
            stream = rng.randrange(2)
            runs = _runs(rng, hostile)
            ps = _pieces(rng, k, runs, hostile)
            sv = tuple(ev.Served(b, e, SOURCES[s], 0) for b, e, s in runs)  # type: ignore[arg-type]
            read = _Read(stream, sv, ())
            try:
                derived = list(crosscheck.as_ranges(read, [tuple(p[1:]) for p in ps]))  # type: ignore[arg-type,misc]
            except (KeyError, IndexError):
                derived = []
            unchanged = rng.random() < 0.4
            ann = derived if unchanged else _mutate(rng, derived)
            plain.append(unchanged and not hostile
                         and not any(p[5] == NOT_JUDGED for p in ps))
            streams.append(stream)
            served.append(sv)
            pieces += ps
            annotations.append(tuple(ann))
        counts, ann = columns.annotation(annotations)
        owner = np.repeat(np.arange(nr), counts)
        runs = np.array([(s.begin, s.end, s.slot) for sv in served for s in sv],
                        np.int64).reshape(-1, 3)
        run_src = np.array([SOURCES.index(s.source) for sv in served for s in sv], np.int64)
        r_runs = np.array([len(sv) for sv in served], np.int64)
        parr = np.array(pieces, np.int64).reshape(-1, 14)
        candidates = np.flatnonzero([len(a) > 0 for a in annotations])
        agreeing = crosscheck.agreeing_c if how == "c" else crosscheck.agreeing_arrays
        shown = agreeing(ann, owner, np.array(streams, np.int64), runs, run_src, r_runs, parr,
                         candidates)
        if shown is None:
            pytest.skip("no C compiler here")
        for k, said in zip(candidates.tolist(), shown.tolist(), strict=True):
            mine = [tuple(p[1:]) for p in pieces if p[0] == k]
            truth = crosscheck.disagrees(_Read(streams[k], served[k], annotations[k]),  # type: ignore[arg-type]
                                         mine)  # type: ignore[arg-type]
            if said:
                assert truth is None, (k, annotations[k], mine, served[k])
                spared += 1
            if plain[k]:
                ordinary += 1
                assert said, (k, annotations[k], mine, served[k])
    assert spared > 50
    assert hostile or ordinary > 50
    assert all(c in CLASSES for c in ("exact", "stale", "foreign"))
