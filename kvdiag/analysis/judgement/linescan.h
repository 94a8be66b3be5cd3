/* The judgement's columns read straight from a trace's lines, for the kinds that make most of
 * a trace (write, upload, evict, read, fits, and a step's, a mark's and an output's lines),
 * without decoding them into objects
 * (kvdiag/analysis/judgement/linescan.py; included by columns.c, whose Taken it fills as
 * add_events does from decoded events).
 *
 * A line is taken only where msgspec's decoder would make the same event of it: the types are
 * the model's own (linescan.py hands over msgspec.inspect's description of each struct:
 * integers, strings, booleans, literals, null-or-X, fixed and variable tuples, structs by key
 * floats, and array-like structs), checked as strictly as the decoder checks them; keys the model does
 * not name are checked against JSON's grammar and skipped, as the decoder skips them. Anything
 * this pass is not sure of is declined and left to the decoder, which stays the reference: a
 * "kind" key that is not the first, a key given twice, an integer of more than INT_DIGITS
 * digits, a string with a non-ASCII byte or a \u escape (jsonscan.h), an array-like struct
 * without all its fields, a type the description does not cover, a line without its newline.
 * So is a line the columns would hand to Python (a fits decision with a bad outcome, a step
 * whose phase is not the last step's, an output that diverged or has no reference), and one
 * whose seq is not the one the reader and the lost-event check expect next.
 * tests/test_linescan.py holds the columns and the judgement equal on real, random and hostile
 * lines. Nothing here reads outside the buffer it is given.
 */
#ifndef KVDIAG_LINESCAN_H
#define KVDIAG_LINESCAN_H

#include "jsonscan.h"

enum { S_INT, S_STR, S_BOOL, S_NONE, S_LIT, S_TUPLE, S_VARTUPLE, S_OPT, S_STRUCT, S_ASTRUCT,
       S_FLOAT, S_OTHER };
#define MAX_NODES 512
#define MAX_FIELDS 256
#define MAX_LITS 128
#define LIT_LEN 32
#define MAX_STRUCT 64 /* fields of one struct: one bit each for the keys seen */

/* S_LIT: lits[a, a + n); S_TUPLE: items kids[a, a + n); S_VARTUPLE, S_OPT: item node a;
 * S_STRUCT, S_ASTRUCT: fields[a, a + n) */
typedef struct {
    int type, a, n;
} Node;
typedef struct {
    char name[LIT_LEN];
    Py_ssize_t len;
    int required, node;
} SField;

static Node nodes[MAX_NODES];
static int kids[MAX_NODES];
static SField sfields[MAX_FIELDS];
static char lits[MAX_LITS][LIT_LEN];
static Py_ssize_t lit_len[MAX_LITS];
static int n_nodes; /* nodes[] in use (configure checks every other index against its table) */

/* The kinds read here, by columns.c's code: the tag, the struct's node, and where each field
 * the columns need is among its fields (-1: the kind is not read here). */
enum { K_SEQ, K_STEP, K_LAYER, K_STREAM, K_CELLS, K_VERSIONS, K_PAGES, K_SLOT, K_BYTES,
       K_TARGET, K_REASON, K_POOL, K_RING, K_HOST, K_SERVED, K_RANGES, K_ROUTE, K_RESULT,
       K_PHASE, K_DELTA, K_TOLERANCE, NK };
typedef struct {
    char tag[LIT_LEN];
    Py_ssize_t tag_len;
    int node;
    int at[NK];
} Root;
static Root roots[KINDS];
static int scan_ready = 0;

/* What the walk keeps of each top-level field: an integer's value (-1 for null), a literal's
 * index, a boolean; where an array began (read again for its items); whether it was given. */
typedef struct {
    int64_t val;
    double f; /* a float's value */
    const unsigned char *at;
    int given, null;
} Rec;

static int valid(Cur *c, int node, int depth, Rec *rec);

static int lit_index(const Node *nd, const unsigned char *s, Py_ssize_t n) {
    for (int i = 0; i < nd->n; i++)
        if (lit_len[nd->a + i] == n && memcmp(lits[nd->a + i], s, (size_t)n) == 0) return i;
    return -1;
}

/* Whether a key is the field's name (names are short: compared here, not by a call). */
static inline int same(const SField *sf, const unsigned char *s, Py_ssize_t n) {
    if (sf->len != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)sf->name[i] != s[i]) return 0;
    return 1;
}

