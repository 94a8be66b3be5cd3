/* The page judgement's columns taken out of decoded events in one C pass.
 *
 * kvdiag/analysis/judgement/columns.py defines the columns (its module docstring) and takes
 * them out with attrgetter/chain/fromiter; this does the same in C, event by event, reading
 * each field once. The Python function stays the reference and the fallback (no C compiler
 * here, KVDIAG_COMPILED=0): tests/test_compiled_columns.py holds the two equal.
 *
 * Nothing here trusts the events' shape beyond what msgspec's decoder guarantees: a field that
 * is missing or of another type raises, and so does an integer beyond +-2^62 (columns.BOUND:
 * the Python path clips a whole column holding one beyond 64 bits); the caller then takes the
 * Python path for that run of events.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "vec.h"

#define BOUND ((int64_t)1 << 62)

enum { WRITE, UPLOAD, EVICT, INVALIDATE, READ, OTHER, FITS, OUTPUT, STEP, MARK, KINDS };
/* the kinds of the types tuple, in its order */
static const int TYPE_CODES[] = {WRITE, UPLOAD, EVICT, INVALIDATE, READ, FITS, OUTPUT, STEP, MARK};
#define NTYPES 9

/* The fields read, by index: names interned at import, each type's offsets found once. */
enum {
    F_STEP, F_SEQ, F_LAYER, F_STREAM, F_CELLS, F_VERSIONS, F_PAGES, F_SLOT, F_BYTES, F_TARGET,
    F_REASON, F_SERVED, F_RANGES, F_POOL, F_RING, F_HOST, F_BEGIN, F_END, F_SOURCE, F_HOLDER,
    F_LAG, F_CLS, F_ROUTE, F_RESULT, F_PHASE, F_DELTA, F_TOLERANCE, NFIELDS
};
static const char *const FIELD_NAMES[NFIELDS] = {
    "step", "seq", "layer", "stream", "cells", "versions", "pages", "slot", "bytes", "target",
    "reason", "served", "ranges", "pool", "ring", "host", "begin", "end", "source", "holder",
    "version_lag", "cls", "route", "result", "phase", "max_abs_delta", "tolerance"};
static PyObject *names[NFIELDS];

/* Where each field of a type is kept: msgspec keeps a Struct's fields in the object, each
 * named by a member descriptor of its type; a field found otherwise (-1) is read by getattr. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[NFIELDS];
} Layout;

static void layout_of(Layout *l, PyTypeObject *t) {
    l->type = t;
    for (int f = 0; f < NFIELDS; f++) {
        l->off[f] = -1;
        PyObject *d = PyObject_GetAttr((PyObject *)t, names[f]);
        if (!d) {
            PyErr_Clear();
            continue;
        }
        if (PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX || m->type == T_OBJECT) l->off[f] = m->offset;
        }
        Py_DECREF(d);
    }
}

/* Field ``f`` of ``o`` (whose type's layout is ``l``): a new reference, or NULL with an
 * exception set. */
static PyObject *get(PyObject *o, const Layout *l, int f) {
    Py_ssize_t off = l->off[f];
    if (off >= 0) {
        PyObject *x = *(PyObject **)((char *)o + off);
        if (x) {
            Py_INCREF(x);
            return x;
        }
    }
    return PyObject_GetAttr(o, names[f]);
}

static Layout layouts[9], run_layout, range_layout;
static Layout by_getattr; /* every field read by getattr (PyInit sets its offsets to -1) */
static PyObject *layouts_for; /* the types tuple the layouts are of */

/* An integer as the columns hold it; None is -1 (an upload's unknown bytes: the Python path's
 * TypeError case). Returns -1 with an exception set on another type or beyond +-2^62. */
static int as_int(PyObject *o, int64_t *out) {
    /* most of a trace's integers fit one machine word: read without the generic conversion */
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(o) && PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 0;
    }
#else
    if (PyLong_CheckExact(o)) {
        Py_ssize_t size = Py_SIZE(o);
        if (size >= -1 && size <= 1) {
            *out = size * (int64_t)((PyLongObject *)o)->ob_digit[0];
            return 0;
        }
    }
