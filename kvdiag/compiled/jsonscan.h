/* JSON read straight from a line's bytes, for the C passes that take fields out of trace
 * lines without decoding them into objects (kvdiag/analysis/indexscan.c: the viewer's index
 * rows; kvdiag/analysis/judgement/linescan.h: the judgement's columns).
 *
 * Every function checks what it reads against JSON's grammar (RFC 8259) and answers 0 where it
 * is not sure: a caller then declines the line and leaves it to msgspec, which stays the
 * reference. Strings holding a control byte, a non-ASCII byte or a \u escape are declined (a
 * lone surrogate is an error to the decoder; UTF-8 is msgspec's to check). Integers of more
 * than JSON_INT_DIGITS digits, and any number with a fraction or exponent where an integer is
 * wanted (msgspec's strict int refuses a float), are declined. Nothing reads outside
 * [p, end). Call json_init() once before the first line.
 */
#ifndef KVDIAG_JSONSCAN_H
#define KVDIAG_JSONSCAN_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define INT_DIGITS 18 /* |value| < 10**18: no overflow in int64, and within +-2^62 */

/* bytes a string's scan stops at: the quote, a backslash, control and non-ASCII bytes */
static unsigned char STOP[256];

static void json_init(void) {
    for (int ch = 0; ch < 256; ch++) STOP[ch] = ch == '"' || ch == '\\' || ch < 0x20 || ch >= 0x80;
}

typedef struct {
    const unsigned char *p, *end; /* the line, without its newline */
} Cur;

static void ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static int is_digit(unsigned char ch) { return ch >= '0' && ch <= '9'; }

/* A string at c->p (the opening quote): its bytes between the quotes as [*s, *s + *n);
 * ``plain``: no backslash allowed (a field the index keeps). 0: declined. */
static int string(Cur *c, const unsigned char **s, Py_ssize_t *n, int plain) {
    if (c->p >= c->end || *c->p != '"') return 0;
    const unsigned char *q = ++c->p;
    while (q < c->end) {
        if (!STOP[*q]) {
            q++;
            continue;
        }
        unsigned char ch = *q;
        if (ch == '"') break;
        if (ch < 0x20 || ch >= 0x80) return 0;
        if (ch == '\\') {
            if (plain || q + 1 >= c->end) return 0;
            unsigned char e = q[1];
            /* \u escapes are declined: a lone surrogate is an error to the decoder */
            if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                  e == 'r' || e == 't'))
                return 0;
            q += 2;
            continue;
        }
        q++;
    }
    if (q >= c->end) return 0;
    *s = c->p;
    *n = q - c->p;
    c->p = q + 1;
    return 1;
}

/* A JSON number, checked against the grammar and skipped. ``short_ints``: an integer (no
 * fraction, no exponent) of more than INT_DIGITS digits is declined (a trace reader refuses a
 * line holding one beyond 64 bits anywhere, kvdiag/trace/reader.py _huge_integer). */
static int number(Cur *c, int short_ints) {
    const unsigned char *q = c->p;
    if (q < c->end && *q == '-') q++;
    if (q >= c->end || !is_digit(*q)) return 0;
    const unsigned char *digits = q;
    if (*q == '0') q++;
    else
        while (q < c->end && is_digit(*q)) q++;
    if (short_ints && q - digits > INT_DIGITS &&
        !(q < c->end && (*q == '.' || *q == 'e' || *q == 'E')))
        return 0;
    if (q < c->end && *q == '.') {
        q++;
        if (q >= c->end || !is_digit(*q)) return 0;
        while (q < c->end && is_digit(*q)) q++;
    }
    if (q < c->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < c->end && (*q == '+' || *q == '-')) q++;
        if (q >= c->end || !is_digit(*q)) return 0;
        while (q < c->end && is_digit(*q)) q++;
    }
    c->p = q;
    return 1;
}

/* An integer the index keeps: no fraction or exponent (the decoder's int refuses a float),
 * at most INT_DIGITS digits. */
static int integer(Cur *c, int64_t *out) {
    const unsigned char *q = c->p, *end = c->end;
    int neg = 0;
    if (q < end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= end) return 0;
    unsigned d = (unsigned)*q - '0';
    if (d > 9) return 0;
    int64_t v = (int64_t)d;
    q++;
    if (d) {
        /* at most INT_DIGITS digits: one more is declined */
        const unsigned char *lim = end - q > INT_DIGITS - 1 ? q + (INT_DIGITS - 1) : end;
        while (q < lim && (d = (unsigned)*q - '0') <= 9) {
            v = v * 10 + (int64_t)d;
            q++;
        }
        if (q < end && (unsigned)*q - '0' <= 9) return 0;
    }
    if (q < end && (*q == '.' || *q == 'e' || *q == 'E')) return 0;
    c->p = q;
    *out = neg ? -v : v;
    return 1;
}

static int literal(Cur *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* After an opening bracket: the container is empty (its closing bracket taken). */
static int empty(Cur *c, unsigned char close) {
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    return 0;
}

/* After an item: 1 another follows (the comma taken), 2 the container ends (its bracket
 * taken), 0 malformed. */
static int after_item(Cur *c, unsigned char close) {
    ws(c);
    if (c->p >= c->end) return 0;
    if (*c->p == ',') {
        c->p++;
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        return 2;
    }
    return 0;
}

/* An object's key and its colon. */
static int member(Cur *c, const unsigned char **s, Py_ssize_t *n, int plain) {
    ws(c);
    if (!string(c, s, n, plain)) return 0;
    ws(c);
    if (c->p >= c->end || *c->p != ':') return 0;
    c->p++;
    ws(c);
    return 1;
}

/* Any JSON value, checked and skipped (``short_ints``: as number()). */
static int value(Cur *c, int depth, int short_ints) {
    if (c->p >= c->end) return 0;
    unsigned char ch = *c->p;
    if (ch == '"') {
        const unsigned char *s;
        Py_ssize_t n;
        return string(c, &s, &n, 0);
    }
    if (ch == '-' || is_digit(ch)) return number(c, short_ints);
    if (ch == 't') return literal(c, "true");
    if (ch == 'f') return literal(c, "false");
    if (ch == 'n') return literal(c, "null");
    if (depth >= MAX_DEPTH) return 0;
    if (ch != '[' && ch != '{') return 0;
    unsigned char close = ch == '[' ? ']' : '}';
    c->p++;
    if (empty(c, close)) return 1;
    for (;;) {
        if (close == '}') {
            const unsigned char *s;
            Py_ssize_t n;
            if (!member(c, &s, &n, 0)) return 0;
        }
        ws(c);
        if (!value(c, depth + 1, short_ints)) return 0;
        int more = after_item(c, close);
        if (more != 1) return more == 2;
    }
}

static int pair(Cur *c, int64_t out[2]) {
    if (c->p >= c->end || *c->p != '[') return 0;
    c->p++;
    ws(c);
    if (!integer(c, &out[0])) return 0;
    ws(c);
    if (c->p >= c->end || *c->p != ',') return 0;
    c->p++;
    ws(c);
    if (!integer(c, &out[1])) return 0;
    ws(c);
    if (c->p >= c->end || *c->p != ']') return 0;
    c->p++;
    return 1;
}

static int boolean(Cur *c, int *out) {
    if (literal(c, "true")) *out = 1;
    else if (literal(c, "false")) *out = 0;
    else return 0;
    return 1;
}

#endif
