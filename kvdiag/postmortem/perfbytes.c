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
 * are compared in full; elsewhere, and for the last bytes of a block, one offset at a time. sre's search compares every byte in a
 * loop, once per pattern: five anchors and the slot pattern were six passes over each block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "vec.h"

#define MAX_ANCHORS 16

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
    Py_ssize_t next; /* the first offset where its next match may start (non-overlapping) */
} Needle;

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline int has(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, const char *lit,
                      Py_ssize_t n) {
    return end - q >= n && memcmp(b + q, lit, (size_t)n) == 0;
}
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

/* ---- the usual request's two matches, read as the pattern reads them ------------------------
 *
 * pairs() reads, at the offsets scan() gave, the two matches of SLOT_LINES that the usual
 * request of the older shape prints one after the other (bench_logscan's log; perfpairs.py):
 *   NEW   'id <s> | task <t> | new prompt, n_ctx_slot = <n>, n_keep = <k>, task.n_tokens = <d>'
 *         then, on the next line, the same slot and task's cache line (the pattern's _next)
 *   BLOCK 'id <s> | task <t> | ' at a line's end, the three lines of the older print_timing
 *         block, then the same slot and task's release line with its truncated flag
 * following the pattern's first choice at each of its choice points and nothing else: where the
 * text takes another (a prefix before a block line, 'n_prompt_tokens', no truncated flag, a
 * figure that is not [\d.]+), it is not read here and the pattern reads it. Its repeats are
 * possessive, so a first choice that holds to the end is the match sre returns; the _next
 * part's greedy [^\n]* before 'id' is the last 'id' of the line after which the rest holds,
 * tried from the line's end as sre does. Each number is handed back as its printed text, in
 * the JSON rows perfpairs.py decodes from the pattern's groups (the same text, the same
 * decoder). A pair is a NEW whose next offset after its end is a BLOCK: no other match of the
 * pattern can lie between (scan's offsets hold every one). */

typedef struct {
    Py_ssize_t a, b;
} Span;

static inline Py_ssize_t skip_spaces(const unsigned char *b, Py_ssize_t q, Py_ssize_t end) {
    while (q < end && b[q] == ' ') q++;
    return q;
}

/* at least one [0-9] (dot: or '.') from q: the offset after them, -1 where none */
static inline Py_ssize_t run_of(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, int dot,
                                Span *g) {
    Py_ssize_t a = q;
    while (q < end && (is_digit(b[q]) || (dot && b[q] == '.'))) q++;
    if (q == a) return -1;
    if (g) {
        g->a = a;
        g->b = q;
    }
    return q;
}

#define LIT(lit)                                                                         \
    do {                                                                                 \
        if (q < 0 || !has(b, q, end, lit, (Py_ssize_t)(sizeof(lit) - 1))) return -1;     \
        q += (Py_ssize_t)(sizeof(lit) - 1);                                              \
    } while (0)

/* 'id ++(\d++) \| task ++(-?+\d++) \| *+' at p: the offset after it (-1: none) */
static Py_ssize_t prefix(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, Span *s,
                         Span *t) {
    Py_ssize_t q = p;
    LIT("id ");
    q = run_of(b, skip_spaces(b, q, end), end, 0, s);
    LIT(" | task ");
    q = skip_spaces(b, q, end);
    Py_ssize_t a = q;
    if (q < end && b[q] == '-') q++;
    q = run_of(b, q, end, 0, NULL);
    if (q < 0) return -1;
    t->a = a;
    t->b = q;
    LIT(" |");
    return skip_spaces(b, q, end);
}

/* 'id ++\1 \| task ++\2 \| *+' at q (the slot and task printed as s and t) */
static Py_ssize_t same_prefix(const unsigned char *b, Py_ssize_t q, Py_ssize_t end,
                              const Span *s, const Span *t) {
    LIT("id ");
    q = skip_spaces(b, q, end);
    if (!has(b, q, end, (const char *)b + s->a, s->b - s->a)) return -1;
    q += s->b - s->a;
    LIT(" | task ");
    q = skip_spaces(b, q, end);
    if (!has(b, q, end, (const char *)b + t->a, t->b - t->a)) return -1;
    q += t->b - t->a;
    LIT(" |");
    return skip_spaces(b, q, end);
}