#endif
    if (o == Py_None) {
        *out = -1;
        return 0;
    }
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "not an integer");
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v > BOUND || v < -BOUND) {
        PyErr_SetString(PyExc_OverflowError, "beyond +-2^62");
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Field ``f`` of ``o`` as an integer, pushed on ``a`` (reserved by the caller). */
static int push_attr(Vec *a, PyObject *o, const Layout *l, int f) {
    Py_ssize_t off = l->off[f];
    if (off >= 0) { /* the field itself, borrowed: ``o`` holds it while we read it */
        PyObject *x = *(PyObject **)((char *)o + off);
        if (x) {
            int64_t v;
            if (as_int(x, &v)) return -1;
            a->v[a->n++] = v;
            return 0;
        }
    }
    PyObject *x = get(o, l, f);
    if (!x) return -1;
    int64_t v;
    int rc = as_int(x, &v);
    Py_DECREF(x);
    if (rc) return -1;
    a->v[a->n++] = v;
    return 0;
}

/* A pair field (cells, pages): two integers pushed on ``a``. */
static int push_pair(Vec *a, PyObject *o, const Layout *l, int f) {
    PyObject *x = get(o, l, f);
    if (!x) return -1;
    int rc = -1;
    if (PyTuple_Check(x) && PyTuple_GET_SIZE(x) == 2) {
        int64_t v0, v1;
        if (!as_int(PyTuple_GET_ITEM(x, 0), &v0) && !as_int(PyTuple_GET_ITEM(x, 1), &v1)) {
            a->v[a->n++] = v0;
            a->v[a->n++] = v1;
            rc = 0;
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "not a pair");
    }
    Py_DECREF(x);
    return rc;
}

static const char *const SOURCES[] = {"pool", "ring", "host"};
static const char *const TARGETS[] = {"resident", "ring"};
static const char *const REASONS[] = {"miss", "dirty", "wide-query", "last-chunk", "ring"};
static const char *const CLASSES[] = {"exact", "stale", "foreign", "not judged"};
static const char *const ROUTES[] = {"streamed", "fallback", "abort", "ordinary"};

/* Index of ``o`` (a str) among ``names``, or ``other`` for another string. */
static int name_index(PyObject *o, const char *const *names, int count, int other) {
    if (!PyUnicode_Check(o)) return -2;
    for (int i = 0; i < count; i++)
        if (PyUnicode_CompareWithASCIIString(o, names[i]) == 0) return i;
    return other;
}

enum {
    V_STEP, V_WPOS, V_W, V_WCELLS, V_WVLEN, V_WVERS, V_UPOS, V_U, V_UPAGES, V_UKEY, V_EPOS,
    V_ESLOT, V_INV, V_RPOS, V_R, V_RRUNS, V_RCOUNTS, V_RUNS, V_RUNSRC, V_FPOS, V_FLAYER, V_RANN,
    V_ANN, V_FSEQ, V_FROUTE, V_FRES, V_OPOS, V_OSEQ, V_OSTREAM, V_ODIV, NVEC
};

/* Columns being taken out: the NVEC columns, one code per event, whether every read so far
 * had served runs, and the read events where they are kept. */
typedef struct {
    Vec v[NVEC];
    char *codes;
    Py_ssize_t n, cap;
    int all_runs;
    PyObject *reads; /* a list where the reads are kept, else NULL */
    int phase; /* the last step's phase added (1 decode, 0 another, -1 none yet): kept across
                * takes, for linescan's steps */
} Taken;

static void taken_clear(Taken *c) {
    for (int j = 0; j < NVEC; j++) PyMem_Free(c->v[j].v);
    PyMem_Free(c->codes);
    Py_CLEAR(c->reads);
    memset(c->v, 0, sizeof c->v);
    c->codes = NULL;
    c->n = c->cap = 0;
    c->all_runs = 1;
    c->phase = -1;
}

/* Empty again, the room kept (a stream's next chunk fills as much). */
static void taken_reset(Taken *c) {
    for (int j = 0; j < NVEC; j++) c->v[j].n = 0;
    c->n = 0;
    c->all_runs = 1;
    Py_CLEAR(c->reads); /* pack() handed the list over: never emptied in place */
}

/* Room for ``more`` events' codes after the ``n`` held (-1 with MemoryError set). */
static int codes_room(Taken *c, Py_ssize_t more) {
    if (c->n + more <= c->cap) return 0;
    Py_ssize_t cap = c->cap ? c->cap : 1024;
    while (cap < c->n + more) cap *= 2;
    char *codes = PyMem_Realloc(c->codes, (size_t)cap);
    if (!codes) {
        PyErr_NoMemory();
        return -1;
    }
    c->codes = codes;
    c->cap = cap;
    return 0;
}

/* The types tuple as the 9 kinds' types, their layouts made once per tuple. */
static int kinds_of(PyObject *types, PyTypeObject **tp) {
    if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != NTYPES) {
        PyErr_SetString(PyExc_ValueError, "types: a tuple of 9 expected");
        return -1;
    }
    for (int i = 0; i < NTYPES; i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "types: types expected");
            return -1;
        }
        tp[i] = (PyTypeObject *)t;
    }
    if (layouts_for != types) {
        for (int i = 0; i < NTYPES; i++) layout_of(&layouts[i], tp[i]);
        Py_XDECREF(layouts_for);
        Py_INCREF(types);
        layouts_for = types;
    }
    return 0;
}

