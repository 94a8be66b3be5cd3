/* kvtrace.h self-test program (C99, no ggml): tests/test_native_header.py builds it and checks
 * the traces it writes with kvdiag's TraceReader.
 *
 *   kvtrace_selftest all          every event kind the header offers, fixed values
 *   kvtrace_selftest threads T N  T threads emit N upload events each, concurrently
 *   kvtrace_selftest end-race     KVTRACE_END while 4 threads are still emitting
 *   kvtrace_selftest forever      emit until killed (the SIGKILL test)
 *   kvtrace_selftest strings      awkward strings: quotes, backslashes, control bytes, UTF-8
 *   kvtrace_selftest overflow     arrays longer than KVTRACE_LINE_MAX allows, and a read of more
 *                                 runs than one kvtrace_read builder holds
 *   kvtrace_selftest numbers      integers at the digit-count boundaries, 0 to 2^64-1 and negative
 *   kvtrace_selftest bad-args     invalid enumeration arguments, an event before KVTRACE_BOOT
 *   kvtrace_selftest abort-text   the abort event parser, fed ggml_abort's text directly
 *   kvtrace_selftest abort-at [M] KVTRACE_ABORT (no ggml) with message M, then abort()
 *   kvtrace_selftest off          every macro with KVTRACE_FILE unset: writes nothing
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void boot(const char *name) {
    kvtrace_plan p;
    kvtrace_plan_defaults(&p);
    p.run_name = name;
    p.build = "selftest-build \"1\"";
    p.device_name = "no GPU";
    p.layout = "shared";
    p.dispatch = "fits";
    p.np = 2;
    p.kv_unified = 0;
    p.page_bytes = 73728;
    p.v_offset = 34816;
    p.pool_pages = 96;
    p.resident_pages_per_layer = 8;
    p.ring_slots = 32;
    p.stage_bytes = 73728;
    p.kv_size = 4096;
    p.streamed_layers = 8;
    p.layers = 8;
    p.n_stream = 2;
    p.head_dim = 256;
    p.n_head = 24;
    p.n_head_kv = 4;
    p.type_k = "q8_0";
    p.type_v = "q5_1";
    p.pages_per_stream = 16;
    KVTRACE_BOOT(&p);
}

static kvtrace_tensor tensor(const char *name, const char *type, const char *buft,
                             uint64_t data, uint64_t runtime, int64_t ne3) {
    kvtrace_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.type = type;
    t.buffer = buft;
    t.buffer_name = buft[0] ? "CUDA0_buffer" : "";
    t.ne[0] = 256; t.ne[1] = 512; t.ne[2] = 4; t.ne[3] = ne3;
    t.nb[0] = 34; t.nb[1] = 1088; t.nb[2] = 272; t.nb[3] = 4456448;
    t.data = data;
    t.view_offs = 4096;
    t.base = data - 4096;
    t.runtime = runtime;
    t.contiguous = 0;
    return t;
}

static int all_kinds(void) {
    static const int32_t streams[2] = {0, 1};
    static const char *const failed[2] = {"Q->ne[3] == 1", "K->ne[3] == 1"};
    static const int64_t rows[6] = {0, 1, 2, 3, 4096, 4097};
    static const int32_t mkeys[2][3] = {{0, -1, 0}, {1, -1, 16}};
    static const int32_t outside[1][2] = {{-1, 16}};
    static const int32_t wkeys[1][3] = {{3, 1, 2}};
    kvtrace_tensor q = tensor("Qcur-3", "f32", "CUDA0", 0x7f0000001000ull, 0, 2);
    kvtrace_tensor k = tensor("k-3 (view)", "q8_0", "CUDA_KV_Stream_Host", 0x7f0000100000ull,
                              0x55550000aaaaull, 2);
    kvtrace_tensor v = tensor("v-3 (view)", "q5_1", "CUDA_KV_Stream_Host", 0x7f0000200000ull,
                              0x55550000aaaaull, 2);
    kvtrace_tensor m = tensor("KQ_mask", "f16", "CUDA0", 0x7f0000300000ull, 0, 1);
    kvtrace_tensor d = tensor("__fattn__-3", "f32", "CUDA0", 0x7f0000400000ull, 0, 2);
    kvtrace_read r;
    int i;
    m.contiguous = 1;
    boot("selftest all");
    KVTRACE_STEP("prefill", streams, 2, 512, 1024);
    KVTRACE_LEARN(3, (void *)(uintptr_t)0x7f0000100000ull, 0);
    KVTRACE_FITS_RAW("__fattn__-3", 3, &q, &k, &v, &m, &d, 0, "fallback", failed, 2);
    KVTRACE_FITS_RAW("__fattn__-3", -1, &q, &k, &v, NULL, &d, 1, "streamed", NULL, 0);
    KVTRACE_MARK_OUTSIDE(rows, 6, mkeys, 2, 0, outside, 1);
    KVTRACE_MARK(rows, 0, NULL, 0, 1);
    KVTRACE_WRITE(3, 1, 0, 4, 4096, 4100, wkeys, 1);
    KVTRACE_UPLOAD(3, 1, 0, 4, 7, "resident", 4 * 73728, "miss", 1);
    KVTRACE_UPLOAD(3, 0, 8, 10, 0, "ring", 2 * 73728, "ring", -1);
    KVTRACE_STEP("decode", streams, 2, 1, 1025);
    KVTRACE_READ_BEGIN(&r, 3, 1);
    for (i = 0; i < 4; i++) KVTRACE_READ_PAGE(&r, i, KVTRACE_POOL, 7 + i);
    KVTRACE_READ_PAGE(&r, 4, KVTRACE_POOL, 20);
    KVTRACE_READ_PAGE(&r, 5, KVTRACE_RING, 0);
    KVTRACE_READ_PAGE(&r, 6, KVTRACE_RING, 1);
    KVTRACE_READ_PAGE(&r, 7, KVTRACE_HOST, 99);
    KVTRACE_READ_PAGE(&r, 8, KVTRACE_HOST, -1);
    KVTRACE_READ_END(&r);
    printf("read seq %lld\n", (long long)r.seq);
    KVTRACE_INVALIDATE("buffer-clear", 5);
    KVTRACE_INVALIDATE("resize", -1);
    KVTRACE_REPARTITION(8, 7, 32, 40, 2.5, 61.25, "starved");
    KVTRACE_REPARTITION(7, 8, 40, 32, -1, -1, "");
    KVTRACE_ADAPT(1025, 8, 32, 100, 3, 45.5, 12);
    KVTRACE_ADAPT_EX(1025, 8, 32, -1, -1, -1.0, -1, 2, 5, 9);
    KVTRACE_OUTPUT(0, 0xdeadbeefu, 0xdeadbeefu, 1, 0.0, 0.001);
    KVTRACE_OUTPUT(1, 0x0000abcdu, 0, 0, -1, -1);
    KVTRACE_WARN_LAYER("kv-stream-fallback", 3, "layer 3: fits() false, ordinary flash attention");
    KVTRACE_END("completed");
    KVTRACE_WARN("late", "after the end: must not be written");
    return 0;
}

static long per_thread;

static void *worker(void *arg) {
    long t = (long)(intptr_t)arg, i;
    for (i = 0; i < per_thread; i++) KVTRACE_UPLOAD(t, 0, i, i + 1, i, "ring", 73728, "ring", -1);
    return NULL;
}

static int threads(int n, long each) {
    pthread_t tid[64];
    int i;
    if (n > 64) n = 64;
    per_thread = each;
    boot("selftest threads");
    for (i = 0; i < n; i++) pthread_create(&tid[i], NULL, worker, (void *)(intptr_t)i);
    for (i = 0; i < n; i++) pthread_join(tid[i], NULL);
    return 0; /* atexit writes the end event */
}