/* '(?:(?:cached )?n_(?:tokens|past) = \d++, memory_seq_rm|kv cache rm) \[(\d++),' */
static Py_ssize_t cache_body(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    if (has(b, q, end, "kv cache rm", 11)) {
        q += 11;
    } else {
        if (has(b, q, end, "cached ", 7)) q += 7;
        LIT("n_");
        if (has(b, q, end, "tokens", 6)) q += 6;
        else LIT("past");
        LIT(" = ");
        q = run_of(b, q, end, 0, NULL);
        LIT(", memory_seq_rm");
    }
    LIT(" [");
    q = run_of(b, q, end, 0, g);
    LIT(",");
    return q;
}

/* 'stop processing: n_(?:tokens|past) = (\d++)(?:, truncated = (\d))?', the flag required */
static Py_ssize_t stop_body(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    LIT("stop processing: n_");
    if (has(b, q, end, "tokens", 6)) q += 6;
    else LIT("past");
    LIT(" = ");
    q = run_of(b, q, end, 0, &g[0]);
    LIT(", truncated = ");
    if (q >= end || !is_digit(b[q])) return -1;
    g[1].a = q;
    g[1].b = q + 1;
    return q + 1;
}

typedef Py_ssize_t (*Body)(const unsigned char *, Py_ssize_t, Py_ssize_t, Span *);

/* the pattern's _next(body) at q: '\r?\n[^\n]*id ++\1 \| task ++\2 \| *+' + body, the last
 * 'id' of the line where the rest holds (none of it matches a line end) */
static Py_ssize_t next_line(const unsigned char *b, Py_ssize_t q, Py_ssize_t end,
                            const Span *s, const Span *t, Body body, Span *g) {
    if (q < end && b[q] == '\r') q++;
    if (q >= end || b[q] != '\n') return -1;
    Py_ssize_t ls = q + 1;
    const unsigned char *nl = ls < end ? memchr(b + ls, '\n', (size_t)(end - ls)) : NULL;
    Py_ssize_t le = nl ? nl - b : end;
    for (Py_ssize_t x = le - 2; x >= ls; x--) {
        if (b[x] != 'i' || b[x + 1] != 'd') continue;
        Py_ssize_t r = same_prefix(b, x, le, s, t);
        if (r >= 0 && (r = body(b, r, le, g)) >= 0) return r;
    }
    return -1;
}

/* FIGURES after its line's text: 'time = ++([\d.]++) ms / ++(\d++) (?:tokens|runs) *+\( *+'
 * NUM ' ms per token, ++' NUM ' tokens per second\)', NUM's first choice '-?+[\d.]++' */
static Py_ssize_t figures(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    LIT("time = ");
    q = run_of(b, skip_spaces(b, q, end), end, 1, &g[0]);
    LIT(" ms / ");
    q = run_of(b, skip_spaces(b, q, end), end, 0, &g[1]);
    LIT(" ");
    if (has(b, q, end, "tokens", 6)) q += 6;
    else LIT("runs");
    q = skip_spaces(b, q, end);
    LIT("(");
    q = skip_spaces(b, q, end);
    Py_ssize_t a = q;
    if (q < end && b[q] == '-') q++;
    q = run_of(b, q, end, 1, NULL);
    if (q < 0) return -1;
    g[2].a = a;
    g[2].b = q;
    LIT(" ms per token, ");
    q = skip_spaces(b, q, end);
    a = q;
    if (q < end && b[q] == '-') q++;
    q = run_of(b, q, end, 1, NULL);
    if (q < 0) return -1;
    g[3].a = a;
    g[3].b = q;
    LIT(" tokens per second)");
    return q;
}