/* The key at c->p is the field's name, and its colon follows: both taken. A name holds
 * neither a quote nor a backslash (linescan.py gives only identifiers), so the quote after it
 * ends the key: the key is that name, as string() would read it. */
static inline int quoted(Cur *c, const SField *sf) {
    const unsigned char *p = c->p;
    Py_ssize_t n = sf->len;
    if (c->end - p < n + 3 || p[0] != '"' || p[n + 1] != '"') return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)sf->name[i] != p[i + 1]) return 0;
    p += n + 2;
    while (p < c->end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    if (p >= c->end || *p != ':') return 0;
    c->p = p + 1;
    ws(c);
    return 1;
}

/* A JSON number read as a double (msgspec's float takes an integer too): checked against the
 * grammar, then converted by strtod, which rounds correctly as msgspec's parser does. Declined:
 * more than 20 significant characters or an exponent beyond +-300 (no overflow, no
 * underflow to be sure of). */
static int real(Cur *c, double *out) {
    const unsigned char *start = c->p;
    if (!number(c, 1)) return 0;
    Py_ssize_t n = c->p - start;
    if (n > 24) return 0;
    char buf[32];
    memcpy(buf, start, (size_t)n);
    buf[n] = 0;
    const char *e = strpbrk(buf, "eE");
    if (e) {
        long x = strtol(e + 1, NULL, 10);
        if (x > 300 || x < -300) return 0;
    }
    char *end;
    *out = PyOS_string_to_double(buf, &end, NULL);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return end == buf + n;
}

/* The members of an object whose '{' (and, for an event, its "kind" member) was read; ``rec``
 * gets one Rec per field of the struct, or is NULL. */
static int members(Cur *c, const Node *nd, int depth, Rec *rec, int open, int tagged) {
    uint64_t seen = 0;
    if (open) {
        if (empty(c, '}')) goto done;
    } else {
        int more = after_item(c, '}');
        if (more == 0) return 0;
        if (more == 2) goto done;
    }
    int hint = 0; /* writers give the fields in the model's order: the next one is tried first */
    for (;;) {
        const unsigned char *s;
        Py_ssize_t n;
        int f = -1;
        ws(c);
        if (hint < nd->n && quoted(c, &sfields[nd->a + hint])) {
            f = hint;
        } else {
            if (!member(c, &s, &n, 0)) return 0;
            for (int i = 0; i < nd->n; i++)
                if (same(&sfields[nd->a + i], s, n)) {
                    f = i;
                    break;
                }
        }
        if (f >= 0) hint = f + 1;
        if (f < 0) {
            /* the tag given twice is the decoder's to judge; another key is skipped by it */
            if (tagged && n == 4 && memcmp(s, "kind", 4) == 0) return 0;
            /* skipped as the decoder skips it, but for an integer it might refuse the line for */
            if (!value(c, depth + 1, 1)) return 0;
        } else {
            if (seen & ((uint64_t)1 << f)) return 0;
            seen |= (uint64_t)1 << f;
            Rec *r = rec ? &rec[f] : NULL;
            if (r) {
                r->at = c->p;
                r->given = 1;
            }
            int node = sfields[nd->a + f].node;
            int type = nodes[node].type;
            if (type == S_INT) { /* the commonest values: read here, not through valid() */
                int64_t v;
                if (!integer(c, &v)) return 0;
                if (r) r->val = v;
            } else if (type == S_STR) {
                const unsigned char *vs;
                Py_ssize_t vn;
                if (!string(c, &vs, &vn, 0)) return 0;
            } else if (!valid(c, node, depth + 1, r)) {
                return 0;
            }
        }
        int more = after_item(c, '}');
        if (more == 0) return 0;
        if (more == 2) break;
    }
done:
    for (int i = 0; i < nd->n; i++)
        if (sfields[nd->a + i].required && !(seen & ((uint64_t)1 << i))) return 0;
    return 1;
}

/* One value of the description's ``node`` at c->p, checked (rec: where a top-level field's
 * value is kept, else NULL). 0: declined. */