static int end_race(void) {
    pthread_t tid[4];
    struct timespec pause = {0, 1000 * 1000};
    int i;
    per_thread = 200000;
    boot("selftest end-race");
    for (i = 0; i < 4; i++) pthread_create(&tid[i], NULL, worker, (void *)(intptr_t)i);
    while (__atomic_load_n(&kvtrace_12_state.seq, __ATOMIC_RELAXED) < 1000) nanosleep(&pause, NULL);
    KVTRACE_END_REASON("completed", "ended while threads emit");
    for (i = 0; i < 4; i++) pthread_join(tid[i], NULL);
    return 0;
}

static int forever(void) {
    static const int32_t s[1] = {0};
    static const int32_t keys[3][3] = {{0, 0, 1}, {1, 0, 1}, {2, 0, 1}};
    long i;
    boot("selftest forever");
    fprintf(stdout, "ready\n");
    fflush(stdout);
    for (i = 0;; i++) {
        if (i % 100 == 0) KVTRACE_STEP("decode", s, 1, 1, i);
        KVTRACE_WRITE(i % 8, 0, i, i + 1, i, i + 1, keys, 3);
    }
    return 0;
}

static int strings(void) {
    boot("quote \" backslash \\ newline \n tab \t bell \a del \x7f end");
    KVTRACE_WARN("code\"\\", "a \"quoted\" \\path\\ \r\n\x01\x1f caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    KVTRACE_WARN("bad-utf8", "lone \xff byte, cut \xe2\x82 seq, surrogate \xed\xa0\x80 x");
    KVTRACE_INVALIDATE("reason with \"quotes\"", 1);
    KVTRACE_END_REASON("error", "interrupted by \"SIGINT\"\n");
    return 0;
}

static int overflow(void) {
    enum { N = 20000 };
    static int64_t rows[N];
    static int32_t keys[N][3];
    int i;
    for (i = 0; i < N; i++) {
        rows[i] = 2 * i; /* no two consecutive: one run per row */
        keys[i][0] = i;
        keys[i][1] = -1;
        keys[i][2] = i;
    }
    kvtrace_read r;
    boot("selftest overflow");
    KVTRACE_MARK(rows, N, keys, N, 0);
    KVTRACE_WRITE(0, 0, 0, 1, 0, 1, keys, N);
    /* 300 pages alternating pool/host: 300 runs, more than one builder's 128 */
    KVTRACE_READ_BEGIN(&r, 2, 1);
    for (i = 0; i < 300; i++)
        KVTRACE_READ_PAGE(&r, i, i % 2 ? KVTRACE_HOST : KVTRACE_POOL, 1000 + i);
    KVTRACE_READ_END(&r);
    KVTRACE_END("completed");
    return 0;
}

static int numbers(void) {
    uint64_t v = 1;
    int i;
    boot("selftest numbers");
    KVTRACE_LEARN(0, (uintptr_t)0, 0);
    for (i = 0; i < 20; i++) { /* 10^i - 1 and 10^i: every digit count */
        KVTRACE_LEARN(i, v - 1, 0);
        KVTRACE_LEARN(i, v, 0);
        v *= 10u;
    }
    KVTRACE_LEARN(20, UINT64_MAX, 1);
    KVTRACE_UPLOAD(0, 0, 0, 1, 0, "ring", -1, "ring", -1); /* bytes unknown: null */
    KVTRACE_UPLOAD(0, 0, 1, 2, 1, "ring", 0, "ring", -1);
    KVTRACE_WRITE(INT32_MIN, -1, INT64_MIN, INT64_MAX, -9, -10, NULL, 0);
    KVTRACE_END("completed");
    return 0;
}

static int bad_args(void) {
    static const int32_t s[1] = {0};
    kvtrace_tensor t;
    memset(&t, 0, sizeof t);
    KVTRACE_WARN("first", "before BOOT: a minimal header is written");
    boot("too late");
    KVTRACE_STEP("warmup", s, 1, 1, 1);
    KVTRACE_UPLOAD(0, 0, 0, 1, 0, "pool", 1, "miss", -1);
    KVTRACE_UPLOAD(0, 0, 0, 1, 0, "ring", 1, "because", -1);
    KVTRACE_FITS_RAW("n", 0, &t, &t, &t, NULL, &t, 1, "maybe", NULL, 0);
    KVTRACE_FITS_RAW("n", 0, &t, NULL, &t, NULL, &t, 1, "streamed", NULL, 0);
    KVTRACE_STEP("decode", s, 1, 1, 2);
    KVTRACE_END("finished");
    return 0;
}

static int abort_text(void) {
    boot("selftest abort");
    kvtrace_12_abort("/src/ggml/ggml-cuda.cu:1898: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed");
    return 0;
}

/* A runtime without ggml reporting its own assertion, then dying the way an assert does. */
static int abort_at(const char *message) {
    boot("selftest abort-at");
    KVTRACE_ABORT("/src/runtime/kv_cache.c", 214, message);
    fflush(stdout);
    abort();
}

static int off(void) {
    static const int32_t s[1] = {0};
    kvtrace_read r;
    boot("off");
    KVTRACE_STEP("decode", s, 1, 1, 1);
    KVTRACE_UPLOAD(0, 0, 0, 1, 0, "ring", 1, "ring", -1);
    KVTRACE_READ_BEGIN(&r, 0, 0);
    KVTRACE_READ_PAGE(&r, 0, KVTRACE_HOST, -1);
    KVTRACE_READ_END(&r);
    KVTRACE_END("completed");
    printf("enabled=%d\n", kvtrace_12_enabled);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "all") == 0) return all_kinds();
    if (strcmp(mode, "threads") == 0 && argc > 3) return threads(atoi(argv[2]), atol(argv[3]));
    if (strcmp(mode, "forever") == 0) return forever();
    if (strcmp(mode, "end-race") == 0) return end_race();
    if (strcmp(mode, "strings") == 0) return strings();
    if (strcmp(mode, "overflow") == 0) return overflow();
    if (strcmp(mode, "abort-text") == 0) return abort_text();
    if (strcmp(mode, "abort-at") == 0)
        return abort_at(argc > 2 ? argv[2] : "KV_ASSERT(page < window) failed");
    if (strcmp(mode, "bad-args") == 0) return bad_args();
    if (strcmp(mode, "numbers") == 0) return numbers();
    if (strcmp(mode, "off") == 0) return off();
    fprintf(stderr, "usage: %s all|threads T N|end-race|forever|strings|overflow|numbers|bad-args|abort-text|abort-at [M]|off\n", argv[0]);
    return 2;
}
