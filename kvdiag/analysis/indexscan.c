/* The trace index's row fields read straight from a block of event lines, without decoding
 * them into objects (kvdiag/analysis/trace_index.py: IndexBuilder._scanned).
 *
 * Each line must be one JSON object, alone on its line, whose fields the index keeps (kind,
 * seq, step, layer, stream, slot, page, pages, cells, target, key_stream, result, route,
 * relearn) have the types trace_index._Row declares; every other value is checked against
 * JSON's grammar and skipped. The Python path (msgspec into _Row, then numpy) stays the
 * reference: a block holding any line this pass is not sure of — malformed, a field of
 * another type, a number outside its column, a string with a non-ASCII byte or a \u escape,
 * nesting deeper than MAX_DEPTH, a blank line — is declined whole (None) and indexed there.
 * tests/test_trace_indexscan.py holds the two equal on random, hostile and real lines.
 * Nothing here reads outside the buffer it is given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "jsonscan.h"

#define MAX_NAMES 64
#define NAME_LEN 32

enum { F_KIND, F_SEQ, F_STEP, F_LAYER, F_STREAM, F_SLOT, F_PAGE, F_PAGES, F_CELLS, F_TARGET,
       F_KEY_STREAM, F_RESULT, F_ROUTE, F_RELEARN, F_OTHER };
static const char *FIELDS[] = {"kind", "seq", "step", "layer", "stream", "slot", "page",
                               "pages", "cells", "target", "key_stream", "result", "route",
                               "relearn"};
static const Py_ssize_t FIELD_LEN[] = {4, 3, 4, 5, 6, 4, 4, 5, 5, 6, 10, 6, 5, 7};

/* names and codes handed over by configure() (trace_index.py's KINDS, ROUTES, flags) */
static char kinds[MAX_NAMES][NAME_LEN];
static Py_ssize_t kind_len[MAX_NAMES], n_kinds = 0, unknown_code = -1;
static char routes[MAX_NAMES][NAME_LEN];
static Py_ssize_t route_len[MAX_NAMES], n_routes = 0;

static long code_upload = -1, code_write = -1, code_evict = -1, code_fits = -1, code_learn = -1;
static long flag_ring = 0, flag_fits_false = 0, flag_relearn = 0;

static int field_of(const unsigned char *s, Py_ssize_t n) {
    for (int i = 0; i < F_OTHER; i++)
        if (FIELD_LEN[i] == n && FIELDS[i][0] == (char)s[0] && memcmp(FIELDS[i], s, (size_t)n) == 0)
            return i;
    return F_OTHER;
}

static int in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

static Py_ssize_t name_code(char names[][NAME_LEN], const Py_ssize_t *lens, Py_ssize_t count,
                            const unsigned char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < count; i++)
        if (lens[i] == n && memcmp(names[i], s, (size_t)n) == 0) return i;
    return -1;
}

/* One line into its 11 row values (trace_index.COLUMNS' order, the offset first). */
static int line(Cur *c, int64_t off, int64_t row[11]) {
    int64_t seq = 0, step = 0, layer = -1, stream = -1, slot = -1, page = -1;
    int64_t pages[2] = {-1, -1}, cells[2] = {-1, -1}, key = -1;
    int have_kind = 0, have_seq = 0, have_step = 0, result = 1, relearn = 0;
    const unsigned char *kind = NULL, *target = NULL, *route = NULL;
    Py_ssize_t kind_n = 0, target_n = 0, route_n = 0;
    ws(c);
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    if (empty(c, '}')) return 0; /* no kind */
    for (;;) {
        const unsigned char *s;
        Py_ssize_t n;
        if (!member(c, &s, &n, 1)) return 0;
        int ok;
        switch (field_of(s, n)) {
        case F_KIND: ok = string(c, &kind, &kind_n, 1); have_kind = 1; break;
        case F_SEQ: ok = integer(c, &seq); have_seq = 1; break;
        case F_STEP: ok = integer(c, &step); have_step = 1; break;
        case F_LAYER: ok = integer(c, &layer); break;
        case F_STREAM: ok = integer(c, &stream); break;
        case F_SLOT: ok = integer(c, &slot); break;
        case F_PAGE: ok = integer(c, &page); break;
        case F_PAGES: ok = pair(c, pages); break;
        case F_CELLS: ok = pair(c, cells); break;
        case F_TARGET: ok = string(c, &target, &target_n, 1); break;
        case F_KEY_STREAM:
            if (literal(c, "null")) {
                key = -1;
                ok = 1;
            } else {
                ok = integer(c, &key);
            }
            break;
        case F_RESULT: ok = boolean(c, &result); break;
        case F_ROUTE: ok = string(c, &route, &route_n, 1); break;
        case F_RELEARN: ok = boolean(c, &relearn); break;
        default: ok = value(c, 1, 0); /* skipped unread, as msgspec skips a field it lacks */
        }
        if (!ok) return 0;
        int more = after_item(c, '}');
        if (more == 0) return 0;
        if (more == 2) break;
    }
    ws(c);
    if (c->p != c->end || !have_kind || !have_seq || !have_step) return 0;
    Py_ssize_t code = name_code(kinds, kind_len, n_kinds, kind, kind_n);
    if (code < 0) code = unknown_code;
    int64_t a = -1, b = -1, flags = 0, k = -1;
    if (code == code_upload) {
        a = pages[0];
        b = pages[1];
        flags = (target_n == 4 && memcmp(target, "ring", 4) == 0) ? flag_ring : 0;
        k = key;
    } else if (code == code_write) {
        a = cells[0];
        b = cells[1];
    } else if (code == code_evict) {
        a = page;
    } else if (code == code_fits) {
        a = route ? name_code(routes, route_len, n_routes, route, route_n) : -1;
        flags = result ? 0 : flag_fits_false;
    } else if (code == code_learn) {
        flags = relearn ? flag_relearn : 0;
    }
    /* the columns' types (trace_index.COLUMNS): a value outside one is the reference's */
    const int64_t I32 = INT32_MAX, I16 = INT16_MAX;
    if (!in_range(step, -I32 - 1, I32) || !in_range(layer, -I16 - 1, I16) ||
        !in_range(stream, -I16 - 1, I16) || !in_range(slot, -I32 - 1, I32) ||
        !in_range(a, -I32 - 1, I32) || !in_range(b, -I32 - 1, I32) || !in_range(k, -I16 - 1, I16))
        return 0;
    row[0] = off;
    row[1] = seq;
    row[2] = step;
    row[3] = code;
    row[4] = layer;
    row[5] = stream;
    row[6] = slot;
    row[7] = a;
    row[8] = b;
    row[9] = k;
    row[10] = flags;
    return 1;
}

