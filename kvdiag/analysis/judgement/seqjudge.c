/* A chunk's page judgement event by event, in C: the twin of batch.judge_chunk's page verdicts.
 *
 * kvdiag/analysis/judgement/seqjudge.py prepares the chunk's events as position-ordered arrays
 * (writes, uploads, evicts, invalidates, reads and their served runs) and hands over the
 * carried state's arrays (slots.py: PageTable, the pool and ring SlotTables); this walks the
 * events in file order, applying each to the state as slots.py's rule says, and judges every
 * page of a judged run against the slot's newest copy at the moment of its read. It returns
 * what batch.Chunk holds (per-read counts, per-source counts, not-judged reasons, the pieces
 * of non-exact pages, the flows' keys, the ring copies for the ring log).
 *
 * Rule 3 of the ring (a ring slot whose newest copy is another page of the read's own view)
 * needs the recent ring copies walked: where a page meets it, the chunk is declined, every
 * change to the state undone, and batch.judge_chunk judges the chunk (tests hold the two
 * equal: tests/test_compiled_judgement.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "vec.h"

enum { EXACT, STALE, FOREIGN, NOT_JUDGED };
enum { POOL, RING, HOST };
enum { NO_UPLOAD = 2, NO_WRITE = 3, OUT_OF_RANGE = 4, LOST_EVENTS = 8, WHYS = 9 };
/* a slot's view after events were lost from the trace: what it holds is unknown (slots.LOST) */
#define LOST (-2)
enum { CAT_JUDGED, CAT_HOST, CAT_OUT_OF_RANGE, CAT_NO_UPLOAD, CAT_DROPPED };
#define PIECE 14
#define RINGROW 7

/* The undo log: the old values of every slot and host page the chunk changes, kept at its
 * first change (so the log is bounded by the state's size, not by the chunk's copies). */
typedef struct {
    int64_t *old;      /* per entry: kind, index, then up to 6 old values */
    Py_ssize_t n, cap; /* in entries */
} Undo;
#define UNDO_WIDTH 8
enum { U_PAGE, U_POOL, U_RING };

typedef struct {
    int64_t *view, *page, *version, *seq, *step, *row;
    Py_ssize_t size;
    unsigned char *saved;
} Table;

typedef struct {
    int64_t *version, *wseq, *wrow;
    Py_ssize_t size;
    unsigned char *saved;
} Pages;

static int64_t *undo_entry(Undo *u) {
    if (u->n == u->cap) {
        Py_ssize_t cap = u->cap ? 2 * u->cap : 256;
        int64_t *o = PyMem_Realloc(u->old, (size_t)(cap * UNDO_WIDTH) * sizeof(int64_t));
        if (!o) {
            PyErr_NoMemory();
            return NULL;
        }
        u->old = o;
        u->cap = cap;
    }
    return &u->old[UNDO_WIDTH * u->n++];
}

/* Before a slot's first change in the chunk: its old content. */
static int save_slot(Undo *u, Table *t, int kind, Py_ssize_t q) {
    if (t->saved[q]) return 0;
    int64_t *e = undo_entry(u);
    if (!e) return -1;
    t->saved[q] = 1;
    e[0] = kind;
    e[1] = q;
    e[2] = t->view[q], e[3] = t->page[q], e[4] = t->version[q], e[5] = t->seq[q];
    e[6] = t->step[q], e[7] = t->row[q];
    return 0;
}

static int save_page(Undo *u, Pages *p, Py_ssize_t f) {
    if (p->saved[f]) return 0;
    int64_t *e = undo_entry(u);
    if (!e) return -1;
    p->saved[f] = 1;
    e[0] = U_PAGE;
    e[1] = f;
    e[2] = p->version[f], e[3] = p->wseq[f], e[4] = p->wrow[f];
    return 0;
}