/* A fits decision the page judgement alone cannot settle: its outcome is a mismatch or a
 * fallback (fits.outcome_codes), so it makes a finding. */
static int bad_fits(int64_t route, int64_t result) {
    return route == 1 || (!result && (route == 0 || route == 2));
}

/* Append the columns of ``events`` (positions from ``base``) to ``c``. ``handed``: a list that
 * gets the index (in ``events``) of each event Python must see itself, or NULL: a step whose
 * phase differs from the step before it in ``events`` (the first one too: a decode loop starts
 * where the phase turns to decode, so the steps between say nothing new), an output that
 * diverged, an output without a reference while ``hand_unreferenced`` (its finding still
 * keeps evidence), a bad fits decision (bad_fits) or one whose route is none of ROUTES (Python
 * counts it under its name: fits.route_name), any kind but the nine. ``stop``: a tuple of types;
 * an event of one of them stops the pass before anything is appended (returns 1). On an error
 * (-1, exception set) or a stop, ``c`` is as it was. */
static int add_events(Taken *c, PyObject *events, PyTypeObject **tp, Py_ssize_t base,
                      PyObject *handed, PyObject *stop, int hand_unreferenced) {
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (stop) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = (PyObject *)Py_TYPE(PyList_GET_ITEM(events, i));
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(stop); j++)
                if (PyTuple_GET_ITEM(stop, j) == t) return 1;
        }
    }
    Vec *v = c->v;
    Py_ssize_t saved[NVEC];
    for (int j = 0; j < NVEC; j++) saved[j] = v[j].n;
    Py_ssize_t saved_n = c->n, saved_reads = c->reads ? PyList_GET_SIZE(c->reads) : 0;
    Py_ssize_t saved_handed = handed ? PyList_GET_SIZE(handed) : 0;
    int saved_all_runs = c->all_runs, saved_phase = c->phase;
    if (codes_room(c, n)) return -1;
    char *codes = c->codes + c->n;
    PyObject *reads = c->reads;
    int last_decode = -1; /* the phase of the step before, in this run of events */
    /* every event has a step; each kind's rows at most one per event */
    if (vec_reserve(&v[V_STEP], n)) goto fail;

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        PyTypeObject *t = Py_TYPE(e);
        int k = OTHER;
        const Layout *L = NULL;
        for (int j = 0; j < NTYPES; j++)
            if (t == tp[j]) {
                k = TYPE_CODES[j];
                L = &layouts[j];
                break;
            }
        if (!L) L = &by_getattr; /* another kind: only its step is read */
        codes[i] = (char)k;
        if (push_attr(&v[V_STEP], e, L, F_STEP)) goto fail;
        int64_t pos = (int64_t)(i + base);
        int hand = 0;
        switch (k) {
        case WRITE: {
            if (vec_reserve(&v[V_WPOS], 1) || vec_reserve(&v[V_W], 3) ||
                vec_reserve(&v[V_WCELLS], 2) || vec_reserve(&v[V_WVLEN], 1))
                goto fail;
            v[V_WPOS].v[v[V_WPOS].n++] = pos;
            if (push_attr(&v[V_W], e, L, F_SEQ) || push_attr(&v[V_W], e, L, F_LAYER) ||
                push_attr(&v[V_W], e, L, F_STREAM) || push_pair(&v[V_WCELLS], e, L, F_CELLS))
                goto fail;
            PyObject *vers = get(e, L, F_VERSIONS);
            if (!vers) goto fail;
            if (!PyTuple_Check(vers)) {
                Py_DECREF(vers);
                PyErr_SetString(PyExc_TypeError, "versions: not a tuple");
                goto fail;
            }
            Py_ssize_t nv = PyTuple_GET_SIZE(vers);
            v[V_WVLEN].v[v[V_WVLEN].n++] = nv;
            if (nv) {
                if (vec_reserve(&v[V_WVERS], 2 * nv)) {
                    Py_DECREF(vers);
                    goto fail;
                }
                for (Py_ssize_t j = 0; j < nv; j++) {
                    PyObject *pair = PyTuple_GET_ITEM(vers, j);
                    int64_t a0, a1;
                    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                        as_int(PyTuple_GET_ITEM(pair, 0), &a0) ||
                        as_int(PyTuple_GET_ITEM(pair, 1), &a1)) {
                        Py_DECREF(vers);
                        if (!PyErr_Occurred())
                            PyErr_SetString(PyExc_TypeError, "versions: not pairs");
                        goto fail;
                    }
                    v[V_WVERS].v[v[V_WVERS].n++] = a0;
                    v[V_WVERS].v[v[V_WVERS].n++] = a1;
                }
            }
            Py_DECREF(vers);
            break;
        }
        case UPLOAD: {
            if (vec_reserve(&v[V_UPOS], 1) || vec_reserve(&v[V_U], 5) ||
                vec_reserve(&v[V_UPAGES], 2) || vec_reserve(&v[V_UKEY], 1))
                goto fail;
            v[V_UPOS].v[v[V_UPOS].n++] = pos;
            if (push_attr(&v[V_U], e, L, F_SEQ) || push_attr(&v[V_U], e, L, F_LAYER) ||
                push_attr(&v[V_U], e, L, F_STREAM) || push_attr(&v[V_U], e, L, F_SLOT) ||
                push_attr(&v[V_U], e, L, F_BYTES) || push_pair(&v[V_UPAGES], e, L, F_PAGES))
                goto fail;
            PyObject *tg = get(e, L, F_TARGET);
            if (!tg) goto fail;
            PyObject *rs = get(e, L, F_REASON);
            if (!rs) {
                Py_DECREF(tg);
                goto fail;
            }
            int ti = name_index(tg, TARGETS, 2, -1);
            int ri = name_index(rs, REASONS, 5, 5);
            Py_DECREF(tg);
            Py_DECREF(rs);
            if (ti < 0 || ri < 0) {
                PyErr_SetString(PyExc_ValueError, "upload: unknown target");
                goto fail;
            }
            v[V_UKEY].v[v[V_UKEY].n++] = ti * 8 + ri;
            break;
        }
        case EVICT:
            if (vec_reserve(&v[V_EPOS], 1) || vec_reserve(&v[V_ESLOT], 1)) goto fail;
            v[V_EPOS].v[v[V_EPOS].n++] = pos;
            if (push_attr(&v[V_ESLOT], e, L, F_SLOT)) goto fail;
            break;
        case INVALIDATE:
            if (vec_reserve(&v[V_INV], 1)) goto fail;
            v[V_INV].v[v[V_INV].n++] = pos;
            break;
        case READ: {
            if (vec_reserve(&v[V_RPOS], 1) || vec_reserve(&v[V_R], 3) ||
                vec_reserve(&v[V_RRUNS], 1) || vec_reserve(&v[V_RCOUNTS], 3))
                goto fail;
            v[V_RPOS].v[v[V_RPOS].n++] = pos;
            if (push_attr(&v[V_R], e, L, F_SEQ) || push_attr(&v[V_R], e, L, F_LAYER) ||
                push_attr(&v[V_R], e, L, F_STREAM))
                goto fail;
            PyObject *sv = get(e, L, F_SERVED);
            if (!sv) goto fail;
            if (!PyTuple_Check(sv)) {
                Py_DECREF(sv);
                PyErr_SetString(PyExc_TypeError, "served: not a tuple");
                goto fail;
            }
            Py_ssize_t nrun = PyTuple_GET_SIZE(sv);
            v[V_RRUNS].v[v[V_RRUNS].n++] = nrun;
            if (nrun) {
                /* the read's own counts matter only where it has no served runs */
                for (int j = 0; j < 3; j++) v[V_RCOUNTS].v[v[V_RCOUNTS].n++] = 0;
            } else {
                c->all_runs = 0;
                if (push_attr(&v[V_RCOUNTS], e, L, F_POOL) || push_attr(&v[V_RCOUNTS], e, L, F_RING) ||
                    push_attr(&v[V_RCOUNTS], e, L, F_HOST)) {
                    Py_DECREF(sv);
                    goto fail;
                }
            }
            if (vec_reserve(&v[V_RUNS], 3 * nrun) || vec_reserve(&v[V_RUNSRC], nrun)) {
                Py_DECREF(sv);
                goto fail;
            }
            for (Py_ssize_t j = 0; j < nrun; j++) {
                PyObject *run = PyTuple_GET_ITEM(sv, j);
                if (Py_TYPE(run) != run_layout.type) layout_of(&run_layout, Py_TYPE(run));
                if (push_attr(&v[V_RUNS], run, &run_layout, F_BEGIN) || push_attr(&v[V_RUNS], run, &run_layout, F_END) ||
                    push_attr(&v[V_RUNS], run, &run_layout, F_SLOT)) {
                    Py_DECREF(sv);
                    goto fail;
                }
                PyObject *src = get(run, &run_layout, F_SOURCE);
                if (!src) {
                    Py_DECREF(sv);
                    goto fail;
                }
                int si = name_index(src, SOURCES, 3, -1);
                Py_DECREF(src);
                if (si < 0) {
                    Py_DECREF(sv);
                    PyErr_SetString(PyExc_ValueError, "served: unknown source");
                    goto fail;
                }
                v[V_RUNSRC].v[v[V_RUNSRC].n++] = si;
            }
            PyObject *rg = get(e, L, F_RANGES);
            if (!rg) {
                Py_DECREF(sv);
                goto fail;
            }
            if (!PyTuple_Check(rg)) {
                Py_DECREF(rg);
                Py_DECREF(sv);
                PyErr_SetString(PyExc_TypeError, "ranges: not a tuple");
                goto fail;
            }
            /* the model's annotation: begin, end, holder, lag, source and class codes (-1:
             * another name) of each range, for the cross-check */
            Py_ssize_t nann = PyTuple_GET_SIZE(rg);
            if (vec_reserve(&v[V_RANN], 1) || vec_reserve(&v[V_ANN], 6 * nann)) {
                Py_DECREF(rg);
                Py_DECREF(sv);
                goto fail;
            }
            v[V_RANN].v[v[V_RANN].n++] = nann;
            for (Py_ssize_t j = 0; j < nann; j++) {
                PyObject *a = PyTuple_GET_ITEM(rg, j);
                if (Py_TYPE(a) != range_layout.type) layout_of(&range_layout, Py_TYPE(a));
                int fail = push_attr(&v[V_ANN], a, &range_layout, F_BEGIN) ||
                           push_attr(&v[V_ANN], a, &range_layout, F_END) ||
                           push_attr(&v[V_ANN], a, &range_layout, F_HOLDER) ||
                           push_attr(&v[V_ANN], a, &range_layout, F_LAG);
                PyObject *asrc = fail ? NULL : get(a, &range_layout, F_SOURCE);
                PyObject *acls = asrc ? get(a, &range_layout, F_CLS) : NULL;
                int si = acls ? name_index(asrc, SOURCES, 3, -1) : -2;
                int ci = acls ? name_index(acls, CLASSES, 4, -1) : -2;
                Py_XDECREF(asrc);
                Py_XDECREF(acls);
                if (si == -2 || ci == -2) {
                    Py_DECREF(rg);
                    Py_DECREF(sv);
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ranges: not str");
                    goto fail;
                }
                v[V_ANN].v[v[V_ANN].n++] = si;
                v[V_ANN].v[v[V_ANN].n++] = ci;
            }
            int bad = reads && PyList_Append(reads, e);
            Py_DECREF(rg);
            Py_DECREF(sv);
            if (bad) goto fail;
            break;
        }
        case FITS: {
            if (vec_reserve(&v[V_FPOS], 1) || vec_reserve(&v[V_FLAYER], 1) ||
                vec_reserve(&v[V_FSEQ], 1) || vec_reserve(&v[V_FROUTE], 1) ||
                vec_reserve(&v[V_FRES], 1))
                goto fail;
            v[V_FPOS].v[v[V_FPOS].n++] = pos;
            if (push_attr(&v[V_FLAYER], e, L, F_LAYER) || push_attr(&v[V_FSEQ], e, L, F_SEQ))
                goto fail;
            PyObject *route = get(e, L, F_ROUTE);
            if (!route) goto fail;
            /* another route, a string or not, is code 4 (fits.route_code) */
            int ri = name_index(route, ROUTES, 4, 4);
            Py_DECREF(route);
            if (ri < 0) ri = 4;
            PyObject *res = get(e, L, F_RESULT);
            int truth = res ? PyObject_IsTrue(res) : -1;
            Py_XDECREF(res);
            if (truth < 0) goto fail;
            v[V_FROUTE].v[v[V_FROUTE].n++] = ri;
            v[V_FRES].v[v[V_FRES].n++] = truth;
            hand = ri == 4 || bad_fits(ri, truth);
            break;
        }
        case STEP: {
            PyObject *ph = get(e, L, F_PHASE);
            if (!ph) goto fail;
            int decode = PyUnicode_Check(ph) && PyUnicode_CompareWithASCIIString(ph, "decode") == 0;
            Py_DECREF(ph);
            hand = decode != last_decode;
            last_decode = decode;
            c->phase = decode;
            break;
        }
        case OUTPUT: {
            if (vec_reserve(&v[V_OPOS], 1) || vec_reserve(&v[V_OSEQ], 1) ||
                vec_reserve(&v[V_OSTREAM], 1) || vec_reserve(&v[V_ODIV], 1))
                goto fail;
            v[V_OPOS].v[v[V_OPOS].n++] = pos;
            if (push_attr(&v[V_OSEQ], e, L, F_SEQ) || push_attr(&v[V_OSTREAM], e, L, F_STREAM))
                goto fail;
            /* Output.diverged: max |delta| above the tolerance; -1 without a reference */
            PyObject *d = get(e, L, F_DELTA);
            PyObject *tol = d ? get(e, L, F_TOLERANCE) : NULL;
            int64_t div = -1;
            if (tol && d != Py_None && tol != Py_None) {
                double a = PyFloat_AsDouble(d), b = PyFloat_AsDouble(tol);
                div = a > b;
            }
            Py_XDECREF(d);
            Py_XDECREF(tol);
            if (!tol || PyErr_Occurred()) goto fail;
            v[V_ODIV].v[v[V_ODIV].n++] = div;
            hand = div == 1 || (div == -1 && hand_unreferenced);
            break;
        }
        case OTHER:
            hand = 1;
            break;
        default:
            break;
        }
        if (hand && handed) {
            PyObject *at = PyLong_FromSsize_t(i);
            int bad = !at || PyList_Append(handed, at);
            Py_XDECREF(at);
            if (bad) goto fail;
        }
    }
    c->n += n;
    return 0;