/* The index's columns, in trace_index.COLUMNS' order, and the bytes of one value of each. */
#define NCOLS 11
static const Py_ssize_t WIDTH[NCOLS] = {8, 8, 4, 1, 2, 2, 4, 4, 4, 2, 1};

static void put(void *col, Py_ssize_t width, Py_ssize_t i, int64_t v) {
    switch (width) {
    case 8: ((int64_t *)col)[i] = v; break;
    case 4: ((int32_t *)col)[i] = (int32_t)v; break;
    case 2: ((int16_t *)col)[i] = (int16_t)v; break;
    default: ((int8_t *)col)[i] = (int8_t)v; /* kind, flags: small, range-checked */
    }
}

/* scan_into(block, base, columns, at) -> the rows written from row ``at`` of ``columns`` (the
 * index's 11 arrays, room made for one row per line), offsets counted from ``base``; or None:
 * a line this pass declines (the block is the reference's; rows past ``at`` may have been
 * written and are written again). Values go straight into the arrays: a result buffer per
 * block cost the allocator fresh pages every block (page faults, measured). */
static PyObject *scan_into(PyObject *self, PyObject *args) {
    PyObject *block, *columns;
    long long base;
    Py_ssize_t at;
    if (unknown_code < 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OLO!n", &block, &base, &PyTuple_Type, &columns, &at))
        return NULL;
    if (PyTuple_GET_SIZE(columns) != NCOLS || at < 0) {
        PyErr_SetString(PyExc_ValueError, "11 columns and a row to start at");
        return NULL;
    }
    Py_buffer view, cols[NCOLS];
    int held = 0;
    PyObject *res = NULL;
    if (PyObject_GetBuffer(block, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *s = view.buf, *end = s + view.len;
    Py_ssize_t rows = 0;
    for (const unsigned char *p = s; p < end; rows++) {
        const unsigned char *q = memchr(p, '\n', (size_t)(end - p));
        p = q ? q + 1 : end;
    }
    for (; held < NCOLS; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, held), &cols[held],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (cols[held].itemsize != WIDTH[held] || cols[held].len / WIDTH[held] < at + rows) {
            held++;
            PyErr_SetString(PyExc_ValueError, "a column of another type, or no room");
            goto done;
        }
    }
    Py_ssize_t r = at;
    for (const unsigned char *p = s; p < end; r++) {
        const unsigned char *q = memchr(p, '\n', (size_t)(end - p));
        Cur c = {p, q ? q : end};
        int64_t row[NCOLS];
        if (!line(&c, (int64_t)base + (int64_t)(p - s), row)) {
            res = Py_NewRef(Py_None);
            goto done;
        }
        for (int k = 0; k < NCOLS; k++) put(cols[k].buf, WIDTH[k], r, row[k]);
        p = q ? q + 1 : end;
    }
    res = PyLong_FromSsize_t(rows);
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&cols[k]);
    PyBuffer_Release(&view);
    return res;
}

static int names(PyObject *seq, char dst[][NAME_LEN], Py_ssize_t *lens, Py_ssize_t *count) {
    PyObject *fast = PySequence_Fast(seq, "names: a sequence of str");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_NAMES) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fast, i), &len);
        if (!u || len >= NAME_LEN) {
            Py_DECREF(fast);
            if (u) PyErr_SetString(PyExc_ValueError, "a name too long");
            return -1;
        }
        memcpy(dst[i], u, (size_t)len + 1);
        lens[i] = len;
    }
    *count = n;
    Py_DECREF(fast);
    return 0;
}

/* configure(kinds, routes, unknown, upload, write, evict, fits, learn, ring, fits_false,
 * relearn): the names and codes trace_index.py defines */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *k, *r;
    long unknown;
    if (!PyArg_ParseTuple(args, "OOlllllllll", &k, &r, &unknown, &code_upload, &code_write,
                          &code_evict, &code_fits, &code_learn, &flag_ring, &flag_fits_false,
                          &flag_relearn))
        return NULL;
    if (names(k, kinds, kind_len, &n_kinds) < 0 || names(r, routes, route_len, &n_routes) < 0)
        return NULL;
    json_init();
    unknown_code = unknown;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan_into", scan_into, METH_VARARGS,
     "Write a block's index rows into the columns; how many, or None (declined)."},
    {"configure", configure, METH_VARARGS, "The kind and route names, codes and flags."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_indexscan", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__indexscan(void) { return PyModule_Create(&module); }
