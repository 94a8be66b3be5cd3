/* kvtrace.h — write kvdiag traces (kvtrace format 1.2) from a C/C++/CUDA runtime.
 *
 * SPDX-License-Identifier: MIT
 * Copyright (c) 2026 the kvdiag authors
 *
 * Permission is hereby granted, free of charge, to any person obtaining a copy of this
 * software and associated documentation files (the "Software"), to deal in the Software
 * without restriction, including without limitation the rights to use, copy, modify, merge,
 * publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
 * to whom the Software is furnished to do so, subject to the following conditions:
 * The above copyright notice and this permission notice shall be included in all copies or
 * substantial portions of the Software.
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
 * INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
 * PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
 * FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
 * OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 * DEALINGS IN THE SOFTWARE.
 *
 * One header, libc + pthreads only (plus ggml.h / ggml-backend.h for the tensor-taking calls).
 * C99, C++17, and host code of .cu files. Field meanings: kvdiag docs/trace-format.md; where
 * each macro goes in a kv-stream runtime: kvdiag docs/native-bridge.md.
 *
 *   Off unless the environment variable KVTRACE_FILE is set (non-empty) when the first macro
 *   runs; "%p" in it becomes the process id, "%%" a percent sign. Off, every macro is one
 *   load of a global int and one not-taken branch; its arguments are never evaluated (the
 *   first call decides on/off before it evaluates anything).
 *   On, each event is formatted on the caller's stack and written with ONE write() to an
 *   O_APPEND descriptor while a mutex is held, so file order == seq order; lines are laid out
 *   so that a process killed at any instant leaves only complete lines (see KVTRACE_PAGE_:
 *   Linux can stop a write() between two file pages on SIGKILL, never inside one).
 *
 *   Tensor-taking calls (KVTRACE_FITS) and the abort hook (KVTRACE_INSTALL_ABORT_HOOK) exist
 *   only when ggml.h was included BEFORE this header (detected by GGML_MAX_DIMS), or when
 *   KVTRACE_WITH_GGML is defined (this header then includes "ggml.h" itself). Everything
 *   else, including KVTRACE_FITS_RAW, needs no ggml.
 *
 *   Process-wide state is one per process: its symbols are weak with default visibility, so
 *   copies from several translation units and shared objects (libggml-cuda.so, libllama.so)
 *   bind to one definition. Define KVTRACE_STATIC for per-translation-unit state (a
 *   single-TU program), KVTRACE_DISABLE to compile every macro away.
 *
 *   The header line says which event kinds the process can write ("records"): every macro
 *   expansion leaves its kinds in an ELF section (kvtrace_rec_12, an assembler directive, no
 *   code) that a constructor of each translation unit folds into the process-wide state, so what a fork compiles in -- in the
 *   program and in every shared object, dlopen()ed ones included -- is declared. Compilers or
 *   formats without named sections: KVTRACE_DECLARE("step write upload read ...").
 */
#ifndef KVTRACE_H
#define KVTRACE_H

#define KVTRACE_H_VERSION "1.2"

/* clock_gettime, O_CLOEXEC and gmtime_r are POSIX 2008: ask for it when nothing has decided
 * the feature set yet (strict -std=c99 with this header included first). */
#if !defined(__cplusplus) && !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) \
    && !defined(_DEFAULT_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_FEATURES_H)
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(CLOCK_MONOTONIC) || !defined(O_CLOEXEC)
#error "kvtrace.h needs POSIX 2008: compile with -D_POSIX_C_SOURCE=200809L (or -std=gnu99/gnu11), or include kvtrace.h before any system header"
#endif

#if defined(GGML_MAX_DIMS) || defined(KVTRACE_WITH_GGML)
#  ifndef GGML_MAX_DIMS
#    include "ggml.h"
#  endif
#  include "ggml-backend.h"
#  define KVTRACE_HAVE_GGML 1
#else
#  define KVTRACE_HAVE_GGML 0
#endif

#ifndef KVTRACE_LINE_MAX
/* bytes of one event line, on the caller's stack; longer arrays are cut and a warn event
 * (code "kvtrace-truncated") says how many elements were dropped */
#define KVTRACE_LINE_MAX 16384
#endif
#ifndef KVTRACE_READ_RUNS
/* served runs one kvtrace_read builder holds before it emits what it has as one read event */
#define KVTRACE_READ_RUNS 128
#endif
#ifndef KVTRACE_STRING_MAX
/* input bytes of one string argument that are logged; the rest is cut at a UTF-8 boundary */
#define KVTRACE_STRING_MAX 1024
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define KVTRACE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define KVTRACE_UNLIKELY(x) (x)
#endif

#if defined(KVTRACE_STATIC)
#  define KVTRACE_FN_ static __attribute__((unused))
#  define KVTRACE_VAR_ static __attribute__((unused))
#else
#  define KVTRACE_FN_ __attribute__((weak, visibility("default")))
#  define KVTRACE_VAR_ __attribute__((weak, visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- public types ----------------------------------------------------------------------- */

/* What KVTRACE_BOOT puts in the header line. Any int/int64 field < 0 or string NULL is left
 * out; start from kvtrace_plan_defaults() so unset fields are -1/NULL, not 0. */
typedef struct kvtrace_plan {
    const char *run_name, *build, *device_name;
    const char *layout;   /* "shared" | "per-stream" */
    const char *dispatch; /* "membership" | "fits" */
    int np, kv_unified;
    int64_t page_bytes, v_offset, pool_pages, resident_pages_per_layer, ring_slots, stage_bytes,
        kv_size;
    int streamed_layers, layers, n_stream, head_dim, n_head, n_head_kv;
    const char *type_k, *type_v;
    int64_t pages_per_stream; /* not in the first API draft; the format's plan names it */
} kvtrace_plan;

/* One tensor of a fits decision without ggml (KVTRACE_FITS_RAW). Strings may be NULL (""). */
typedef struct kvtrace_tensor {
    const char *name, *type;   /* type: ggml_type_name words, "f32", "f16", "q8_0", ... */
    const char *buffer;        /* buffer TYPE name: "CUDA0", "CUDA_KV_Stream_Host", "" */
    const char *buffer_name;   /* ggml_backend_buffer_name of the tensor's buffer, "" */
    int64_t ne[4];
    uint64_t nb[4];
    uint64_t data, view_offs, base; /* base: data of view_src, or of the tensor itself */
    uint64_t runtime;          /* kv-stream runtime handle; 0 = none (null) */
    int contiguous;
} kvtrace_tensor;

enum { KVTRACE_POOL = 0, KVTRACE_RING = 1, KVTRACE_HOST = 2 };

/* What the header line's "records" lists: the event kinds this process can write, decided
 * by the macros compiled in (KVTRACE_R_*_ bits, names in kvtrace_record_names_), plus
 * "mark.outside" when KVTRACE_MARK_OUTSIDE is used (KVTRACE_MARK leaves `outside` out). */
#define KVTRACE_R_STEP_ (1u << 0)
#define KVTRACE_R_LEARN_ (1u << 1)
#define KVTRACE_R_FITS_ (1u << 2)
#define KVTRACE_R_WRITE_ (1u << 3)
#define KVTRACE_R_MARK_ (1u << 4)
#define KVTRACE_R_UPLOAD_ (1u << 5)
#define KVTRACE_R_INVALIDATE_ (1u << 6)
#define KVTRACE_R_READ_ (1u << 7)
#define KVTRACE_R_ABORT_ (1u << 8)
#define KVTRACE_R_WARN_ (1u << 9)
#define KVTRACE_R_OUTPUT_ (1u << 10)
#define KVTRACE_R_REPARTITION_ (1u << 11)
#define KVTRACE_R_ADAPT_ (1u << 12)
#define KVTRACE_R_END_ (1u << 13)
#define KVTRACE_R_MARK_OUTSIDE_ (1u << 14)
#define KVTRACE_R_COUNT_ 15
/* the writer itself can always write these: warn (kvtrace-truncated, -bad-arg) and end (exit) */
#define KVTRACE_R_ALWAYS_ (KVTRACE_R_WARN_ | KVTRACE_R_END_)

typedef struct kvtrace_read_run_ {
    int64_t begin, end, slot;
    int source;
} kvtrace_read_run_;

/* Builder of one read event, on the caller's stack (KVTRACE_READ_BEGIN/PAGE/END). `seq` is
 * the seq of the last read event it wrote (set by KVTRACE_READ_END), so a runtime can tie its
 * own records to the trace; while tracing is off no macro touches the builder, so zero it
 * first (`kvtrace_read r = {0};`, C++ `kvtrace_read r{};`) if you read `seq`. */
typedef struct kvtrace_read {
    int64_t layer, stream;
    int64_t count[3];
    int n;
    kvtrace_read_run_ runs[KVTRACE_READ_RUNS];
    int64_t seq;
} kvtrace_read;

/* ---- process-wide state (one per process, see the top comment) ---------------------------- */

typedef struct kvtrace_bounded_ kvtrace_bounded_; /* rotation / flight recorder, below */

typedef struct kvtrace_state_12_ {
    pthread_mutex_t lock;
    int inited, header_done, ended, fd;
    int64_t seq, step, t0, stage_bytes, offset;
    long pid;
    void (*abort_prev)(const char *);
    int abort_installed;
    uint32_t records;     /* KVTRACE_R_*_ bits declared so far */
    int records_declared; /* 0: nothing declared (no sections, no KVTRACE_DECLARE) */
    kvtrace_bounded_ *bd; /* NULL: plain tracing (no KVTRACE_MAX_MB / KVTRACE_RING_MB) */
} kvtrace_state_12_;

/* -1: not decided yet (the next macro decides), 0: off, 1: on. */
KVTRACE_VAR_ int kvtrace_12_enabled = -1;
KVTRACE_VAR_ kvtrace_state_12_ kvtrace_12_state = {
    PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, -1, 0, -1, 0, 0, 0, 0, 0, 0, 0u, 0, 0};
/* The state this copy of the writer uses: 0 = its own, else the address of the one that opened
 * the trace, when this copy could not bind to it (see kvtrace_adopt_). An integer, not a
 * pointer: nvcc's front end (cudafe++ 13.0) crashes on __atomic_load_n of a pointer. */
KVTRACE_VAR_ uintptr_t kvtrace_12_owner = 0;
static inline kvtrace_state_12_ *kvtrace_s_(void) {
    uintptr_t owner = __atomic_load_n(&kvtrace_12_owner, __ATOMIC_ACQUIRE);
    return owner ? (kvtrace_state_12_ *)owner : &kvtrace_12_state;
}
#define KVTRACE_S_() kvtrace_s_()

KVTRACE_FN_ int kvtrace_12_start(void);

/* The decision before the arguments: a macro's call (and so its arguments) runs only when
 * tracing is on. Off is one relaxed load and one untaken branch; -1 ("not decided") and 1 go
 * to kvtrace_on_slow_, where the first call of the process decides. */
static inline int kvtrace_on_slow_(void) {
    int on = __atomic_load_n(&kvtrace_12_enabled, __ATOMIC_ACQUIRE);
    return on < 0 ? kvtrace_12_start() : on;
}
#define KVTRACE_ON_()                                                                          \
    (KVTRACE_UNLIKELY(__atomic_load_n(&kvtrace_12_enabled, __ATOMIC_RELAXED) != 0) &&           \
     kvtrace_on_slow_())

/* ---- line formatting (stack buffer; no allocation) ------------------------------------------ */

/* Line layout on disk. Each write() is "<pad>\n<event JSON>": the newline that ends the
 * previous line is written with the next event (the last event of a file written by END,
 * the abort hook or exit gets its own newline). Linux copies a buffered write() into the page
 * cache one page-sized chunk at a time and checks for a fatal signal before each chunk
 * (mm/filemap.c, generic_perform_write), so a line that crossed a 4 KiB file page could be
 * cut by SIGKILL (seen: 2 kills in 60, each cut at a multiple of 4096; with large folios the
 * chunks are larger and still page-aligned). When "\n<event>" would cross one, <pad> spaces fill
 * the rest of the page first: trailing blanks of the previous line, which JSON ignores, and a
 * cut between the pages leaves only them. Lines longer than 4 KiB can still be cut.
 *
 * The body is formatted after a gap of KVTRACE_GAP_ bytes; under the lock the prefix
 * \n{"kind":..,"seq":..,"t_ns":..,"step":.. goes right-aligned into the gap, and the pad before
 * it. */
#define KVTRACE_PAGE_ 4096
#define KVTRACE_PREFIX_ 112
#define KVTRACE_GAP_ (KVTRACE_PAGE_ + KVTRACE_PREFIX_)
#define KVTRACE_RESERVE_ 8
#define KVTRACE_TAIL_ 256

typedef struct kvtrace_buf_ {
    char *p, *end; /* end leaves KVTRACE_RESERVE_ bytes for the closing brace */
    int over;
} kvtrace_buf_;

static inline void kvtrace_put_(kvtrace_buf_ *b, const char *s, size_t n) {
    if (b->over || (size_t)(b->end - b->p) < n) {
        b->over = 1;
        return;
    }
    memcpy(b->p, s, n);
    b->p += n;
}

#define KVTRACE_LIT_(b, s) kvtrace_put_((b), (s), sizeof(s) - 1)

/* strnlen's result, by hand: GCC 12 at -O1 in the gnu dialects warns
 * (-Wstringop-overread, an error under -Werror) on strnlen(s, max) when it can see a literal
 * shorter than max flowing into s, although strnlen stops at the NUL. */
static inline size_t kvtrace_strnlen_(const char *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n]) n++;
    return n;
}

/* Decimal digits of v at out (up to 20), two at a time from the right; returns the count.
 * Numbers are most of every event, so this is the formatter's hot loop. */
static inline size_t kvtrace_u64_text_(char *out, uint64_t v) {
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    size_t n = 1;
    uint64_t t = 10;
    char *p;
    while (n < 20 && v >= t) {
        n++;
        t *= 10u;
    }
    p = out + n;
    while (v >= 100u) {
        unsigned r = (unsigned)(v % 100u);
        v /= 100u;
        p -= 2;
        p[0] = pairs[2 * r];
        p[1] = pairs[2 * r + 1];
    }
    if (v >= 10u) {
        p -= 2;
        p[0] = pairs[2 * v];
        p[1] = pairs[2 * v + 1];
    } else {
        *--p = (char)('0' + (int)v);
    }
    return n;
}

