/* Where in a block of log bytes kvdiag perf's patterns can match, found in one C pass.
 *
 * kvdiag/postmortem/perfbytes.py says what this finds and why (its module docstring); the
 * patterns of kvdiag/postmortem/timinglines.py stay the reference and still read every line
 * they match. scan() returns
 *   - the offsets of every "id" where SLOT_LINES could match: the pattern's literal start,
 *     then, for its later-form alternative, the slot prefix "id <n> | task <t> | " and the
 *     first bytes of a message it reads (each test below is implied by the pattern: a
 *     necessary condition, never a sufficient one; the pattern decides), and every "id" its
 *     2024-form alternative could start at ("id" then one of _ " = :);
 *   - the offsets of the rare anchors (RARE_ANCHORS), each anchor's matches non-overlapping
 *     from the left as re.finditer finds them, merged in order (two anchors never start at
 *     one offset unless one is a prefix of the other: then the offset is given once).
 * Nothing is read outside [start, end): a test that needs bytes past the end fails, as the
 * pattern would with that end (endpos). The log's bytes are only compared, never executed.
 *
 * The pass: for each 32 bytes (AVX2, where the processor has it) or 16 (SSE2, every x86-64),
 * each needle's first and last byte are compared at once, and only offsets where both agree
 * are compared in full; elsewhere, and for the last bytes of a block, one offset at a time.
 * sre's search compares every byte in a loop, once per pattern: each anchor and the slot
 * pattern was a pass of its own over each block. perfpairs.c reads the usual request at these
 * offsets.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "logbytes.h"
#include "vec.h"

#define MAX_ANCHORS 16

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
    Py_ssize_t next; /* the first offset where its next match may start (non-overlapping) */
} Needle;

#define HAS(lit) has(b, q, end, lit, (Py_ssize_t)(sizeof(lit) - 1))

/* Whether SLOT_LINES can match at b[p] (b[p], b[p + 1] are "id"). The pattern, after "id":
 *   ' ++(\d++) \| task ++(-?+\d++) \| *+' then one of: 'new prompt, n_ctx_slot = ',
 *   '[cn]…_' (cached n_, c_, n_), 'kv cache rm [', '[pe]' + 'rompt eval '/'val ',
 *   'graphs reused = ', 'stop processing: n_', '[\r\n]' (the older block's header)
 *   or '[_"=:]…' (the 2024 form, left to the pattern). */
static int slot_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t end) {
    Py_ssize_t q = p + 2;
    if (q >= end) return 0;
    unsigned char c = b[q];
    if (c == '_' || c == '"' || c == '=' || c == ':') return 1;
    if (c != ' ') return 0;
    while (q < end && b[q] == ' ') q++;
    if (q >= end || !is_digit(b[q])) return 0;
    while (q < end && is_digit(b[q])) q++;
    if (!HAS(" | task ")) return 0;
    q += 8;
    while (q < end && b[q] == ' ') q++;
    if (q < end && b[q] == '-') q++;
    if (q >= end || !is_digit(b[q])) return 0;
    while (q < end && is_digit(b[q])) q++;
    if (!HAS(" |")) return 0;
    q += 2;
    while (q < end && b[q] == ' ') q++;
    if (q >= end) return 0;
    switch (b[q]) {
    case '\r':
    case '\n':
    case 'c':
        return 1;
    case 'n':
        return HAS("new prompt, n_ctx_slot = ") || HAS("n_");
    case 'k':
        return HAS("kv cache rm [");
    case 'p':
        return HAS("prompt eval ");
    case 'e':
        return HAS("eval ");
    case 'g':
        return HAS("graphs reused = ");
    case 's':
        return HAS("stop processing: n_");
    default:
        return 0;
    }
}

/* Needle 0 is "id" (slot lines), the others the anchors. What starts at b[p] is recorded. */
static inline int hit(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, Needle *nd,
                      int k, Vec *slots, Vec *rare) {
    int any = 0;
    for (int j = 1; j < k; j++) {
        Needle *x = &nd[j];
        if (p >= x->next && end - p >= x->n && memcmp(b + p, x->s, (size_t)x->n) == 0) {
            x->next = p + x->n;
            any = 1;
        }
    }
    if (any && vec_push(rare, p)) return -1;
    if (b[p] == 'i' && end - p >= 2 && b[p + 1] == 'd' && slot_at(b, p, end))
        return vec_push(slots, p);
    return 0;
}

#if defined(__SSE2__)
/* The 16-byte steps from i: offsets i .. i + 15 hold a needle's first byte, i + n - 1 ..
 * i + n + 14 its last; both loads stay below end. Returns where the steps stopped (-1: no
 * memory). */
