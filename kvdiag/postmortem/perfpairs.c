/* The usual request read in one C pass, as kvdiag perf's slot-line pattern reads it.
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

/* pairs() reads, at the offsets scan() gave, the matches of SLOT_LINES that the usual request
 * prints one after the other (perfpairs.py):
 *   NEW   'id <s> | task <t> | new prompt, n_ctx_slot = <n>, n_keep = <k>, task.n_tokens = <d>'
 *         then, on the next line, the same slot and task's cache line (the pattern's _next)
 *   then, older shape (bench_logscan's log):
 *   BLOCK 'id <s> | task <t> | ' at a line's end, the three lines of the older print_timing
 *         block, then the same slot and task's release line with its truncated flag
 *   or, newer shape: the 'prompt eval time' line alone, then the 'eval time' line with the
 *         same slot and task's total time, graphs reused (if printed) and release lines
 * following the pattern's first choice at each of its choice points and nothing else: where the
 * text takes another (a prefix before a block line, 'n_prompt_tokens', no truncated flag, a
 * figure that is not [\d.]+), it is not read here and the pattern reads it. Its repeats are
 * possessive, so a first choice that holds to the end is the match sre returns; the _next
 * part's greedy [^\n]* before 'id' is the last 'id' of the line after which the rest holds,
 * tried from the line's end as sre does. Each number is handed back as its printed text, in
 * the JSON rows perfpairs.py decodes from the pattern's groups (the same text, the same
 * decoder). A request is a NEW whose next offset after its end is a BLOCK, or a prompt line
 * whose next is a decode line: no other match of the pattern can lie between (scan's offsets
 * hold every one). */

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

/* 'stop processing: n_(?:tokens|past) = (\d++)(?:, truncated = (\d))?' (no flag: g[1] empty) */
static Py_ssize_t stop_body(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    LIT("stop processing: n_");
    if (has(b, q, end, "tokens", 6)) q += 6;
    else LIT("past");
    LIT(" = ");
    q = run_of(b, q, end, 0, &g[0]);
    if (q < 0) return -1;
    g[1].a = g[1].b = q;
    if (has(b, q, end, ", truncated = ", 14) && q + 14 < end && is_digit(b[q + 14])) {
        g[1].a = q + 14;
        g[1].b = q + 15;
        return q + 15;
    }
    return q;
}

/* 'total time[^\n]*+' */
static Py_ssize_t total_body(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    (void)g;
    LIT("total time");
    const unsigned char *nl = memchr(b + q, '\n', (size_t)(end - q));
    return nl ? nl - b : end;
}

/* 'graphs reused = ++(\d++)' */
static Py_ssize_t graphs_body(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, Span *g) {
    LIT("graphs reused = ");
    return run_of(b, skip_spaces(b, q, end), end, 0, g);
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
    q = next_line(b, nl - b, end, &g[0], &g[1], stop_body, &g[10]);
    return q >= 0 && g[11].b > g[11].a ? q : -1;  /* a release without its flag: the pattern's */
}

/* A timing line of the newer shape at p ('prompt eval ' or 'eval ' + FIGURES, the rest of its
 * line) with the pattern's three optional next lines: total time, graphs reused, the release.
 * The prompt's line is read here where none of the three follows it, the decode's where the
 * total time and the release with its flag do. Groups: slot, task, 4 figures, graphs, stop,
 * truncated (the absent ones empty). */
static Py_ssize_t timing_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, int prompt,
                            Span *g) {
    Py_ssize_t q = prefix(b, p, end, &g[0], &g[1]);
    if (prompt) LIT("prompt eval ");
    else LIT("eval ");
    q = figures(b, q, end, &g[2]);
    if (q < 0) return -1;
    const unsigned char *nl = memchr(b + q, '\n', (size_t)(end - q));
    q = nl ? nl - b : end;
    g[6].a = g[6].b = g[8].a = g[8].b = -1;
    Py_ssize_t t = next_line(b, q, end, &g[0], &g[1], total_body, NULL);
    if (t >= 0) q = t;
    Py_ssize_t r = next_line(b, q, end, &g[0], &g[1], graphs_body, &g[6]);
    if (r >= 0) q = r;
    else g[6].a = g[6].b = -1;
    Py_ssize_t e = next_line(b, q, end, &g[0], &g[1], stop_body, &g[7]);
    if (e >= 0) q = e;
    if (prompt) return t < 0 && r < 0 && e < 0 ? q : -1;
    return t >= 0 && e >= 0 && g[8].b > g[8].a ? q : -1;
}

/* JSON text being made: a list of rows (or of values), each number as printed. */
typedef struct {
    PyObject *text;
    Py_ssize_t len;
} Json;

static int put(Json *j, const char *x, Py_ssize_t n) {
    if (!j->text) {
        if (!(j->text = PyBytes_FromStringAndSize(NULL, 4096))) return -1;
        PyBytes_AS_STRING(j->text)[0] = '[';
        j->len = 1;
    }
    if (j->len + n + 2 > PyBytes_GET_SIZE(j->text) &&
        _PyBytes_Resize(&j->text, PyBytes_GET_SIZE(j->text) * 2 + n + 2))
        return -1;
    memcpy(PyBytes_AS_STRING(j->text) + j->len, x, (size_t)n);
    j->len += n;
    return 0;
}