static void undo_all(Undo *u, Pages *p, Table *tables) {
    for (Py_ssize_t i = u->n - 1; i >= 0; i--) {
        int64_t *e = &u->old[UNDO_WIDTH * i];
        Py_ssize_t at = (Py_ssize_t)e[1];
        if (e[0] == U_PAGE) {
            p->version[at] = e[2], p->wseq[at] = e[3], p->wrow[at] = e[4];
        } else {
            Table *t = &tables[e[0] == U_POOL ? 0 : 1];
            t->view[at] = e[2], t->page[at] = e[3], t->version[at] = e[4];
            t->seq[at] = e[5], t->step[at] = e[6], t->row[at] = e[7];
        }
    }
    u->n = 0;
}

enum {
    A_WPOS, A_WVID, A_WP0, A_WP1, A_WSEQ,
    A_UPOS, A_UVID, A_UP0, A_UCNT, A_USLOT, A_UTGT, A_USEQ, A_USTEP,
    A_EPOS, A_ESLOT, A_INV, A_LOSE,
    A_RPOS, A_RVID, A_RRUN0,
    A_B, A_E, A_SLOT, A_SRC, A_CAT,
    A_VLAYER, A_VSTREAM,
    A_POFF, A_PVER, A_PWSEQ, A_PWROW,
    A_WVLEN, A_WVERS, A_PCAP,
    A_POOL, /* view, page, version, seq, step, row */
    A_RING = A_POOL + 6,
    NARRAYS = A_RING + 6
};
/* the state's arrays changed in place */
#define WRITABLE(i) ((i) == A_PVER || (i) == A_PWSEQ || (i) == A_PWROW || (i) >= A_POOL)
#define VERSIONS 4

/* Every slot of a table set to ``view`` (-1: empty, an invalidate; LOST: events lost). */
static int clear_table(Undo *u, Table *t, int kind, int64_t view) {
    for (Py_ssize_t q = 0; q < t->size; q++) {
        if (t->view[q] == view && t->row[q] == -1) continue;
        if (save_slot(u, t, kind, q)) return -1;
        t->view[q] = view;
        t->row[q] = -1;
    }
    return 0;
}

/* judge(arrays, rows0, writes_from, flows) -> (writes_from: a write is recorded at positions
 * after it; -1: before the chunk)
 *   None (declined: rule 3 met; the state is as it was) or
 *   (r_counts, page_cls, not_judged, page pieces, run pieces, flow keys, ring rows, versions):
 *   int64 bytearrays (per read 4 counts; 3 x 4; WHYS; 14 per piece; keys; 7 per ring copy;
 *   per write whose annotated versions disagree, its first: write, page, annotated, judged) */
