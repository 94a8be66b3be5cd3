"""A chunk of events judged with array operations: the page verdicts of every read in it.

The rule is :mod:`~kvdiag.analysis.judgement.slots`'s; this module applies it to a chunk of
(up to a few thousand) events at once, from their columns (:mod:`.columns`), because judging
event by event in Python costs more than decoding the trace (benchmarks/bench_check.py).
Within a chunk every page-changing event has a position; for a page read at position t:

- its host version is the version carried into the chunk plus the chunk's writes of that page
  before t (a sorted key ``page * R + position`` and two binary searches);
- its slot's newest copy is the chunk's last upload into that slot before t, unless an
  ``evict`` of the slot or an ``invalidate`` came after that upload (then: empty), or, with
  none of those before t, the copy carried into the chunk; the copy's version is the page's
  version at the upload's own position;
- rule 3 of the ring (the newest copy is another page of the same view) is walked page by
  page over the recent ring copies: it occurs only where one read cycles through the ring.

At the end of the chunk the carried state (versions, last writes, slot contents, recent ring
copies, each view's last read) is brought forward with the same arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from kvdiag.analysis.judgement.classes import (
    BEFORE_SNAPSHOT,
    EXACT,
    FOREIGN,
    HOST,
    LOST_EVENTS,
    MAX_PAGE,
    MAX_SLOT,
    NO_DISPATCH,
    NO_UPLOAD,
    NO_WRITE,
    NOT_JUDGED,
    OUT_OF_RANGE,
    POOL,
    RING,
    RING_HISTORY,
    STALE,
)
from kvdiag.analysis.judgement.columns import (
    CODE_OF,
    OTHER,
    REASONS,
    Cols,
    column,
)
from kvdiag.analysis.judgement.slots import (
    LOST,
    PageTable,
    RingLog,
    SlotTable,
    Views,
    sorted_unique,
)
from kvdiag.model.pages import PAGE_TOKENS

__all__ = ["CODE_OF", "OTHER", "REASONS", "Chunk", "State", "ints", "judge_chunk"]

_TARGET_OF_KEY = 8
"""An upload's key is target * 8 + reason (:mod:`.columns`)."""

NO_BATCH = -(1 << 62)
"""A view's ring batch start when it has none (its next copy starts one). Not -1: a batch
that began before a gap or snapshot at row 0 starts at row -1 (:meth:`State.lose_history`)."""


def ints(objs: Sequence[Any], getter: Any) -> np.ndarray:
    """One integer field of each object, as an array (clipped: :data:`.columns.BOUND`)."""
    return column(lambda: map(getter, objs), len(objs))


def expand(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner index, first + i) for i in range(count) of each owner."""
    count = np.maximum(count, 0)
    owner = np.repeat(np.arange(count.size), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return owner, first[owner] + within


@dataclass
class State:
    """What the judgement carries from one chunk to the next."""

    views: Views = field(default_factory=Views)
    pages: PageTable = field(default_factory=PageTable)
    pool: SlotTable = field(default_factory=SlotTable)
    ring: SlotTable = field(default_factory=SlotTable)
    ring_log: RingLog = field(default_factory=RingLog)
    batch_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Per view: row of the first ring copy of its current batch (:data:`NO_BATCH`: none;
    :attr:`history_row` - 1: it began before that row) — rule 3."""
    read_since: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    """Per view: a read came since its batch started (its next ring copy starts a new one)."""
    writes: bool | None = None
    """A write is recorded (or declared); None: not yet seen."""
    uploads: list[bool | None] = field(default_factory=lambda: [None, None])
    """Per target (resident, ring): an upload is recorded (or declared)."""
    out_of_range: int = 0
    history_row: int = -1
    """Row of the snapshot the state was taken from (:mod:`.snapshot`), or of the first event
    after events lost from the trace (:meth:`lose`): ring copies before it are not in
    :attr:`ring_log` (-1: the log goes back to the trace's start, or to an invalidate after
    that row, before which no copy matters: :func:`after_loss`)."""
    history_why: int = BEFORE_SNAPSHOT
    """Why a page whose ring batch began before :attr:`history_row` is not judged."""
    upload_stats: np.ndarray = field(default_factory=lambda: np.zeros((2, 4, 8), np.int64))
    """[target, (uploads, pages, bytes, uploads of unknown bytes), reason] (reason index 5:
    another reason) — of the uploads whose pages and slots are possible."""
    dispatch: dict[int, int] = field(default_factory=dict)
    """Per layer: row of its latest ``fits`` event (the FA node's dispatch) in the chunks
    before this one — rule 3 (the Judge keeps it). A gap keeps it (:meth:`lose`)."""

    def lose(self, row: int) -> None:
        """Events were lost from the trace before row ``row`` (a gap in seq: :mod:`.gaps`):
        a lost upload, evict or invalidate may have changed any slot, so what every pool and
        ring slot holds becomes unknown (:data:`~.slots.LOST`) until an upload fills it again,
        and a ring batch that began before the gap is not walked back across it (its lost
        copies: :meth:`lose_history`). Host versions stay: the writes lost are missing from a
        slot's copy and from the page's current version alike once an upload after the gap
        refills the slot, so exact and stale are told apart by the writes that are in the
        trace.

        Each layer's last dispatch (:attr:`dispatch`) stays too, and rule 3 may still use one
        from before the gap: it only compares a dispatch with ring copies made after the gap
        (the copies before it are forgotten), and the dispatch the read's own FA node made
        is either recorded after the gap (the rule takes the latest) or lies before the gap's
        end, lost or not, like the one remembered — so both are older than every copy the
        walk meets and the verdict is the one the whole trace gives
        (tests/test_lost_events_ring.py holds both)."""
        self.pool.lose()
        self.ring.lose()
        self.ring_log.clear()
        self.lose_history(row)

    def lose_history(self, row: int) -> None:
        """:meth:`lose`'s ring batches: every view's is open and began before the gap. The
        lost events may hold a read of the view (its next copy would start a new batch) or
        copies its next read consumes; which is not known, so the copies after the gap
        continue the batch until a read of the view is recorded, and a walk that reaches the
        gap without finding the page's copy judges nothing (``lost-events``) rather than
        calling the page foreign. A view first seen after the gap starts the same way
        (:func:`fresh_batch`)."""
        grow_views(self)
        self.batch_start[:] = row - 1
        self.read_since[:] = False
        self.history_row = row
        self.history_why = LOST_EVENTS