static inline void kvtrace_u64_(kvtrace_buf_ *b, uint64_t v) {
    if (b->over || b->end - b->p < 20) {
        char t[24];
        kvtrace_put_(b, t, kvtrace_u64_text_(t, v));
        return;
    }
    b->p += kvtrace_u64_text_(b->p, v);
}

static inline void kvtrace_i64_(kvtrace_buf_ *b, int64_t v) {
    if (v < 0) {
        KVTRACE_LIT_(b, "-");
        kvtrace_u64_(b, 0u - (uint64_t)v);
    } else {
        kvtrace_u64_(b, (uint64_t)v);
    }
}

/* v < 0 -> null (the API's "unknown" for counts and ids) */
static inline void kvtrace_i64_or_null_(kvtrace_buf_ *b, int64_t v) {
    if (v < 0) KVTRACE_LIT_(b, "null");
    else kvtrace_i64_(b, v);
}

static inline void kvtrace_bool_(kvtrace_buf_ *b, int v) {
    if (v) KVTRACE_LIT_(b, "true");
    else KVTRACE_LIT_(b, "false");
}

/* negative, NaN or infinite -> null; otherwise %.17g with the decimal point forced to '.'
 * whatever LC_NUMERIC says (JSON has one decimal point). */
static inline void kvtrace_f64_or_null_(kvtrace_buf_ *b, double v) {
    char t[40];
    int n, i;
    if (!(v >= 0.0) || v - v != 0.0) {
        KVTRACE_LIT_(b, "null");
        return;
    }
    n = snprintf(t, sizeof t, "%.17g", v);
    if (n <= 0 || n >= (int)sizeof t) {
        KVTRACE_LIT_(b, "null");
        return;
    }
    for (i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= '0' && c <= '9') || c == 'e' || c == 'E' || c == '+' || c == '-')) t[i] = '.';
    }
    kvtrace_put_(b, t, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (at most `left` bytes), 0 if invalid. */
static inline size_t kvtrace_utf8_len_(const unsigned char *s, size_t left) {
    unsigned char c = s[0];
    size_t n, i;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (left < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* A JSON string: quotes, backslash and control characters escaped, invalid UTF-8 replaced
 * by U+FFFD, at most `max` input bytes, and cut at a character boundary when the line is
 * full (the string is still closed). NULL -> "". */
static inline void kvtrace_str_(kvtrace_buf_ *b, const char *str, size_t max) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)(str ? str : "");
    size_t i = 0;
    if (b->over || b->end - b->p < 2) {
        b->over = 1;
        return;
    }
    *b->p++ = '"';
    while (i < max && s[i]) {
        char esc[8];
        size_t run = 0, room;
        /* printable ASCII without quote or backslash goes through in one copy */
        while (i + run < max && s[i + run] >= 0x20 && s[i + run] < 0x7F && s[i + run] != '"' &&
               s[i + run] != '\\')
            run++;
        if (run) {
            room = (size_t)(b->end - b->p) - 1; /* keep room for the closing quote */
            if (run > room) run = room;
            memcpy(b->p, s + i, run);
            b->p += run;
            i += run;
            if (!room || run == room) break;
            continue;
        }
        const char *out = esc;
        size_t n = 1, take = 1;
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            n = 2;
        } else if (c == '\n') {
            esc[0] = '\\'; esc[1] = 'n'; n = 2;
        } else if (c == '\t') {
            esc[0] = '\\'; esc[1] = 't'; n = 2;
        } else if (c == '\r') {
            esc[0] = '\\'; esc[1] = 'r'; n = 2;
        } else if (c < 0x20 || c == 0x7F) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        } else if (c < 0x80) {
            esc[0] = (char)c;
        } else {
            size_t left = max - i, len;
            len = kvtrace_utf8_len_(s + i, left < 4 ? left : 4);
            if (len) {
                out = (const char *)(s + i);
                n = take = len;
            } else {
                out = "\xEF\xBF\xBD";
                n = 3;
            }
        }
        if ((size_t)(b->end - b->p) < n + 1) break; /* keep room for the closing quote */
        memcpy(b->p, out, n);
        b->p += n;
        i += take;
    }
    *b->p++ = '"';
}

/* ,"key": -- key is always a string literal, so this is one copy of a constant */
#define KVTRACE_KEY_(b, key) KVTRACE_LIT_((b), ",\"" key "\":")

#define KVTRACE_KEYSTR_(b, k, s) (KVTRACE_KEY_((b), k), kvtrace_str_((b), (s), KVTRACE_STRING_MAX))
#define KVTRACE_KEYI_(b, k, v) (KVTRACE_KEY_((b), k), kvtrace_i64_((b), (int64_t)(v)))
#define KVTRACE_KEYU_(b, k, v) (KVTRACE_KEY_((b), k), kvtrace_u64_((b), (uint64_t)(v)))
#define KVTRACE_KEYB_(b, k, v) (KVTRACE_KEY_((b), k), kvtrace_bool_((b), (v)))

static inline void kvtrace_pair_(kvtrace_buf_ *b, int64_t x, int64_t y) {
    KVTRACE_LIT_(b, "[");
    kvtrace_i64_(b, x);
    KVTRACE_LIT_(b, ",");
    kvtrace_i64_(b, y);
    KVTRACE_LIT_(b, "]");
}

/* Appends one array element; on overflow rolls the element back and reports it (the caller
 * stops and counts the rest as dropped). */
static inline int kvtrace_elem_ok_(kvtrace_buf_ *b, char *mark) {
    /* an array stops KVTRACE_TAIL_ bytes early: the fields after it always fit */
    if (!b->over && b->end - b->p >= KVTRACE_TAIL_) return 1;
    b->p = mark;
    b->over = 0;
    return 0;
}

static inline int kvtrace_is_one_of_(const char *s, const char *const *words) {
    if (!s) return 0;
    for (; *words; words++)
        if (strcmp(s, *words) == 0) return 1;
    return 0;
}

/* ---- the writer (weak: one per process) ------------------------------------------------------ */

KVTRACE_FN_ int64_t kvtrace_12_now(void);
KVTRACE_FN_ int64_t kvtrace_12_commit(const char *kind, char *line, kvtrace_buf_ *b,
                                      int advance);
typedef struct kvtrace_op_ kvtrace_op_;
KVTRACE_FN_ int64_t kvtrace_12_commit_op(const char *kind, char *line, kvtrace_buf_ *b,
                                         int advance, const kvtrace_op_ *op);
KVTRACE_FN_ void kvtrace_12_end(const char *status, const char *reason);
KVTRACE_FN_ void kvtrace_12_warn(const char *code, const char *message);
KVTRACE_FN_ void kvtrace_12_warn_layer(const char *code, int64_t layer, const char *message);
KVTRACE_FN_ void kvtrace_12_add_records(uint32_t bits);
KVTRACE_FN_ void kvtrace_12_atexit(void);
KVTRACE_FN_ void kvtrace_12_atfork_child(void);

KVTRACE_FN_ int64_t kvtrace_12_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Writes everything; a short write is continued (never seen for a regular file), EINTR is
 * retried. Returns 0 on failure. */
static inline int kvtrace_write_all_(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            return 0;
        }
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

static inline void kvtrace_stderr_(const char *a, const char *b2, const char *c) {
    /* write(), not stdio: this also runs from the abort path */
    if (a) { ssize_t r = write(2, a, strlen(a)); (void)r; }
    if (b2) { ssize_t r = write(2, b2, strlen(b2)); (void)r; }
    if (c) { ssize_t r = write(2, c, strlen(c)); (void)r; }
}

static inline void kvtrace_fail_(kvtrace_state_12_ *S) {
    int err = errno;
    S->ended = 1;
    __atomic_store_n(&kvtrace_12_enabled, 0, __ATOMIC_RELAXED);
    kvtrace_stderr_("kvtrace: write failed: ", strerror(err), "; tracing off\n");
}

/* ---- bounded traces: rotation into segments, and the flight recorder ------------------------ *
 *
 * Both are off unless asked for in the environment, read once when the trace is opened
 * (docs/native-bridge.md, "Bounded traces"):
 *   KVTRACE_MAX_MB=M   rotation: the trace is a set of numbered segments <stem>.NNNNNN.kvtrace
 *                      (KVTRACE_FILE <stem>.kvtrace, or any name: the number goes before a
 *                      .kvtrace ending, else after the name); a new segment is started before
 *                      the first step event once the current one holds M MB (2 M MB at any
 *                      event, for a writer without step events or with one huge step).
 *   KVTRACE_KEEP=K     with rotation: keep the newest K segments, delete older ones (and their
 *                      .zst); 0 or unset keeps all.
 *   KVTRACE_RING_MB=N  flight recorder: events are kept in N MB of memory instead of the file,
 *                      and written (header, snapshot, events, end) at KVTRACE_END, exit(), an
 *                      abort through the ggml hook or KVTRACE_ABORT, and SIGSEGV, SIGBUS, SIGILL,
 *                      SIGFPE or SIGABRT (that path only calls write()). Wins over KVTRACE_MAX_MB.
 * M and N may have a fraction ("0.25"); a segment is at least 4 KiB, half the ring at least
 * two of the longest events (2 KVTRACE_LINE_MAX + 8 KiB, 40 KiB by default).
 *
 * A segment (and a flight recorder's window) starts with a header line and a `snapshot` event:
 * what the judgement needs to judge it alone -- what every pool and ring slot holds (layer,
 * stream, page, the host page's version when copied, the upload's step and seq), the host
 * version of every page written, the views whose ring copies still wait for their read, and the
 * partition of the last repartition. So the header shadows those while a bounded mode is on:
 * 4 bytes per host page ever written, 32 per slot ever filled, about 40 per (layer, stream),
 * allocated as they first appear (a failed allocation stops snapshots: no more rotation, and
 * a flight recorder keeps its current window). Plain tracing keeps no shadow. */

#define KVTRACE_MAX_PAGE_ (1 << 20) /* kvdiag's judgement believes no page beyond (MAX_PAGE) */
#define KVTRACE_MAX_SLOT_ (1 << 22) /* ... nor slot (MAX_SLOT) */
#define KVTRACE_SEG_MAX_ 999999     /* six digits: a glob sorts the segments in order */
#define KVTRACE_HEAD_MAX_ 8192      /* the header line, as kvtrace_header_locked_ builds it */
#define KVTRACE_N_SIGNALS_ 5

typedef struct kvtrace_copy_ {
    int32_t layer, stream, page; /* page < 0: the slot holds nothing */
    uint32_t version;
    int64_t step, seq;
} kvtrace_copy_;

typedef struct kvtrace_view_ {
    int32_t layer, stream, used, ring_pending;
    uint32_t *ver;
    int64_t n;
} kvtrace_view_;

struct kvtrace_bounded_ {
    int flight;
    int64_t max_bytes, keep, mb_milli;
    int64_t seg_index;
    char base[4096]; /* segment path before its number */
    size_t base_len;
    char suffix[16]; /* after its number: ".kvtrace" */
    char run[48];
    char head[KVTRACE_HEAD_MAX_]; /* the header line up to its "extra" */
    size_t head_len;
    int anchor;      /* descriptor published for adoption: the trace's folder */
    int failed;      /* the shadow could not grow: no more snapshots */
    int64_t dropped; /* flight recorder: events that did not fit after a failure */
    kvtrace_view_ *views;
    int64_t n_views, cap_views; /* open addressing; cap a power of 2 */
    kvtrace_view_ *last_view;   /* a write, its upload and its read name one view in a row */
    kvtrace_copy_ *slots[2];    /* 0: pool (resident), 1: ring */
    int64_t n_slots[2];
    int64_t resident, ring; /* partition of the last repartition; -1 unknown */
    char *snap;
    size_t snap_cap;
    char *chunk[2];
    size_t chunk_cap, used[2];
    int64_t chunk_seq[2];
    int active;
    char dump[KVTRACE_HEAD_MAX_ + 1024];
    struct sigaction old[KVTRACE_N_SIGNALS_];
};

static const int kvtrace_signals_[KVTRACE_N_SIGNALS_] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static const char *const kvtrace_signal_names_[KVTRACE_N_SIGNALS_] = {
    "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};

/* What an event changes in the shadow (filled by the event's builder, applied under the lock
 * right after the event is written, so a snapshot holds exactly the events before it). */
enum {
    KVTRACE_OP_WRITE_ = 1, /* layer, stream, cell0, cell1 */
    KVTRACE_OP_UPLOAD_,    /* layer, stream, page0, page1, slot, ring */
    KVTRACE_OP_READ_,      /* layer, stream */
    KVTRACE_OP_INVALIDATE_,
    KVTRACE_OP_PARTITION_ /* resident, ring */
};
struct kvtrace_op_ {
    int what;
    int64_t a[6];
};

/* "0.25" -> milli-MB; 0 for anything else (no locale: LC_NUMERIC may say ',') */
static inline int64_t kvtrace_milli_(const char *s) {
    int64_t whole = 0, frac = 0, scale = 1000;
    if (!s || !*s) return 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        whole = whole * 10 + (*s - '0');
        if (whole > 1000000000) return 0;
    }
    if (*s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++)
            if (scale > 1) frac += (scale /= 10) * (*s - '0');
    return *s ? 0 : whole * 1000 + frac;
}

static inline void kvtrace_seg_path_(const kvtrace_bounded_ *B, int64_t index, int zst, char *out) {
    char digits[24];
    size_t n = B->base_len, d = kvtrace_u64_text_(digits, (uint64_t)index), i;
    memcpy(out, B->base, n);
    for (i = d; i < 6; i++) out[n++] = '0';
    memcpy(out + n, digits, d);
    n += d;
    memcpy(out + n, B->suffix, strlen(B->suffix));
    n += strlen(B->suffix);
    if (zst) {
        memcpy(out + n, ".zst", 4);
        n += 4;
    }
    out[n] = 0;
}