fail:
    for (int j = 0; j < NVEC; j++) v[j].n = saved[j];
    c->n = saved_n;
    c->all_runs = saved_all_runs;
    c->phase = saved_phase;
    if (c->reads) PyList_SetSlice(c->reads, saved_reads, PY_SSIZE_T_MAX, NULL);
    if (handed) PyList_SetSlice(handed, saved_handed, PY_SSIZE_T_MAX, NULL);
    return -1;
}

#include "linescan.h"

/* (code: bytes, one int8 per event; data: bytearray of int64 (the events' indices by kind,
 *  stably, then the NVEC columns); lens: each column's length; ends: each kind's end in the
 *  indices; every read has served runs; reads: the read events kept, else None) */
static PyObject *pack(const Taken *c) {
    /* the events by kind, stably (a counting sort): Cols.order, and each kind's bounds */
    Py_ssize_t n = c->n, count[KINDS] = {0}, at[KINDS];
    const char *codes = c->codes;
    for (Py_ssize_t i = 0; i < n; i++) count[(int)codes[i]]++;
    Py_ssize_t total = n;
    for (int j = 0; j < NVEC; j++) total += c->v[j].n;
    PyObject *code = PyBytes_FromStringAndSize(n ? codes : NULL, n);
    PyObject *data = PyByteArray_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(int64_t));
    PyObject *lens = PyTuple_New(NVEC);
    PyObject *ends = PyTuple_New(KINDS);
    if (!code || !data || !lens || !ends) {
        Py_XDECREF(code);
        Py_XDECREF(data);
        Py_XDECREF(lens);
        Py_XDECREF(ends);
        return NULL;
    }
    int64_t *out = (int64_t *)PyByteArray_AS_STRING(data);
    Py_ssize_t sum = 0;
    for (int k = 0; k < KINDS; k++) {
        at[k] = sum;
        sum += count[k];
        PyTuple_SET_ITEM(ends, k, PyLong_FromSsize_t(sum));
    }
    for (Py_ssize_t i = 0; i < n; i++) out[at[(int)codes[i]]++] = (int64_t)i;
    out += n;
    for (int j = 0; j < NVEC; j++) {
        if (c->v[j].n) memcpy(out, c->v[j].v, (size_t)c->v[j].n * sizeof(int64_t));
        out += c->v[j].n;
        PyTuple_SET_ITEM(lens, j, PyLong_FromSsize_t(c->v[j].n));
    }
    return Py_BuildValue("(NNNNNO)", code, data, lens, ends, PyBool_FromLong(c->all_runs),
                         c->reads ? c->reads : Py_None);
}