@dataclass
class Chunk:
    """The reads of one judged chunk: what the Judge groups, counts, records and hands out."""

    rows0: int
    cols: Cols
    """The columns judged (their ``reads`` are kept only where a caller asks by identity)."""
    r_pos: np.ndarray
    r_counts: np.ndarray
    """Per read: pages exact, stale, foreign, not judged."""
    pieces: np.ndarray
    """Non-exact runs, one row each (columns :data:`PIECE_COLUMNS`), in read and page order."""
    page_cls: np.ndarray
    """Per source (pool, ring, host) and class: pages."""
    not_judged: dict[int, int]
    flows: np.ndarray
    """(write seq, read index, class) of the stale and foreign pages' last writes (found only
    when asked for)."""
    detail: dict[str, Any]
    """The page-level arrays :meth:`pages` reads (this chunk only)."""
    versions_disagree: list[tuple[int, int, int, int, int, int, int]]
    """(write seq, step, layer, stream, page, annotated version, judged version) where
    ``write.versions`` (the model's annotation) disagrees: the first page of each such
    write."""
    r_layer: np.ndarray
    r_stream: np.ndarray
    r_step: np.ndarray
    r_seq: np.ndarray
    r_pages: np.ndarray
    """Per read: pages of its served runs from pool, ring, host."""


PIECE_COLUMNS = ("read", "begin", "end", "source", "slot", "cls", "lag", "h_layer", "h_stream",
                 "h_page", "h_version", "h_step", "h_seq", "why")


def _known_at(carried: bool | None, first: int, pos: np.ndarray) -> np.ndarray:
    """Is a kind known (recorded or declared) at each position, given where the chunk first
    records it?"""
    if carried:
        return np.ones(pos.shape, bool)
    return pos > first


class Prep(NamedTuple):
    """A chunk's page events checked and named by view, event by event (before any page is
    expanded): what both judgements of a chunk start from (:func:`judge_chunk` and
    :mod:`.seqjudge`). Impossible pages and slots are counted in ``state.out_of_range`` and
    left out; the upload statistics are counted."""

    w_ok: np.ndarray
    """Per write: it touches believable pages."""
    w_p0: np.ndarray
    w_p1: np.ndarray
    w_vid: np.ndarray
    """View of each write kept (``w_ok``)."""
    u_ok: np.ndarray
    u_p0: np.ndarray
    u_cnt: np.ndarray
    u_tgt: np.ndarray
    u_slot: np.ndarray
    u_vid: np.ndarray
    """View of each upload kept (``u_ok``)."""
    r_vid: np.ndarray
    run_read: np.ndarray
    run_pos: np.ndarray
    length: np.ndarray
    keep: np.ndarray
    """Per served run: it has pages, all believable."""
    host: np.ndarray
    slot_bad: np.ndarray
    no_upload: np.ndarray
    judged: np.ndarray
    first_write: int
    """Position of the chunk's first write kept (``n``: none)."""
    e_pos: np.ndarray
    e_slot: np.ndarray
    """The evicts of a believable slot (``0 <= slot < MAX_SLOT``)."""


def prepare(state: State, cols: Cols) -> Prep:
    """:class:`Prep` of a chunk (views named in the order writes, uploads, reads)."""
    n = cols.n
    views = state.views
    w = cols.w
    if w.shape[0]:
        c0, c1 = cols.w_cells[:, 0], cols.w_cells[:, 1]
        p0, p1 = c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1
        ok = c1 > c0
        bad = ok & ((p0 < 0) | (p1 > MAX_PAGE))
        state.out_of_range += int(bad.sum())
        ok &= ~bad
        w_vid = views.of(w[ok, 1], w[ok, 2])
        first_write = int(cols.w_pos[ok][0]) if ok.any() else n
    else:
        p0 = p1 = w_vid = np.empty(0, np.int64)
        ok = np.empty(0, bool)
        first_write = n
    u = cols.u
    if u.shape[0]:
        u0, u1 = cols.u_pages[:, 0], cols.u_pages[:, 1]
        cnt = u1 - u0
        key = cols.u_key  # [target, reason] flattened, for the residency statistics
        tgt = key // _TARGET_OF_KEY
        slot0 = u[:, 3]
        u_ok = cnt > 0
        bad = u_ok & ((u0 < 0) | (u1 > MAX_PAGE) | (slot0 < 0) | (slot0 > MAX_SLOT - cnt))
        state.out_of_range += int(bad.sum())
        u_ok &= ~bad
        # the statistics count what the judgement believes: an upload of impossible pages or
        # slots filled nothing (it is out_of_range), and unknown bytes (null, or a writer's
        # negative "unknown") are counted as unknown, not summed
        kb = key[u_ok]
        nbytes = u[u_ok, 4]
        known = nbytes >= 0
        st = state.upload_stats
        st[:, 0, :] += np.bincount(kb, minlength=16).reshape(2, 8)
        st[:, 1, :] += np.bincount(kb, weights=cnt[u_ok],
                                   minlength=16).astype(np.int64).reshape(2, 8)
        st[:, 2, :] += np.bincount(kb[known], weights=nbytes[known],
                                   minlength=16).astype(np.int64).reshape(2, 8)
        st[:, 3, :] += np.bincount(kb[~known], minlength=16).reshape(2, 8)
        u_vid = views.of(u[u_ok, 1], u[u_ok, 2])
    else:
        u0 = cnt = tgt = slot0 = u_vid = np.empty(0, np.int64)
        u_ok = np.empty(0, bool)
    first_up = []
    for t in (0, 1):
        mine = np.flatnonzero(u_ok & (tgt == t))
        first_up.append(int(cols.u_pos[mine[0]]) if mine.size else n)

    rc = cols.r
    nr = rc.shape[0]
    r_vid = views.of(rc[:, 1], rc[:, 2])
    run_read = np.repeat(np.arange(nr), cols.r_runs)
    b, e, slot, src = cols.runs[:, 0], cols.runs[:, 1], cols.runs[:, 2], cols.run_src
    run_pos = cols.r_pos[run_read]
    length = e - b
    keep = length > 0
    oor = keep & ((b < 0) | (e > MAX_PAGE))
    state.out_of_range += int(oor.sum())
    keep &= ~oor
    host = keep & (src == HOST)
    slot_bad = keep & ~host & ((slot < 0) | (slot > MAX_SLOT - length))
    up_known = np.where(src == RING, _known_at(state.uploads[1], first_up[1], run_pos),
                        _known_at(state.uploads[0], first_up[0], run_pos))
    no_upload = keep & ~host & ~slot_bad & ~up_known
    judged = keep & ~host & ~slot_bad & up_known
    for t, table in ((POOL, state.pool), (RING, state.ring)):
        if table.fill != LOST and not cols.lose.size:
            continue
        mine = judged & (src == t)
        if mine.any():
            # after a gap, a slot never seen is unknown too, not empty: the arrays must say so
            table.grow(int((slot + length)[mine].max()))
    # an evict of an impossible slot empties nothing (it must not size the chunk's arrays)
    e_ok = (cols.e_slot >= 0) & (cols.e_slot < MAX_SLOT)
    state.out_of_range += int(e_ok.size - e_ok.sum())
    return Prep(ok, p0, p1, w_vid, u_ok, u0, cnt, tgt, slot0, u_vid, r_vid, run_read, run_pos,
                length, keep, host, slot_bad, no_upload, judged, first_write, cols.e_pos[e_ok],
                cols.e_slot[e_ok])