static inline kvtrace_view_ *kvtrace_view_of_(kvtrace_bounded_ *B, int64_t layer, int64_t stream,
                                              int create) {
    uint64_t h, mask;
    kvtrace_view_ *v = B->last_view;
    if (v && v->layer == layer && v->stream == stream) return v;
    if (layer != (int32_t)layer || stream != (int32_t)stream) return NULL;
    if (create && (B->n_views + 1) * 2 > B->cap_views) {
        int64_t cap = B->cap_views ? B->cap_views * 2 : 64, i;
        kvtrace_view_ *grown = (kvtrace_view_ *)calloc((size_t)cap, sizeof *grown), *old = B->views;
        if (!grown) {
            B->failed = 1;
            return NULL;
        }
        for (i = 0; i < B->cap_views; i++) {
            if (!old[i].used) continue;
            h = ((uint64_t)(uint32_t)old[i].layer * 2654435761u) ^ (uint32_t)old[i].stream;
            while (grown[h & (uint64_t)(cap - 1)].used) h++;
            grown[h & (uint64_t)(cap - 1)] = old[i];
        }
        free(old);
        B->views = grown;
        B->cap_views = cap;
        B->last_view = NULL;
    }
    if (!B->cap_views) return NULL;
    mask = (uint64_t)(B->cap_views - 1);
    h = ((uint64_t)(uint32_t)layer * 2654435761u) ^ (uint32_t)stream;
    for (;; h++) {
        v = &B->views[h & mask];
        if (!v->used) {
            if (!create) return NULL;
            v->used = 1;
            v->layer = (int32_t)layer;
            v->stream = (int32_t)stream;
            B->n_views++;
            return B->last_view = v;
        }
        if (v->layer == layer && v->stream == stream) return B->last_view = v;
    }
}

static inline int kvtrace_view_grow_(kvtrace_bounded_ *B, kvtrace_view_ *v, int64_t end) {
    int64_t cap = v->n ? v->n : 16;
    uint32_t *grown;
    if (end <= v->n) return 1;
    while (cap < end) cap *= 2;
    grown = (uint32_t *)realloc(v->ver, (size_t)cap * sizeof *grown);
    if (!grown) {
        B->failed = 1;
        return 0;
    }
    memset(grown + v->n, 0, (size_t)(cap - v->n) * sizeof *grown);
    v->ver = grown;
    v->n = cap;
    return 1;
}

static inline int kvtrace_slots_grow_(kvtrace_bounded_ *B, int ring, int64_t end) {
    int64_t have = B->n_slots[ring], cap = have ? have : 16, i;
    kvtrace_copy_ *grown;
    if (end <= have) return 1;
    while (cap < end) cap *= 2;
    grown = (kvtrace_copy_ *)realloc(B->slots[ring], (size_t)cap * sizeof *grown);
    if (!grown) {
        B->failed = 1;
        return 0;
    }
    for (i = have; i < cap; i++) grown[i].page = -1;
    B->slots[ring] = grown;
    B->n_slots[ring] = cap;
    return 1;
}

/* The shadow follows kvdiag's judgement (kvdiag/analysis/judgement/slots.py, judge.py): a
 * write bumps the version of every page its cells touch, an upload copies the pages' current
 * versions into consecutive slots of its target, invalidate empties every slot, a read ends its
 * view's ring batch; events the judgement would not believe change nothing here either. */
static inline void kvtrace_shadow_apply_(kvtrace_bounded_ *B, const kvtrace_op_ *op, int64_t seq,
                                         int64_t step) {
    const int64_t *a = op->a;
    kvtrace_view_ *v;
    int64_t i;
    if (B->failed) return;
    switch (op->what) {
    case KVTRACE_OP_WRITE_: {
        int64_t p0, p1;
        if (a[3] <= a[2] || a[2] < 0) return;
        p0 = a[2] / 256;
        p1 = (a[3] - 1) / 256 + 1;
        if (p1 > KVTRACE_MAX_PAGE_) return;
        v = kvtrace_view_of_(B, a[0], a[1], 1);
        if (!v || !kvtrace_view_grow_(B, v, p1)) return;
        for (i = p0; i < p1; i++) v->ver[i]++;
        return;
    }
    case KVTRACE_OP_UPLOAD_: {
        int64_t n = a[3] - a[2];
        int ring = a[5] ? 1 : 0;
        if (n <= 0 || a[2] < 0 || a[3] > KVTRACE_MAX_PAGE_ || a[4] < 0 ||
            a[4] > KVTRACE_MAX_SLOT_ - n)
            return;
        v = kvtrace_view_of_(B, a[0], a[1], 1);
        if (!v || !kvtrace_view_grow_(B, v, a[3]) || !kvtrace_slots_grow_(B, ring, a[4] + n))
            return;
        for (i = 0; i < n; i++) {
            kvtrace_copy_ *c = &B->slots[ring][a[4] + i];
            c->layer = (int32_t)a[0];
            c->stream = (int32_t)a[1];
            c->page = (int32_t)(a[2] + i);
            c->version = v->ver[a[2] + i];
            c->step = step;
            c->seq = seq;
        }
        if (ring) v->ring_pending = 1;
        return;
    }
    case KVTRACE_OP_READ_:
        v = kvtrace_view_of_(B, a[0], a[1], 0);
        if (v) v->ring_pending = 0;
        return;
    case KVTRACE_OP_INVALIDATE_: {
        int r;
        for (r = 0; r < 2; r++)
            for (i = 0; i < B->n_slots[r]; i++) B->slots[r][i].page = -1;
        for (i = 0; i < B->cap_views; i++) B->views[i].ring_pending = 0;
        return;
    }
    case KVTRACE_OP_PARTITION_:
        B->resident = a[0];
        B->ring = a[1];
        return;
    default:
        return;
    }
}

static inline void kvtrace_slot_runs_(kvtrace_buf_ *b, const kvtrace_copy_ *s, int64_t n) {
    int64_t i = 0, j, k, runs = 0;
    while (i < n) {
        if (s[i].page < 0) {
            i++;
            continue;
        }
        for (j = i + 1; j < n && s[j].page == s[j - 1].page + 1 && s[j].layer == s[i].layer &&
                        s[j].stream == s[i].stream && s[j].seq == s[i].seq;
             j++) {
        }
        if (runs++) KVTRACE_LIT_(b, ",");
        KVTRACE_LIT_(b, "[");
        kvtrace_i64_(b, i);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, s[i].layer);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, s[i].stream);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, s[i].page);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, s[i].step);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, s[i].seq);
        KVTRACE_LIT_(b, ",[");
        for (k = i; k < j; k++) {
            if (k > i) KVTRACE_LIT_(b, ",");
            kvtrace_u64_(b, s[k].version);
        }
        KVTRACE_LIT_(b, "]]");
        i = j;
    }
}

/* "\n{snapshot event}" into B->snap (grown as needed); 0 when memory ran out. */
static inline int kvtrace_snapshot_text_(kvtrace_state_12_ *S, kvtrace_bounded_ *B, int64_t seq,
                                         int64_t step, const char *reason, size_t *len) {
    for (;;) {
        kvtrace_buf_ b;
        int64_t i, k, first;
        if (B->snap_cap < 4096 || !B->snap) {
            free(B->snap);
            B->snap_cap = 1 << 16;
            B->snap = (char *)malloc(B->snap_cap);
            if (!B->snap) break;
        }
        b.p = B->snap;
        b.end = B->snap + B->snap_cap - KVTRACE_RESERVE_;
        b.over = 0;
        KVTRACE_LIT_(&b, "\n{\"kind\":\"snapshot\"");
        KVTRACE_KEYI_(&b, "seq", seq);
        KVTRACE_KEYI_(&b, "t_ns", kvtrace_12_now() - S->t0);
        KVTRACE_KEYI_(&b, "step", step < 0 ? 0 : step);
        KVTRACE_KEYSTR_(&b, "reason", reason);
        KVTRACE_LIT_(&b, ",\"versions\":[");
        first = 1;
        for (i = 0; i < B->cap_views; i++) {
            const kvtrace_view_ *v = &B->views[i];
            int64_t lo = 0, hi = v->n;
            if (!v->used) continue;
            while (lo < hi && !v->ver[lo]) lo++;
            while (hi > lo && !v->ver[hi - 1]) hi--;
            if (lo == hi) continue;
            if (!first) KVTRACE_LIT_(&b, ",");
            first = 0;
            KVTRACE_LIT_(&b, "[");
            kvtrace_i64_(&b, v->layer);
            KVTRACE_LIT_(&b, ",");
            kvtrace_i64_(&b, v->stream);
            KVTRACE_LIT_(&b, ",");
            kvtrace_i64_(&b, lo);
            KVTRACE_LIT_(&b, ",[");
            for (k = lo; k < hi; k++) {
                if (k > lo) KVTRACE_LIT_(&b, ",");
                kvtrace_u64_(&b, v->ver[k]);
            }
            KVTRACE_LIT_(&b, "]]");
        }
        KVTRACE_LIT_(&b, "],\"pool\":[");
        kvtrace_slot_runs_(&b, B->slots[0], B->n_slots[0]);
        KVTRACE_LIT_(&b, "],\"ring\":[");
        kvtrace_slot_runs_(&b, B->slots[1], B->n_slots[1]);
        KVTRACE_LIT_(&b, "],\"ring_pending\":[");
        first = 1;
        for (i = 0; i < B->cap_views; i++) {
            if (!B->views[i].used || !B->views[i].ring_pending) continue;
            if (!first) KVTRACE_LIT_(&b, ",");
            first = 0;
            kvtrace_pair_(&b, B->views[i].layer, B->views[i].stream);
        }
        KVTRACE_LIT_(&b, "]");
        if (B->resident >= 0 || B->ring >= 0) {
            KVTRACE_LIT_(&b, ",\"partition\":{\"resident\":");
            kvtrace_i64_or_null_(&b, B->resident);
            KVTRACE_LIT_(&b, ",\"ring\":");
            kvtrace_i64_or_null_(&b, B->ring);
            KVTRACE_LIT_(&b, "}");
        }
        b.end += KVTRACE_RESERVE_;
        KVTRACE_LIT_(&b, "}");
        if (!b.over) {
            *len = (size_t)(b.p - B->snap);
            return 1;
        }
        if (B->snap_cap > ((size_t)1 << 30)) break;
        B->snap_cap *= 2;
        free(B->snap);
        B->snap = (char *)malloc(B->snap_cap);
        if (!B->snap) break;
    }
    B->snap_cap = 0;
    B->failed = 1;
    return 0;
}

static inline void kvtrace_records_json_(kvtrace_buf_ *b, uint32_t bits);

/* ,"extra":{"segment":{...}},"records":[...]} -- the end of every header line of a bounded
 * trace (and of a plain one: ,"extra":{}...). No allocation, no lock: the signal path uses it. */
static inline void kvtrace_head_tail_(const kvtrace_state_12_ *S, kvtrace_buf_ *b,
                                      int64_t first_seq) {
    const kvtrace_bounded_ *B = S->bd;
    KVTRACE_LIT_(b, ",\"extra\":{");
    if (B) {
        KVTRACE_LIT_(b, "\"segment\":{\"run\":");
        kvtrace_str_(b, B->run, sizeof B->run);
        KVTRACE_KEYI_(b, "first_seq", first_seq);
        if (B->flight) {
            KVTRACE_KEYSTR_(b, "mode", "flight-recorder");
            KVTRACE_KEYI_(b, "ring_kb", B->mb_milli * 1024 / 1000);
            if (B->dropped) KVTRACE_KEYI_(b, "dropped", B->dropped);
        } else {
            KVTRACE_KEYSTR_(b, "mode", "rotate");
            KVTRACE_KEYI_(b, "index", B->seg_index);
            KVTRACE_KEYI_(b, "max_kb", B->mb_milli * 1024 / 1000);
            KVTRACE_KEYI_(b, "keep", B->keep);
        }
        KVTRACE_LIT_(b, "}");
    }
    KVTRACE_LIT_(b, "}");
    if (S->records_declared) {
        KVTRACE_LIT_(b, ",\"records\":");
        kvtrace_records_json_(b, S->records);
    }
    KVTRACE_LIT_(b, "}");
}

/* Starts segment seg_index + 1: the old one gets its final newline and is closed, segments
 * beyond KVTRACE_KEEP are deleted, the new one gets its header line and snapshot. Lock held. */
static inline void kvtrace_rotate_locked_(kvtrace_state_12_ *S, kvtrace_bounded_ *B,
                                          int64_t step) {
    char path[sizeof B->base + 40], line[KVTRACE_HEAD_MAX_ + 1024];
    kvtrace_buf_ b;
    size_t snap_len = 0;
    int64_t next = B->seg_index + 1;
    int fd;
    if (B->failed || next > KVTRACE_SEG_MAX_ || !B->head_len) return;
    if (!kvtrace_snapshot_text_(S, B, S->seq + 1, step, "rotate", &snap_len)) {
        kvtrace_stderr_("kvtrace: out of memory for the segment snapshot; rotation off\n", NULL,
                        NULL);
        return;
    }
    kvtrace_seg_path_(B, next, 0, path);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        kvtrace_stderr_("kvtrace: cannot open ", path, ": ");
        kvtrace_stderr_(strerror(errno), "; rotation off, the trace goes on in this segment\n",
                        NULL);
        B->failed = 1;
        return;
    }
    if (!kvtrace_write_all_(S->fd, "\n", 1)) { /* the closed segment's final newline */
        close(fd);
        kvtrace_fail_(S);
        return;
    }
    close(S->fd);
    S->fd = fd;
    S->offset = 0;
    B->seg_index = next;
    if (B->keep > 0 && next > B->keep) {
        kvtrace_seg_path_(B, next - B->keep, 0, path);
        unlink(path);
        kvtrace_seg_path_(B, next - B->keep, 1, path);
        unlink(path);
    }
    b.p = line;
    b.end = line + sizeof line - KVTRACE_RESERVE_;
    b.over = 0;
    kvtrace_put_(&b, B->head, B->head_len);
    kvtrace_head_tail_(S, &b, S->seq + 1);
    if (!kvtrace_write_all_(S->fd, line, (size_t)(b.p - line)) ||
        !kvtrace_write_all_(S->fd, B->snap, snap_len)) {
        kvtrace_fail_(S);
        return;
    }
    S->seq++;
    S->offset = (int64_t)(b.p - line) + (int64_t)snap_len;
}

/* Flight recorder: the active half of the ring is full (or a step begins and it is 3/4 full):
 * the other half is reused, starting with a snapshot. Lock held. */
static inline void kvtrace_chunk_switch_(kvtrace_state_12_ *S, kvtrace_bounded_ *B, int64_t step) {
    int next = 1 - B->active;
    size_t n = 0;
    if (B->failed) return;
    if (!kvtrace_snapshot_text_(S, B, S->seq + 1, step, "flight-recorder", &n) ||
        n > B->chunk_cap / 2) {
        B->failed = 1;
        kvtrace_stderr_("kvtrace: the flight recorder's snapshot does not fit (raise "
                        "KVTRACE_RING_MB); the recorder keeps its current window\n", NULL, NULL);
        return;
    }
    S->seq++;
    /* the signal path reads used[] and active without the lock: empty the half first */
    __atomic_store_n(&B->used[next], 0, __ATOMIC_RELEASE);
    memcpy(B->chunk[next], B->snap, n);
    B->chunk_seq[next] = S->seq;
    __atomic_store_n(&B->used[next], n, __ATOMIC_RELEASE);
    __atomic_store_n(&B->active, next, __ATOMIC_RELEASE);
}