static int valid(Cur *c, int node, int depth, Rec *rec) {
    if (depth > MAX_DEPTH || node < 0 || node >= n_nodes) return 0;
    const Node *nd = &nodes[node];
    ws(c);
    switch (nd->type) {
    case S_INT: {
        int64_t v;
        if (!integer(c, &v)) return 0;
        if (rec) rec->val = v;
        return 1;
    }
    case S_STR: {
        const unsigned char *s;
        Py_ssize_t n;
        return string(c, &s, &n, 0);
    }
    case S_BOOL: {
        int b;
        if (!boolean(c, &b)) return 0;
        if (rec) rec->val = b;
        return 1;
    }
    case S_NONE:
        if (rec) {
            rec->val = -1;
            rec->null = 1;
        }
        return literal(c, "null");
    case S_LIT: {
        const unsigned char *s;
        Py_ssize_t n;
        if (!string(c, &s, &n, 1)) return 0;
        int i = lit_index(nd, s, n);
        if (i < 0) return 0;
        if (rec) rec->val = i;
        return 1;
    }
    case S_OPT:
        if (c->p < c->end && *c->p == 'n') {
            if (rec) {
                rec->val = -1;
                rec->null = 1;
            }
            return literal(c, "null");
        }
        return valid(c, nd->a, depth, rec);
    case S_FLOAT: {
        double f;
        if (!real(c, &f)) return 0;
        if (rec) rec->f = f;
        return 1;
    }
    case S_TUPLE:
    case S_VARTUPLE:
    case S_ASTRUCT: {
        if (c->p >= c->end || *c->p != '[') return 0;
        c->p++;
        int count = 0;
        if (!empty(c, ']')) {
            for (;;) {
                int item;
                if (nd->type == S_VARTUPLE) item = nd->a;
                else if (count >= nd->n) return 0;
                else if (nd->type == S_TUPLE) item = kids[nd->a + count];
                else item = sfields[nd->a + count].node;
                if (nodes[item].type == S_INT) { /* shapes, strides, page pairs */
                    int64_t v;
                    ws(c);
                    if (!integer(c, &v)) return 0;
                } else if (!valid(c, item, depth + 1, NULL)) {
                    return 0;
                }
                count++;
                int more = after_item(c, ']');
                if (more == 0) return 0;
                if (more == 2) break;
            }
        }
        /* an array-like struct's trailing defaults are the decoder's to fill in */
        if (nd->type != S_VARTUPLE && count != nd->n) return 0;
        if (rec) rec->val = count;
        return 1;
    }
    case S_STRUCT:
        if (c->p >= c->end || *c->p != '{') return 0;
        c->p++;
        return members(c, nd, depth, NULL, 1, 0);
    default:
        return 0;
    }
}

/* An array of flat arrays, each of the scalars ``shape`` names ('i' an integer, 's' a string
 * without escapes), already checked by valid(): the integers of item ``k`` go to
 * ints[k * ni...], the strings to strs/lens[k * ns...]. -1: not as expected. */
static Py_ssize_t items(Cur *c, const char *shape, Vec *ints, const unsigned char ***strs,
                        Py_ssize_t **lens, Py_ssize_t *cap) {
    ws(c);
    if (c->p >= c->end || *c->p != '[') return -1;
    c->p++;
    Py_ssize_t k = 0;
    if (empty(c, ']')) return 0;
    int ns = 0, ni = 0;
    for (const char *t = shape; *t; t++) *t == 's' ? ns++ : ni++;
    for (;; k++) {
        ws(c);
        if (c->p >= c->end || *c->p != '[') return -1;
        c->p++;
        if (vec_reserve(ints, ni)) return -2;
        if (ns && (k + 1) * ns > *cap) {
            Py_ssize_t want = (k + 1) * ns * 2;
            const unsigned char **s2 = PyMem_Realloc(*strs, (size_t)want * sizeof **strs);
            if (s2) *strs = s2;
            Py_ssize_t *l2 = s2 ? PyMem_Realloc(*lens, (size_t)want * sizeof **lens) : NULL;
            if (!s2 || !l2) {
                PyErr_NoMemory();
                return -2;
            }
            *lens = l2;
            *cap = want;
        }
        int si = 0;
        for (const char *t = shape; *t; t++) {
            ws(c);
            if (*t == 'i') {
                int64_t v;
                if (!integer(c, &v)) return -1;
                ints->v[ints->n++] = v;
            } else {
                const unsigned char *s;
                Py_ssize_t n;
                if (!string(c, &s, &n, 1)) return -1;
                (*strs)[k * ns + si] = s;
                (*lens)[k * ns + si] = n;
                si++;
            }
            if (t[1] && after_item(c, ']') != 1) return -1;
        }
        if (after_item(c, ']') != 2) return -1;
        int more = after_item(c, ']');
        if (more == 0) return -1;
        if (more == 2) return k + 1;
    }
}

