"""The model's own annotations compared with the judgement (a cross-check, never an input).

The model writes ``read.ranges`` (its provenance of each read) and ``write.versions`` (each
page's version after a write); a native writer writes neither. The judgement never reads them;
where a trace carries them, every read's verdicts are put in the annotation's shape — runs of
equal (source, holder stream, class, lag) — and compared, and every annotated version is
compared with the judged one; disagreements become the ``annotation-mismatch`` finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from kvdiag import compiled
from kvdiag.analysis.judgement.classes import CLASSES, EXACT, NOT_JUDGED, SOURCES
from kvdiag.analysis.judgement.slots import Piece
from kvdiag.model import events as ev


def as_ranges(read: ev.Read, bad: Sequence[Piece]) -> tuple[ev.ReadRange, ...]:
    """Verdicts in the model annotation's shape, in page order; pages of the served runs
    outside ``bad`` are exact."""
    stream = read.stream
    items: list[tuple[int, int, str, int, str, int]] = [
        (p[0], p[1], SOURCES[p[2]], p[7] if p[6] >= 0 else -1, CLASSES[p[4]], p[5])
        for p in bad]
    for s in read.served:
        if s.end <= s.begin:
            continue
        at = s.begin
        for p in sorted(q for q in bad if s.begin <= q[0] < s.end):
            if p[0] > at:
                items.append((at, p[0], s.source, stream, "exact", 0))
            at = max(at, p[1])
        if at < s.end:
            items.append((at, s.end, s.source, stream, "exact", 0))
    items.sort()
    return merge(ev.ReadRange(*i) for i in items)  # type: ignore[arg-type]


def merge(ranges: Iterable[ev.ReadRange]) -> tuple[ev.ReadRange, ...]:
    out: list[ev.ReadRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if (last is not None and last.end == r.begin and last.source == r.source
                and last.holder == r.holder and last.cls == r.cls
                and last.version_lag == r.version_lag):
            out[-1] = ev.ReadRange(last.begin, r.end, r.source, r.holder, r.cls, r.version_lag)
        else:
            out.append(r)
    return tuple(out)


def ranges_text(ranges: Iterable[ev.ReadRange]) -> str:
    return ", ".join(f"{r.begin}..{r.end - 1} {r.source} {r.cls}"
                     + (f" (stream {r.holder})" if r.cls == "foreign" else "")
                     + (f" -{r.version_lag}" if r.cls == "stale" else "") for r in ranges)


def disagrees(read: ev.Read, bad: Sequence[Piece]) -> str | None:
    """How the read's annotation differs from its verdicts (None: it agrees, or a page is not
    judged so nothing can be compared)."""
    if any(p[4] == 3 for p in bad):
        return None
    derived = as_ranges(read, bad)
    annotated = merge(read.ranges)
    if derived == annotated:
        return None
    return f"annotated {ranges_text(annotated)}; judged {ranges_text(derived)}"


MAX_PAGES = 1 << 22
"""Pages a chunk's reads may cover for :func:`agreeing` to compare them page by page."""
_PAGE_LIMIT = 1 << 31
_SHIFT = 1 << 32