/* Before an event of `need` bytes is stamped: rotate or switch halves. Lock held. */
static inline void kvtrace_bounded_before_(kvtrace_state_12_ *S, kvtrace_bounded_ *B, int advance,
                                           size_t need) {
    int64_t step = advance ? S->step + 1 : S->step;
    if (!B->flight) {
        if ((advance && S->offset >= B->max_bytes) || S->offset / 2 >= B->max_bytes)
            kvtrace_rotate_locked_(S, B, step);
    } else {
        size_t used = B->used[B->active], cap = B->chunk_cap;
        if ((advance && used >= cap / 4 * 3) || used + need > cap) kvtrace_chunk_switch_(S, B, step);
    }
}

static inline void kvtrace_chunk_put_(kvtrace_bounded_ *B, const char *start, const char *stop) {
    size_t n = (size_t)(stop - start), used = B->used[B->active];
    if (used + n > B->chunk_cap) {
        B->dropped++;
        return;
    }
    memcpy(B->chunk[B->active] + used, start, n);
    __atomic_store_n(&B->used[B->active], used + n, __ATOMIC_RELEASE);
}

/* Writes the flight recorder's window: header line (extra.segment.first_seq = the window's
 * first seq), the older half, the newer half, then `end` ("\n{end}\n"). Only write(),
 * ftruncate() and arithmetic: the signal path calls it too. */
static inline void kvtrace_flight_dump_(kvtrace_state_12_ *S, kvtrace_bounded_ *B,
                                        const char *end, size_t end_len) {
    int a = __atomic_load_n(&B->active, __ATOMIC_ACQUIRE), o = 1 - a;
    size_t ua = __atomic_load_n(&B->used[a], __ATOMIC_ACQUIRE);
    size_t uo = __atomic_load_n(&B->used[o], __ATOMIC_ACQUIRE);
    kvtrace_buf_ b;
    b.p = B->dump;
    b.end = B->dump + sizeof B->dump - KVTRACE_RESERVE_;
    b.over = 0;
    kvtrace_put_(&b, B->head, B->head_len);
    kvtrace_head_tail_(S, &b, uo ? B->chunk_seq[o] : B->chunk_seq[a]);
    if (ftruncate(S->fd, 0) != 0) return;
    if (!kvtrace_write_all_(S->fd, B->dump, (size_t)(b.p - B->dump))) return;
    if (uo && !kvtrace_write_all_(S->fd, B->chunk[o], uo)) return;
    if (ua && !kvtrace_write_all_(S->fd, B->chunk[a], ua)) return;
    if (kvtrace_write_all_(S->fd, end, end_len)) S->offset = 0;
}

KVTRACE_FN_ void kvtrace_12_on_signal(int sig);

/* The bounded mode asked for in the environment, or NULL (plain tracing). `path` is the
 * expanded KVTRACE_FILE; for rotation it becomes segment 1's path. */
static inline kvtrace_bounded_ *kvtrace_bounded_new_(kvtrace_state_12_ *S, char *path,
                                                     size_t path_cap) {
    const char *ring = getenv("KVTRACE_RING_MB"), *max = getenv("KVTRACE_MAX_MB");
    const char *keep = getenv("KVTRACE_KEEP");
    int64_t ring_m = kvtrace_milli_(ring), max_m = kvtrace_milli_(max), keep_n = 0;
    size_t n = strlen(path), cut;
    kvtrace_bounded_ *B;
    if (ring && *ring && ring_m == 0)
        kvtrace_stderr_("kvtrace: KVTRACE_RING_MB is not a positive number (MB, e.g. 64 or 0.5); "
                        "flight recorder off\n", NULL, NULL);
    if (max && *max && max_m == 0)
        kvtrace_stderr_("kvtrace: KVTRACE_MAX_MB is not a positive number (MB, e.g. 256 or "
                        "0.5); rotation off\n", NULL, NULL);
    if (keep && *keep) {
        keep_n = kvtrace_milli_(keep);
        if (keep_n % 1000 || (keep_n == 0 && strcmp(keep, "0") != 0)) {
            kvtrace_stderr_("kvtrace: KVTRACE_KEEP is not a whole number; keeping every "
                            "segment\n", NULL, NULL);
            keep_n = 0;
        }
        keep_n /= 1000;
    }
    if (ring_m && max_m)
        kvtrace_stderr_("kvtrace: KVTRACE_RING_MB and KVTRACE_MAX_MB both set: flight recorder, "
                        "no rotation\n", NULL, NULL);
    if (!ring_m && !max_m) return NULL;
    B = (kvtrace_bounded_ *)calloc(1, sizeof *B);
    if (!B) return NULL;
    B->anchor = -1;
    B->resident = B->ring = -1;
    B->seg_index = 1;
    B->chunk_seq[0] = B->chunk_seq[1] = 1;
    snprintf(B->run, sizeof B->run, "%ld-%lld", S->pid, (long long)S->t0);
    if (ring_m) {
        int64_t bytes = ring_m * 1048576 / 1000;
        B->flight = 1;
        B->mb_milli = ring_m;
        /* a half holds at least two of the longest events */
        B->chunk_cap = (size_t)(bytes / 2 < 2 * KVTRACE_GAP_ + 2 * KVTRACE_LINE_MAX
                                    ? 2 * KVTRACE_GAP_ + 2 * KVTRACE_LINE_MAX : bytes / 2);
        B->chunk[0] = (char *)malloc(B->chunk_cap);
        B->chunk[1] = (char *)malloc(B->chunk_cap);
        if (!B->chunk[0] || !B->chunk[1]) {
            kvtrace_stderr_("kvtrace: cannot allocate KVTRACE_RING_MB; flight recorder off\n",
                            NULL, NULL);
            free(B->chunk[0]);
            free(B->chunk[1]);
            free(B);
            return NULL;
        }
        return B;
    }
    B->mb_milli = max_m;
    B->max_bytes = max_m * 1048576 / 1000;
    if (B->max_bytes < 4096) B->max_bytes = 4096;
    B->keep = keep_n;
    cut = n >= 8 && memcmp(path + n - 8, ".kvtrace", 8) == 0 ? n - 8 : n;
    if (cut + 1 + 40 > sizeof B->base || cut + 40 > path_cap) {
        kvtrace_stderr_("kvtrace: KVTRACE_FILE is too long for segment names; rotation off\n",
                        NULL, NULL);
        free(B);
        return NULL;
    }
    memcpy(B->base, path, cut);
    B->base[cut] = '.';
    B->base_len = cut + 1;
    memcpy(B->suffix, ".kvtrace", 9);
    kvtrace_seg_path_(B, 1, 0, path);
    return B;
}

/* Once the trace is open: the descriptor adoption checks (the trace's folder: segments come and
 * go), and the flight recorder's signal handlers. */