static int name_of(const unsigned char *s, Py_ssize_t n, const char *const *names, int count,
                   int other) {
    for (int i = 0; i < count; i++)
        if ((Py_ssize_t)strlen(names[i]) == n && memcmp(names[i], s, (size_t)n) == 0) return i;
    return other;
}

/* Scratch for a read's strings (items()). */
static const unsigned char **scratch_s;
static Py_ssize_t *scratch_n, scratch_cap;

/* One line (without its newline) into ``c`` at position ``pos`` as add_events would add its
 * event: its kind's code, or -1 where it is declined (``c`` as it was), -2 on an error. Its
 * seq must be ``expect``; its step goes to *step. */
static int scan_line(Taken *c, Cur *cur, int64_t pos, int64_t expect, int64_t *step) {
    ws(cur);
    if (cur->p >= cur->end || *cur->p != '{') return -1;
    cur->p++;
    const unsigned char *s;
    Py_ssize_t n;
    if (!member(cur, &s, &n, 1) || n != 4 || memcmp(s, "kind", 4) != 0) return -1;
    if (!string(cur, &s, &n, 1)) return -1;
    int k = -1;
    for (int i = 0; i < KINDS; i++)
        if (roots[i].node >= 0 && roots[i].tag_len == n && memcmp(roots[i].tag, s, (size_t)n) == 0) {
            k = i;
            break;
        }
    if (k < 0) return -1;
    const Root *R = &roots[k];
    const Node *nd = &nodes[R->node];
    Rec rec[MAX_STRUCT];
    memset(rec, 0, sizeof(Rec) * (size_t)nd->n);
    if (!members(cur, nd, 0, rec, 0, 1)) return -1;
    ws(cur);
    if (cur->p != cur->end) return -1;
    const int *at = R->at;
#define GIVEN(f) rec[at[f]].given
#define VAL(f) rec[at[f]].val
    if (VAL(K_SEQ) != expect) return -1;
    /* fields with a default, not given: the default (the model's, checked by configure) */
    int decode = 0;
    if (k == STEP) {
        /* a step says something new only where its phase changes (AdaptAnalyzer: a decode loop
         * starts there; add_events hands those): such a step is Python's to see */
        const Node *ln = &nodes[sfields[nd->a + at[K_PHASE]].node];
        const char *name = lits[ln->a + VAL(K_PHASE)];
        decode = lit_len[ln->a + VAL(K_PHASE)] == 6 && memcmp(name, "decode", 6) == 0;
        if (decode != c->phase) return -1;
    }
    if (k == OUTPUT) {
        /* an output with a reference that did not diverge: counted; the others are Python's */
        const Rec *d = &rec[at[K_DELTA]], *t = &rec[at[K_TOLERANCE]];
        if (!d->given || !t->given || d->null || t->null || d->f > t->f) return -1;
    }
    int route = 0;
    if (k == FITS) {
        /* a literal's index is in the description's order: the route is found by its name */
        const Node *ln = &nodes[sfields[nd->a + at[K_ROUTE]].node];
        route = name_of((const unsigned char *)lits[ln->a + VAL(K_ROUTE)],
                        lit_len[ln->a + VAL(K_ROUTE)], ROUTES, 4, 4);
        if (route == 4 || bad_fits(route, VAL(K_RESULT))) return -1; /* Python's to see */
    }
    Vec *v = c->v;
    Py_ssize_t saved[NVEC];
    for (int j = 0; j < NVEC; j++) saved[j] = v[j].n;
    int saved_all_runs = c->all_runs;
    if (codes_room(c, 1) || vec_reserve(&v[V_STEP], 1)) return -2;
    v[V_STEP].v[v[V_STEP].n++] = VAL(K_STEP);
    *step = VAL(K_STEP);
    switch (k) {
    case WRITE: {
        Cur cc = {rec[at[K_CELLS]].at, cur->end};
        int64_t cells[2];
        ws(&cc);
        if (!pair(&cc, cells)) goto declined;
        if (vec_reserve(&v[V_WPOS], 1) || vec_reserve(&v[V_W], 3) || vec_reserve(&v[V_WCELLS], 2) ||
            vec_reserve(&v[V_WVLEN], 1))
            goto error;
        v[V_WPOS].v[v[V_WPOS].n++] = pos;
        v[V_W].v[v[V_W].n++] = VAL(K_SEQ);
        v[V_W].v[v[V_W].n++] = VAL(K_LAYER);
        v[V_W].v[v[V_W].n++] = VAL(K_STREAM);
        v[V_WCELLS].v[v[V_WCELLS].n++] = cells[0];
        v[V_WCELLS].v[v[V_WCELLS].n++] = cells[1];
        Py_ssize_t nv = 0;
        if (GIVEN(K_VERSIONS)) {
            Cur vc = {rec[at[K_VERSIONS]].at, cur->end};
            nv = items(&vc, "ii", &v[V_WVERS], &scratch_s, &scratch_n, &scratch_cap);
            if (nv == -2) goto error;
            if (nv < 0) goto declined;
        }
        v[V_WVLEN].v[v[V_WVLEN].n++] = nv;
        break;
    }
    case UPLOAD: {
        Cur pc = {rec[at[K_PAGES]].at, cur->end};
        int64_t pages[2];
        ws(&pc);
        if (!pair(&pc, pages)) goto declined;
        if (vec_reserve(&v[V_UPOS], 1) || vec_reserve(&v[V_U], 5) || vec_reserve(&v[V_UPAGES], 2) ||
            vec_reserve(&v[V_UKEY], 1))
            goto error;
        v[V_UPOS].v[v[V_UPOS].n++] = pos;
        v[V_U].v[v[V_U].n++] = VAL(K_SEQ);
        v[V_U].v[v[V_U].n++] = VAL(K_LAYER);
        v[V_U].v[v[V_U].n++] = VAL(K_STREAM);
        v[V_U].v[v[V_U].n++] = VAL(K_SLOT);
        v[V_U].v[v[V_U].n++] = VAL(K_BYTES); /* null: -1, as as_int reads None */
        v[V_UPAGES].v[v[V_UPAGES].n++] = pages[0];
        v[V_UPAGES].v[v[V_UPAGES].n++] = pages[1];
        const Node *tn = &nodes[sfields[nd->a + at[K_TARGET]].node];
        const Node *rn = &nodes[sfields[nd->a + at[K_REASON]].node];
        int ti = name_of((const unsigned char *)lits[tn->a + VAL(K_TARGET)],
                         lit_len[tn->a + VAL(K_TARGET)], TARGETS, 2, -1);
        int ri = name_of((const unsigned char *)lits[rn->a + VAL(K_REASON)],
                         lit_len[rn->a + VAL(K_REASON)], REASONS, 5, 5);
        if (ti < 0) goto declined;
        v[V_UKEY].v[v[V_UKEY].n++] = ti * 8 + ri;
        break;
    }
    case EVICT:
        if (vec_reserve(&v[V_EPOS], 1) || vec_reserve(&v[V_ESLOT], 1)) goto error;
        v[V_EPOS].v[v[V_EPOS].n++] = pos;
        v[V_ESLOT].v[v[V_ESLOT].n++] = VAL(K_SLOT);
        break;
    case READ: {
        if (vec_reserve(&v[V_RPOS], 1) || vec_reserve(&v[V_R], 3) || vec_reserve(&v[V_RRUNS], 1) ||
            vec_reserve(&v[V_RCOUNTS], 3) || vec_reserve(&v[V_RANN], 1))
            goto error;
        v[V_RPOS].v[v[V_RPOS].n++] = pos;
        v[V_R].v[v[V_R].n++] = VAL(K_SEQ);
        v[V_R].v[v[V_R].n++] = VAL(K_LAYER);
        v[V_R].v[v[V_R].n++] = VAL(K_STREAM);
        Py_ssize_t nrun = 0, nann = 0;
        if (GIVEN(K_SERVED)) {
            Cur sc = {rec[at[K_SERVED]].at, cur->end};
            nrun = items(&sc, "iisi", &v[V_RUNS], &scratch_s, &scratch_n, &scratch_cap);
            if (nrun == -2) goto error;
            if (nrun < 0) goto declined;
            if (vec_reserve(&v[V_RUNSRC], nrun)) goto error;
            for (Py_ssize_t j = 0; j < nrun; j++) {
                int si = name_of(scratch_s[j], scratch_n[j], SOURCES, 3, -1);
                if (si < 0) goto declined;
                v[V_RUNSRC].v[v[V_RUNSRC].n++] = si;
            }
            /* items() gave begin, end, slot per run: the order add_events pushes them in */
        }
        v[V_RRUNS].v[v[V_RRUNS].n++] = nrun;
        if (nrun) {
            for (int j = 0; j < 3; j++) v[V_RCOUNTS].v[v[V_RCOUNTS].n++] = 0;
        } else {
            c->all_runs = 0;
            v[V_RCOUNTS].v[v[V_RCOUNTS].n++] = VAL(K_POOL);
            v[V_RCOUNTS].v[v[V_RCOUNTS].n++] = VAL(K_RING);
            v[V_RCOUNTS].v[v[V_RCOUNTS].n++] = VAL(K_HOST);
        }
        if (GIVEN(K_RANGES)) {
            /* begin, end, holder, version_lag, then the source and class codes */
            Py_ssize_t from = v[V_ANN].n;
            Cur rc = {rec[at[K_RANGES]].at, cur->end};
            nann = items(&rc, "iisisi", &v[V_ANN], &scratch_s, &scratch_n, &scratch_cap);
            if (nann == -2) goto error;
            if (nann < 0) goto declined;
            if (vec_reserve(&v[V_ANN], 2 * nann)) goto error;
            /* items() left 4 integers per range: spread them to 6 from the end backwards */
            int64_t *a = v[V_ANN].v + from;
            for (Py_ssize_t j = nann - 1; j >= 0; j--) {
                int64_t b0 = a[4 * j], b1 = a[4 * j + 1], h = a[4 * j + 2], lag = a[4 * j + 3];
                a[6 * j] = b0;
                a[6 * j + 1] = b1;
                a[6 * j + 2] = h;
                a[6 * j + 3] = lag;
                a[6 * j + 4] = name_of(scratch_s[2 * j], scratch_n[2 * j], SOURCES, 3, -1);
                a[6 * j + 5] = name_of(scratch_s[2 * j + 1], scratch_n[2 * j + 1], CLASSES, 4, -1);
            }
            v[V_ANN].n = from + 6 * nann;
        }
        v[V_RANN].v[v[V_RANN].n++] = nann;
        break;
    }
    case FITS:
        if (vec_reserve(&v[V_FPOS], 1) || vec_reserve(&v[V_FLAYER], 1) || vec_reserve(&v[V_FSEQ], 1) ||
            vec_reserve(&v[V_FROUTE], 1) || vec_reserve(&v[V_FRES], 1))
            goto error;
        v[V_FPOS].v[v[V_FPOS].n++] = pos;
        v[V_FLAYER].v[v[V_FLAYER].n++] = VAL(K_LAYER);
        v[V_FSEQ].v[v[V_FSEQ].n++] = VAL(K_SEQ);
        v[V_FROUTE].v[v[V_FROUTE].n++] = route;
        v[V_FRES].v[v[V_FRES].n++] = VAL(K_RESULT);
        break;
    case STEP:
    case MARK:
        break; /* their code and step are all the columns keep */
    case OUTPUT:
        if (vec_reserve(&v[V_OPOS], 1) || vec_reserve(&v[V_OSEQ], 1) ||
            vec_reserve(&v[V_OSTREAM], 1) || vec_reserve(&v[V_ODIV], 1))
            goto error;
        v[V_OPOS].v[v[V_OPOS].n++] = pos;
        v[V_OSEQ].v[v[V_OSEQ].n++] = VAL(K_SEQ);
        v[V_OSTREAM].v[v[V_OSTREAM].n++] = VAL(K_STREAM);
        v[V_ODIV].v[v[V_ODIV].n++] = 0;
        break;
    default:
        goto declined;
    }
#undef GIVEN
#undef VAL
    c->codes[c->n++] = (char)k;
    if (k == STEP) c->phase = decode;
    return k;
declined:
    for (int j = 0; j < NVEC; j++) v[j].n = saved[j];
    c->all_runs = saved_all_runs;
    return -1;
error:
    for (int j = 0; j < NVEC; j++) v[j].n = saved[j];
    c->all_runs = saved_all_runs;
    return -2;
}

