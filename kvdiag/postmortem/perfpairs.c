/* The older shape's usual request read in one C pass, as kvdiag perf's slot-line pattern reads it.
 *
 * kvdiag/postmortem/perfpairs.py's walk_compiled hands this the offsets perfbytes.c's scan()
 * found (every offset where SLOT_LINES can match); what it reads goes to perfpairs.py's bulk
 * step, and everything it declines to the pattern. The pattern (timinglines.py) stays the
 * reference: tests/test_perf_bytes.py holds the two equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "logbytes.h"
#include "vec.h"

/* pairs() reads, at the offsets scan() gave, the two matches of SLOT_LINES that the usual
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
    {"pairs", pairs, METH_VARARGS,
     "pairs(buf, offsets, end, lo): the runs of the older shape's usual request (perfpairs.py)"
     " among scan's offsets[lo:]: [(lo, hi, starts, news, blocks, end), ...]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_perfpairs", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__perfpairs(void) { return PyModule_Create(&module); }