static inline void kvtrace_bounded_open_(kvtrace_state_12_ *S, kvtrace_bounded_ *B,
                                         const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (slash && n == 0) n = 1; /* "/x" */
    if (n >= sizeof dir) n = 0;
    memcpy(dir, slash ? path : ".", slash ? n : 1);
    dir[slash ? n : 1] = 0;
    B->anchor = open(dir, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    S->bd = B;
    if (B->flight) {
        int i;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = kvtrace_12_on_signal;
#ifdef SA_ONSTACK /* XSI: the runtime's alternate stack, if it set one (stack overflows) */
        sa.sa_flags = SA_ONSTACK;
#endif
        sigemptyset(&sa.sa_mask);
        for (i = 0; i < KVTRACE_N_SIGNALS_; i++)
            sigaction(kvtrace_signals_[i], &sa, &B->old[i]);
    }
}

/* One state per process even where symbol binding cannot give it: a shared object dlopen()ed
 * with RTLD_LOCAL while the program that carries the header does not export its symbols (no
 * -rdynamic), or one linked with -Bsymbolic, has its own copy of the state. The copy that opens
 * the trace publishes its state in the environment (KVTRACE_STATE_12 =
 * "<pid>:<state address>:<fd>:<st_dev>:<st_ino>"); a later copy in the same process adopts it
 * instead of opening (and truncating) the file a second time. The descriptor check proves the
 * address belongs to this process image: after exec() (same pid, environment kept) the
 * O_CLOEXEC descriptor is closed, so a stale entry is never followed. */
static inline kvtrace_state_12_ *kvtrace_adopt_(void) {
    const char *env = getenv("KVTRACE_STATE_12");
    unsigned long long v[5];
    struct stat st;
    int i;
    char *end;
    if (!env) return NULL;
    for (i = 0; i < 5; i++) {
        v[i] = strtoull(env, &end, 10);
        if (end == env || (i < 4 && *end != ':') || (i == 4 && *end)) return NULL;
        env = end + 1;
    }
    if (v[0] != (unsigned long long)getpid() || v[2] > 1u << 30) return NULL;
    if (fstat((int)v[2], &st) != 0 || (unsigned long long)st.st_dev != v[3] ||
        (unsigned long long)st.st_ino != v[4])
        return NULL;
    if ((uintptr_t)v[1] == (uintptr_t)&kvtrace_12_state) return NULL;
    return (kvtrace_state_12_ *)(uintptr_t)v[1];
}

static inline void kvtrace_publish_(kvtrace_state_12_ *S) {
    char text[128];
    struct stat st;
    size_t n = 0;
    unsigned long long v[5];
    int i;
    int fd = S->bd && S->bd->anchor >= 0 ? S->bd->anchor : S->fd;
    if (fstat(fd, &st) != 0) return;
    v[0] = (unsigned long long)S->pid;
    v[1] = (unsigned long long)(uintptr_t)S;
    v[2] = (unsigned long long)fd;
    v[3] = (unsigned long long)st.st_dev;
    v[4] = (unsigned long long)st.st_ino;
    for (i = 0; i < 5; i++) {
        if (i) text[n++] = ':';
        n += kvtrace_u64_text_(text + n, (uint64_t)v[i]);
    }
    text[n] = 0;
    setenv("KVTRACE_STATE_12", text, 1);
}

/* Decides on/off once per process: open KVTRACE_FILE (%p -> pid) or stay off. */
KVTRACE_FN_ int kvtrace_12_start(void) {
    kvtrace_state_12_ *S = &kvtrace_12_state, *owner;
    const char *env;
    char path[4096];
    size_t n = 0;
    int on = __atomic_load_n(&kvtrace_12_enabled, __ATOMIC_ACQUIRE);
    if (on >= 0) return on;
    pthread_mutex_lock(&S->lock);
    if (S->inited) {
        pthread_mutex_unlock(&S->lock);
        return __atomic_load_n(&kvtrace_12_enabled, __ATOMIC_ACQUIRE);
    }
    S->inited = 1;
    on = 0;
    owner = kvtrace_adopt_();
    if (owner) { /* another copy of the writer opened the trace: write through its state */
        __atomic_store_n(&kvtrace_12_owner, (uintptr_t)owner, __ATOMIC_RELEASE);
        __atomic_store_n(&kvtrace_12_enabled, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&S->lock);
        /* kinds this copy's constructors registered before the trace was opened */
        if (S->records_declared) kvtrace_12_add_records(S->records);
        return 1;
    }
    env = getenv("KVTRACE_FILE");
    if (env && *env) {
        S->pid = (long)getpid();
        for (; *env && n + 24 < sizeof path; env++) {
            if (env[0] == '%' && env[1] == 'p') {
                n += kvtrace_u64_text_(path + n, (uint64_t)S->pid);
                env++;
            } else if (env[0] == '%' && env[1] == '%') {
                path[n++] = '%';
                env++;
            } else {
                path[n++] = *env;
            }
        }
        path[n] = 0;
        if (*env) {
            kvtrace_stderr_("kvtrace: KVTRACE_FILE is too long; tracing off\n", NULL, NULL);
        } else {
            kvtrace_bounded_ *B;
            S->t0 = kvtrace_12_now();
            B = kvtrace_bounded_new_(S, path, sizeof path); /* rotation: segment 1's path */
            /* O_TRUNC: a rerun with the same name starts a fresh trace instead of appending
             * a second header mid-file. */
            S->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
            if (S->fd < 0) {
                kvtrace_stderr_("kvtrace: cannot open ", path, ": ");
                kvtrace_stderr_(strerror(errno), "; tracing off\n", NULL);
                if (B) {
                    free(B->chunk[0]);
                    free(B->chunk[1]);
                    free(B);
                }
            } else {
                if (B) kvtrace_bounded_open_(S, B, path);
                S->step = -1;
                atexit(kvtrace_12_atexit);
                pthread_atfork(NULL, NULL, kvtrace_12_atfork_child);
                kvtrace_publish_(S);
                on = 1;
            }
        }
    }
    __atomic_store_n(&kvtrace_12_enabled, on, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&S->lock);
    return on;
}

/* A forked child shares the descriptor: it must not write into the parent's trace. */
KVTRACE_FN_ void kvtrace_12_atfork_child(void) {
    KVTRACE_S_()->ended = 1;
    __atomic_store_n(&kvtrace_12_enabled, 0, __ATOMIC_RELAXED);
}

/* Writes [start, stop) -- "\n<event>" -- with the pad described at KVTRACE_PAGE_; start has
 * KVTRACE_PAGE_ writable bytes before it. Lock held. */
static inline void kvtrace_emit_locked_(kvtrace_state_12_ *S, char *start, const char *stop) {
    size_t n = (size_t)(stop - start), in_page = (size_t)(S->offset % KVTRACE_PAGE_), pad = 0;
    if (n <= KVTRACE_PAGE_ && in_page + n > KVTRACE_PAGE_) pad = KVTRACE_PAGE_ - in_page;
    start -= pad;
    memset(start, ' ', pad);
    if (kvtrace_write_all_(S->fd, start, n + pad)) S->offset += (int64_t)(n + pad);
    else kvtrace_fail_(S);
}

static const char *const kvtrace_record_names_[KVTRACE_R_COUNT_] = {
    "step", "learn", "fits", "write", "mark", "upload", "invalidate", "read", "abort", "warn",
    "output", "repartition", "adapt", "end", "mark.outside"};

/* ["step","write",...]: the names of the set bits, in kvtrace_record_names_ order */
static inline void kvtrace_records_json_(kvtrace_buf_ *b, uint32_t bits) {
    int i, first = 1;
    KVTRACE_LIT_(b, "[");
    for (i = 0; i < KVTRACE_R_COUNT_; i++) {
        if (!(bits & (1u << i))) continue;
        if (!first) KVTRACE_LIT_(b, ",");
        first = 0;
        kvtrace_str_(b, kvtrace_record_names_[i], 32);
    }
    KVTRACE_LIT_(b, "]");
}

/* The header line: called with the lock held. plan NULL -> the minimal header. */
static inline void kvtrace_header_locked_(kvtrace_state_12_ *S, const kvtrace_plan *p) {
    char line[8192], created[40];
    kvtrace_buf_ b;
    struct tm tm;
    time_t now = time(NULL);
    b.p = line;
    b.end = line + sizeof line - KVTRACE_RESERVE_;
    b.over = 0;
    if (gmtime_r(&now, &tm) == NULL ||
        strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%S+00:00", &tm) == 0)
        strcpy(created, "1970-01-01T00:00:00+00:00");
    KVTRACE_LIT_(&b, "{\"format\":\"kvtrace\",\"version\":\"" KVTRACE_H_VERSION
                     "\",\"kvdiag_version\":\"kvtrace.h " KVTRACE_H_VERSION "\"");
    KVTRACE_KEYSTR_(&b, "created", created);
    KVTRACE_KEYSTR_(&b, "backend", "native");
    KVTRACE_LIT_(&b, ",\"device\":{\"name\":");
    kvtrace_str_(&b, p && p->device_name ? p->device_name : "unknown", KVTRACE_STRING_MAX);
    KVTRACE_LIT_(&b, "},\"scenario\":{\"name\":");
    kvtrace_str_(&b, p && p->run_name ? p->run_name : "", KVTRACE_STRING_MAX);
    KVTRACE_LIT_(&b, ",\"source\":\"native\"");
    KVTRACE_KEYI_(&b, "pid", S->pid);
    KVTRACE_KEYSTR_(&b, "build", p && p->build ? p->build : "");
    KVTRACE_LIT_(&b, ",\"config\":{");
    if (p) {
        char *start = b.p;
        if (p->np >= 0) KVTRACE_KEYI_(&b, "np", p->np);
        if (p->kv_unified >= 0) KVTRACE_KEYB_(&b, "kv_unified", p->kv_unified);
        if (p->layout) KVTRACE_KEYSTR_(&b, "layout", p->layout);
        if (p->dispatch) KVTRACE_KEYSTR_(&b, "dispatch", p->dispatch);
        if (b.p > start && !b.over) { /* drop the first key's leading comma */
            memmove(start, start + 1, (size_t)(b.p - start - 1));
            b.p--;
        }
    }
    KVTRACE_LIT_(&b, "}},\"plan\":{");
    if (p) {
        char *start = b.p;
#define KVTRACE_PLAN_I_(f) if (p->f >= 0) KVTRACE_KEYI_(&b, #f, p->f)
        KVTRACE_PLAN_I_(page_bytes);
        KVTRACE_PLAN_I_(v_offset);
        KVTRACE_PLAN_I_(pool_pages);
        KVTRACE_PLAN_I_(resident_pages_per_layer);
        KVTRACE_PLAN_I_(ring_slots);
        KVTRACE_PLAN_I_(stage_bytes);
        KVTRACE_PLAN_I_(streamed_layers);
        KVTRACE_PLAN_I_(layers);
        KVTRACE_PLAN_I_(kv_size);
        KVTRACE_PLAN_I_(n_stream);
        KVTRACE_PLAN_I_(head_dim);
        KVTRACE_PLAN_I_(n_head);
        KVTRACE_PLAN_I_(n_head_kv);
        KVTRACE_PLAN_I_(pages_per_stream);
#undef KVTRACE_PLAN_I_
        if (p->type_k) KVTRACE_KEYSTR_(&b, "type_k", p->type_k);
        if (p->type_v) KVTRACE_KEYSTR_(&b, "type_v", p->type_v);
        if (b.p > start && !b.over) {
            memmove(start, start + 1, (size_t)(b.p - start - 1));
            b.p--;
        }
    }
    KVTRACE_LIT_(&b, "}");
    if (S->bd && !b.over) { /* every segment's header line starts the same */
        S->bd->head_len = (size_t)(b.p - line);
        memcpy(S->bd->head, line, S->bd->head_len);
    }
    kvtrace_head_tail_(S, &b, S->seq + 1); /* its newline comes with the first event */
    if (b.over) { /* only absurd strings get here: fall back to the minimal header */
        kvtrace_header_locked_(S, NULL);
        return;
    }
    S->header_done = 1;
    if (kvtrace_write_all_(S->fd, line, (size_t)(b.p - line))) S->offset = (int64_t)(b.p - line);
    else kvtrace_fail_(S);
}

/* Stamps kind/seq/t_ns/step into the gap before the body and writes the line (one write()).
 * advance: 1 for a step event (the step counter moves first). Returns the event's seq, 0 when
 * nothing was written. */
KVTRACE_FN_ int64_t kvtrace_12_commit(const char *kind, char *line, kvtrace_buf_ *b,
                                      int advance) {
    return kvtrace_12_commit_op(kind, line, b, advance, NULL);
}

/* kvtrace_12_commit, and what the event changes in a bounded trace's shadow (op, or NULL). */
KVTRACE_FN_ int64_t kvtrace_12_commit_op(const char *kind, char *line, kvtrace_buf_ *b,
                                         int advance, const kvtrace_op_ *op) {
    kvtrace_state_12_ *S = KVTRACE_S_();
    kvtrace_bounded_ *B;
    char pre[KVTRACE_PREFIX_];
    kvtrace_buf_ h;
    char *body = line + KVTRACE_GAP_, *start;
    size_t plen;
    int64_t seq;
    if (b->over) { /* cannot happen with the builders here; never write a broken line */
        b->p = body;
        b->over = 0;
        kind = "warn";
        KVTRACE_LIT_(b, ",\"message\":\"kvtrace: an event longer than KVTRACE_LINE_MAX was "
                        "left out\",\"code\":\"kvtrace-truncated\"");
    }
    b->end += KVTRACE_RESERVE_;
    b->over = 0;
    KVTRACE_LIT_(b, "}");
    h.p = pre;
    h.end = pre + sizeof pre;
    h.over = 0;
    pthread_mutex_lock(&S->lock);
    if (S->ended || S->fd < 0) {
        pthread_mutex_unlock(&S->lock);
        return 0;
    }
    if (!S->header_done) kvtrace_header_locked_(S, NULL);
    B = S->bd;
    if (B) kvtrace_bounded_before_(S, B, advance, (size_t)(b->p - body) + KVTRACE_PREFIX_);
    if (advance) S->step++;
    KVTRACE_LIT_(&h, "\n{\"kind\":\"");
    kvtrace_put_(&h, kind, strlen(kind));
    KVTRACE_LIT_(&h, "\",\"seq\":");
    seq = ++S->seq;
    kvtrace_i64_(&h, seq);
    KVTRACE_LIT_(&h, ",\"t_ns\":");
    kvtrace_i64_(&h, kvtrace_12_now() - S->t0);
    KVTRACE_LIT_(&h, ",\"step\":");
    kvtrace_i64_(&h, S->step < 0 ? 0 : S->step);
    plen = (size_t)(h.p - pre);
    start = body - plen;
    memcpy(start, pre, plen);
    if (B && B->flight) kvtrace_chunk_put_(B, start, b->p);
    else kvtrace_emit_locked_(S, start, b->p);
    if (B && op) kvtrace_shadow_apply_(B, op, seq, S->step < 0 ? 0 : S->step);
    pthread_mutex_unlock(&S->lock);
    return seq;
}

/* Every event builder starts like this: a stack line with the gap, the body after it. */
#define KVTRACE_BEGIN_(line, b)                                                    \
    char line[KVTRACE_GAP_ + KVTRACE_LINE_MAX];                                    \
    kvtrace_buf_ b;                                                                \
    b.p = line + KVTRACE_GAP_;                                                     \
    b.end = b.p + KVTRACE_LINE_MAX - KVTRACE_PREFIX_ - KVTRACE_RESERVE_;           \
    b.over = 0

static inline void kvtrace_dropped_(const char *what, int64_t dropped, int64_t total) {
    char msg[256];
    kvtrace_buf_ b;
    b.p = msg;
    b.end = msg + sizeof msg - 1;
    b.over = 0;
    kvtrace_put_(&b, what, strlen(what));
    KVTRACE_LIT_(&b, ": ");
    kvtrace_i64_(&b, dropped);
    KVTRACE_LIT_(&b, " of ");
    kvtrace_i64_(&b, total);
    KVTRACE_LIT_(&b, " elements did not fit in KVTRACE_LINE_MAX and were left out");
    *b.p = 0;
    kvtrace_12_warn("kvtrace-truncated", msg);
}

static inline void kvtrace_bad_arg_(const char *macro, const char *arg, const char *value) {
    char msg[256];
    kvtrace_buf_ b;
    b.p = msg;
    b.end = msg + sizeof msg - 1;
    b.over = 0;
    kvtrace_put_(&b, macro, strlen(macro));
    KVTRACE_LIT_(&b, ": invalid ");
    kvtrace_put_(&b, arg, strlen(arg));
    KVTRACE_LIT_(&b, " '");
    value = value ? value : "(null)";
    kvtrace_put_(&b, value, kvtrace_strnlen_(value, 64));
    KVTRACE_LIT_(&b, "'; event not written");
    *b.p = 0;
    kvtrace_12_warn("kvtrace-bad-arg", msg);
}

/* layer < 0: no layer (null) */
KVTRACE_FN_ void kvtrace_12_warn_layer(const char *code, int64_t layer, const char *message) {
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYSTR_(&b, "message", message);
        KVTRACE_KEYSTR_(&b, "code", code ? code : "");
        if (layer >= 0) KVTRACE_KEYI_(&b, "layer", layer);
        kvtrace_12_commit("warn", line, &b, 0);
    }
}

KVTRACE_FN_ void kvtrace_12_warn(const char *code, const char *message) {
    kvtrace_12_warn_layer(code, -1, message);
}

/* Adds kinds to what the process declares. Before the header line they go into it; after it,
 * the kinds not declared yet are written as a `records` event (a shared object dlopen()ed
 * later, a late KVTRACE_DECLARE). Never decides on/off itself: it runs from constructors. */
KVTRACE_FN_ void kvtrace_12_add_records(uint32_t bits) {
    kvtrace_state_12_ *S = KVTRACE_S_();
    uint32_t fresh;
    int late;
    if (S == &kvtrace_12_state && !__atomic_load_n(&S->inited, __ATOMIC_ACQUIRE)) {
        /* a shared object with its own copy of the state, loaded after the trace was opened:
         * its kinds belong to the process's trace (kvtrace_adopt_) */
        kvtrace_state_12_ *owner = kvtrace_adopt_();
        if (owner) {
            __atomic_store_n(&kvtrace_12_owner, (uintptr_t)owner, __ATOMIC_RELEASE);
            S = owner;
        }
    }
    bits |= KVTRACE_R_ALWAYS_;
    pthread_mutex_lock(&S->lock);
    fresh = bits & ~S->records;
    S->records |= bits;
    S->records_declared = 1;
    late = fresh && S->header_done && !S->ended && S->fd >= 0;
    pthread_mutex_unlock(&S->lock);
    if (late) {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_LIT_(&b, ",\"kinds\":");
        kvtrace_records_json_(&b, fresh);
        kvtrace_12_commit("records", line, &b, 0);
    }
}

/* The entries one linked object (program or shared object) holds in its kvtrace_rec_12
 * section, between the linker's __start_/__stop_ symbols. */
KVTRACE_FN_ void kvtrace_12_register(const uint32_t *begin, const uint32_t *end);
KVTRACE_FN_ void kvtrace_12_register(const uint32_t *begin, const uint32_t *end) {
    uint32_t bits = 0;
    for (; begin && begin < end; begin++) bits |= *begin;
    kvtrace_12_add_records(bits);
}

/* KVTRACE_DECLARE: names separated by blanks or commas; an unknown name is a bad-arg warn. */
KVTRACE_FN_ void kvtrace_12_declare(const char *names);
KVTRACE_FN_ void kvtrace_12_declare(const char *names) {
    uint32_t bits = 0;
    const char *p = names ? names : "";
    while (*p) {
        size_t n = 0;
        int i, found = 0;
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        while (p[n] && p[n] != ' ' && p[n] != ',' && p[n] != '\t') n++;
        if (!n) break;
        for (i = 0; i < KVTRACE_R_COUNT_; i++) {
            if (strlen(kvtrace_record_names_[i]) == n && memcmp(kvtrace_record_names_[i], p, n) == 0) {
                bits |= 1u << i;
                found = 1;
            }
        }
        if (!found) {
            char word[64];
            size_t w = n < sizeof word - 1 ? n : sizeof word - 1;
            memcpy(word, p, w);
            word[w] = 0;
            kvtrace_bad_arg_("KVTRACE_DECLARE", "kind", word);
        }
        p += n;
    }
    kvtrace_12_add_records(bits);
}

KVTRACE_FN_ void kvtrace_12_end(const char *status, const char *reason) {
    static const char *const statuses[] = {"completed", "aborted", "error", NULL};
    kvtrace_state_12_ *S = KVTRACE_S_();
    char line[KVTRACE_PAGE_ + 2048];
    kvtrace_buf_ b;
    if (!kvtrace_12_start()) return;
    if (!kvtrace_is_one_of_(status, statuses)) status = "error";
    b.p = line + KVTRACE_PAGE_;
    b.end = line + sizeof line - KVTRACE_RESERVE_;
    b.over = 0;
    pthread_mutex_lock(&S->lock);
    if (S->ended || S->fd < 0) {
        pthread_mutex_unlock(&S->lock);
        return;
    }
    if (!S->header_done) kvtrace_header_locked_(S, NULL);
    KVTRACE_LIT_(&b, "\n{\"kind\":\"end\"");
    KVTRACE_KEYI_(&b, "seq", S->seq + 1);
    KVTRACE_KEYI_(&b, "t_ns", kvtrace_12_now() - S->t0);
    KVTRACE_KEYI_(&b, "step", S->step < 0 ? 0 : S->step);
    KVTRACE_KEYSTR_(&b, "status", status);
    KVTRACE_KEYI_(&b, "steps", S->step + 1);
    KVTRACE_KEYI_(&b, "events", S->seq);
    if (reason && *reason) {
        KVTRACE_KEY_(&b, "reason");
        kvtrace_str_(&b, reason, 512);
    }
    b.end += KVTRACE_RESERVE_;
    KVTRACE_LIT_(&b, "}\n"); /* the file's final newline */
    __atomic_store_n(&S->ended, 1, __ATOMIC_RELEASE);
    S->seq++;
    if (S->bd && S->bd->flight)
        kvtrace_flight_dump_(S, S->bd, line + KVTRACE_PAGE_, (size_t)(b.p - line - KVTRACE_PAGE_));
    else
        kvtrace_emit_locked_(S, line + KVTRACE_PAGE_, b.p);
    __atomic_store_n(&kvtrace_12_enabled, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&S->lock);
}

KVTRACE_FN_ void kvtrace_12_atexit(void) { kvtrace_12_end("completed", ""); }

/* The flight recorder's crash path (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT): no lock (the
 * crashing thread may hold it), no allocation, only write() -- the window as it is, an `end`
 * event (status "aborted", reason "signal <NAME>"); then the handler that was there before, or
 * the default action, gets the signal. A thread writing an event at that instant may leave that
 * one event cut (the reader reports it). */
KVTRACE_FN_ void kvtrace_12_on_signal(int sig) {
    kvtrace_state_12_ *S = KVTRACE_S_();
    kvtrace_bounded_ *B = S->bd;
    const char *name = "signal";
    int i, saved = errno;
    for (i = 0; i < KVTRACE_N_SIGNALS_; i++)
        if (kvtrace_signals_[i] == sig) name = kvtrace_signal_names_[i];
    if (B && B->flight && S->header_done && S->fd >= 0 &&
        !__atomic_exchange_n(&S->ended, 1, __ATOMIC_ACQ_REL)) {
        char line[512];
        kvtrace_buf_ b;
        int64_t seq = S->seq, step = S->step;
        b.p = line;
        b.end = line + sizeof line - KVTRACE_RESERVE_;
        b.over = 0;
        KVTRACE_LIT_(&b, "\n{\"kind\":\"end\"");
        KVTRACE_KEYI_(&b, "seq", seq + 1);
        KVTRACE_KEYI_(&b, "t_ns", kvtrace_12_now() - S->t0);
        KVTRACE_KEYI_(&b, "step", step < 0 ? 0 : step);
        KVTRACE_LIT_(&b, ",\"status\":\"aborted\"");
        KVTRACE_KEYI_(&b, "steps", step + 1);
        KVTRACE_KEYI_(&b, "events", seq);
        KVTRACE_LIT_(&b, ",\"reason\":\"signal ");
        kvtrace_put_(&b, name, strlen(name));
        b.end += KVTRACE_RESERVE_;
        KVTRACE_LIT_(&b, "\"}\n");
        __atomic_store_n(&kvtrace_12_enabled, 0, __ATOMIC_RELAXED);
        kvtrace_flight_dump_(S, B, line, (size_t)(b.p - line));
    }
    for (i = 0; i < KVTRACE_N_SIGNALS_; i++) {
        if (kvtrace_signals_[i] != sig) continue;
        if (B) sigaction(sig, &B->old[i], NULL);
        else signal(sig, SIG_DFL);
    }
    errno = saved;
    raise(sig); /* delivered when this handler returns, to the previous disposition */
}

/* ---- events ---------------------------------------------------------------------------------- */

KVTRACE_FN_ void kvtrace_12_boot(const kvtrace_plan *plan);
KVTRACE_FN_ void kvtrace_12_boot(const kvtrace_plan *plan) {
    kvtrace_state_12_ *S = KVTRACE_S_();
    int late;
    if (!kvtrace_12_start()) return;
    pthread_mutex_lock(&S->lock);
    late = S->header_done;
    if (!late && !S->ended && S->fd >= 0) {
        __atomic_store_n(&S->stage_bytes, plan && plan->stage_bytes > 0 ? plan->stage_bytes : 0,
                         __ATOMIC_RELAXED);
        kvtrace_header_locked_(S, plan);
    }
    pthread_mutex_unlock(&S->lock);
    if (late)
        kvtrace_12_warn("kvtrace-late-boot",
                        "KVTRACE_BOOT after the header was written (an event came first, or a "
                        "second BOOT): this plan is not in the header");
}

KVTRACE_FN_ void kvtrace_12_step(const char *phase, const int32_t *streams, int64_t n_streams,
                                 int64_t tokens, int64_t n_kv);
KVTRACE_FN_ void kvtrace_12_step(const char *phase, const int32_t *streams, int64_t n_streams,
                                 int64_t tokens, int64_t n_kv) {
    static const char *const phases[] = {"prefill", "decode", NULL};
    int64_t i, dropped = 0;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        if (!kvtrace_is_one_of_(phase, phases)) {
            /* the step still advances so later events keep their step numbers */
            KVTRACE_KEYSTR_(&b, "message", "KVTRACE_STEP: invalid phase (want prefill|decode)");
            KVTRACE_KEYSTR_(&b, "code", "kvtrace-bad-arg");
            kvtrace_12_commit("warn", line, &b, 1);
            return;
        }
        KVTRACE_KEYSTR_(&b, "phase", phase);
        KVTRACE_LIT_(&b, ",\"streams\":[");
        for (i = 0; i < n_streams; i++) {
            char *mark = b.p;
            if (i) KVTRACE_LIT_(&b, ",");
            kvtrace_i64_(&b, streams[i]);
            if (!kvtrace_elem_ok_(&b, mark)) {
                dropped = n_streams - i;
                break;
            }
        }
        KVTRACE_LIT_(&b, "]");
        KVTRACE_KEYI_(&b, "tokens", tokens);
        KVTRACE_KEYI_(&b, "n_kv", n_kv);
        kvtrace_12_commit("step", line, &b, 1);
    }
    if (dropped) kvtrace_dropped_("step streams", dropped, n_streams);
}