/* the row '[g0,g1,...]' (one value: no brackets, and an empty group is null), after a ',' */
static int add(Json *j, const unsigned char *b, const Span *g, int n) {
    if (put(j, j->text && j->len > 1 ? "," : "", j->text && j->len > 1 ? 1 : 0)) return -1;
    if (n == 1 && g[0].a < 0) return put(j, "null", 4);
    if (n > 1 && put(j, "[", 1)) return -1;
    for (int i = 0; i < n; i++)
        if ((i && put(j, ",", 1)) || put(j, (const char *)b + g[i].a, g[i].b - g[i].a))
            return -1;
    return n > 1 ? put(j, "]", 1) : 0;
}

static PyObject *done(Json *j) {
    PyObject *out = NULL;
    if (!j->text) return PyBytes_FromStringAndSize(NULL, 0);
    if (!put(j, "]", 1) && !_PyBytes_Resize(&j->text, j->len)) {
        out = j->text;
        j->text = NULL;
    }
    Py_CLEAR(j->text);
    return out;
}

/* The run being made: its kind (2: NEW, BLOCK; 3: NEW, prompt, decode), its offsets (the
 * starts of its matches), its rows. */
typedef struct {
    int kind;
    Py_ssize_t lo;
    Vec at;
    Json news, second, third, graphs;
} Run;

static void run_clear(Run *r) {
    Py_CLEAR(r->news.text);
    Py_CLEAR(r->second.text);
    Py_CLEAR(r->third.text);
    Py_CLEAR(r->graphs.text);
    r->at.n = 0;
    r->kind = 0;
}

/* the run as (lo, hi, kind, starts, news, blocks or prompts, decodes, graphs, end) into runs */
static int run_done(Run *r, PyObject *runs, Py_ssize_t hi, Py_ssize_t last_end) {
    PyObject *at = PyBytes_FromStringAndSize((const char *)r->at.v,
                                             r->at.n * (Py_ssize_t)sizeof(int64_t));
    PyObject *n = done(&r->news), *s = done(&r->second), *t = done(&r->third);
    PyObject *g = done(&r->graphs), *item = NULL;
    int failed = -1;
    if (at && n && s && t && g)
        item = Py_BuildValue("nniOOOOOn", r->lo, hi, r->kind, at, n, s, t, g, last_end);
    if (item) failed = PyList_Append(runs, item);
    Py_XDECREF(item);
    Py_XDECREF(at);
    Py_XDECREF(n);
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(g);
    run_clear(r);
    return failed;
}

/* pairs(buf, offsets, end, lo) -> [(lo, hi, kind, starts, news, second, third, graphs, end),
 * ...]: the runs of usual requests among offsets[lo:] (scan's, native int64), each from offset
 * index lo to hi (the first offset at or after its last match's end), its kind (2: older shape,
 * 3: newer), its matches' starts (native int64), its rows as JSON (news; blocks, or prompts;
 * decodes; graphs reused: empty for kind 2) and its last match's end. */
static PyObject *pairs(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, offs;
    Py_ssize_t end, i;
    if (!PyArg_ParseTuple(args, "y*y*nn", &view, &offs, &end, &i)) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    const int64_t *o = (const int64_t *)offs.buf;
    Py_ssize_t n = offs.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *runs = PyList_New(0);
    Run r = {0, 0, {NULL, 0, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    Py_ssize_t run_hi = -1, run_end = 0;
    Span g[5 + 12], h[9];
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
        /* the next offset after it: a BLOCK (kind 2), or a prompt then a decode line (3) */
        Py_ssize_t j = i + 1, k = -1, e = -1;
        int kind = 2;
        while (j < n && o[j] < e1) j++;
        if (j < n && o[j] >= 0 && o[j] < end) {
            e = block_at(b, (Py_ssize_t)o[j], end, g + 5);
            if (e < 0 && (e = timing_at(b, (Py_ssize_t)o[j], end, 1, g + 5)) >= 0) {
                kind = 3;
                k = j + 1;
                while (k < n && o[k] < e) k++;
                e = k < n && o[k] >= 0 && o[k] < end ? timing_at(b, (Py_ssize_t)o[k], end, 0, h)
                                                     : -1;
            }
        }
        if (e < 0) {
            i++;
            continue;
        }
        /* not right after the run before, or of another kind: a run of its own */
        if (r.kind && (run_hi != i || r.kind != kind) && run_done(&r, runs, run_hi, run_end))
            goto fail;
        if (!r.kind) {
            r.kind = kind;
            r.lo = i;
        }
        if (vec_push(&r.at, p) || vec_push(&r.at, o[j]) || add(&r.news, b, g, 5)) goto fail;
        if (kind == 2 && add(&r.second, b, g + 5, 12)) goto fail;
        if (kind == 3) {
            Span decode[8] = {h[0], h[1], h[2], h[3], h[4], h[5], h[7], h[8]};
            if (vec_push(&r.at, o[k]) || add(&r.second, b, g + 5, 6) ||
                add(&r.third, b, decode, 8) || add(&r.graphs, b, h + 6, 1))
                goto fail;
        }
        i = (kind == 2 ? j : k) + 1;
        while (i < n && o[i] < e) i++;
        run_hi = i;
        run_end = e;
    }
    if (r.kind && run_done(&r, runs, run_hi, run_end)) goto fail;
    PyMem_Free(r.at.v);
    PyBuffer_Release(&view);
    PyBuffer_Release(&offs);
    return runs;
fail:
    Py_XDECREF(runs);
    run_clear(&r);
    PyMem_Free(r.at.v);
    PyBuffer_Release(&view);
    PyBuffer_Release(&offs);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pairs", pairs, METH_VARARGS,
     "pairs(buf, offsets, end, lo): the runs of the usual request (perfpairs.py) among scan's "
     "offsets[lo:]: [(lo, hi, kind, starts, news, second, third, graphs, end), ...]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_perfpairs", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__perfpairs(void) { return PyModule_Create(&module); }