/* '[^\n]*+\n' from q: the next line's start (-1: no line end) */
static inline Py_ssize_t line_after(const unsigned char *b, Py_ssize_t q, Py_ssize_t end) {
    if (q < 0 || q >= end) return -1;
    const unsigned char *nl = memchr(b + q, '\n', (size_t)(end - q));
    return nl ? nl - b + 1 : -1;
}

/* NEW at p: groups slot, task, n_ctx_slot, task.n_tokens, cache kept */
static Py_ssize_t new_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, Span *g) {
    Py_ssize_t q = prefix(b, p, end, &g[0], &g[1]);
    LIT("new prompt, n_ctx_slot = ");
    q = run_of(b, q, end, 0, &g[2]);
    LIT(", n_keep = ");
    if (q < end && b[q] == '-') q++;
    q = run_of(b, q, end, 0, NULL);
    LIT(", task.n_tokens = ");
    q = run_of(b, q, end, 0, &g[3]);
    if (q < 0) return -1;
    return next_line(b, q, end, &g[0], &g[1], cache_body, &g[4]);
}

/* BLOCK at p: groups slot, task, the prompt's and the decode's figures, stop, truncated */
static Py_ssize_t block_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, Span *g) {
    Py_ssize_t q = prefix(b, p, end, &g[0], &g[1]);
    if (q < 0 || q >= end) return -1;
    if (b[q] == '\r') q++;
    LIT("\n");
    LIT("prompt eval ");
    q = line_after(b, figures(b, q, end, &g[2]), end);
    if (q < 0) return -1;
    q = skip_spaces(b, q, end);
    LIT("eval ");
    q = line_after(b, figures(b, q, end, &g[6]), end);
    if (q < 0) return -1;
    q = skip_spaces(b, q, end);
    LIT("total time = ");
    q = run_of(b, skip_spaces(b, q, end), end, 1, NULL);
    LIT(" ms");
    const unsigned char *nl = memchr(b + q, '\n', (size_t)(end - q));
    if (!nl) return -1;
    return next_line(b, nl - b, end, &g[0], &g[1], stop_body, &g[10]);
}

/* '[a,b,...]' of the groups' text, after a ',' where the list has rows already */
static int row(PyObject **out, Py_ssize_t *len, const unsigned char *b, const Span *g, int n) {
    Py_ssize_t need = 2 + n;
    for (int i = 0; i < n; i++) need += g[i].b - g[i].a;
    Py_ssize_t at = *len;
    if (at + need + 1 > PyBytes_GET_SIZE(*out)) {
        Py_ssize_t size = PyBytes_GET_SIZE(*out) * 2 + need + 1;
        if (_PyBytes_Resize(out, size)) return -1;
    }
    char *w = PyBytes_AS_STRING(*out) + at;
    if (at > 1) *w++ = ',';
    *w++ = '[';
    for (int i = 0; i < n; i++) {
        if (i) *w++ = ',';
        memcpy(w, b + g[i].a, (size_t)(g[i].b - g[i].a));
        w += g[i].b - g[i].a;
    }
    *w++ = ']';
    *len = w - PyBytes_AS_STRING(*out);
    return 0;
}

/* The run being made: its offsets (two match starts a pair, then its end), its rows. */
typedef struct {
    Py_ssize_t lo;
    Vec at;
    PyObject *news, *blocks;
    Py_ssize_t news_len, blocks_len;
} Run;

static PyObject *run_done(Run *r, Py_ssize_t hi, Py_ssize_t last_end) {
    PyObject *at = NULL, *out = NULL;
    r->news_len += 1;
    r->blocks_len += 1;
    PyBytes_AS_STRING(r->news)[r->news_len - 1] = ']';
    PyBytes_AS_STRING(r->blocks)[r->blocks_len - 1] = ']';
    if (_PyBytes_Resize(&r->news, r->news_len) || _PyBytes_Resize(&r->blocks, r->blocks_len))
        goto done;
    at = PyBytes_FromStringAndSize((const char *)r->at.v, r->at.n * (Py_ssize_t)sizeof(int64_t));
    if (at) out = Py_BuildValue("nnOOOn", r->lo, hi, at, r->news, r->blocks, last_end);
done:
    Py_XDECREF(at);
    Py_CLEAR(r->news);
    Py_CLEAR(r->blocks);
    r->at.n = 0;
    return out;
}