/* The kind read here that the line [p, q) begins as ({"kind":"<tag>"), plus one; 0: none. */
static int begins_as_read(const unsigned char *p, const unsigned char *q) {
    static const char open[] = "{\"kind\":\"";
    Py_ssize_t n = (Py_ssize_t)sizeof open - 1;
    if (q - p < n || memcmp(p, open, (size_t)n) != 0) return 0;
    p += n;
    for (int i = 0; i < KINDS; i++) {
        const Root *R = &roots[i];
        if (R->node >= 0 && q - p > R->tag_len && memcmp(p, R->tag, (size_t)R->tag_len) == 0 &&
            p[R->tag_len] == '"')
            return i + 1;
    }
    return 0;
}

static int copy_name(PyObject *o, char *dst, Py_ssize_t *len) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(o, &n);
    if (!u) return -1;
    if (n >= LIT_LEN) {
        PyErr_SetString(PyExc_ValueError, "a name too long");
        return -1;
    }
    memcpy(dst, u, (size_t)n + 1);
    *len = n;
    return 0;
}

/* scan_configure(nodes, kids, fields, literals, roots): the model's description
 * (linescan.py): nodes (type, a, n); kids (node indices); fields (name, required, node);
 * literals (str); roots (code, tag, node, at: NK field indices, -1 where the kind's columns
 * do not need the key: linescan.py checks each needed one). Until it succeeds, scan()
 * takes nothing. */
