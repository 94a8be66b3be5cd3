/* kvtrace.h cost measurements; benchmarks/bench_native.py builds it with gcc -O2 and runs it.
 *
 *   kvtrace_bench off N        ns per iteration: empty loop vs a loop with one KVTRACE_UPLOAD,
 *                              tracing off (KVTRACE_FILE unset); prints "empty_ns macro_ns
 *                              empty_cpu_ns macro_cpu_ns"
 *   kvtrace_bench on N T       T threads emit N upload events in total into $KVTRACE_FILE;
 *                              prints "seconds bytes_per_line cpu_seconds"
 *   kvtrace_bench write N LEN  baseline: N plain write() calls of a LEN-byte line to an
 *                              O_APPEND file (argument 4); prints "seconds cpu_seconds"
 *
 * Times are wall clock and, beside them, this process's CPU time (all threads): on a shared
 * machine the CPU figures are the steadier ones.
 *   kvtrace_bench gen N        a native trace of about N events into $KVTRACE_FILE, shaped
 *                              like a decode run: per step a step and a mark, per layer a write,
 *                              an upload and a read, per stream an output; fits (large lines)
 *                              for every layer every 64th step; prints "events seconds
 *                              cpu_seconds" (with KVTRACE_MAX_MB set: the cost of rotation)
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

/* The barrier keeps both loops real (the compiler cannot drop or merge iterations) and makes
 * the macro reload its flag each time, as in a runtime where other code runs in between. */
#define BARRIER(i) __asm__ __volatile__("" : : "r"(i) : "memory")

static double loop_empty(long n, double *cpu_ns) {
    long i;
    double t = now_s(), c = cpu_s();
    for (i = 0; i < n; i++) BARRIER(i);
    *cpu_ns = (cpu_s() - c) * 1e9 / (double)n;
    return (now_s() - t) * 1e9 / (double)n;
}

static double loop_macro(long n, double *cpu_ns) {
    long i;
    double t = now_s(), c = cpu_s();
    for (i = 0; i < n; i++) {
        BARRIER(i);
        KVTRACE_UPLOAD(3, 1, i, i + 1, 7, "resident", 73728, "miss", -1);
    }
    *cpu_ns = (cpu_s() - c) * 1e9 / (double)n;
    return (now_s() - t) * 1e9 / (double)n;
}

static long per_thread;

static void *emit(void *arg) {
    long t = (long)(intptr_t)arg, i;
    for (i = 0; i < per_thread; i++)
        KVTRACE_UPLOAD(t, 1, i, i + 1, 7 + (i & 31), "resident", 73728, "miss", -1);
    return NULL;
}

static int on(long n, int threads) {
    pthread_t tid[64];
    double t, c;
    int i;
    kvtrace_plan p;
    kvtrace_plan_defaults(&p);
    p.run_name = "bench";
    KVTRACE_BOOT(&p);
    if (threads < 1 || threads > 64) return 2;
    per_thread = n / threads;
    t = now_s();
    c = cpu_s();
    if (threads == 1) emit(NULL);
    else {
        for (i = 0; i < threads; i++) pthread_create(&tid[i], NULL, emit, (void *)(intptr_t)i);
        for (i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    }
    t = now_s() - t;
    c = cpu_s() - c;
    printf("%.9f %.2f %.9f\n", t, (double)kvtrace_12_state.offset / (double)(per_thread * threads),
           c);
    return 0;
}

static int plain_write(long n, int len, const char *path) {
    char line[4096];
    long i;
    double t, c;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || len < 2 || len > (int)sizeof line) return 2;
    memset(line, 'x', (size_t)len);
    line[len - 1] = '\n';
    t = now_s();
    c = cpu_s();
    for (i = 0; i < n; i++)
        if (write(fd, line, (size_t)len) != len) return 1;
    t = now_s() - t;
    c = cpu_s() - c;
    close(fd);
    printf("%.9f %.9f\n", t, c);
    return 0;
}