/* pairs(buf, offsets, end, lo) -> [(lo, hi, starts, news, blocks, end), ...]: the runs of
 * pairs among offsets[lo:] (scan's, native int64), each from offset index lo to hi (the first
 * offset at or after its last match's end), its matches' starts (native int64), its rows as
 * JSON and its last match's end. */
static PyObject *pairs(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, offs;
    Py_ssize_t end, i;
    if (!PyArg_ParseTuple(args, "y*y*nn", &view, &offs, &end, &i)) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    const int64_t *o = (const int64_t *)offs.buf;
    Py_ssize_t n = offs.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *runs = PyList_New(0);
    Run r = {0, {NULL, 0, 0}, NULL, NULL, 0, 0};
    Py_ssize_t run_hi = -1, run_end = 0;
    Span g[17];
    if (end > view.len) end = view.len;
    if (i < 0) i = 0;
    if (!runs) goto fail;
    while (i < n) {
        Py_ssize_t p = (Py_ssize_t)o[i];
        if (p < 0 || p >= end) break;
        Py_ssize_t e1 = new_at(b, p, end, g);
        if (e1 < 0) {
            i++;
            continue;
        }
        Py_ssize_t j = i + 1;
        while (j < n && o[j] < e1) j++;
        Py_ssize_t e2 = j < n && o[j] >= 0 && o[j] < end
                            ? block_at(b, (Py_ssize_t)o[j], end, g + 5) : -1;
        if (e2 < 0) {
            i++;
            continue;
        }
        if (r.news && run_hi != i) {  /* not right after the run before: a run of its own */
            PyObject *done = run_done(&r, run_hi, run_end);
            if (!done || PyList_Append(runs, done)) {
                Py_XDECREF(done);
                goto fail;
            }
            Py_DECREF(done);
        }
        if (!r.news) {
            r.lo = i;
            r.news = PyBytes_FromStringAndSize(NULL, 4096);
            r.blocks = PyBytes_FromStringAndSize(NULL, 8192);
            if (!r.news || !r.blocks) goto fail;
            PyBytes_AS_STRING(r.news)[0] = PyBytes_AS_STRING(r.blocks)[0] = '[';
            r.news_len = r.blocks_len = 1;
        }
        if (vec_push(&r.at, p) || vec_push(&r.at, o[j]) || row(&r.news, &r.news_len, b, g, 5) ||
            row(&r.blocks, &r.blocks_len, b, g + 5, 12))
            goto fail;
        i = j + 1;
        while (i < n && o[i] < e2) i++;
        run_hi = i;
        run_end = e2;
    }
    if (r.news) {
        PyObject *done = run_done(&r, run_hi, run_end);
        if (!done || PyList_Append(runs, done)) {
            Py_XDECREF(done);
            goto fail;
        }
        Py_DECREF(done);
    }
    PyMem_Free(r.at.v);
    PyBuffer_Release(&view);
    PyBuffer_Release(&offs);
    return runs;
fail:
    Py_XDECREF(runs);
    Py_XDECREF(r.news);
    Py_XDECREF(r.blocks);
    PyMem_Free(r.at.v);
    PyBuffer_Release(&view);
    PyBuffer_Release(&offs);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, start, end, anchors, wide=True): the offsets where kvdiag perf's slot-line "
     "pattern can match (native int64 bytes) and those of the anchors (a list), in "
     "buf[start:end]; wide=False: no 32-byte steps (the tests' way to the 16-byte ones)."},
    {"pairs", pairs, METH_VARARGS,
     "pairs(buf, offsets, end, lo): the runs of the older shape's usual request (perfpairs.py)"
     " among scan's offsets[lo:]: [(lo, hi, starts, news, blocks, end), ...]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_perfbytes", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__perfbytes(void) { return PyModule_Create(&module); }