def _expand(begin: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pages of ranges ``[begin, end)`` (non-empty), and each page's range."""
    lens = end - begin
    which = np.repeat(np.arange(lens.size), lens)
    pages = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    return pages + begin[which], which


def _disjoint(own: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per entry (sorted by owner, then begin): does it overlap the one before of its owner?"""
    over = np.zeros(own.size, bool)
    if own.size > 1:
        over[1:] = (own[1:] == own[:-1]) & (begin[1:] < end[:-1])
    return over


_C_SOURCE = Path(__file__).with_name("crosscheck.c")
_C_MODULE = f"{__package__}._crosscheck"


def agreeing(ann: np.ndarray, owner: np.ndarray, stream: np.ndarray, runs: np.ndarray,
             run_src: np.ndarray, r_runs: np.ndarray, pieces: np.ndarray,
             candidates: np.ndarray) -> np.ndarray:
    """Which ``candidates`` (indices of a chunk's reads) are shown to agree with their
    annotation as :func:`disagrees` would find — the rest it is asked about: in C a read at a
    time (``crosscheck.c``: both sides as merged runs, no page expanded) where a compiler is at
    hand, else :func:`agreeing_arrays`."""
    shown = agreeing_c(ann, owner, stream, runs, run_src, r_runs, pieces, candidates)
    if shown is not None:
        return shown
    return agreeing_arrays(ann, owner, stream, runs, run_src, r_runs, pieces, candidates)


def agreeing_c(ann: np.ndarray, owner: np.ndarray, stream: np.ndarray, runs: np.ndarray,
               run_src: np.ndarray, r_runs: np.ndarray, pieces: np.ndarray,
               candidates: np.ndarray) -> np.ndarray | None:
    """:func:`agreeing` in C (None: no compiler, or arrays not grouped by read)."""
    c = compiled.load(_C_SOURCE, _C_MODULE)
    if c is None:
        return None
    ps = pieces[np.lexsort((pieces[:, 1], pieces[:, 0]))] if pieces.shape[0] > 1 else pieces
    arrays = tuple(np.ascontiguousarray(a, np.int64) for a in (
        ann, owner, stream, runs, run_src, r_runs, ps.reshape(-1, 14), candidates))
    try:
        shown = c.agreeing(arrays)
    except ValueError:
        return None
    out: np.ndarray = np.frombuffer(shown, np.uint8).astype(bool)
    return out


def agreeing_arrays(ann: np.ndarray, owner: np.ndarray, stream: np.ndarray, runs: np.ndarray,
                    run_src: np.ndarray, r_runs: np.ndarray, pieces: np.ndarray,
                    candidates: np.ndarray) -> np.ndarray:
    """:func:`agreeing` with array operations (the path without a compiler).

    ``ann``: every annotated range of the chunk's reads (begin, end, holder, lag, source and
    class codes: :func:`.columns.annotation`), ``owner`` the read of each;
    ``stream``: each read's stream; ``runs`` (begin, end, slot), ``run_src`` and ``r_runs``:
    the served runs (:mod:`.columns`); ``pieces``: the judged pieces (``batch.PIECE_COLUMNS``).
    A read with a piece not judged agrees (nothing can be compared). Otherwise both sides are
    compared page by page — source, holder, class, lag — where that decides what
    :func:`disagrees` decides: the annotated ranges sorted, disjoint and non-empty, the served
    runs disjoint, each piece inside one served run and disjoint from the others. Both sides
    are then the unique maximal runs of one page map (:func:`merge`), equal exactly when the
    maps are. A read outside those conditions (a hostile trace), or a chunk covering more than
    :data:`MAX_PAGES`, is left to :func:`disagrees`."""
    nr = stream.size
    agree = np.zeros(nr, bool)
    if not candidates.size:
        return np.zeros(0, bool)
    cand = np.zeros(nr, bool)
    cand[candidates] = True
    if pieces.size:
        nj = np.zeros(nr, bool)
        nj[pieces[pieces[:, 5] == NOT_JUDGED, 0]] = True
        agree |= nj & cand
        cand &= ~nj
    ok = cand.copy()
    # the annotated side
    pick = np.flatnonzero(cand[owner])
    a = ann[pick, :4]
    a_src = ann[pick, 4]
    a_cls = ann[pick, 5]
    a_own = owner[pick]
    bad = ((a[:, 0] < 0) | (a[:, 1] > _PAGE_LIMIT) | (a[:, 1] <= a[:, 0]) | (a_src < 0)
           | (a_cls < 0) | _disjoint(a_own, a[:, 0], a[:, 1]))
    ok[a_own[bad]] = False
    # the judged side: served runs, then the pieces that override their pages
    run_own = np.repeat(np.arange(nr), r_runs)
    keep = cand[run_own] & (runs[:, 1] > runs[:, 0]) if runs.size else np.zeros(0, bool)
    rb, re_, rsrc, rown = runs[keep, 0], runs[keep, 1], run_src[keep], run_own[keep]
    order = np.lexsort((rb, rown))
    rb, re_, rsrc, rown = rb[order], re_[order], rsrc[order], rown[order]
    bad = (rb < 0) | (re_ > _PAGE_LIMIT) | _disjoint(rown, rb, re_)
    ok[rown[bad]] = False
    ps = pieces[cand[pieces[:, 0]]] if pieces.size else np.zeros((0, 14), np.int64)
    ps = ps[np.lexsort((ps[:, 1], ps[:, 0]))]
    at = np.searchsorted(rown * _SHIFT + rb, ps[:, 0] * _SHIFT + ps[:, 1], "right") - 1
    inside = (at >= 0) & (ps[:, 2] > ps[:, 1])
    at = np.where(inside, at, 0)
    if rb.size:
        inside &= (rown[at] == ps[:, 0]) & (rb[at] <= ps[:, 1]) & (ps[:, 2] <= re_[at])
    else:
        inside[:] = False
    bad = ~inside | _disjoint(ps[:, 0], ps[:, 1], ps[:, 2])
    ok[ps[bad, 0]] = False
    go_a, go_r, go_p = ok[a_own], ok[rown], ok[ps[:, 0]]
    if int((a[go_a, 1] - a[go_a, 0]).sum() + (re_[go_r] - rb[go_r]).sum()) > MAX_PAGES:
        shown: np.ndarray = agree[candidates]
        return shown
    # page maps: key = read * 2^32 + page; value = (source, holder, class, lag)
    a_pages, ai = _expand(a[go_a, 0], a[go_a, 1])
    a_key = a_own[go_a][ai] * _SHIFT + a_pages
    a_val = np.stack([a_src[go_a][ai], a[go_a, 2][ai], a_cls[go_a][ai], a[go_a, 3][ai]], 1)
    d_pages, di = _expand(rb[go_r], re_[go_r])
    d_own = rown[go_r][di]
    d_key = d_own * _SHIFT + d_pages
    d_val = np.stack([rsrc[go_r][di], stream[d_own], np.full(di.size, EXACT),
                      np.zeros(di.size, np.int64)], 1)
    p = ps[go_p]
    p_pages, pi = _expand(p[:, 1], p[:, 2])
    p_key = p[pi, 0] * _SHIFT + p_pages
    holder = np.where(p[:, 7] >= 0, p[:, 8], -1)
    d_val[np.searchsorted(d_key, p_key)] = np.stack([p[pi, 3], holder[pi], p[pi, 5], p[pi, 6]],
                                                    1)
    wrong = np.zeros(nr, bool)
    pos = np.searchsorted(d_key, a_key)
    hit = pos < d_key.size
    hit[hit] = d_key[pos[hit]] == a_key[hit]
    wrong[(a_key[~hit] // _SHIFT)] = True
    same = (d_val[pos[hit]] == a_val[hit]).all(axis=1)
    wrong[a_key[hit][~same] // _SHIFT] = True
    pos = np.searchsorted(a_key, d_key)
    hit = pos < a_key.size
    hit[hit] = a_key[pos[hit]] == d_key[hit]
    wrong[d_key[~hit] // _SHIFT] = True
    agree |= ok & ~wrong
    out: np.ndarray = agree[candidates]
    return out