KVTRACE_FN_ void kvtrace_12_learn(int64_t layer, uint64_t k_ptr, int relearn);
KVTRACE_FN_ void kvtrace_12_learn(int64_t layer, uint64_t k_ptr, int relearn) {
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "layer", layer);
        KVTRACE_KEYU_(&b, "k_ptr", k_ptr);
        KVTRACE_KEYB_(&b, "relearn", relearn);
        kvtrace_12_commit("learn", line, &b, 0);
    }
}

static inline void kvtrace_tensor_json_(kvtrace_buf_ *b, const kvtrace_tensor *t) {
    int i;
    KVTRACE_LIT_(b, "{\"name\":");
    kvtrace_str_(b, t->name, 256);
    KVTRACE_KEYSTR_(b, "type", t->type);
    KVTRACE_LIT_(b, ",\"ne\":[");
    for (i = 0; i < 4; i++) {
        if (i) KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, t->ne[i]);
    }
    KVTRACE_LIT_(b, "],\"nb\":[");
    for (i = 0; i < 4; i++) {
        if (i) KVTRACE_LIT_(b, ",");
        kvtrace_u64_(b, t->nb[i]);
    }
    KVTRACE_LIT_(b, "]");
    KVTRACE_KEYU_(b, "data", t->data);
    KVTRACE_KEY_(b, "buffer");
    kvtrace_str_(b, t->buffer, 256);
    KVTRACE_KEY_(b, "runtime");
    if (t->runtime) kvtrace_u64_(b, t->runtime);
    else KVTRACE_LIT_(b, "null");
    KVTRACE_KEYB_(b, "contiguous", t->contiguous);
    KVTRACE_KEY_(b, "buffer_name");
    kvtrace_str_(b, t->buffer_name, 256);
    KVTRACE_KEYU_(b, "view_offs", t->view_offs);
    KVTRACE_KEYU_(b, "base", t->base);
    KVTRACE_LIT_(b, "}");
}

/* failed == NULL: the caller did not evaluate the conditions ("evaluated": false). */
KVTRACE_FN_ void kvtrace_12_fits(const char *node, int64_t layer, const kvtrace_tensor *q,
                                 const kvtrace_tensor *k, const kvtrace_tensor *v,
                                 const kvtrace_tensor *mask, const kvtrace_tensor *dst,
                                 int result, const char *route, const char *const *failed,
                                 int64_t n_failed);
KVTRACE_FN_ void kvtrace_12_fits(const char *node, int64_t layer, const kvtrace_tensor *q,
                                 const kvtrace_tensor *k, const kvtrace_tensor *v,
                                 const kvtrace_tensor *mask, const kvtrace_tensor *dst,
                                 int result, const char *route, const char *const *failed,
                                 int64_t n_failed) {
    static const char *const routes[] = {"streamed", "fallback", "abort", "ordinary", NULL};
    int64_t i, dropped = 0;
    if (!kvtrace_12_start()) return;
    if (!kvtrace_is_one_of_(route, routes)) {
        kvtrace_bad_arg_("KVTRACE_FITS", "route", route);
        return;
    }
    if (!q || !k || !v || !dst) {
        kvtrace_bad_arg_("KVTRACE_FITS", "tensor", "NULL q/k/v/dst");
        return;
    }
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYSTR_(&b, "node", node);
        KVTRACE_KEYI_(&b, "layer", layer);
        KVTRACE_KEY_(&b, "q");
        kvtrace_tensor_json_(&b, q);
        KVTRACE_KEY_(&b, "k");
        kvtrace_tensor_json_(&b, k);
        KVTRACE_KEY_(&b, "v");
        kvtrace_tensor_json_(&b, v);
        KVTRACE_KEY_(&b, "dst");
        kvtrace_tensor_json_(&b, dst);
        if (mask) {
            KVTRACE_KEY_(&b, "mask");
            kvtrace_tensor_json_(&b, mask);
        }
        KVTRACE_KEYI_(&b, "stage_bytes",
                      __atomic_load_n(&KVTRACE_S_()->stage_bytes, __ATOMIC_RELAXED));
        KVTRACE_KEYB_(&b, "result", result);
        KVTRACE_KEYSTR_(&b, "route", route);
        KVTRACE_KEYB_(&b, "membership", k->runtime != 0 || v->runtime != 0);
        if (failed) {
            KVTRACE_LIT_(&b, ",\"failed\":[");
            for (i = 0; i < n_failed; i++) {
                char *mark = b.p;
                if (i) KVTRACE_LIT_(&b, ",");
                kvtrace_str_(&b, failed[i], 256);
                if (!kvtrace_elem_ok_(&b, mark)) {
                    dropped = n_failed - i;
                    break;
                }
            }
            KVTRACE_LIT_(&b, "]");
        } else {
            KVTRACE_LIT_(&b, ",\"evaluated\":false");
        }
        if (b.over) { /* only pathological tensor strings get here */
            kvtrace_bad_arg_("KVTRACE_FITS", "size", "event longer than KVTRACE_LINE_MAX");
            return;
        }
        kvtrace_12_commit("fits", line, &b, 0);
    }
    if (dropped) kvtrace_dropped_("fits failed", dropped, n_failed);
}

/* keys: {layer, stream (-1 = null), page} */
static inline int64_t kvtrace_keys_(kvtrace_buf_ *b, const int32_t (*keys)[3], int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        char *mark = b->p;
        if (i) KVTRACE_LIT_(b, ",");
        KVTRACE_LIT_(b, "[");
        kvtrace_i64_(b, keys[i][0]);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_or_null_(b, keys[i][1]);
        KVTRACE_LIT_(b, ",");
        kvtrace_i64_(b, keys[i][2]);
        KVTRACE_LIT_(b, "]");
        if (!kvtrace_elem_ok_(b, mark)) return n - i;
    }
    return 0;
}

KVTRACE_FN_ void kvtrace_12_mark(const int64_t *rows, int64_t n_rows, const int32_t (*keys)[3],
                                 int64_t n_keys, int all, const int32_t (*outside)[2],
                                 int64_t n_outside);
KVTRACE_FN_ void kvtrace_12_mark(const int64_t *rows, int64_t n_rows, const int32_t (*keys)[3],
                                 int64_t n_keys, int all, const int32_t (*outside)[2],
                                 int64_t n_outside) {
    int64_t i = 0, d_rows = 0, d_keys = 0, d_out = 0, runs = 0;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_LIT_(&b, ",\"rows\":[");
        while (i < n_rows) {
            int64_t j = i + 1;
            char *mark = b.p;
            while (j < n_rows && rows[j] == rows[j - 1] + 1) j++;
            if (runs) KVTRACE_LIT_(&b, ",");
            kvtrace_pair_(&b, rows[i], rows[j - 1] + 1);
            if (!kvtrace_elem_ok_(&b, mark)) {
                d_rows = n_rows - i;
                break;
            }
            runs++;
            i = j;
        }
        KVTRACE_LIT_(&b, "],\"keys\":[");
        d_keys = kvtrace_keys_(&b, keys, n_keys);
        KVTRACE_LIT_(&b, "]");
        KVTRACE_KEYB_(&b, "all", all);
        if (n_outside > 0) {
            KVTRACE_LIT_(&b, ",\"outside\":[");
            for (i = 0; i < n_outside; i++) {
                char *mark = b.p;
                if (i) KVTRACE_LIT_(&b, ",");
                KVTRACE_LIT_(&b, "[");
                kvtrace_i64_or_null_(&b, outside[i][0]);
                KVTRACE_LIT_(&b, ",");
                kvtrace_i64_(&b, outside[i][1]);
                KVTRACE_LIT_(&b, "]");
                if (!kvtrace_elem_ok_(&b, mark)) {
                    d_out = n_outside - i;
                    break;
                }
            }
            KVTRACE_LIT_(&b, "]");
        }
        kvtrace_12_commit("mark", line, &b, 0);
    }
    if (d_rows) kvtrace_dropped_("mark rows", d_rows, n_rows);
    if (d_keys) kvtrace_dropped_("mark keys", d_keys, n_keys);
    if (d_out) kvtrace_dropped_("mark outside", d_out, n_outside);
}

KVTRACE_FN_ void kvtrace_12_write(int64_t layer, int64_t stream, int64_t cell0, int64_t cell1,
                                  int64_t row0, int64_t row1, const int32_t (*keys)[3],
                                  int64_t n_keys);
