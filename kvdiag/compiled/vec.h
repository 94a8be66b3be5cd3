/* A growable array of int64, shared by the C helpers (kvdiag/analysis/judgement/columns.c,
 * seqjudge.c; kvdiag/postmortem/perfbytes.c): kvdiag.compiled builds them with this folder on
 * the include path. */
#ifndef KVDIAG_VEC_H
#define KVDIAG_VEC_H

#include <Python.h>
#include <stdint.h>

typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Vec;

/* Room for ``more`` values after the ``n`` held (-1 with MemoryError set). */
static inline int vec_reserve(Vec *a, Py_ssize_t more) {
    if (a->n + more <= a->cap) return 0;
    Py_ssize_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + more) cap *= 2;
    int64_t *v = PyMem_Realloc(a->v, (size_t)cap * sizeof(int64_t));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    a->v = v;
    a->cap = cap;
    return 0;
}

static inline int vec_push(Vec *a, int64_t x) {
    if (vec_reserve(a, 1)) return -1;
    a->v[a->n++] = x;
    return 0;
}

#endif
