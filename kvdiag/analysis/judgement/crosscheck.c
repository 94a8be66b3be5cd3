/* The annotation cross-check's shortcut in C: which reads agree with the model's annotation.
 *
 * kvdiag/analysis/judgement/crosscheck.py's ``agreeing`` compares, with array operations, the
 * page maps of a chunk's annotated reads with their verdicts. This compares the same thing a
 * read at a time without expanding a page: both sides as runs of equal (source, holder,
 * class, lag) — the verdicts built as ``as_ranges`` builds them (each served run's pages exact,
 * but where a judged piece says otherwise), both merged into maximal runs as ``merge`` does —
 * and equal maps are equal lists. A read it cannot settle so (a range, run or piece out of
 * order, overlapping, empty or outside ``[0, 2^31)``; a piece outside every served run) is
 * left to the per-read comparison (``disagrees``), as the array version leaves it; a read with
 * a piece not judged agrees (nothing can be compared). tests/test_judgement_crosscheck.py holds
 * both versions to ``disagrees`` on random and hostile reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define EXACT 0
#define NOT_JUDGED 3
#define LIMIT ((int64_t)1 << 31)
#define PIECE 14

typedef struct {
    int64_t b, e, src, holder, cls, lag;
} Seg;

typedef struct {
    Seg *v;
    Py_ssize_t n, cap;
} Segs;

/* Append ``s``, merged into the last one where it continues it with the same values. */
static int add(Segs *a, Seg s) {
    if (a->n) {
        Seg *l = &a->v[a->n - 1];
        if (l->e == s.b && l->src == s.src && l->holder == s.holder && l->cls == s.cls &&
            l->lag == s.lag) {
            l->e = s.e;
            return 0;
        }
    }
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 64;
        Seg *v = PyMem_Realloc(a->v, (size_t)cap * sizeof(Seg));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    return 0;
}

typedef struct {
    int64_t b, e, src;
} Run;

static int run_before(const void *x, const void *y) {
    const Run *a = x, *b = y;
    return (a->b > b->b) - (a->b < b->b);
}

enum { A_ANN, A_OWNER, A_STREAM, A_RUNS, A_RUNSRC, A_RRUNS, A_PIECES, A_CAND, NARRAYS };

/* agreeing(arrays) -> bytes: per candidate, 1 where it is shown to agree */
static PyObject *agreeing(PyObject *self, PyObject *args) {
    PyObject *arrays;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &arrays)) return NULL;
    if (PyTuple_GET_SIZE(arrays) != NARRAYS) {
        PyErr_SetString(PyExc_ValueError, "agreeing: wrong number of arrays");
        return NULL;
    }
    Py_buffer buf[NARRAYS];
    int got = 0;
    PyObject *result = NULL;
    Segs judged = {0}, said = {0};
    Run *runs = NULL;
    Py_ssize_t *ann_at = NULL, *piece_at = NULL, *run_at = NULL;
    for (; got < NARRAYS; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, got), &buf[got], PyBUF_CONTIG_RO) < 0)
            goto done;
        if (buf[got].itemsize != 8 || buf[got].len % 8) {
            got++;
            PyErr_SetString(PyExc_TypeError, "agreeing: int64 arrays expected");
            goto done;
        }
    }