KVTRACE_FN_ void kvtrace_12_write(int64_t layer, int64_t stream, int64_t cell0, int64_t cell1,
                                  int64_t row0, int64_t row1, const int32_t (*keys)[3],
                                  int64_t n_keys) {
    int64_t dropped;
    kvtrace_op_ op;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "layer", layer);
        KVTRACE_KEYI_(&b, "stream", stream);
        KVTRACE_LIT_(&b, ",\"cells\":");
        kvtrace_pair_(&b, cell0, cell1);
        KVTRACE_LIT_(&b, ",\"rows\":");
        kvtrace_pair_(&b, row0, row1);
        KVTRACE_LIT_(&b, ",\"dirty\":[");
        dropped = kvtrace_keys_(&b, keys, n_keys);
        KVTRACE_LIT_(&b, "]");
        op.what = KVTRACE_OP_WRITE_;
        op.a[0] = layer;
        op.a[1] = stream;
        op.a[2] = cell0;
        op.a[3] = cell1;
        kvtrace_12_commit_op("write", line, &b, 0, &op);
    }
    if (dropped) kvtrace_dropped_("write dirty", dropped, n_keys);
}

KVTRACE_FN_ void kvtrace_12_upload(int64_t layer, int64_t stream, int64_t page0, int64_t page1,
                                   int64_t slot, const char *target, int64_t bytes,
                                   const char *reason, int64_t key_stream);
KVTRACE_FN_ void kvtrace_12_upload(int64_t layer, int64_t stream, int64_t page0, int64_t page1,
                                   int64_t slot, const char *target, int64_t bytes,
                                   const char *reason, int64_t key_stream) {
    static const char *const targets[] = {"resident", "ring", NULL};
    static const char *const reasons[] = {"miss", "dirty", "wide-query", "last-chunk", "ring",
                                          NULL};
    kvtrace_op_ op;
    if (!kvtrace_12_start()) return;
    if (!kvtrace_is_one_of_(target, targets)) {
        kvtrace_bad_arg_("KVTRACE_UPLOAD", "target", target);
        return;
    }
    if (!kvtrace_is_one_of_(reason, reasons)) {
        kvtrace_bad_arg_("KVTRACE_UPLOAD", "reason", reason);
        return;
    }
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "layer", layer);
        KVTRACE_KEYI_(&b, "stream", stream);
        KVTRACE_LIT_(&b, ",\"pages\":");
        kvtrace_pair_(&b, page0, page1);
        KVTRACE_KEYI_(&b, "slot", slot);
        KVTRACE_KEYSTR_(&b, "target", target);
        KVTRACE_KEY_(&b, "bytes"); /* < 0: unknown, null as every unknown count */
        kvtrace_i64_or_null_(&b, bytes);
        KVTRACE_KEYSTR_(&b, "reason", reason);
        if (key_stream >= 0) KVTRACE_KEYI_(&b, "key_stream", key_stream);
        op.what = KVTRACE_OP_UPLOAD_;
        op.a[0] = layer;
        op.a[1] = stream;
        op.a[2] = page0;
        op.a[3] = page1;
        op.a[4] = slot;
        op.a[5] = target[0] == 'r' && target[1] == 'i'; /* "ring" */
        kvtrace_12_commit_op("upload", line, &b, 0, &op);
    }
}

KVTRACE_FN_ void kvtrace_12_read_emit(kvtrace_read *r);
KVTRACE_FN_ void kvtrace_12_read_emit(kvtrace_read *r) {
    static const char *const names[] = {"pool", "ring", "host"};
    kvtrace_op_ op;
    int i;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "layer", r->layer);
        KVTRACE_KEYI_(&b, "stream", r->stream);
        KVTRACE_KEYI_(&b, "pool", r->count[KVTRACE_POOL]);
        KVTRACE_KEYI_(&b, "ring", r->count[KVTRACE_RING]);
        KVTRACE_KEYI_(&b, "host", r->count[KVTRACE_HOST]);
        KVTRACE_LIT_(&b, ",\"served\":[");
        for (i = 0; i < r->n; i++) {
            const kvtrace_read_run_ *run = &r->runs[i];
            if (i) KVTRACE_LIT_(&b, ",");
            KVTRACE_LIT_(&b, "[");
            kvtrace_i64_(&b, run->begin);
            KVTRACE_LIT_(&b, ",");
            kvtrace_i64_(&b, run->end);
            KVTRACE_LIT_(&b, ",\"");
            kvtrace_put_(&b, names[run->source], strlen(names[run->source]));
            KVTRACE_LIT_(&b, "\",");
            kvtrace_i64_(&b, run->slot);
            KVTRACE_LIT_(&b, "]");
        }
        KVTRACE_LIT_(&b, "]");
        op.what = KVTRACE_OP_READ_;
        op.a[0] = r->layer;
        op.a[1] = r->stream;
        r->seq = kvtrace_12_commit_op("read", line, &b, 0, &op);
    }
}

static inline void kvtrace_read_begin_(kvtrace_read *r, int64_t layer, int64_t stream) {
    r->layer = layer;
    r->stream = stream;
    r->count[0] = r->count[1] = r->count[2] = 0;
    r->n = 0;
    r->seq = 0;
}

/* Consecutive pages in consecutive slots (any slot for the host) from one source share a run. */
static inline void kvtrace_read_page_(kvtrace_read *r, int64_t page, int source, int64_t slot) {
    kvtrace_read_run_ *last;
    if (source < KVTRACE_POOL || source > KVTRACE_HOST) return;
    if (source == KVTRACE_HOST) slot = -1;
    last = r->n ? &r->runs[r->n - 1] : NULL;
    if (last && last->source == source && last->end == page &&
        (source == KVTRACE_HOST || slot == last->slot + (last->end - last->begin))) {
        last->end++;
    } else {
        if (r->n == KVTRACE_READ_RUNS) { /* full: emit this part and carry on */
            kvtrace_12_read_emit(r);
            r->count[0] = r->count[1] = r->count[2] = 0;
            r->n = 0;
        }
        last = &r->runs[r->n++];
        last->begin = page;
        last->end = page + 1;
        last->slot = slot;
        last->source = source;
    }
    r->count[source]++;
}

KVTRACE_FN_ void kvtrace_12_invalidate(const char *reason, int64_t generation);
KVTRACE_FN_ void kvtrace_12_invalidate(const char *reason, int64_t generation) {
    kvtrace_op_ op;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYSTR_(&b, "reason", reason);
        KVTRACE_KEY_(&b, "generation");
        kvtrace_i64_or_null_(&b, generation);
        op.what = KVTRACE_OP_INVALIDATE_;
        kvtrace_12_commit_op("invalidate", line, &b, 0, &op);
    }
}

KVTRACE_FN_ void kvtrace_12_repartition(int64_t res_from, int64_t res_to, int64_t ring_from,
                                        int64_t ring_to, double miss_pct, double busy_pct,
                                        const char *reason);
KVTRACE_FN_ void kvtrace_12_repartition(int64_t res_from, int64_t res_to, int64_t ring_from,
                                        int64_t ring_to, double miss_pct, double busy_pct,
                                        const char *reason) {
    kvtrace_op_ op;
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_LIT_(&b, ",\"resident\":");
        kvtrace_pair_(&b, res_from, res_to);
        KVTRACE_LIT_(&b, ",\"ring\":");
        kvtrace_pair_(&b, ring_from, ring_to);
        KVTRACE_KEY_(&b, "miss_pct");
        kvtrace_f64_or_null_(&b, miss_pct);
        KVTRACE_KEY_(&b, "busy_pct");
        kvtrace_f64_or_null_(&b, busy_pct);
        KVTRACE_KEYSTR_(&b, "reason", reason ? reason : "");
        op.what = KVTRACE_OP_PARTITION_;
        op.a[0] = res_to;
        op.a[1] = ring_to;
        kvtrace_12_commit_op("repartition", line, &b, 0, &op);
    }
}

KVTRACE_FN_ void kvtrace_12_adapt(int64_t active, int64_t resident, int64_t ring,
                                  int64_t samples, int64_t misses, double busy_pct,
                                  int64_t peak, int64_t layout, int64_t skipped,
                                  int64_t resident_attended);
KVTRACE_FN_ void kvtrace_12_adapt(int64_t active, int64_t resident, int64_t ring,
                                  int64_t samples, int64_t misses, double busy_pct,
                                  int64_t peak, int64_t layout, int64_t skipped,
                                  int64_t resident_attended) {
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "active", active);
        KVTRACE_KEYI_(&b, "resident", resident);
        KVTRACE_KEYI_(&b, "ring", ring);
        KVTRACE_KEY_(&b, "samples");
        kvtrace_i64_or_null_(&b, samples);
        KVTRACE_KEY_(&b, "misses");
        kvtrace_i64_or_null_(&b, misses);
        KVTRACE_KEY_(&b, "busy_pct");
        kvtrace_f64_or_null_(&b, busy_pct);
        KVTRACE_KEY_(&b, "peak");
        kvtrace_i64_or_null_(&b, peak);
        if (layout >= 0) KVTRACE_KEYI_(&b, "layout", layout);
        if (skipped >= 0) KVTRACE_KEYI_(&b, "skipped", skipped);
        if (resident_attended >= 0) KVTRACE_KEYI_(&b, "resident_attended", resident_attended);
        kvtrace_12_commit("adapt", line, &b, 0);
    }
}

static inline void kvtrace_crc_(kvtrace_buf_ *b, uint32_t v) {
    static const char hex[] = "0123456789abcdef";
    char t[10];
    int i;
    t[0] = '"';
    for (i = 0; i < 8; i++) t[1 + i] = hex[(v >> (28 - 4 * i)) & 15u];
    t[9] = '"';
    kvtrace_put_(b, t, 10);
}

KVTRACE_FN_ void kvtrace_12_output(int64_t stream, uint32_t checksum, uint32_t ref_checksum,
                                   int has_ref, double max_abs_delta, double tolerance);
KVTRACE_FN_ void kvtrace_12_output(int64_t stream, uint32_t checksum, uint32_t ref_checksum,
                                   int has_ref, double max_abs_delta, double tolerance) {
    if (!kvtrace_12_start()) return;
    {
        KVTRACE_BEGIN_(line, b);
        KVTRACE_KEYI_(&b, "stream", stream);
        KVTRACE_KEY_(&b, "checksum");
        kvtrace_crc_(&b, checksum);
        if (has_ref) {
            KVTRACE_KEY_(&b, "ref_checksum");
            kvtrace_crc_(&b, ref_checksum);
        }
        KVTRACE_KEY_(&b, "max_abs_delta");
        kvtrace_f64_or_null_(&b, max_abs_delta);
        KVTRACE_KEY_(&b, "tolerance");
        kvtrace_f64_or_null_(&b, tolerance);
        kvtrace_12_commit("output", line, &b, 0);
    }
}

/* ggml_abort's text is "<file>:<line>: <message>"; GGML_ASSERT's message is
 * "GGML_ASSERT(<condition>) failed". Returns the offset of <message>, 0 if the shape differs;
 * *line_no and *file_len describe the prefix. */
static inline size_t kvtrace_abort_split_(const char *msg, size_t *file_len, int64_t *line_no) {
    size_t i;
    for (i = 0; msg[i]; i++) {
        size_t j = i + 1;
        int64_t v = 0;
        if (msg[i] != ':' || i == 0) continue;
        while (msg[j] >= '0' && msg[j] <= '9' && j - i < 12) v = v * 10 + (msg[j++] - '0');
        if (j > i + 1 && msg[j] == ':' && msg[j + 1] == ' ') {
            *file_len = i;
            *line_no = v;
            return j + 2;
        }
    }
    return 0;
}

/* "<NAME>(<condition>) failed" -- GGML_ASSERT's message, or a runtime's own assert macro of
 * the same shape: the offset and length of <condition>, 0 when the message has another shape. */
static inline size_t kvtrace_condition_(const char *m, size_t n, size_t *len) {
    static const char post[] = ") failed";
    size_t i = 0, k = sizeof post - 1;
    while (i < n && ((m[i] >= 'A' && m[i] <= 'Z') || (m[i] >= 'a' && m[i] <= 'z') || m[i] == '_' ||
                     (i > 0 && m[i] >= '0' && m[i] <= '9')))
        i++;
    if (i == 0 || i >= n || m[i] != '(' || n < i + 1 + k + 1 || memcmp(m + n - k, post, k) != 0)
        return 0;
    *len = n - k - (i + 1);
    return i + 1;
}

/* The abort event (message = "<file>:<line>: <text>", as ggml_abort formats it) and the end
 * {status "aborted"}; one write() each, no allocation. */
static inline void kvtrace_abort_event_(const char *whole, const char *file, size_t file_len,
                                        int64_t line_no, const char *text) {
    size_t n = strlen(text), clen = 0, at = kvtrace_condition_(text, n, &clen);
    KVTRACE_BEGIN_(line, b);
    KVTRACE_KEYSTR_(&b, "message", whole);
    if (file) {
        KVTRACE_KEY_(&b, "file");
        kvtrace_str_(&b, file, file_len < 512 ? file_len : 512);
        KVTRACE_KEYI_(&b, "line", line_no);
        if (at) {
            KVTRACE_KEY_(&b, "condition");
            kvtrace_str_(&b, text + at, clen);
        }
    }
    kvtrace_12_commit("abort", line, &b, 0);
    kvtrace_12_end("aborted", "");
}

/* ggml_abort's whole text (the abort hook's path). */
KVTRACE_FN_ void kvtrace_12_abort(const char *msg);
KVTRACE_FN_ void kvtrace_12_abort(const char *msg) {
    size_t file_len = 0, at;
    int64_t line_no = 0;
    if (!kvtrace_12_start()) return;
    msg = msg ? msg : "";
    at = kvtrace_abort_split_(msg, &file_len, &line_no);
    if (at) kvtrace_abort_event_(msg, msg, file_len, line_no, msg + at);
    else kvtrace_abort_event_(msg, NULL, 0, 0, msg);
}

/* KVTRACE_ABORT: a runtime without ggml reports its own fatal assertion. */
KVTRACE_FN_ void kvtrace_12_abort_at(const char *file, int64_t line_no, const char *text);
KVTRACE_FN_ void kvtrace_12_abort_at(const char *file, int64_t line_no, const char *text) {
    char whole[512 + 32 + KVTRACE_STRING_MAX];
    size_t f, t;
    if (!kvtrace_12_start()) return;
    file = file ? file : "";
    text = text ? text : "";
    f = kvtrace_strnlen_(file, 512);
    t = kvtrace_strnlen_(text, KVTRACE_STRING_MAX);
    memcpy(whole, file, f);
    whole[f] = ':';
    f++;
    f += kvtrace_u64_text_(whole + f, (uint64_t)(line_no < 0 ? 0 : line_no));
    whole[f++] = ':';
    whole[f++] = ' ';
    memcpy(whole + f, text, t);
    whole[f + t] = 0;
    kvtrace_abort_event_(whole, file, kvtrace_strnlen_(file, 512), line_no, whole + f);
}