def judge_chunk(state: State, cols: Cols, rows0: int, flows: bool, detail: bool) -> Chunk:
    """Judge every read page of the events whose columns are ``cols`` (:mod:`.columns`; the
    first of them is row ``rows0``); ``flows``: also find the writes stale and foreign pages
    missed; ``detail``: the upload seq and step of every page's copy, exact ones too."""
    return judge_prepared(state, cols, rows0, flows, detail, prepare(state, cols))


def judge_prepared(state: State, cols: Cols, rows0: int, flows: bool, detail: bool,
                   prep: Prep) -> Chunk:
    """:func:`judge_chunk` of a chunk already prepared (:func:`prepare`)."""
    n = cols.n
    R = n + 1
    steps = cols.step
    views, pages = state.views, state.pages

    # -- writes ------------------------------------------------------------------------------
    w = cols.w
    wi = cols.w_pos
    w_ok, w_vid_e = prep.w_ok, prep.w_vid
    if w.shape[0]:
        p0, p1 = prep.w_p0, prep.w_p1
        owner, w_page = expand(p0[w_ok], (p1 - p0)[w_ok])
        w_vid = w_vid_e[owner]
        w_pos = wi[w_ok][owner]
        w_seq = w[w_ok, 0][owner]
    else:
        w_vid = w_page = w_pos = w_seq = np.empty(0, np.int64)
    first_write = prep.first_write

    # -- uploads -----------------------------------------------------------------------------
    u = cols.u
    if u.shape[0]:
        ui = cols.u_pos
        ok, u0, cnt, tgt, slot0 = prep.u_ok, prep.u_p0, prep.u_cnt, prep.u_tgt, prep.u_slot
        owner, u_page = expand(u0[ok], cnt[ok])
        u_vid = prep.u_vid[owner]
        u_slot = slot0[ok][owner] + (u_page - u0[ok][owner])
        u_pos = ui[ok][owner]
        u_tgt = tgt[ok][owner]
        u_seq = u[ok, 0][owner]
        u_step = steps[ui][ok][owner]
    else:
        u_vid = u_page = u_slot = u_pos = u_tgt = u_seq = u_step = np.empty(0, np.int64)

    # -- evicts, invalidates -----------------------------------------------------------------
    e_pos, e_slot = prep.e_pos, prep.e_slot
    inv_pos = cols.inv
    lose_pos = cols.lose
    """Events lost before these positions (gaps in seq): every slot's content unknown."""

    # -- reads ---------------------------------------------------------------------------------
    rc = cols.r
    nr = rc.shape[0]
    ri = cols.r_pos
    r_layer, r_stream = rc[:, 1], rc[:, 2]
    r_vid, run_read, run_pos, length = prep.r_vid, prep.run_read, prep.run_pos, prep.length
    b, e, slot, src = cols.runs[:, 0], cols.runs[:, 1], cols.runs[:, 2], cols.run_src
    keep, host, slot_bad, no_upload = prep.keep, prep.host, prep.slot_bad, prep.no_upload
    jr = np.flatnonzero(prep.judged)

    # -- versions ------------------------------------------------------------------------------
    need_v = np.concatenate([w_vid, u_vid, r_vid[run_read[jr]]])
    need_e = np.concatenate([w_page + 1, u_page + 1, e[jr]])
    pages.ensure(need_v, need_e)
    w_flat = pages.flat(w_vid, w_page)
    worder = np.argsort(w_flat * R + w_pos, kind="stable")
    wkey = (w_flat * R + w_pos)[worder]

    def before(flat: np.ndarray, t: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.searchsorted(wkey, flat * R + t) - np.searchsorted(wkey, flat * R)
        return out

    # -- whole runs first: most runs are exact, and a run whose slots the chunk leaves alone
    # is decided from the carried slots without a page of it expanded (pages in slots the
    # chunk fills or whose host page it writes are judged one by one below)
    quick = np.zeros(jr.size, np.int64)
    """Per judged run: pages found exact by the run-level check."""
    if detail or not jr.size:
        owner, p_page = expand(b[jr], length[jr])
        p_run = jr[owner]
    else:
        p_run, p_page, quick = _quick_runs(
            state, jr, b, length, src, slot, run_pos, r_vid[run_read[jr]],
            _Copies(u_tgt, u_slot, u_pos, u_vid, u_page), e_slot, e_pos,
            inv_pos if not lose_pos.size else np.sort(np.concatenate([inv_pos, lose_pos])),
            _known_at(state.writes, first_write, run_pos[jr]), w_flat, wkey, R)
    p_read = run_read[p_run]
    p_pos = run_pos[p_run]
    p_vid = r_vid[p_read]
    p_src = src[p_run]
    p_slot = slot[p_run] + (p_page - b[p_run])

    p_flat = pages.flat(p_vid, p_page)
    cur = pages.version[p_flat]
    if w_flat.size:  # only pages this chunk writes can have moved on since it began
        written = np.zeros(pages.version.size, bool)
        written[w_flat] = True
        moved = np.flatnonzero(written[p_flat])
        cur[moved] += before(p_flat[moved], p_pos[moved])
    versions_disagree = _check_versions(cols, w_ok, w_vid_e, pages, before)
    u_flat = pages.flat(u_vid, u_page)
    u_ver = pages.version[u_flat] + before(u_flat, u_pos)

    # -- the newest copy of each read page's slot ----------------------------------------------
    m = p_page.size
    h_vid = np.full(m, -1, np.int64)
    h_page = np.full(m, -1, np.int64)
    h_ver = np.full(m, -1, np.int64)
    from_upload = np.full(m, -1, np.int64)
    """Per page: the upload entry its copy came from (-1: carried, or none)."""
    carried_slot = np.full(m, -1, np.int64)
    """Per page: the carried slot its copy is in (-1: from an upload, or none)."""
    for target, table, code_src in ((0, state.pool, POOL), (1, state.ring, RING)):
        sel = np.flatnonzero(p_src == code_src)
        if not sel.size:
            continue
        q, t = p_slot[sel], p_pos[sel]
        tu = np.flatnonzero(u_tgt == target)
        evicts = e_slot if target == 0 else e_slot[:0]
        # a page whose slot this chunk neither fills nor empties before it holds what came in
        busy = t > inv_pos[0] if inv_pos.size else np.zeros(sel.size, bool)
        if lose_pos.size:
            busy |= t >= lose_pos[0]
        if tu.size or evicts.size:
            top = int(max(q.max(), u_slot[tu].max() if tu.size else 0,
                          evicts.max() if evicts.size else 0)) + 1
            touched = np.zeros(top, bool)
            touched[u_slot[tu]] = True
            touched[evicts[evicts >= 0]] = True
            busy |= touched[q]
        quiet = np.flatnonzero(~busy)
        if quiet.size:
            _carried(table, sel[quiet], q[quiet], h_vid, h_page, h_ver, carried_slot)
        look = np.flatnonzero(busy)
        if not look.size:
            continue
        sel, q, t = sel[look], q[look], t[look]
        ukey_all = u_slot[tu] * R + u_pos[tu]
        uorder = np.argsort(ukey_all, kind="stable")
        ukey = ukey_all[uorder]
        j = np.searchsorted(ukey, q * R + t) - 1
        jc = np.maximum(j, 0)
        hit = (j >= 0) & (ukey[jc] // R == q) if ukey.size else np.zeros(sel.size, bool)
        u_at = np.where(hit, ukey[jc] % R if ukey.size else 0, -1)
        at = u_at.copy()
        if evicts.size:
            ekey = np.sort(evicts * R + e_pos)
            k = np.searchsorted(ekey, q * R + t) - 1
            kc = np.maximum(k, 0)
            ehit = (k >= 0) & (ekey[kc] // R == q)
            at = np.maximum(at, np.where(ehit, ekey[kc] % R, -1))
        if inv_pos.size:
            li = np.searchsorted(inv_pos, t) - 1
            at = np.maximum(at, np.where(li >= 0, inv_pos[np.maximum(li, 0)], -1))
        if lose_pos.size:
            # lost events before position L came after every event at a position < L, and
            # before the event at L
            lj = np.searchsorted(lose_pos, t, side="right") - 1
            lost_here = np.where(lj >= 0, lose_pos[np.maximum(lj, 0)], -1) > at
            h_vid[sel[lost_here]] = LOST
        else:
            lost_here = np.zeros(sel.size, bool)
        from_up = hit & (u_at == at) & ~lost_here
        carried = (at < 0) & ~lost_here
        if from_up.any():
            src_i = tu[uorder[jc[from_up]]]
            dst = sel[from_up]
            h_vid[dst] = u_vid[src_i]
            h_page[dst] = u_page[src_i]
            h_ver[dst] = u_ver[src_i]
            from_upload[dst] = src_i
        if carried.any():
            _carried(table, sel[carried], q[carried], h_vid, h_page, h_ver, carried_slot)

    # -- classes -------------------------------------------------------------------------------
    same = (h_vid == p_vid) & (h_page == p_page) & (h_vid >= 0)
    wk = _known_at(state.writes, first_write, p_pos)
    cls = np.full(m, FOREIGN, np.int64)
    cls[same & wk & (h_ver == cur)] = EXACT
    cls[same & wk & (h_ver != cur)] = STALE
    cls[same & ~wk] = NOT_JUDGED
    why = np.where(same & ~wk, NO_WRITE, 0)
    lost = h_vid == LOST
    if lost.any():
        cls[lost] = NOT_JUDGED
        why[lost] = LOST_EVENTS
    lag = np.where(cls == STALE, cur - h_ver, 0)
    h_seq = np.full(m, -1, np.int64)
    h_step = np.full(m, -1, np.int64)
    h_row = np.full(m, -1, np.int64)
    need = np.arange(m) if detail else np.flatnonzero(cls != EXACT)
    up_i = from_upload[need]
    got = up_i >= 0
    h_seq[need[got]] = u_seq[up_i[got]]
    h_step[need[got]] = u_step[up_i[got]]
    h_row[need[got]] = rows0 + u_pos[up_i[got]]
    cs = carried_slot[need]
    got = cs >= 0
    for target, table in ((POOL, state.pool), (RING, state.ring)):
        mine = got & (p_src[need] == target)
        h_seq[need[mine]] = table.seq[cs[mine]]
        h_step[need[mine]] = table.step[cs[mine]]
        h_row[need[mine]] = table.row[cs[mine]]
    rule3 = np.flatnonzero((p_src == RING) & (h_vid == p_vid) & ~same)
    dispatched = list(zip((rows0 + cols.f_pos).tolist(), cols.f_layer.tolist(), strict=True))
    if rule3.size:
        _rule3(state, rule3, rows0, dispatched, p_vid, p_page, p_slot, p_pos, cur, wk, r_vid, ri,
               u_tgt, u_pos, u_slot, u_vid, u_page, u_ver, u_seq, u_step, inv_pos, lose_pos,
               cls, lag, why, h_vid, h_page, h_ver, h_seq, h_step, h_row)
    # the latest dispatch of each layer, for the chunks after this one (the fits events are
    # in file order): set here, once the chunk is judged, so a later dispatch in the chunk is
    # never taken for an earlier read's
    state.dispatch.update((layer, row) for row, layer in dispatched)

    # -- counts --------------------------------------------------------------------------------
    page_cls = np.bincount(p_src * 4 + cls, minlength=12).reshape(3, 4)
    if quick.any():
        page_cls[:, EXACT] += np.bincount(src[jr], weights=quick, minlength=3).astype(np.int64)
    page_cls[HOST, EXACT] += int(length[host].sum())
    nj_runs = np.flatnonzero(slot_bad | no_upload)
    nj_why = np.where(slot_bad[nj_runs], OUT_OF_RANGE, NO_UPLOAD)
    for k in nj_runs.tolist():
        page_cls[src[k], NOT_JUDGED] += int(length[k])
    r_counts = np.bincount(p_read * 4 + cls, minlength=nr * 4).reshape(nr, 4)
    if quick.any():
        r_counts[:, EXACT] += np.bincount(run_read[jr], weights=quick,
                                          minlength=nr).astype(np.int64)
    if host.any():
        r_counts[:, EXACT] += np.bincount(run_read[host], weights=length[host],
                                          minlength=nr).astype(np.int64)
    if nj_runs.size:
        r_counts[:, NOT_JUDGED] += np.bincount(run_read[nj_runs], weights=length[nj_runs],
                                               minlength=nr).astype(np.int64)
    not_judged = {int(w): int(c) for w, c in enumerate(np.bincount(
        np.concatenate([why[cls == NOT_JUDGED], nj_why]),
        weights=np.concatenate([np.ones(int((cls == NOT_JUDGED).sum())), length[nj_runs]]),
        minlength=6)) if c}

    # -- pieces: runs of non-exact pages ---------------------------------------------------------
    badi = np.flatnonzero(cls != EXACT)
    if badi.size:
        k = badi
        # a slot that held nothing has no page to line up: its h_page is whatever the slot
        # last named (or -1), which would cut a run of empty slots by how the chunks fell
        off = np.where(h_vid[k] >= 0, h_page[k] - p_page[k], 0)
        new = np.ones(k.size, bool)
        new[1:] = ((p_run[k][1:] != p_run[k][:-1]) | (p_page[k][1:] != p_page[k][:-1] + 1)
                   | (cls[k][1:] != cls[k][:-1]) | (lag[k][1:] != lag[k][:-1])
                   | (h_vid[k][1:] != h_vid[k][:-1]) | (off[1:] != off[:-1])
                   | (why[k][1:] != why[k][:-1]))
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], k.size) - 1
        s_, e_ = k[starts], k[ends]
        hv = h_vid[s_]
        has = hv >= 0
        hvc = np.maximum(hv, 0)
        page_pieces = np.stack([
            p_read[s_], p_page[s_], p_page[e_] + 1, p_src[s_], p_slot[s_], cls[s_], lag[s_],
            np.where(has, views.layer[hvc] if views.layer.size else -1, -1),
            np.where(has, views.stream[hvc] if views.stream.size else -1, -1),
            np.where(has, h_page[s_], -1), np.where(has, h_ver[s_], -1),
            np.where(has, h_step[s_], -1), np.where(has, h_seq[s_], -1), why[s_]], axis=1)
    else:
        page_pieces = np.empty((0, 14), np.int64)
    if nj_runs.size:
        minus = np.full(nj_runs.size, -1, np.int64)
        run_pieces = np.stack([
            run_read[nj_runs], b[nj_runs], e[nj_runs], src[nj_runs], slot[nj_runs],
            np.full(nj_runs.size, NOT_JUDGED, np.int64), np.zeros(nj_runs.size, np.int64),
            minus, minus, minus, minus, minus, minus, nj_why], axis=1)
        pieces = np.concatenate([page_pieces, run_pieces])
    else:
        pieces = page_pieces
    if pieces.shape[0] > 1:
        # in read and page order, whichever runs a read's served list gives first and however
        # the chunks fell (a read's pieces are its evidence, in that order)
        pieces = pieces[np.lexsort((pieces[:, 1], pieces[:, 0]))]

    # -- flows: the last write of every stale or foreign page ------------------------------------
    fl = np.flatnonzero((cls == STALE) | (cls == FOREIGN)) if flows else np.empty(0, np.int64)
    if fl.size:
        f_flat, f_t = p_flat[fl], p_pos[fl]
        j = np.searchsorted(wkey, f_flat * R + f_t) - 1
        jc = np.maximum(j, 0)
        in_chunk = (j >= 0) & (wkey[jc] // R == f_flat) if wkey.size else np.zeros(fl.size, bool)
        wseq = np.where(in_chunk, w_seq[worder[jc]] if w_seq.size else 0, pages.wseq[f_flat])
        # one (write, read) pair once: a packed key sorts in one pass
        key = sorted_unique((wseq << 22 | p_read[fl]) << 2 | (cls[fl] == FOREIGN))
        found = np.stack([key >> 24, (key >> 2) & ((1 << 22) - 1),
                          np.where(key & 1, FOREIGN, STALE)], axis=1)
        found = found[found[:, 0] > 0]
    else:
        found = np.empty((0, 3), np.int64)

    info = {"p_run": p_run, "p_read": p_read, "p_page": p_page, "p_src": p_src, "p_slot": p_slot,
              "cls": cls, "lag": lag, "why": why, "cur": cur, "h_vid": h_vid,
              "h_page": h_page, "h_ver": h_ver, "h_seq": h_seq, "h_step": h_step,
              "run_read": run_read, "b": b, "e": e, "src": src, "slot": slot,
              "keep": keep, "host": host, "nj_runs": nj_runs, "nj_why": nj_why,
              "wkey": wkey, "R": R, "ri": ri, "n": n}

    # -- carry the state forward ---------------------------------------------------------------
    if w_flat.size:
        np.add.at(pages.version, w_flat, 1)
        last = _last_of(w_flat)
        pages.wseq[w_flat[last]] = w_seq[last]
        pages.wrow[w_flat[last]] = rows0 + w_pos[last]
        if state.writes is None:
            state.writes = True
    last_inv_pos = int(inv_pos[-1]) if inv_pos.size else -1
    last_lose = int(lose_pos[-1]) if lose_pos.size else -1
    lost_last = last_lose > last_inv_pos
    """The chunk's last wholesale change is a loss (an invalidate at its position follows it)."""
    for target, table in ((0, state.pool), (1, state.ring)):
        tu = np.flatnonzero(u_tgt == target)
        if state.uploads[target] is None and tu.size:
            state.uploads[target] = True
        if lost_last:
            table.lose()
        elif last_inv_pos >= 0:
            table.clear()
        if target == 0 and e_slot.size:
            ev_in = (e_slot >= 0) & (e_slot < table.view.size)
            if lost_last:  # an evict before the loss says nothing of the slot now
                ev_in &= e_pos >= last_lose
            ev_slots = e_slot[ev_in]
            table.view[ev_slots] = -1
            table.row[ev_slots] = -1
            # an upload after the evict refills the slot below
        if tu.size:
            last = tu[_last_of(u_slot[tu])]
            if target == 0 and e_slot.size:
                ekey = np.sort(e_slot * R + e_pos)
                k = np.searchsorted(ekey, u_slot[last] * R + n) - 1
                kc = np.maximum(k, 0)
                evicted_after = (k >= 0) & (ekey[kc] // R == u_slot[last]) & \
                    (ekey[kc] % R > u_pos[last])
                last = last[~evicted_after]
            last = last[u_pos[last] > last_inv_pos]
            if lost_last:
                last = last[u_pos[last] >= last_lose]
            if last.size:
                table.grow(int(u_slot[last].max()) + 1)
                qs = u_slot[last]
                table.view[qs] = u_vid[last]
                table.page[qs] = u_page[last]
                table.version[qs] = u_ver[last]
                table.seq[qs] = u_seq[last]
                table.step[qs] = u_step[last]
                table.row[qs] = rows0 + u_pos[last]
    if inv_pos.size or lose_pos.size:
        state.ring_log.clear()
    ring_up = ring_up_all = np.flatnonzero(u_tgt == 1)
    if inv_pos.size:
        ring_up = ring_up[u_pos[ring_up] > inv_pos[-1]]
    if lose_pos.size:
        ring_up = ring_up[u_pos[ring_up] >= last_lose]
    if ring_up.size:
        state.ring_log.add(np.stack([rows0 + u_pos[ring_up], u_slot[ring_up], u_vid[ring_up],
                                     u_page[ring_up], u_ver[ring_up], u_seq[ring_up],
                                     u_step[ring_up]], axis=1))
    after_loss(state, rows0, last_lose, last_inv_pos, u_vid[ring_up_all], u_pos[ring_up_all],
               r_vid, ri)
    r_pages = np.bincount(run_read[keep] * 3 + src[keep], weights=length[keep],
                          minlength=nr * 3).astype(np.int64).reshape(nr, 3)
    return Chunk(rows0, cols, ri, r_counts, pieces, page_cls, not_judged, found, info,
                 versions_disagree, r_layer, r_stream, steps[ri], rc[:, 0], r_pages)


def _check_versions(cols: Cols, w_ok: np.ndarray, w_vid_e: np.ndarray, pages: PageTable,
                    before: Any) -> list[tuple[int, int, int, int, int, int, int]]:
    """Compare each write's annotated ``versions`` with the judged version after it: (seq,
    step, layer, stream of the write, page, annotated version, judged version) for the first
    disagreeing page of each write that disagrees."""
    total = cols.w_vers.shape[0]
    if not total:
        return []
    w = cols.w
    wi = cols.w_pos
    wix = np.repeat(np.arange(w.shape[0]), cols.w_vlen)
    page, annotated = cols.w_vers[:, 0], cols.w_vers[:, 1]
    okidx = np.cumsum(w_ok) - 1
    vid = np.where(w_ok[wix], w_vid_e[np.maximum(okidx[wix], 0)] if w_vid_e.size else -1, -1)
    cap = np.where(vid >= 0, pages.cap[np.maximum(vid, 0)] if pages.cap.size else 0, 0)
    inside = (vid >= 0) & (page >= 0) & (page < cap)
    judged = np.zeros(total, np.int64)
    if inside.any():
        flat = pages.flat(vid[inside], page[inside])
        judged[inside] = pages.version[flat] + before(flat, wi[wix[inside]] + 1)
    bad = np.flatnonzero(judged != annotated)
    out: list[tuple[int, int, int, int, int, int, int]] = []
    seen: set[int] = set()
    for k in bad.tolist():
        i = int(wix[k])
        if i not in seen:
            seen.add(i)
            out.append((int(w[i, 0]), int(cols.step[wi[i]]), int(w[i, 1]), int(w[i, 2]),
                        int(page[k]), int(annotated[k]), int(judged[k])))
    return out


_OFF = 1 << 23
_BIG = 1 << 25
"""A slot's content as one number: view * _BIG + (page - slot) + _OFF (pages and slots are
below 2^20 and 2^22), so consecutive pages in consecutive slots share it."""


class _Copies(NamedTuple):
    """The chunk's upload entries, one per page copied (target 0 pool, 1 ring)."""

    tgt: np.ndarray
    slot: np.ndarray
    pos: np.ndarray
    vid: np.ndarray
    page: np.ndarray


def _quick_runs(state: State, jr: np.ndarray, b: np.ndarray, length: np.ndarray,
                src: np.ndarray, slot: np.ndarray, run_pos: np.ndarray, vid: np.ndarray,
                ups: _Copies, e_slot: np.ndarray, e_pos: np.ndarray,
                inv_pos: np.ndarray, writes_known: np.ndarray, w_flat: np.ndarray,
                wkey: np.ndarray, R: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run-level check: (run of each page entry still to judge one by one, its page,
    pages of each judged run found exact by the check).

    A run passes when every slot of it that the chunk does not fill (or empty) holds, since
    the chunk began, the run's own pages in order (one content number throughout) at their
    current version. Its pages in slots the chunk fills, or whose host page the chunk writes,
    are judged one by one — unless the chunk's last copy into the slot before the read is of
    the page itself and neither a write of the page nor an evict of the slot came between
    (:func:`_fresh`); a run that does not pass is judged page by page entirely."""
    u_tgt, u_slot = ups.tgt, ups.slot
    pages = state.pages
    passing = np.zeros(jr.size, bool)
    special_run: list[np.ndarray] = []
    special_page: list[np.ndarray] = []
    eligible = writes_known.copy()
    if inv_pos.size:
        eligible &= run_pos[jr] < inv_pos[0]
    w_sorted = sorted_unique(w_flat)
    for target, table, code_src in ((0, state.pool, POOL), (1, state.ring, RING)):
        mine = np.flatnonzero(eligible & (src[jr] == code_src))
        if not mine.size or not table.view.size:
            continue
        runs = jr[mine]
        q, n = slot[runs], length[runs]
        tu = u_slot[u_tgt == target]
        ev_slots = e_slot[e_slot >= 0] if target == 0 else e_slot[:0]
        size = int(max(table.view.size, int((q + n).max()),
                       int(tu.max()) + 1 if tu.size else 0,
                       int(ev_slots.max()) + 1 if ev_slots.size else 0))
        touched = np.zeros(size, bool)
        touched[tu] = True
        touched[ev_slots] = True
        held = table.view >= 0
        hv = np.where(held, table.view, 0)
        hp = np.where(held, table.page, 0)
        code = np.full(size, -1, np.int64)
        code[:table.view.size] = np.where(
            held, hv * _BIG + (hp - np.arange(table.view.size)) + _OFF, -1)
        good = np.zeros(size, bool)
        if pages.offset.size:
            inside = held & (hv < pages.cap.size)
            inside &= hp < np.where(inside, pages.cap[np.where(inside, hv, 0)], 0)
            at = np.where(inside, pages.offset[np.where(inside, hv, 0)] + hp, 0)
            good[:table.view.size] = inside & (table.version == pages.version[at])
        idx_u = np.flatnonzero(~touched)
        codes_u = code[idx_u]
        brk = np.concatenate(([0], np.cumsum(codes_u[1:] != codes_u[:-1])))
        bad = np.concatenate(([0], np.cumsum(~good[idx_u])))
        lo = np.searchsorted(idx_u, q)
        hi = np.searchsorted(idx_u, q + n)
        some = hi > lo
        want = vid[mine] * _BIG + (b[runs] - q) + _OFF
        if idx_u.size:
            first = np.minimum(lo, idx_u.size - 1)
            last = np.maximum(hi - 1, 0)
            ok = ~some | ((codes_u[first] == want) & (brk[last] == brk[first]))
        else:
            ok = ~some
        ok &= bad[hi] == bad[lo]
        good_runs = mine[ok]
        passing[good_runs] = True
        runs = jr[good_runs]
        q, n = slot[runs], length[runs]
        # their pages in slots the chunk fills or empties
        t_list = np.flatnonzero(touched)
        tlo, thi = np.searchsorted(t_list, q), np.searchsorted(t_list, q + n)
        owner, at = expand(tlo, thi - tlo)
        special_run.append(good_runs[owner])
        special_page.append(b[runs][owner] + t_list[at] - q[owner])
        # their pages the chunk writes
        base = pages.offset[vid[good_runs]] + b[runs]
        wlo = np.searchsorted(w_sorted, base)
        whi = np.searchsorted(w_sorted, base + n)
        owner, at = expand(wlo, whi - wlo)
        special_run.append(good_runs[owner])
        special_page.append(b[runs][owner] + (w_sorted[at] - base[owner]))
    full = np.flatnonzero(~passing)
    owner, page = expand(b[jr[full]], length[jr[full]])
    runs_out = [full[owner]]
    pages_out = [page]
    quick = np.zeros(jr.size, np.int64)
    if special_run:
        sr = np.concatenate(special_run)
        sp = np.concatenate(special_page)
        key = sorted_unique(sr * (1 << 21) + sp)  # a page both filled and written: once
        sr, sp = key >> 21, key & ((1 << 21) - 1)
        if sr.size and ups.tgt.size:
            stay = ~_fresh(state, jr[sr], sp, vid[sr], b, src, slot, run_pos, ups, e_slot,
                           e_pos, wkey, R)
            sr, sp = sr[stay], sp[stay]
        runs_out.append(sr)
        pages_out.append(sp)
        quick[passing] = length[jr[passing]]
        quick -= np.bincount(sr, minlength=jr.size)
    run_idx = np.concatenate(runs_out)
    page_all = np.concatenate(pages_out)
    order = np.lexsort((page_all, run_idx))
    return jr[run_idx[order]], page_all[order], quick


def _fresh(state: State, runs: np.ndarray, page: np.ndarray, vid: np.ndarray, b: np.ndarray,
           src: np.ndarray, slot: np.ndarray, run_pos: np.ndarray, ups: _Copies,
           e_slot: np.ndarray, e_pos: np.ndarray, wkey: np.ndarray, R: int) -> np.ndarray:
    """Of pages of passing runs (``runs``: index of each one's served run; no invalidate came
    before their read in the chunk): which are exact because the chunk's last copy into their
    slot before the read is of the page itself (rule 1 of the ring; a pool slot's newest copy)
    with no write of the page (its version unchanged) and no evict of the slot between that
    copy and the read. The page-by-page judgement gives them the same verdict; this decides
    them without it (a ring's pages are copied in the chunk of their read)."""
    t = run_pos[runs]
    ring = (src[runs] == RING).astype(np.int64)
    q = slot[runs] + (page - b[runs])
    space = MAX_SLOT + 1
    ukey_all = (ups.tgt * space + ups.slot) * R + ups.pos
    order = np.argsort(ukey_all, kind="stable")
    ukey = ukey_all[order]
    want = (ring * space + q) * R
    j = np.searchsorted(ukey, want + t) - 1
    jc = np.maximum(j, 0)
    src_i = order[jc]
    fresh = (j >= 0) & (ukey[jc] // R == want // R)
    fresh &= (ups.vid[src_i] == vid) & (ups.page[src_i] == page)
    at = ups.pos[src_i]
    inside = (e_slot >= 0) & (e_slot < MAX_SLOT)
    if inside.any():
        ekey = np.sort(e_slot[inside] * R + e_pos[inside])
        emptied = np.searchsorted(ekey, q * R + t) - np.searchsorted(ekey, q * R + at)
        fresh &= (ring == 1) | (emptied == 0)
    if wkey.size:
        flat = state.pages.flat(vid, page)
        fresh &= np.searchsorted(wkey, flat * R + t) == np.searchsorted(wkey, flat * R + at)
    out: np.ndarray = fresh
    return out


def _carried(table: SlotTable, dst: np.ndarray, q: np.ndarray, h_vid: np.ndarray,
             h_page: np.ndarray, h_ver: np.ndarray, carried_slot: np.ndarray) -> None:
    """Pages ``dst`` read the copy their slot ``q`` held when the chunk began."""
    inside = q < table.view.size
    dst, q = dst[inside], q[inside]
    h_vid[dst] = table.view[q]
    h_page[dst] = table.page[q]
    h_ver[dst] = table.version[q]
    carried_slot[dst] = q


def fresh_batch(state: State) -> int:
    """Where the ring batch of a view not seen before starts: at its first copy
    (:data:`NO_BATCH`), except after events lost from the trace, which may hold its first
    copies (it began before the gap: :meth:`State.lose_history`). A snapshot names the views
    whose copies wait (``ring_pending``), so a view it does not name has none."""
    if state.history_why == LOST_EVENTS and state.history_row >= 0:
        return state.history_row - 1
    return NO_BATCH


def grow_views(state: State) -> None:
    n = len(state.views.ids)
    if n > state.batch_start.size:
        grow = n - state.batch_start.size
        state.batch_start = np.concatenate([state.batch_start,
                                            np.full(grow, fresh_batch(state), np.int64)])
        state.read_since = np.concatenate([state.read_since, np.zeros(grow, bool)])


def _advance_batches(state: State, c_vid: np.ndarray, c_row: np.ndarray, r_vid: np.ndarray,
                     r_row: np.ndarray) -> None:
    """Each view's ring batch after a chunk's ring copies and reads (rule 3): a copy after a
    read of its view starts a new batch; reads and copies are taken in row order."""
    grow_views(state)
    if not c_vid.size and not r_vid.size:
        return
    nv = state.batch_start.size
    last_copy = np.full(nv, -1, np.int64)
    np.maximum.at(last_copy, c_vid, c_row)
    before = r_row < last_copy[r_vid]
    last_read = np.full(nv, -1, np.int64)
    np.maximum.at(last_read, r_vid[before], r_row[before])
    after = c_row > last_read[c_vid]
    first = np.full(nv, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, c_vid[after], c_row[after])
    has_copy = last_copy >= 0
    start, since = state.batch_start, state.read_since
    renew = (last_read >= 0) | since | (start == NO_BATCH)
    state.batch_start = np.where(has_copy, np.where(renew, first, start), start)
    read_after = np.bincount(r_vid[r_row > last_copy[r_vid]], minlength=nv) > 0
    any_read = np.bincount(r_vid, minlength=nv) > 0
    state.read_since = np.where(has_copy, read_after, since | any_read)


def _batch_start(state: State, view: int, c_row: np.ndarray, r_row: np.ndarray,
                 carried: tuple[int, bool] | None = None) -> tuple[int, bool]:
    """The row where a view's current ring batch starts, given its copies and reads in this
    chunk before the moment asked about (both ascending), and whether a read of the view came
    since (the batch was another read's: the one asked about made no copy of its own).
    ``carried``: (start, read since) to start from instead of the state's."""
    if carried is not None:
        start, since = carried
    elif view < state.batch_start.size:
        start, since = int(state.batch_start[view]), bool(state.read_since[view])
    else:
        start, since = fresh_batch(state), False
    events = sorted([(int(r), 0) for r in c_row] + [(int(r), 1) for r in r_row])
    for row, is_read in events:
        if is_read:
            since = True
        elif start == NO_BATCH or since:
            start, since = row, False
    return start, since


def after_loss(state: State, rows0: int, last_lose: int, last_inv: int, c_vid: np.ndarray,
               c_pos: np.ndarray, r_vid: np.ndarray, r_pos: np.ndarray) -> None:
    """Each view's ring batch after a chunk's ring copies (``c_*``) and reads (``r_*``), and
    where the chunk lost events last (``last_lose``, -1: none), what :meth:`State.lose` does
    at that position: the batches are open across it (both judgements of a chunk). An
    invalidate after it (``last_inv``: the chunk's last, -1: none) emptied every slot, so the
    copies before it, lost or summarised by a snapshot, can no longer be what a read consumes:
    the history ends there."""
    if last_lose >= 0:
        state.lose_history(rows0 + last_lose)
        c_keep, r_keep = c_pos >= last_lose, r_pos >= last_lose
        c_vid, c_pos, r_vid, r_pos = c_vid[c_keep], c_pos[c_keep], r_vid[r_keep], r_pos[r_keep]
    if last_inv >= 0 and last_inv >= last_lose:
        state.history_row = -1
    _advance_batches(state, c_vid, rows0 + c_pos, r_vid, rows0 + r_pos)


def _last_of(keys: np.ndarray) -> np.ndarray:
    """Index of the last occurrence of each distinct key."""
    rev = keys[::-1]
    _, first = np.unique(rev, return_index=True)
    out: np.ndarray = keys.size - 1 - first
    return out


def _rule3(state: State, idx: np.ndarray, rows0: int, dispatched: list[tuple[int, int]],
           p_vid: np.ndarray, p_page: np.ndarray,
           p_slot: np.ndarray, p_pos: np.ndarray, cur: np.ndarray, wk: np.ndarray,
           r_vid: np.ndarray, ri: np.ndarray, u_tgt: np.ndarray, u_pos: np.ndarray,
           u_slot: np.ndarray, u_vid: np.ndarray, u_page: np.ndarray, u_ver: np.ndarray,
           u_seq: np.ndarray, u_step: np.ndarray, inv_pos: np.ndarray, lose_pos: np.ndarray,
           cls: np.ndarray,
           lag: np.ndarray,
           why: np.ndarray, h_vid: np.ndarray, h_page: np.ndarray, h_ver: np.ndarray,
           h_seq: np.ndarray, h_step: np.ndarray, h_row: np.ndarray) -> None:
    """Rule 3 of the ring, page by page, over the recent ring copies and this chunk's.
    ``dispatched``: (row, layer) of the chunk's fits events. A copy of the view's other page
    is the ring cycling within the read only when made after the FA node of the view's layer
    was dispatched: the ``consumed`` gate a reuse waits on is the kernel's, and a copy issued
    before its launch cannot wait on it (a prefetch that overran the ring replaced the page
    before the read)."""
    tu = np.flatnonzero(u_tgt == 1)
    chunk_log = np.stack([rows0 + u_pos[tu], u_slot[tu], u_vid[tu], u_page[tu], u_ver[tu],
                          u_seq[tu], u_step[tu]], axis=1) if tu.size else np.empty((0, 7),
                                                                                  np.int64)
    log = np.concatenate([state.ring_log.entries(), chunk_log])
    inv_rows = rows0 + inv_pos
    oldest = int(log[0, 0]) if log.size else -1
    for i in idx.tolist():
        view, page, slot, t = int(p_vid[i]), int(p_page[i]), int(p_slot[i]), rows0 + int(p_pos[i])
        layer = int(state.views.layer[view])
        dispatch = max((r for r, f_layer in dispatched if f_layer == layer and r < t),
                       default=state.dispatch.get(layer, -1))
        # V's batch: its ring copies since a read of V was followed by a copy
        mine_c = chunk_log[(chunk_log[:, 2] == view) & (chunk_log[:, 0] < t), 0]
        mine_r = rows0 + ri[(r_vid == view) & (ri < p_pos[i])]
        lost = rows0 + lose_pos[lose_pos <= p_pos[i]]
        if lost.size:  # events lost in this chunk before the read: the batch is open across
            # the gap (State.lose_history) until a read of the view after it
            loss = int(lost[-1])
            start, earlier = _batch_start(state, view, np.unique(mine_c[mine_c >= loss]),
                                          mine_r[mine_r >= loss], (loss - 1, False))
        else:
            loss = -1
            start, earlier = _batch_start(state, view, np.unique(mine_c), mine_r)
        if start == NO_BATCH:
            start = t
        began_before_loss = start < loss
        if began_before_loss:
            start = loss
        cleared = inv_rows[inv_rows < t]
        if cleared.size:  # an invalidate emptied every slot: nothing before it is in one
            start = max(start, int(cleared[-1]) + 1)
            # the copies lost before it were emptied too: the walk ends at a known state
            began_before_loss &= int(cleared[-1]) < loss
        walk = log[(log[:, 1] == slot) & (log[:, 0] >= start) & (log[:, 0] < t)]
        verdict: tuple[int, ...] | None = None
        for k in range(walk.shape[0] - 1, -1, -1):
            c = walk[k]
            if int(c[2]) != view:
                verdict = (FOREIGN, 0, 0, *c[2:7].tolist())
                break
            if int(c[3]) == page:
                version = int(c[4])
                if not wk[i]:
                    verdict = (NOT_JUDGED, 0, NO_WRITE, *c[2:7].tolist())
                else:
                    same_cls = EXACT if version == int(cur[i]) else STALE
                    verdict = (same_cls, int(cur[i]) - version if same_cls == STALE else 0, 0,
                               *c[2:7].tolist())
                break
            if earlier:  # an earlier read's cycling: this one finds the slot as it is
                continue
            if dispatch < 0:  # nothing says when the read began: the cycling is not judged
                verdict = (NOT_JUDGED, 0, NO_DISPATCH, -1, -1, -1, -1, -1)
                rest = walk[:k]
                if not ((rest[:, 2] != view) | (rest[:, 3] == page)).any():
                    # were it the cycling, the walk would go on to the batch's start unanswered:
                    # the reason is where it ends — events lost in a gap (the read's own
                    # dispatch may be among them), or copies kvdiag no longer keeps or made
                    # before the snapshot — as for a walk that knew the dispatch
                    ends = _unanswered(state, start, oldest, began_before_loss, loss)
                    if ends:
                        verdict = (NOT_JUDGED, 0, ends, -1, -1, -1, -1, -1)
                break
            if int(c[0]) < dispatch:  # replaced before the read began: the read found it
                verdict = (FOREIGN, 0, 0, *c[2:7].tolist())
                break
        if verdict is None:
            ends = _unanswered(state, start, oldest, began_before_loss, loss)
            if ends:
                verdict = (NOT_JUDGED, 0, ends, -1, -1, -1, -1, -1)
        if verdict is None:
            continue  # foreign, holding the newest copy: as judged already
        cls[i], lag[i], why[i] = verdict[0], verdict[1], verdict[2]
        h_vid[i], h_page[i], h_ver[i], h_seq[i], h_step[i] = verdict[3:8]
        h_row[i] = -1


def _unanswered(state: State, start: int, oldest: int, began_before_loss: bool,
                loss: int) -> int:
    """Why a rule-3 walk that reached its batch's start without meeting the page's copy judges
    nothing (0: it judges — foreign, holding the newest copy): the ring's log no longer goes
    back that far, the batch began before events lost in this chunk, or before the segment's
    snapshot or a gap in an earlier chunk (its earlier copies are unknown)."""
    if state.ring_log.dropped and start <= oldest:
        return RING_HISTORY
    if began_before_loss:
        return LOST_EVENTS
    if loss < 0 and start < state.history_row:
        return state.history_why
    return 0