static Py_ssize_t steps16(const unsigned char *b, Py_ssize_t i, Py_ssize_t end,
                          Py_ssize_t longest, Needle *nd, int k, Vec *slots,
                          Vec *rare) {
    __m128i first[MAX_ANCHORS + 1], last[MAX_ANCHORS + 1];
    for (int j = 0; j < k; j++) {
        first[j] = _mm_set1_epi8((char)nd[j].s[0]);
        last[j] = _mm_set1_epi8((char)nd[j].s[nd[j].n - 1]);
    }
    for (; end - i >= longest + 15; i += 16) {
        __m128i w = _mm_loadu_si128((const __m128i *)(b + i));
        unsigned mask = 0;
        for (int j = 0; j < k; j++) {
            __m128i e = _mm_loadu_si128((const __m128i *)(b + i + nd[j].n - 1));
            mask |= (unsigned)_mm_movemask_epi8(
                _mm_and_si128(_mm_cmpeq_epi8(w, first[j]), _mm_cmpeq_epi8(e, last[j])));
        }
        while (mask) {
            Py_ssize_t p = i + __builtin_ctz(mask);
            mask &= mask - 1;
            if (hit(b, p, end, nd, k, slots, rare)) return -1;
        }
    }
    return i;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_STEPS 1
/* steps16 in steps of 32 bytes, where the processor has AVX2 (asked at run time: the module
 * is built for any x86-64). */
__attribute__((target("avx2"))) static Py_ssize_t steps32(
    const unsigned char *b, Py_ssize_t i, Py_ssize_t end, Py_ssize_t longest, Needle *nd,
    int k, Vec *slots, Vec *rare) {
    __m256i first[MAX_ANCHORS + 1], last[MAX_ANCHORS + 1];
    for (int j = 0; j < k; j++) {
        first[j] = _mm256_set1_epi8((char)nd[j].s[0]);
        last[j] = _mm256_set1_epi8((char)nd[j].s[nd[j].n - 1]);
    }
    for (; end - i >= longest + 31; i += 32) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(b + i));
        uint32_t mask = 0;
        for (int j = 0; j < k; j++) {
            __m256i e = _mm256_loadu_si256((const __m256i *)(b + i + nd[j].n - 1));
            mask |= (uint32_t)_mm256_movemask_epi8(
                _mm256_and_si256(_mm256_cmpeq_epi8(w, first[j]), _mm256_cmpeq_epi8(e, last[j])));
        }
        while (mask) {
            Py_ssize_t p = i + __builtin_ctz(mask);
            mask &= mask - 1;
            if (hit(b, p, end, nd, k, slots, rare)) return -1;
        }
    }
    return i;
}
static int avx2 = -1;
#endif

static int scan_range(const unsigned char *b, Py_ssize_t start, Py_ssize_t end, Needle *nd,
                      int k, Vec *slots, Vec *rare, int wide) {
    Py_ssize_t i = start, longest = 0;
    for (int j = 0; j < k; j++)
        if (nd[j].n > longest) longest = nd[j].n;
#ifdef HAVE_AVX2_STEPS
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    if (wide && avx2 && (i = steps32(b, i, end, longest, nd, k, slots, rare)) < 0) return -1;
#else
    (void)wide;
#endif
#if defined(__SSE2__)
    if ((i = steps16(b, i, end, longest, nd, k, slots, rare)) < 0) return -1;
#endif
    for (; i < end; i++) {
        for (int j = 0; j < k; j++) {
            if (b[i] == nd[j].s[0]) {
                if (hit(b, i, end, nd, k, slots, rare)) return -1;
                break;
            }
        }
    }
    return 0;
}

/* scan(buf, start, end, anchors) -> (slot offsets as native int64 bytes, rare offsets list) */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end;
    PyObject *anchors;
    int wide = 1;
    if (!PyArg_ParseTuple(args, "y*nnO!|p", &view, &start, &end, &PyTuple_Type, &anchors,
                          &wide))
        return NULL;
    PyObject *out = NULL, *slots_b = NULL, *rare_l = NULL;
    Vec slots = {NULL, 0, 0}, rare = {NULL, 0, 0};
    Needle nd[MAX_ANCHORS + 1];
    Py_ssize_t k = PyTuple_GET_SIZE(anchors);
    if (k > MAX_ANCHORS) {
        PyErr_SetString(PyExc_ValueError, "too many anchors");
        goto done;
    }
    nd[0].s = (const unsigned char *)"id";
    nd[0].n = 2;
    nd[0].next = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *a = PyTuple_GET_ITEM(anchors, j);
        if (!PyBytes_Check(a) || PyBytes_GET_SIZE(a) == 0) {
            PyErr_SetString(PyExc_TypeError, "anchors: non-empty bytes");
            goto done;
        }
        nd[j + 1].s = (const unsigned char *)PyBytes_AS_STRING(a);
        nd[j + 1].n = PyBytes_GET_SIZE(a);
        nd[j + 1].next = 0;
    }
    /* as re's pos and endpos: clipped to the buffer */
    if (end > view.len) end = view.len;
    if (start < 0) start = 0;
    if (end < start) end = start;
    if (scan_range((const unsigned char *)view.buf, start, end, nd, (int)k + 1, &slots, &rare,
                   wide))
        goto done;
    slots_b = PyBytes_FromStringAndSize((const char *)slots.v,
                                        slots.n * (Py_ssize_t)sizeof(int64_t));
    rare_l = PyList_New(rare.n);
    if (!slots_b || !rare_l) goto done;
    for (Py_ssize_t j = 0; j < rare.n; j++) {
        PyObject *x = PyLong_FromLongLong(rare.v[j]);
        if (!x) goto done;
        PyList_SET_ITEM(rare_l, j, x);
    }
    out = PyTuple_Pack(2, slots_b, rare_l);
done:
    Py_XDECREF(slots_b);
    Py_XDECREF(rare_l);
    PyMem_Free(slots.v);
    PyMem_Free(rare.v);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, start, end, anchors, wide=True): the offsets where kvdiag perf's slot-line "
     "pattern can match (native int64 bytes) and those of the anchors (a list), in "
     "buf[start:end]; wide=False: no 32-byte steps (the tests' way to the 16-byte ones)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_perfbytes", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__perfbytes(void) { return PyModule_Create(&module); }