#if KVTRACE_HAVE_GGML
/* ggml's abort callback: record, then behave as if kvtrace were not there: chain the callback
 * that was installed before, or (none) re-raise through ggml_abort with no callback so ggml
 * prints the message and its backtrace to stderr as usual (the log kvdiag postmortem reads). */
KVTRACE_FN_ void kvtrace_12_on_abort(const char *msg);
KVTRACE_FN_ void kvtrace_12_on_abort(const char *msg) {
    void (*prev)(const char *) = KVTRACE_S_()->abort_prev;
    size_t file_len = 0, at;
    int64_t line_no = 0;
    kvtrace_12_abort(msg);
    if (prev) {
        prev(msg);
        return;
    }
    at = msg ? kvtrace_abort_split_(msg, &file_len, &line_no) : 0;
    if (at && file_len < 4096) {
        char file[4096];
        memcpy(file, msg, file_len);
        file[file_len] = 0;
        ggml_set_abort_callback(NULL);
        ggml_abort(file, (int)line_no, "%s", msg + at);
    }
    kvtrace_stderr_(msg ? msg : "", "\n", NULL);
}

KVTRACE_FN_ void kvtrace_12_install_abort_hook(void);
KVTRACE_FN_ void kvtrace_12_install_abort_hook(void) {
    kvtrace_state_12_ *S = KVTRACE_S_();
    if (!kvtrace_12_start()) return;
    pthread_mutex_lock(&S->lock);
    if (!S->abort_installed) { /* twice would make the hook its own predecessor */
        S->abort_installed = 1;
        S->abort_prev = ggml_set_abort_callback(kvtrace_12_on_abort);
    }
    pthread_mutex_unlock(&S->lock);
}

static inline void kvtrace_from_ggml_(kvtrace_tensor *o, const struct ggml_tensor *t,
                                      const void *runtime) {
    int i;
    o->name = t->name;
    o->type = ggml_type_name(t->type);
    for (i = 0; i < 4; i++) {
        o->ne[i] = t->ne[i];
        o->nb[i] = (uint64_t)t->nb[i];
    }
    o->data = (uint64_t)(uintptr_t)t->data;
    o->view_offs = (uint64_t)t->view_offs;
    o->base = (uint64_t)(uintptr_t)(t->view_src ? t->view_src->data : t->data);
    o->buffer = t->buffer ? ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer)) : "";
    o->buffer_name = t->buffer ? ggml_backend_buffer_name(t->buffer) : "";
    o->runtime = (uint64_t)(uintptr_t)runtime;
    o->contiguous = ggml_is_contiguous(t) ? 1 : 0;
}

/* dst: the FLASH_ATTN_EXT node; Q/K/V/mask = dst->src[0..3]. */
static inline void kvtrace_fits_ggml_(const struct ggml_tensor *dst, int64_t layer, int result,
                                      const char *route, const char *const *failed,
                                      int64_t n_failed, const void *k_runtime,
                                      const void *v_runtime) {
    kvtrace_tensor q, k, v, m, d;
    if (!dst || !dst->src[0] || !dst->src[1] || !dst->src[2]) {
        kvtrace_12_fits(dst ? dst->name : "", layer, NULL, NULL, NULL, NULL, NULL, result, route,
                        failed, n_failed);
        return;
    }
    kvtrace_from_ggml_(&q, dst->src[0], NULL);
    kvtrace_from_ggml_(&k, dst->src[1], k_runtime);
    kvtrace_from_ggml_(&v, dst->src[2], v_runtime);
    kvtrace_from_ggml_(&d, dst, NULL);
    if (dst->src[3]) kvtrace_from_ggml_(&m, dst->src[3], NULL);
    kvtrace_12_fits(dst->name, layer, &q, &k, &v, dst->src[3] ? &m : NULL, &d, result, route,
                    failed, n_failed);
}
#endif /* KVTRACE_HAVE_GGML */

/* Sets every field to "unknown" (left out of the header). */
static inline void kvtrace_plan_defaults(kvtrace_plan *p) {
    memset(p, 0, sizeof *p);
    p->np = p->kv_unified = -1;
    p->page_bytes = p->v_offset = p->pool_pages = p->resident_pages_per_layer = -1;
    p->ring_slots = p->stage_bytes = p->kv_size = p->pages_per_stream = -1;
    p->streamed_layers = p->layers = p->n_stream = p->head_dim = p->n_head = p->n_head_kv = -1;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

/* ---- the macros ------------------------------------------------------------------------------ */

/* C before C23 does not convert int32_t (*)[3] to const int32_t (*)[3] implicitly */
#define KVTRACE_KEYS_(keys) ((const int32_t(*)[3])(keys))

/* Where "records" comes from: each macro expansion leaves a 4-byte entry (its KVTRACE_R_*_
 * bits) in the section kvtrace_rec_12 of the object it is compiled into -- an assembler
 * directive, not code: nothing runs for it. The linker gathers a program's or shared object's
 * entries between __start_kvtrace_rec_12 and __stop_kvtrace_rec_12 (symbols it defines for a
 * section whose name is a C identifier), and a constructor in every translation unit hands that
 * range to the process-wide state. The symbols are hidden so that each object sees its own
 * range, never its neighbour's. (Inline asm rather than a section attribute on a static: GCC
 * ignores the attribute for a static inside a template instantiation, and C++ forks put their
 * dispatch code in templates.) Without GCC/Clang on ELF, or with KVTRACE_NO_SECTIONS, nothing
 * is registered: KVTRACE_DECLARE says what the process records (or the header line leaves
 * "records" out: "not declared"). */
#if !defined(KVTRACE_DISABLE) && !defined(KVTRACE_NO_SECTIONS) && defined(__ELF__) && \
    (defined(__GNUC__) || defined(__clang__))
#define KVTRACE_SECTIONS_ 1
#define KVTRACE_REC_(bits)                                                                     \
    __asm__(".pushsection kvtrace_rec_12,\"a\"\n\t.balign 4\n\t.long %c0\n\t.popsection"      \
            : : "i"((unsigned)(bits)))
#ifdef __cplusplus
extern "C" {
#endif
extern const uint32_t __start_kvtrace_rec_12[] __attribute__((weak, visibility("hidden")));
extern const uint32_t __stop_kvtrace_rec_12[] __attribute__((weak, visibility("hidden")));
#ifdef __cplusplus
}
#endif
static void kvtrace_rec_ctor_(void) __attribute__((constructor, unused));
static void kvtrace_rec_ctor_(void) {
    kvtrace_12_register(__start_kvtrace_rec_12, __stop_kvtrace_rec_12);
}
#else
#define KVTRACE_SECTIONS_ 0
#define KVTRACE_REC_(bits) ((void)0)
#endif

#ifndef KVTRACE_DISABLE
#define KVTRACE_CALL_(bits, call)                                                              \
    do {                                                                                       \
        KVTRACE_REC_(bits);                                                                    \
        if (KVTRACE_ON_()) { call; }                                                           \
    } while (0)
#define KVTRACE_CALL0_(call) do { if (KVTRACE_ON_()) { call; } } while (0)
#else /* compiled away; the arguments still type-check and count as used */
#define KVTRACE_CALL_(bits, call) do { if (0) { call; } } while (0)
#define KVTRACE_CALL0_(call) do { if (0) { call; } } while (0)
#endif

#define KVTRACE_BOOT(plan) KVTRACE_CALL0_(kvtrace_12_boot(plan))
#define KVTRACE_DECLARE(kinds) KVTRACE_CALL0_(kvtrace_12_declare(kinds))
#define KVTRACE_STEP(phase, streams, n_streams, tokens, n_kv)                                  \
    KVTRACE_CALL_(KVTRACE_R_STEP_,                                                             \
                  kvtrace_12_step((phase), (streams), (int64_t)(n_streams), (int64_t)(tokens), \
                                  (int64_t)(n_kv)))
#define KVTRACE_LEARN(layer, k_ptr, relearn)                                                   \
    KVTRACE_CALL_(KVTRACE_R_LEARN_, kvtrace_12_learn((int64_t)(layer),                         \
                                                     (uint64_t)(uintptr_t)(k_ptr), (relearn)))
#define KVTRACE_FITS_RAW(node, layer, q, k, v, mask, dst, result, route, failed, n_failed)      \
    KVTRACE_CALL_(KVTRACE_R_FITS_,                                                             \
                  kvtrace_12_fits((node), (int64_t)(layer), (q), (k), (v), (mask), (dst),      \
                                  (result), (route), (failed), (int64_t)(n_failed)))
#if KVTRACE_HAVE_GGML
#define KVTRACE_FITS(dst, layer, result, route, failed, n_failed, k_runtime, v_runtime)          \
    KVTRACE_CALL_(KVTRACE_R_FITS_,                                                               \
                  kvtrace_fits_ggml_((dst), (int64_t)(layer), (result), (route), (failed),       \
                                     (int64_t)(n_failed), (k_runtime), (v_runtime)))
#define KVTRACE_INSTALL_ABORT_HOOK() \
    KVTRACE_CALL_(KVTRACE_R_ABORT_, kvtrace_12_install_abort_hook())
#endif
#define KVTRACE_ABORT(file, line, message)                                                     \
    KVTRACE_CALL_(KVTRACE_R_ABORT_,                                                            \
                  kvtrace_12_abort_at((file), (int64_t)(line), (message)))
#define KVTRACE_MARK_OUTSIDE(rows, n_rows, keys, n_keys, all, outside, n_outside)               \
    KVTRACE_CALL_(KVTRACE_R_MARK_ | KVTRACE_R_MARK_OUTSIDE_,                                    \
                  kvtrace_12_mark((rows), (int64_t)(n_rows), KVTRACE_KEYS_(keys),               \
                                  (int64_t)(n_keys), (all),                                     \
                                  (const int32_t(*)[2])(outside), (int64_t)(n_outside)))
#define KVTRACE_MARK(rows, n_rows, keys, n_keys, all)                                          \
    KVTRACE_CALL_(KVTRACE_R_MARK_,                                                             \
                  kvtrace_12_mark((rows), (int64_t)(n_rows), KVTRACE_KEYS_(keys),              \
                                  (int64_t)(n_keys), (all), NULL, 0))
#define KVTRACE_WRITE(layer, stream, cell0, cell1, row0, row1, keys, n_keys)                    \
    KVTRACE_CALL_(KVTRACE_R_WRITE_,                                                             \
                  kvtrace_12_write((int64_t)(layer), (int64_t)(stream), (int64_t)(cell0),       \
                                   (int64_t)(cell1), (int64_t)(row0), (int64_t)(row1),          \
                                   KVTRACE_KEYS_(keys), (int64_t)(n_keys)))
#define KVTRACE_UPLOAD(layer, stream, page0, page1, slot, target, bytes, reason, key_stream)    \
    KVTRACE_CALL_(KVTRACE_R_UPLOAD_,                                                            \
                  kvtrace_12_upload((int64_t)(layer), (int64_t)(stream), (int64_t)(page0),      \
                                    (int64_t)(page1), (int64_t)(slot), (target),                 \
                                    (int64_t)(bytes), (reason), (int64_t)(key_stream)))
#define KVTRACE_READ_BEGIN(r, layer, stream) \
    KVTRACE_CALL0_(kvtrace_read_begin_((r), (int64_t)(layer), (int64_t)(stream)))
#define KVTRACE_READ_PAGE(r, page, source, slot) \
    KVTRACE_CALL0_(kvtrace_read_page_((r), (int64_t)(page), (source), (int64_t)(slot)))
#define KVTRACE_READ_END(r) KVTRACE_CALL_(KVTRACE_R_READ_, kvtrace_12_read_emit(r))
#define KVTRACE_INVALIDATE(reason, generation)                                                 \
    KVTRACE_CALL_(KVTRACE_R_INVALIDATE_,                                                       \
                  kvtrace_12_invalidate((reason), (int64_t)(generation)))
#define KVTRACE_REPARTITION(res_from, res_to, ring_from, ring_to, miss_pct, busy_pct, reason)   \
    KVTRACE_CALL_(KVTRACE_R_REPARTITION_,                                                       \
                  kvtrace_12_repartition((int64_t)(res_from), (int64_t)(res_to),                \
                                         (int64_t)(ring_from), (int64_t)(ring_to),              \
                                         (double)(miss_pct), (double)(busy_pct), (reason)))
#define KVTRACE_ADAPT_EX(active, resident, ring, samples, misses, busy_pct, peak, layout,       \
                         skipped, resident_attended)                                            \
    KVTRACE_CALL_(KVTRACE_R_ADAPT_,                                                             \
                  kvtrace_12_adapt((int64_t)(active), (int64_t)(resident), (int64_t)(ring),     \
                                   (int64_t)(samples), (int64_t)(misses), (double)(busy_pct),   \
                                   (int64_t)(peak), (int64_t)(layout), (int64_t)(skipped),      \
                                   (int64_t)(resident_attended)))
#define KVTRACE_ADAPT(active, resident, ring, samples, misses, busy_pct, peak) \
    KVTRACE_ADAPT_EX(active, resident, ring, samples, misses, busy_pct, peak, -1, -1, -1)
#define KVTRACE_OUTPUT(stream, checksum, ref_checksum, has_ref, max_abs_delta, tolerance)       \
    KVTRACE_CALL_(KVTRACE_R_OUTPUT_,                                                            \
                  kvtrace_12_output((int64_t)(stream), (uint32_t)(checksum),                    \
                                    (uint32_t)(ref_checksum), (has_ref),                        \
                                    (double)(max_abs_delta), (double)(tolerance)))
#define KVTRACE_WARN(code, message) \
    KVTRACE_CALL_(KVTRACE_R_WARN_, kvtrace_12_warn((code), (message)))
#define KVTRACE_WARN_LAYER(code, layer, message) \
    KVTRACE_CALL_(KVTRACE_R_WARN_, kvtrace_12_warn_layer((code), (int64_t)(layer), (message)))
#define KVTRACE_END(status) KVTRACE_CALL_(KVTRACE_R_END_, kvtrace_12_end((status), ""))
#define KVTRACE_END_REASON(status, reason) \
    KVTRACE_CALL_(KVTRACE_R_END_, kvtrace_12_end((status), (reason)))

#endif /* KVTRACE_H */
