/* Macro arguments are evaluated only while tracing is on -- the very first macro call included
 * (it decides on/off before it evaluates anything). tests/test_native_header.py builds this
 * file as C99, as C++17 and as CUDA host code (nvcc -x cu), runs it with KVTRACE_FILE unset and
 * set, and compares the two counts it prints: every argument goes through a counting helper.
 *
 *   kvtrace_lazy      ->  "evaluated <n> of <arguments>"   (n = 0 off, n = arguments on)
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#include <stdio.h>

static long evaluated;
static long arguments;

/* one helper per argument type, so the file is also valid C++ (no void * conversions) */
static int64_t I(int64_t v) { evaluated++; return v; }
static double D(double v) { evaluated++; return v; }
static const char *S(const char *s) { evaluated++; return s; }
static const int32_t *P32(const int32_t *p) { evaluated++; return p; }
static const int64_t *P64(const int64_t *p) { evaluated++; return p; }
static const int32_t (*K3(const int32_t (*k)[3]))[3] { evaluated++; return k; }
static const int32_t (*K2(const int32_t (*k)[2]))[2] { evaluated++; return k; }
static const kvtrace_tensor *T(const kvtrace_tensor *t) { evaluated++; return t; }
static const char *const *F(const char *const *f) { evaluated++; return f; }
static kvtrace_read *R(kvtrace_read *r) { evaluated++; return r; }
static const kvtrace_plan *PL(const kvtrace_plan *p) { evaluated++; return p; }

int main(void) {
    static const int32_t streams[2] = {0, 1};
    static const int64_t rows[2] = {0, 1};
    static const int32_t keys[1][3] = {{0, -1, 0}};
    static const int32_t outside[1][2] = {{-1, 8}};
    static const char *const failed[1] = {"Q->ne[3] == 1"};
    kvtrace_plan plan;
    kvtrace_tensor t;
    kvtrace_read r;
    kvtrace_plan_defaults(&plan);
    memset(&t, 0, sizeof t);
    memset(&r, 0, sizeof r);
    t.name = "t";
    t.type = "f32";

    /* the first macro of the process: nothing of it may run while tracing is off */
    KVTRACE_STEP(S("decode"), P32(streams), I(2), I(1), I(256)); arguments += 5;
    KVTRACE_BOOT(PL(&plan)); arguments += 1;
    KVTRACE_DECLARE(S("step")); arguments += 1;
    KVTRACE_LEARN(I(0), I(4096), (int)I(0)); arguments += 3;
    KVTRACE_FITS_RAW(S("fa"), I(0), T(&t), T(&t), T(&t), T(NULL), T(&t), (int)I(0),
                     S("fallback"), F(failed), I(1)); arguments += 11;
    KVTRACE_MARK(P64(rows), I(2), K3(keys), I(1), (int)I(0)); arguments += 5;
    KVTRACE_MARK_OUTSIDE(P64(rows), I(2), K3(keys), I(1), (int)I(0), K2(outside), I(1));
    arguments += 7;
    KVTRACE_WRITE(I(0), I(0), I(0), I(1), I(0), I(1), K3(keys), I(1)); arguments += 8;
    KVTRACE_UPLOAD(I(0), I(0), I(0), I(1), I(4), S("resident"), I(4096), S("miss"), I(-1));
    arguments += 9;
    KVTRACE_READ_BEGIN(R(&r), I(0), I(0)); arguments += 3;
    KVTRACE_READ_PAGE(R(&r), I(0), (int)I(KVTRACE_POOL), I(4)); arguments += 4;
    KVTRACE_READ_END(R(&r)); arguments += 1;
    KVTRACE_INVALIDATE(S("resize"), I(2)); arguments += 2;
    KVTRACE_REPARTITION(I(4), I(3), I(8), I(12), D(1.5), D(50.0), S("grow")); arguments += 7;
    KVTRACE_ADAPT(I(300), I(3), I(12), I(10), I(1), D(40.0), I(6)); arguments += 7;
    KVTRACE_ADAPT_EX(I(300), I(3), I(12), I(10), I(1), D(40.0), I(6), I(2), I(0), I(3));
    arguments += 10;
    KVTRACE_OUTPUT(I(0), (uint32_t)I(1), (uint32_t)I(1), (int)I(1), D(0.0), D(0.001));
    arguments += 6;
    KVTRACE_WARN(S("code"), S("message")); arguments += 2;
    KVTRACE_WARN_LAYER(S("kv-stream-fallback"), I(3), S("message")); arguments += 3;
    KVTRACE_ABORT(S(__FILE__), I(__LINE__), S("MY_ASSERT(x > 0) failed")); arguments += 3;
    printf("evaluated %ld of %ld\n", evaluated, arguments);
    return 0;
}