/* extract(events, types, base, keep_reads) -> pack()'s tuple for one list of events */
static PyObject *extract(PyObject *self, PyObject *args) {
    PyObject *events, *types;
    Py_ssize_t base;
    int keep_reads;
    PyTypeObject *tp[NTYPES];
    if (!PyArg_ParseTuple(args, "O!O!np", &PyList_Type, &events, &PyTuple_Type, &types, &base,
                          &keep_reads) ||
        kinds_of(types, tp))
        return NULL;
    Taken c;
    memset(&c, 0, sizeof c);
    c.all_runs = 1;
    PyObject *result = NULL;
    if (keep_reads && !(c.reads = PyList_New(0))) goto done;
    if (add_events(&c, events, tp, base, NULL, NULL, 0) == 0) result = pack(&c);
done:
    taken_clear(&c);
    return result;
}

/* Accumulator(types, stop): columns taken out a decoded block at a time (``add``) and handed
 * over together (``take``), so that a stream's events are freed right after they are decoded
 * and only the few Python must see come back to it (columns.Accumulator). */
typedef struct {
    PyObject_HEAD
    Taken c;
    PyObject *types, *stop;
    PyTypeObject *tp[NTYPES];
} Accumulator;

static int acc_init(Accumulator *self, PyObject *args, PyObject *kw) {
    PyObject *types, *stop;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &types, &PyTuple_Type, &stop) ||
        kinds_of(types, self->tp))
        return -1;
    taken_clear(&self->c);
    Py_INCREF(types);
    Py_INCREF(stop);
    Py_XSETREF(self->types, types);
    Py_XSETREF(self->stop, stop);
    return 0;
}