#define ARR(i) ((const int64_t *)buf[i].buf)
#define LEN(i) (buf[i].len / 8)
    const int64_t *ann = ARR(A_ANN), *owner = ARR(A_OWNER), *stream = ARR(A_STREAM);
    const int64_t *rr = ARR(A_RUNS), *rsrc = ARR(A_RUNSRC), *r_runs = ARR(A_RRUNS);
    const int64_t *pc = ARR(A_PIECES), *cand = ARR(A_CAND);
    Py_ssize_t na = LEN(A_OWNER), nr = LEN(A_STREAM), nrun = LEN(A_RUNSRC), np = LEN(A_PIECES) / PIECE;
    Py_ssize_t nc = LEN(A_CAND);
    if (LEN(A_ANN) != 6 * na || LEN(A_RUNS) != 3 * nrun || LEN(A_RRUNS) != nr) {
        PyErr_SetString(PyExc_ValueError, "agreeing: array lengths disagree");
        goto done;
    }
    /* where each read's annotated ranges, served runs and pieces start (all grouped by read,
     * in read order) */
    ann_at = PyMem_Calloc((size_t)nr + 1, sizeof(Py_ssize_t));
    piece_at = PyMem_Calloc((size_t)nr + 1, sizeof(Py_ssize_t));
    run_at = PyMem_Calloc((size_t)nr + 1, sizeof(Py_ssize_t));
    runs = PyMem_Malloc(((size_t)nrun + 1) * sizeof(Run));
    if (!ann_at || !piece_at || !run_at || !runs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < na; i++) {
        int64_t r = owner[i];
        if (r < 0 || r >= nr || (i && r < owner[i - 1])) goto disorder;
        ann_at[r + 1]++;
    }
    for (Py_ssize_t i = 0; i < np; i++) {
        int64_t r = pc[i * PIECE];
        if (r < 0 || r >= nr || (i && r < pc[(i - 1) * PIECE])) goto disorder;
        piece_at[r + 1]++;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t r = 0; r < nr; r++) {
        if (r_runs[r] < 0) goto disorder;
        total += r_runs[r];
        ann_at[r + 1] += ann_at[r];
        piece_at[r + 1] += piece_at[r];
        run_at[r + 1] = total;
    }
    if (total != nrun) goto disorder;
    result = PyBytes_FromStringAndSize(NULL, nc);
    if (!result) goto done;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t c = 0; c < nc; c++) {
        int64_t r = cand[c];
        out[c] = 0;
        if (r < 0 || r >= nr) continue;
        int nj = 0;
        for (Py_ssize_t k = piece_at[r]; k < piece_at[r + 1]; k++)
            if (pc[k * PIECE + 5] == NOT_JUDGED) nj = 1;
        if (nj) { /* nothing can be compared: it agrees */
            out[c] = 1;
            continue;
        }
        /* the annotated side: in order, disjoint, non-empty, named */
        said.n = 0;
        int ok = 1;
        for (Py_ssize_t k = ann_at[r]; k < ann_at[r + 1] && ok; k++) {
            const int64_t *a = &ann[k * 6];
            if (a[0] < 0 || a[1] > LIMIT || a[1] <= a[0] || a[4] < 0 || a[5] < 0 ||
                (k > ann_at[r] && a[0] < ann[(k - 1) * 6 + 1]))
                ok = 0;
            else if (add(&said, (Seg){a[0], a[1], a[4], a[2], a[5], a[3]}))
                goto fail;
        }
        if (!ok) continue;
        /* the judged side: the served runs with pages, by begin, disjoint */
        Py_ssize_t n = 0;
        for (Py_ssize_t k = run_at[r]; k < run_at[r + 1]; k++)
            if (rr[k * 3 + 1] > rr[k * 3]) runs[n++] = (Run){rr[k * 3], rr[k * 3 + 1], rsrc[k]};
        qsort(runs, (size_t)n, sizeof(Run), run_before);
        for (Py_ssize_t k = 0; k < n && ok; k++)
            if (runs[k].b < 0 || runs[k].e > LIMIT || (k && runs[k].b < runs[k - 1].e)) ok = 0;
        if (!ok) continue;
        /* each run's pages exact, but where a piece inside it (disjoint, by begin) says */
        judged.n = 0;
        Py_ssize_t p = piece_at[r];
        for (Py_ssize_t k = 0; k < n && ok; k++) {
            int64_t at = runs[k].b;
            for (; p < piece_at[r + 1] && pc[p * PIECE + 1] < runs[k].e; p++) {
                const int64_t *q = &pc[p * PIECE];
                if (q[1] < at || q[2] > runs[k].e || q[2] <= q[1]) {
                    ok = 0; /* outside the run, before the last piece's end, or empty */
                    break;
                }
                if (q[1] > at && add(&judged, (Seg){at, q[1], runs[k].src, stream[r], EXACT, 0}))
                    goto fail;
                if (add(&judged, (Seg){q[1], q[2], q[3], q[7] >= 0 ? q[8] : -1, q[5], q[6]}))
                    goto fail;
                at = q[2];
            }
            if (ok && at < runs[k].e &&
                add(&judged, (Seg){at, runs[k].e, runs[k].src, stream[r], EXACT, 0}))
                goto fail;
        }
        if (!ok || p != piece_at[r + 1]) continue; /* a piece in no run */
        out[c] = judged.n == said.n &&
                 (judged.n == 0 || !memcmp(judged.v, said.v, (size_t)judged.n * sizeof(Seg)));
    }
    goto done;
disorder:
    PyErr_SetString(PyExc_ValueError, "agreeing: arrays not grouped by read");
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (int j = 0; j < got; j++) PyBuffer_Release(&buf[j]);
    PyMem_Free(judged.v);
    PyMem_Free(said.v);
    PyMem_Free(runs);
    PyMem_Free(ann_at);
    PyMem_Free(piece_at);
    PyMem_Free(run_at);
    return result;
}

static PyMethodDef methods[] = {
    {"agreeing", agreeing, METH_VARARGS,
     "Which candidate reads agree with their annotation (kvdiag.analysis.judgement."
     "crosscheck.agreeing, a read at a time)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_crosscheck", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__crosscheck(void) { return PyModule_Create(&module); }