static int gen(long n) {
    enum { LAYERS = 8, STREAMS = 2, PAGES = 16 };
    static const int32_t streams[STREAMS] = {0, 1};
    static const char *const failed[1] = {"Q->ne[3] == 1"};
    kvtrace_plan p;
    kvtrace_tensor q, k, v, d;
    long step;
    int s, l, pg;
    double t, c;
    kvtrace_plan_defaults(&p);
    p.run_name = "bench gen";
    p.np = STREAMS;
    p.kv_unified = 0;
    p.layout = "per-stream";
    p.dispatch = "fits";
    p.page_bytes = 73728;
    p.stage_bytes = 73728;
    p.kv_size = PAGES * 256;
    p.layers = LAYERS;
    p.streamed_layers = LAYERS;
    p.n_stream = STREAMS;
    p.resident_pages_per_layer = PAGES;
    KVTRACE_BOOT(&p);
    memset(&q, 0, sizeof q);
    q.name = "Qcur";
    q.type = "f32";
    q.buffer = "CUDA0";
    q.ne[0] = 256; q.ne[1] = 1; q.ne[2] = 24; q.ne[3] = STREAMS;
    q.nb[0] = 4; q.nb[1] = 1024; q.nb[2] = 1024; q.nb[3] = 24576;
    q.contiguous = 1;
    k = q;
    k.name = "k_view";
    k.type = "q8_0";
    k.buffer = "CUDA_KV_Stream_Host";
    k.runtime = 0x5555aaaa;
    k.ne[1] = PAGES * 256; k.ne[2] = 4;
    v = k;
    v.name = "v_view";
    v.type = "q5_1";
    d = q;
    d.name = "fattn";
    t = now_s();
    c = cpu_s();
    for (step = 0; kvtrace_12_state.seq < n; step++) {
        int64_t rows[STREAMS];
        int32_t keys[STREAMS][3];
        long cell = step % (PAGES * 256);
        KVTRACE_STEP("decode", streams, STREAMS, 1, cell + 1);
        for (s = 0; s < STREAMS; s++) {
            rows[s] = (int64_t)s * PAGES * 256 + cell;
            keys[s][0] = 0; keys[s][1] = s; keys[s][2] = (int32_t)(cell / 256);
        }
        KVTRACE_MARK(rows, STREAMS, keys, STREAMS, 0);
        for (l = 0; l < LAYERS; l++) {
            kvtrace_read r;
            int32_t key[1][3];
            s = (int)(step % STREAMS);
            key[0][0] = l; key[0][1] = s; key[0][2] = (int32_t)(cell / 256);
            if (step % 64 == 0)
                KVTRACE_FITS_RAW("fattn", l, &q, &k, &v, NULL, &d, 1, "streamed", failed, 0);
            KVTRACE_WRITE(l, s, cell, cell + 1, rows[s], rows[s] + 1, key, 1);
            KVTRACE_UPLOAD(l, s, cell / 256, cell / 256 + 1, l * PAGES + cell / 256, "resident",
                           73728, "dirty", s);
            KVTRACE_READ_BEGIN(&r, l, s);
            for (pg = 0; pg <= cell / 256; pg++) KVTRACE_READ_PAGE(&r, pg, KVTRACE_POOL, l * PAGES + pg);
            KVTRACE_READ_END(&r);
        }
        for (s = 0; s < STREAMS; s++) KVTRACE_OUTPUT(s, (uint32_t)step * 2654435761u, 0, 0, -1, -1);
    }
    KVTRACE_END("completed");
    t = now_s() - t;
    c = cpu_s() - c;
    printf("%lld %.9f %.9f\n", (long long)kvtrace_12_state.seq, t, c);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    long n = argc > 2 ? atol(argv[2]) : 0;
    if (strcmp(mode, "off") == 0 && n > 0) {
        double ec, mc, e = loop_empty(n, &ec), m = loop_macro(n, &mc);
        printf("%.4f %.4f %.4f %.4f\n", e, m, ec, mc);
        return kvtrace_12_enabled == 0 ? 0 : 1;
    }
    if (strcmp(mode, "on") == 0 && n > 0 && argc > 3) return on(n, atoi(argv[3]));
    if (strcmp(mode, "write") == 0 && n > 0 && argc > 4) return plain_write(n, atoi(argv[3]), argv[4]);
    if (strcmp(mode, "gen") == 0 && n > 0) return gen(n);
    fprintf(stderr, "usage: %s off N | on N THREADS | write N LEN PATH | gen N\n", argv[0]);
    return 2;
}