static void acc_dealloc(Accumulator *self) {
    taken_clear(&self->c);
    Py_XDECREF(self->types);
    Py_XDECREF(self->stop);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* add(events, base, hand_unreferenced) -> the indices Python must see (add_events), or None
 * where an event of a ``stop`` type is among them (nothing added) */
static PyObject *acc_add(Accumulator *self, PyObject *args) {
    PyObject *events;
    Py_ssize_t base;
    int hand_unreferenced;
    if (!PyArg_ParseTuple(args, "O!np", &PyList_Type, &events, &base, &hand_unreferenced))
        return NULL;
    if (!self->types) {
        PyErr_SetString(PyExc_ValueError, "not initialised");
        return NULL;
    }
    if (kinds_of(self->types, self->tp)) return NULL; /* the layouts may have been remade */
    PyObject *handed = PyList_New(0);
    if (!handed) return NULL;
    int rc = add_events(&self->c, events, self->tp, base, handed, self->stop, hand_unreferenced);
    if (rc == 0) return handed;
    Py_DECREF(handed);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* scan(data, start, base, expect, limit) -> (stop, count, last_step, resume): the lines of
 * ``data`` from byte ``start`` taken into the columns as add() takes their events (positions
 * from ``base``, seqs ``expect``, ``expect`` + 1, ...; linescan.h) up to the first line
 * declined, which begins at ``stop``; ``resume``: where the first line after it that begins as
 * a kind read here does (the decoder's run ends there), else the end of ``data``. At most
 * ``limit`` lines are taken: stopped there, ``resume`` is ``stop`` (nothing was declined). */
static PyObject *acc_scan(Accumulator *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, base, limit;
    long long expect;
    if (!PyArg_ParseTuple(args, "y*nnLn", &view, &start, &base, &expect, &limit)) return NULL;
    const unsigned char *s = view.buf, *end = s + view.len, *p = s + (start < 0 ? 0 : start);
    Py_ssize_t count = 0;
    int64_t step = -1;
    PyObject *out = NULL;
    if (start < 0 || start > view.len) {
        PyErr_SetString(PyExc_ValueError, "start: outside the data");
        goto done;
    }
    int limited = 0;
    if (scan_ready) {
        while (p < end) {
            if (count >= limit) {
                limited = 1;
                break;
            }
            const unsigned char *q = memchr(p, '\n', (size_t)(end - p));
            if (!q) break; /* a line without its newline: the reader's to judge */
            Cur c = {p, q};
            int k = scan_line(&self->c, &c, (int64_t)(base + count), (int64_t)expect + count, &step);
            if (k == -2) goto done;
            if (k < 0) break;
            count++;
            p = q + 1;
        }
    }
    const unsigned char *stop = p, *r = p;
    /* past the declined line: the lines that do not begin as a kind read here, and those of
     * its own kind right after it (an output that diverged is followed by the other streams'
     * outputs, likely to diverge too: one decoded run, not one line each) */
    int declined = 0;
    while (r < end && !limited) {
        const unsigned char *q = memchr(r, '\n', (size_t)(end - r));
        const unsigned char *next = q ? q + 1 : end;
        int kind = scan_ready ? begins_as_read(r, next) : 0;
        if (r == stop) declined = kind;
        else if (kind && kind != declined) break;
        r = next;
    }
    out = Py_BuildValue("nnLn", (Py_ssize_t)(stop - s), count, (long long)step,
                        (Py_ssize_t)(r - s));
done:
    PyBuffer_Release(&view);
    return out;
}

/* take() -> pack()'s tuple of everything added since the last take, then empty */
static PyObject *acc_take(Accumulator *self, PyObject *unused) {
    PyObject *out = pack(&self->c);
    if (out) taken_reset(&self->c);
    return out;
}

static PyObject *acc_len(Accumulator *self, void *unused) {
    return PyLong_FromSsize_t(self->c.n);
}

static PyMethodDef acc_methods[] = {
    {"add", (PyCFunction)acc_add, METH_VARARGS, "Take out the columns of a list of events."},
    {"take", (PyCFunction)acc_take, METH_NOARGS, "The columns taken out since the last take."},
    {"scan", (PyCFunction)acc_scan, METH_VARARGS, "Take the columns of lines read from bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef acc_getset[] = {
    {"count", (getter)acc_len, NULL, "Events added since the last take.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot acc_slots[] = {
    {Py_tp_init, acc_init},
    {Py_tp_dealloc, acc_dealloc},
    {Py_tp_methods, acc_methods},
    {Py_tp_getset, acc_getset},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec acc_spec = {
    "_columns.Accumulator", sizeof(Accumulator), 0, Py_TPFLAGS_DEFAULT, acc_slots,
};

static PyMethodDef methods[] = {
    {"extract", extract, METH_VARARGS,
     "The page judgement's columns of a list of decoded events (kvdiag.analysis.judgement"
     ".columns.extract, in C)."},
    {"scan_configure", scan_configure, METH_VARARGS,
     "The model's description for scan (kvdiag.analysis.judgement.linescan)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columns(void) {
    for (int f = 0; f < NFIELDS; f++) {
        if (!(names[f] = PyUnicode_InternFromString(FIELD_NAMES[f]))) return NULL;
        by_getattr.off[f] = -1;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *acc = PyType_FromSpec(&acc_spec);
    if (!acc || PyModule_AddObject(m, "Accumulator", acc)) {
        Py_XDECREF(acc);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