static PyObject *scan_configure(PyObject *self, PyObject *args) {
    PyObject *nd, *kd, *fd, *ld, *rd;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyTuple_Type, &nd, &PyTuple_Type, &kd,
                          &PyTuple_Type, &fd, &PyTuple_Type, &ld, &PyTuple_Type, &rd))
        return NULL;
    scan_ready = 0;
    if (PyTuple_GET_SIZE(nd) > MAX_NODES || PyTuple_GET_SIZE(kd) > MAX_NODES ||
        PyTuple_GET_SIZE(fd) > MAX_FIELDS || PyTuple_GET_SIZE(ld) > MAX_LITS) {
        PyErr_SetString(PyExc_ValueError, "a description too large");
        return NULL;
    }
    n_nodes = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nd); i++) {
        Node *x = &nodes[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(nd, i), "iii", &x->type, &x->a, &x->n)) return NULL;
        if (x->type == S_STRUCT || x->type == S_ASTRUCT) {
            if (x->n > MAX_STRUCT || x->a < 0 || x->a + x->n > PyTuple_GET_SIZE(fd)) goto bad;
        } else if (x->type == S_TUPLE) {
            if (x->a < 0 || x->a + x->n > PyTuple_GET_SIZE(kd)) goto bad;
        } else if (x->type == S_LIT) {
            if (x->a < 0 || x->a + x->n > PyTuple_GET_SIZE(ld)) goto bad;
        } else if (x->type == S_VARTUPLE || x->type == S_OPT) {
            if (x->a < 0 || x->a >= PyTuple_GET_SIZE(nd)) goto bad;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kd); i++) {
        kids[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(kd, i));
        if (kids[i] < 0 || kids[i] >= PyTuple_GET_SIZE(nd)) goto bad;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fd); i++) {
        PyObject *name;
        SField *f = &sfields[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fd, i), "Uii", &name, &f->required, &f->node) ||
            copy_name(name, f->name, &f->len))
            return NULL;
        if (f->node < 0 || f->node >= PyTuple_GET_SIZE(nd)) goto bad;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ld); i++)
        if (copy_name(PyTuple_GET_ITEM(ld, i), lits[i], &lit_len[i])) return NULL;
    for (int i = 0; i < KINDS; i++) roots[i].node = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rd); i++) {
        int code, node;
        PyObject *tag, *at;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(rd, i), "iUiO!", &code, &tag, &node, &PyTuple_Type,
                              &at))
            return NULL;
        if (code < 0 || code >= KINDS || node < 0 || node >= PyTuple_GET_SIZE(nd) ||
            nodes[node].type != S_STRUCT || PyTuple_GET_SIZE(at) != NK)
            goto bad;
        Root *R = &roots[code];
        if (copy_name(tag, R->tag, &R->tag_len)) return NULL;
        for (int f = 0; f < NK; f++) {
            R->at[f] = (int)PyLong_AsLong(PyTuple_GET_ITEM(at, f));
            if (R->at[f] < -1 || R->at[f] >= nodes[node].n) goto bad; /* -1: not needed */
        }
        R->node = node;
    }
    n_nodes = (int)PyTuple_GET_SIZE(nd);
    json_init();
    scan_ready = 1;
    Py_RETURN_NONE;
bad:
    for (int i = 0; i < KINDS; i++) roots[i].node = -1;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a description out of bounds");
    return NULL;
}

#endif
