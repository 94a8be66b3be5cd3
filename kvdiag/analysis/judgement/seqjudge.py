"""A streamed chunk's pages judged event by event in C (``seqjudge.c``), the same verdicts as
:func:`~kvdiag.analysis.judgement.batch.judge_chunk`'s array operations.

The array judgement finds each page's slot copy with sorts and binary searches over the whole
chunk; walking the chunk's events in file order and keeping the slots as they are at each moment
does the same in one pass (slots.py's rule, applied as written). ``kvdiag check`` and the TUI's
judging pass judge their streamed chunks so where a C compiler is at hand
(:mod:`kvdiag.compiled`); a chunk the walk declines (a ring page that needs rule 3's walk over
the ring's recent copies) or a Judge without the compiled
helper judges with :func:`~kvdiag.analysis.judgement.batch.judge_chunk`. Neither names the copy
of an exact page (``detail``): a Judge that must goes the array way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvdiag import compiled
from kvdiag.analysis.judgement.batch import (
    Chunk,
    State,
    after_loss,
    judge_prepared,
    prepare,
)
from kvdiag.analysis.judgement.classes import FOREIGN, STALE
from kvdiag.analysis.judgement.columns import Cols
from kvdiag.analysis.judgement.slots import EMPTY, LOST, SlotTable, sorted_unique

_SOURCE = Path(__file__).with_name("seqjudge.c")
_MODULE = f"{__package__}._seqjudge"
CAT_JUDGED, CAT_HOST, CAT_OUT_OF_RANGE, CAT_NO_UPLOAD, CAT_DROPPED = range(5)
"""What seqjudge.c does with a served run (its ``enum``)."""


def available() -> bool:
    """The C walk is built and loaded (else every chunk is judged by the arrays)."""
    return compiled.load(_SOURCE, _MODULE) is not None


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def judge_streamed(state: State, cols: Cols, rows0: int, flows: bool) -> Chunk:
    """:func:`~kvdiag.analysis.judgement.batch.judge_chunk` without ``detail``, in C where
    it can be."""
    prep = prepare(state, cols)
    c = compiled.load(_SOURCE, _MODULE)
    if c is None:
        return judge_prepared(state, cols, rows0, flows, False, prep)
    views, pages = state.views, state.pages
    w_ok, u_ok = prep.w_ok, prep.u_ok
    b, e, slot = cols.runs[:, 0], cols.runs[:, 1], cols.runs[:, 2]
    jr = prep.judged
    pages.ensure(np.concatenate([prep.w_vid, prep.u_vid, prep.r_vid[prep.run_read[jr]]]),
                 np.concatenate([prep.w_p1[w_ok], (prep.u_p0 + prep.u_cnt)[u_ok], e[jr]]))
    u_tgt = prep.u_tgt[u_ok]
    u_slot = prep.u_slot[u_ok]
    u_cnt = prep.u_cnt[u_ok]
    for t, table in ((0, state.pool), (1, state.ring)):
        mine = u_tgt == t
        if mine.any():  # room for the chunk's copies (empty slots beyond read as empty)
            table.grow(int((u_slot + u_cnt)[mine].max()))
    cat = np.full(b.size, CAT_DROPPED, np.int64)
    cat[jr] = CAT_JUDGED
    cat[prep.host] = CAT_HOST
    cat[prep.slot_bad] = CAT_OUT_OF_RANGE
    cat[prep.no_upload] = CAT_NO_UPLOAD
    u_pos = cols.u_pos[u_ok]
    arrays = tuple(_i64(a) for a in (
        cols.w_pos[w_ok], prep.w_vid, prep.w_p0[w_ok], prep.w_p1[w_ok], cols.w[w_ok, 0],
        u_pos, prep.u_vid, prep.u_p0[u_ok], u_cnt, u_slot, u_tgt, cols.u[u_ok, 0],
        cols.step[u_pos],
        prep.e_pos, prep.e_slot, cols.inv, cols.lose,
        cols.r_pos, prep.r_vid, np.concatenate([[0], np.cumsum(cols.r_runs)]),
        b, e, slot, cols.run_src, cat,
        views.layer, views.stream))
    pair_ok = np.repeat(w_ok, cols.w_vlen)  # the annotated versions of the writes kept
    arrays += (pages.offset, pages.version, pages.wseq, pages.wrow,
               _i64(cols.w_vlen[w_ok]), _i64(cols.w_vers[pair_ok]), pages.cap, *(
                   getattr(t, name) for t in (state.pool, state.ring)
                   for name in SlotTable.COLUMNS))
    writes_from = -1 if state.writes else prep.first_write
    try:
        out = c.judge(arrays, rows0, writes_from, flows)
    except IndexError:  # a page or slot outside the room made for it: never expected
        out = None
    if out is None:  # rule 3 met (or the above): the state is as it was; the arrays judge
        return judge_prepared(state, cols, rows0, flows, False, prep)
    nr = cols.r.shape[0]
    r_counts, page_cls, nj, page_pieces, run_pieces, keys, ring_rows, versions = (
        np.frombuffer(x, np.int64) for x in out)
    pieces = np.concatenate([page_pieces.reshape(-1, 14), run_pieces.reshape(-1, 14)])
    if pieces.shape[0] > 1:
        pieces = pieces[np.lexsort((pieces[:, 1], pieces[:, 0]))]
    if keys.size:
        key = sorted_unique(keys)
        found = np.stack([key >> 24, (key >> 2) & ((1 << 22) - 1),
                          np.where(key & 1, FOREIGN, STALE)], axis=1)
        found = found[found[:, 0] > 0]
    else:
        found = np.empty((0, 3), np.int64)
    # -- the state the walk does not keep ------------------------------------------------
    if w_ok.any() and state.writes is None:
        state.writes = True
    for t in (0, 1):
        if state.uploads[t] is None and bool((u_tgt == t).any()):
            state.uploads[t] = True
    last_inv = int(cols.inv[-1]) if cols.inv.size else -1
    last_lose = int(cols.lose[-1]) if cols.lose.size else -1
    if last_inv >= 0 or last_lose >= 0:
        state.ring_log.clear()
        # the walk emptied (or made unknown) every slot of the arrays; those beyond them too
        state.pool.fill = state.ring.fill = LOST if last_lose > last_inv else EMPTY
    state.ring_log.add(ring_rows.reshape(-1, 7))
    ring = u_tgt == 1
    ri = cols.r_pos
    after_loss(state, rows0, last_lose, last_inv, prep.u_vid[ring], u_pos[ring], prep.r_vid, ri)
    # the latest dispatch of each layer (batch.judge_chunk sets it once the chunk is judged)
    if cols.f_layer.size:
        # the last of each layer (a chunk has thousands of decisions over a few dozen layers)
        order = np.argsort(cols.f_layer, kind="stable")
        layers = cols.f_layer[order]
        ends = np.empty(layers.size, bool)
        ends[-1] = True
        np.not_equal(layers[1:], layers[:-1], out=ends[:-1])
        last = order[ends]
        state.dispatch.update(zip(cols.f_layer[last].tolist(),
                                  (rows0 + cols.f_pos[last]).tolist(), strict=True))
    keep = prep.keep
    run_read, length, src = prep.run_read, prep.length, cols.run_src
    r_pages = np.bincount(run_read[keep] * 3 + src[keep], weights=length[keep],
                          minlength=nr * 3).astype(np.int64).reshape(nr, 3)
    rc = cols.r
    return Chunk(rows0, cols, ri, r_counts.reshape(nr, 4), pieces, page_cls.reshape(3, 4),
                 {w: int(n) for w, n in enumerate(nj.tolist()) if n}, found, {},
                 _disagreeing(cols, w_ok, pair_ok, versions.reshape(-1, 4)),
                 rc[:, 1], rc[:, 2], cols.step[ri], rc[:, 0], r_pages)


def _disagreeing(cols: Cols, w_ok: np.ndarray, pair_ok: np.ndarray, kept: np.ndarray
                 ) -> list[tuple[int, int, int, int, int, int, int]]:
    """Chunk.versions_disagree: the walk's first disagreeing annotated version of each write
    kept (``kept``: write among those kept, page, annotated, judged), and of each write not
    kept (impossible pages: every version judged 0), in write order."""
    found = [(int(i), p, a, j) for i, (p, a, j) in zip(
        np.flatnonzero(w_ok)[kept[:, 0]].tolist(), kept[:, 1:].tolist(), strict=True)]
    if not pair_ok.all():
        owner = np.repeat(np.arange(w_ok.size), cols.w_vlen)
        seen: set[int] = set()
        for k in np.flatnonzero(~pair_ok & (cols.w_vers[:, 1] != 0)).tolist():
            i = int(owner[k])
            if i not in seen:
                seen.add(i)
                found.append((i, int(cols.w_vers[k, 0]), int(cols.w_vers[k, 1]), 0))
        found.sort(key=lambda f: f[0])
    w, wi = cols.w, cols.w_pos
    return [(int(w[i, 0]), int(cols.step[wi[i]]), int(w[i, 1]), int(w[i, 2]), p, a, j)
            for i, p, a, j in found]