static PyObject *judge(PyObject *self, PyObject *args) {
    PyObject *arrays;
    long long rows0, writes_from;
    int flows;
    if (!PyArg_ParseTuple(args, "O!LLp", &PyTuple_Type, &arrays, &rows0, &writes_from, &flows))
        return NULL;
    if (PyTuple_GET_SIZE(arrays) != NARRAYS) {
        PyErr_SetString(PyExc_ValueError, "judge: wrong number of arrays");
        return NULL;
    }
    Py_buffer buf[NARRAYS];
    int got = 0;
    PyObject *result = NULL;
    Vec r_counts = {0}, page_pieces = {0}, run_pieces = {0}, keys = {0}, ring_rows = {0},
        versions = {0};
    Undo undo = {0};
    Table tables[2];
    Pages pg;
    memset(tables, 0, sizeof tables);
    memset(&pg, 0, sizeof pg);
    int64_t page_cls[12] = {0}, not_judged[WHYS] = {0};
    int declined = 0;

    for (; got < NARRAYS; got++) {
        PyObject *a = PyTuple_GET_ITEM(arrays, got);
        int flags = WRITABLE(got) ? PyBUF_CONTIG : PyBUF_CONTIG_RO;
        if (PyObject_GetBuffer(a, &buf[got], flags) < 0) goto done;
        if (buf[got].itemsize != 8 || buf[got].len % 8) {
            got++;
            PyErr_SetString(PyExc_TypeError, "judge: int64 arrays expected");
            goto done;
        }
    }
#define ARR(i) ((int64_t *)buf[i].buf)
#define LEN(i) (buf[i].len / 8)
    Py_ssize_t nw = LEN(A_WPOS), nu = LEN(A_UPOS), ne = LEN(A_EPOS), ni = LEN(A_INV),
               nl = LEN(A_LOSE),
               nr = LEN(A_RPOS), nviews = LEN(A_VLAYER), npages = LEN(A_PVER);
    for (int t = 0; t < 2; t++) {
        int base = t ? A_RING : A_POOL;
        Table *tb = &tables[t];
        tb->view = ARR(base);
        tb->page = ARR(base + 1);
        tb->version = ARR(base + 2);
        tb->seq = ARR(base + 3);
        tb->step = ARR(base + 4);
        tb->row = ARR(base + 5);
        tb->size = LEN(base);
        for (int j = 1; j < 6; j++)
            if (LEN(base + j) != tb->size) {
                PyErr_SetString(PyExc_ValueError, "judge: slot table columns differ");
                goto done;
            }
    }
    const int64_t *poff = ARR(A_POFF);
    Py_ssize_t nviews_pages = LEN(A_POFF);
    int64_t *pver = ARR(A_PVER), *pwseq = ARR(A_PWSEQ), *pwrow = ARR(A_PWROW);
    if (LEN(A_RRUN0) != nr + 1 || LEN(A_PWSEQ) != npages || LEN(A_PWROW) != npages) {
        PyErr_SetString(PyExc_ValueError, "judge: array lengths disagree");
        goto done;
    }
    pg.version = pver, pg.wseq = pwseq, pg.wrow = pwrow, pg.size = npages;
    pg.saved = PyMem_Calloc((size_t)npages + 1, 1);
    tables[0].saved = PyMem_Calloc((size_t)tables[0].size + 1, 1);
    tables[1].saved = PyMem_Calloc((size_t)tables[1].size + 1, 1);
    if (!pg.saved || !tables[0].saved || !tables[1].saved) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *rrun0 = ARR(A_RRUN0);
    const int64_t *wvlen = ARR(A_WVLEN), *wvers = ARR(A_WVERS), *pcap = ARR(A_PCAP);
    Py_ssize_t nvers = LEN(A_WVERS) / 2, vers_at = 0;
    if (LEN(A_WVLEN) != nw || LEN(A_PCAP) != nviews_pages) {
        PyErr_SetString(PyExc_ValueError, "judge: array lengths disagree");
        goto done;
    }
    Py_ssize_t nrun = LEN(A_B);
    if (r_counts.cap < nr * 4) {
        r_counts.v = PyMem_Calloc((size_t)(nr * 4 + 1), sizeof(int64_t));
        if (!r_counts.v) {
            PyErr_NoMemory();
            goto done;
        }
        r_counts.cap = r_counts.n = nr * 4;
    }

/* flat index of (view, page), checked: the Python side made room (PageTable.ensure) */
#define FLAT(vid, pg, out)                                                                   \
    do {                                                                                     \
        if ((vid) < 0 || (vid) >= nviews_pages || (pg) < 0) goto bad_index;                  \
        (out) = poff[vid] + (pg);                                                            \
        if ((out) < 0 || (out) >= npages) goto bad_index;                                    \
    } while (0)

    Py_ssize_t iw = 0, iu = 0, ie = 0, ii = 0, ir = 0, il = 0;
    /* the open piece of non-exact pages: the last page added */
    int64_t last_run = -1, last_page = 0, last_cls = 0, last_lag = 0, last_hv = 0,
            last_off = 0, last_why = 0;
    for (;;) {
        /* the next event by position */
        int64_t best = INT64_MAX;
        int kind = -1;
        /* first: a loss at a position comes before the event at that position */
        if (il < nl && ARR(A_LOSE)[il] < best) best = ARR(A_LOSE)[il], kind = 5;
        if (iw < nw && ARR(A_WPOS)[iw] < best) best = ARR(A_WPOS)[iw], kind = 0;
        if (iu < nu && ARR(A_UPOS)[iu] < best) best = ARR(A_UPOS)[iu], kind = 1;
        if (ie < ne && ARR(A_EPOS)[ie] < best) best = ARR(A_EPOS)[ie], kind = 2;
        if (ii < ni && ARR(A_INV)[ii] < best) best = ARR(A_INV)[ii], kind = 3;
        if (ir < nr && ARR(A_RPOS)[ir] < best) best = ARR(A_RPOS)[ir], kind = 4;
        if (kind < 0) break;
        int64_t pos = best;
        switch (kind) {
        case 0: { /* write: each page's version moves on; its last write is this one */
            int64_t vid = ARR(A_WVID)[iw], seq = ARR(A_WSEQ)[iw];
            for (int64_t p = ARR(A_WP0)[iw]; p < ARR(A_WP1)[iw]; p++) {
                int64_t f;
                FLAT(vid, p, f);
                if (save_page(&undo, &pg, f)) goto done;
                pver[f]++;
                pwseq[f] = seq;
                pwrow[f] = rows0 + pos;
            }
            /* the model's annotated versions after the write: the first that disagrees */
            int64_t nv = wvlen[iw];
            if (nv < 0 || vers_at + nv > nvers || vid < 0 || vid >= nviews_pages) goto bad_index;
            for (int64_t j = 0; j < nv; j++) {
                int64_t page = wvers[2 * (vers_at + j)], said = wvers[2 * (vers_at + j) + 1];
                int64_t judged = 0;
                if (page >= 0 && page < pcap[vid]) judged = pver[poff[vid] + page];
                if (judged != said) {
                    int64_t row[VERSIONS] = {iw, page, said, judged};
                    for (int q = 0; q < VERSIONS; q++)
                        if (vec_push(&versions, row[q])) goto done;
                    break;
                }
            }
            vers_at += nv;
            iw++;
            break;
        }
        case 1: { /* upload: each slot holds its page at the page's version now */
            int64_t vid = ARR(A_UVID)[iu], p0 = ARR(A_UP0)[iu], cnt = ARR(A_UCNT)[iu];
            int64_t slot0 = ARR(A_USLOT)[iu], tgt = ARR(A_UTGT)[iu];
            int64_t seq = ARR(A_USEQ)[iu], step = ARR(A_USTEP)[iu];
            if (tgt < 0 || tgt > 1) goto bad_index;
            Table *tb = &tables[tgt];
            for (int64_t i = 0; i < cnt; i++) {
                int64_t q = slot0 + i, f;
                FLAT(vid, p0 + i, f);
                if (q < 0 || q >= tb->size) goto bad_index;
                int64_t ver = pver[f];
                if (save_slot(&undo, tb, tgt == RING ? U_RING : U_POOL, q)) goto done;
                tb->view[q] = vid, tb->page[q] = p0 + i, tb->version[q] = ver;
                tb->seq[q] = seq, tb->step[q] = step, tb->row[q] = rows0 + pos;
                if (tgt == RING) {
                    if (vec_reserve(&ring_rows, RINGROW)) goto done;
                    int64_t *row = ring_rows.v + ring_rows.n;
                    row[0] = rows0 + pos, row[1] = q, row[2] = vid, row[3] = p0 + i;
                    row[4] = ver, row[5] = seq, row[6] = step;
                    ring_rows.n += RINGROW;
                }
            }
            iu++;
            break;
        }
        case 2: { /* evict: the pool slot holds nothing */
            int64_t q = ARR(A_ESLOT)[ie];
            if (q >= 0 && q < tables[POOL].size) {
                if (save_slot(&undo, &tables[POOL], U_POOL, q)) goto done;
                tables[POOL].view[q] = -1;
                tables[POOL].row[q] = -1;
            }
            ie++;
            break;
        }
        case 3: /* invalidate: no slot of either kind holds anything */
            if (clear_table(&undo, &tables[POOL], U_POOL, -1) ||
                clear_table(&undo, &tables[RING], U_RING, -1))
                goto done;
            ring_rows.n = 0; /* the ring log restarts after it */
            ii++;
            break;
        case 5: /* events lost before this position: what every slot holds is unknown */
            if (clear_table(&undo, &tables[POOL], U_POOL, LOST) ||
                clear_table(&undo, &tables[RING], U_RING, LOST))
                goto done;
            ring_rows.n = 0;
            il++;
            break;
        case 4: { /* read: every page of its runs judged */
            int64_t vid = ARR(A_RVID)[ir];
            int wk = pos > writes_from;
            int64_t lo = rrun0[ir], hi = rrun0[ir + 1];
            if (lo < 0 || hi > nrun || lo > hi) goto bad_index;
            int64_t *rc = &r_counts.v[ir * 4];
            for (int64_t k = lo; k < hi; k++) {
                int64_t b = ARR(A_B)[k], e = ARR(A_E)[k], slot = ARR(A_SLOT)[k];
                int64_t src = ARR(A_SRC)[k], cat = ARR(A_CAT)[k], len = e - b;
                if (src < 0 || src > 2) goto bad_index;
                if (cat == CAT_DROPPED) continue;
                if (cat == CAT_HOST) {
                    page_cls[HOST * 4 + EXACT] += len;
                    rc[EXACT] += len;
                    continue;
                }
                if (cat == CAT_OUT_OF_RANGE || cat == CAT_NO_UPLOAD) {
                    int64_t why = cat == CAT_OUT_OF_RANGE ? OUT_OF_RANGE : NO_UPLOAD;
                    page_cls[src * 4 + NOT_JUDGED] += len;
                    rc[NOT_JUDGED] += len;
                    not_judged[why] += len;
                    int64_t piece[PIECE] = {ir, b, e, src, slot, NOT_JUDGED, 0,
                                            -1, -1, -1, -1, -1, -1, why};
                    for (int j = 0; j < PIECE; j++)
                        if (vec_push(&run_pieces, piece[j])) goto done;
                    continue;
                }
                if (src == HOST) goto bad_index;
                Table *tb = &tables[src];
                int64_t p = b;
                /* the usual case first: pages whose slot holds them at their version, counted
                 * without the rest of the verdict (every index checked once for the run) */
                if (wk && vid >= 0 && vid < nviews_pages && b >= 0 && slot >= 0 &&
                    slot + len <= tb->size && poff[vid] + e <= npages) {
                    const int64_t *tv = tb->view + slot, *tp = tb->page + slot,
                                  *tver = tb->version + slot, *cur = pver + poff[vid] + b;
                    int64_t i = 0;
                    while (i < len && tv[i] == vid && tp[i] == b + i && tver[i] == cur[i]) i++;
                    page_cls[src * 4 + EXACT] += i;
                    rc[EXACT] += i;
                    p = b + i;
                }
                for (; p < e; p++) {
                    int64_t q = slot + (p - b), f;
                    FLAT(vid, p, f);
                    int64_t hv = -1, hp = -1, hver = -1, hseq = -1, hstep = -1;
                    if (q >= 0 && q < tb->size) {
                        hv = tb->view[q];
                        hp = tb->page[q];
                        hver = tb->version[q];
                        hseq = tb->seq[q];
                        hstep = tb->step[q];
                    }
                    int same = hv >= 0 && hv == vid && hp == p;
                    if (src == RING && hv == vid && !same) {
                        declined = 1; /* rule 3: the ring's copies must be walked */
                        goto finish;
                    }
                    int64_t cur = pver[f], cls, lag = 0, why = 0;
                    if (hv == LOST) cls = NOT_JUDGED, why = LOST_EVENTS;
                    else if (!same) cls = FOREIGN;
                    else if (!wk) cls = NOT_JUDGED, why = NO_WRITE;
                    else if (hver == cur) cls = EXACT;
                    else cls = STALE, lag = cur - hver;
                    page_cls[src * 4 + cls]++;
                    rc[cls]++;
                    if (cls == EXACT) continue;
                    if (why) not_judged[why]++;
                    int64_t off = hv >= 0 ? hp - p : 0;
                    if (!(last_run == k && p == last_page + 1 && cls == last_cls &&
                          lag == last_lag && hv == last_hv && off == last_off &&
                          why == last_why)) {
                        if (page_pieces.n) page_pieces.v[page_pieces.n - PIECE + 2] = last_page + 1;
                        int has = hv >= 0 && hv < nviews;
                        int64_t piece[PIECE] = {
                            ir, p, p + 1, src, q, cls, lag,
                            has ? ARR(A_VLAYER)[hv] : -1, has ? ARR(A_VSTREAM)[hv] : -1,
                            hv >= 0 ? hp : -1, hv >= 0 ? hver : -1, hv >= 0 ? hstep : -1,
                            hv >= 0 ? hseq : -1, why};
                        for (int j = 0; j < PIECE; j++)
                            if (vec_push(&page_pieces, piece[j])) goto done;
                    }
                    last_run = k, last_page = p, last_cls = cls, last_lag = lag, last_hv = hv,
                    last_off = off, last_why = why;
                    if (flows && (cls == STALE || cls == FOREIGN)) {
                        int64_t key = ((pwseq[f] << 22 | ir) << 2) | (cls == FOREIGN);
                        if (vec_push(&keys, key)) goto done;
                    }
                }
            }
            ir++;
            break;
        }
        }
    }
    if (page_pieces.n) page_pieces.v[page_pieces.n - PIECE + 2] = last_page + 1;
finish:
    if (declined) {
        undo_all(&undo, &pg, tables);
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    {
        Vec cls_v = {page_cls, 12, 12}, nj_v = {not_judged, WHYS, WHYS};
        Vec *outs[] = {&r_counts, &cls_v, &nj_v, &page_pieces, &run_pieces, &keys, &ring_rows,
                       &versions};
        result = PyTuple_New(8);
        if (!result) goto done;
        for (int j = 0; j < 8; j++) {
            PyObject *b = PyByteArray_FromStringAndSize(
                (const char *)outs[j]->v, outs[j]->n * (Py_ssize_t)sizeof(int64_t));
            if (!b) {
                Py_CLEAR(result);
                goto done;
            }
            PyTuple_SET_ITEM(result, j, b);
        }
    }
    goto done;
bad_index:
    undo_all(&undo, &pg, tables);
    PyErr_SetString(PyExc_IndexError, "judge: an index outside the arrays given");
done:
    if (!result && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "judge failed");
    if (!result) undo_all(&undo, &pg, tables);
    for (int j = 0; j < got; j++) PyBuffer_Release(&buf[j]);
    PyMem_Free(r_counts.v);
    PyMem_Free(page_pieces.v);
    PyMem_Free(run_pieces.v);
    PyMem_Free(keys.v);
    PyMem_Free(ring_rows.v);
    PyMem_Free(versions.v);
    PyMem_Free(undo.old);
    PyMem_Free(pg.saved);
    PyMem_Free(tables[0].saved);
    PyMem_Free(tables[1].saved);
    return result;
}

static PyMethodDef methods[] = {
    {"judge", judge, METH_VARARGS,
     "A chunk's page verdicts, event by event (kvdiag.analysis.judgement.seqjudge)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_seqjudge", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__seqjudge(void) { return PyModule_Create(&module); }
