/* kvrt: a small kv-stream runtime with real bytes and its own truth, for kvdiag's tests.
 *
 * Written independently of kvdiag's Python model: it shares nothing with it but the trace it
 * writes through kernels/kvtrace.h. tests/native_runtime.py builds and runs it; the corpus test
 * and the judgement are checked against the truth file it writes.
 *
 * The runtime (facts from the domain brief, kv-stream-domain.md §1.4-§1.6, §3, §4):
 *   - a host store of pages (layer, stream, page) of 256 cells; every page starts with an
 *     identity tag (magic, layer, stream, page, version) and holds one 8-byte row per cell;
 *     a write (SET_ROWS) changes the rows and bumps the page's version;
 *   - a device pool of 16 page slots: a transfer ring (slots 0..3) and 4 resident slots per
 *     layer (3 layers), holding COPIED bytes (memcpy), never references;
 *   - resident bookkeeping keyed by (layer, page) with dirty pages from global rows
 *     (stream * 2048 + cell) / 256 -- upstream, buggy -- or by (layer, stream, page) with the
 *     layer's slots split between the streams -- the fix (--layout);
 *   - the FA dispatcher routes on buffer membership and then asserts fits() -- upstream, aborts
 *     through KVTRACE_ABORT -- or on fits(), else the ordinary attention reads the host store
 *     zero-copy and warns (--dispatch).
 *
 * Its own truth: for every page a read serves, the runtime compares the bytes it read -- the
 * slot's, or for a ring page whose slot the read itself reused, the bytes it consumed before
 * that (§1.6 gate, below) -- with the host page's bytes now. Equal: exact. Otherwise the identity tag inside the
 * slot's bytes says whose page it is: the same page at an older version is stale (writes old =
 * host version - slot version), anything else is foreign (holder = the tag; none for a slot
 * never filled). One JSON line per page in --truth FILE, after the read event is in the trace
 * (its seq from kvtrace_read.seq):
 *   {"seq":S,"step":N,"layer":L,"stream":s,"page":p,"source":"pool","slot":k,
 *    "class":"stale","writes_old":1,"holder":{"stream":s,"layer":L,"page":p}}
 *
 * Runs, by flag:
 *   --layout shared|per-stream   bookkeeping (default shared)
 *   --dispatch membership|fits   dispatcher (default fits)
 *   --schedule alternate|concurrent
 *                                alternate: slot 1's request first, then slot 0's, then slot 1
 *                                again, one stream per ubatch (slot1-first style aliasing);
 *                                concurrent: both prefill, then decode in the same ubatches
 *                                (the two-stream views fits() rejects), then slot 0 alone
 *   --ring-prefetch              the ring is filled for every layer at the start of the ubatch,
 *                                before the writes: with 4 ring slots for 12 pages, a later
 *                                layer's copy replaces an earlier layer's before it is read;
 *                                a view with more ring pages than slots replaces its own
 *                                first pages too (nothing is consumed before the dispatch)
 *   --threads                    one thread per stream, each running its own request; the
 *                                runtime lock is held for a whole ubatch
 *   --dso PATH                   ring copies (and layer-identity learns) through the C++ shared
 *                                object kvrt_ring.cpp, dlopen()ed after the header line
 *   --unevaluated                fits events without failed names (kvdiag evaluates them)
 *   --forever                    alternate requests until killed; "ready" after the first step
 *   --rounds N                   with --forever: stop after N requests (a long run that ends)
 *   --crash segv|abort --crash-at N
 *                                at the end of ubatch N: a real SIGSEGV (a store through a null
 *                                pointer) or abort() without KVTRACE_ABORT (the flight recorder's
 *                                signal path)
 *   --steps N --prompt P         decode steps per phase (3), prompt tokens (1300)
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvrt.h"

#define MAGIC 0x4b565254u /* "KVRT" */

typedef struct {
    uint32_t magic;
    int32_t layer, stream, page, version, pad[3];
} tag_t;

typedef struct {
    int32_t cell;
    float value;
} row_t;

typedef struct {
    tag_t tag;
    row_t rows[PAGE_TOKENS];
} page_t;

typedef struct {
    int layout_per_stream, dispatch_fits, concurrent, prefetch, threads, unevaluated, forever;
    int steps, prompt;
    const char *dso, *truth;
    long rounds, crash_at;
    const char *crash;
} options_t;

static options_t opt = {0, 1, 0, 0, 0, 0, 0, 3, 1300, NULL, NULL, 0, -1, NULL};
static int *volatile nowhere = NULL;

static page_t host[LAYERS][STREAMS][PAGES];
static page_t slots[POOL_SLOTS];
static unsigned char loaded[LAYERS][STREAMS][PAGES], dirty[LAYERS][STREAMS][PAGES];
static int ring_of[LAYERS][STREAMS][PAGES]; /* --ring-prefetch: the slot the runtime believes */
/* The streamed attention's ring (§1.6): a page waits in its slot until the attention has
 * consumed it (the `consumed` event gates the slot's reuse), so a read that needs more ring
 * pages than there are slots reads each page before its slot is copied into again. The
 * attention reads as the copies come; kvrt judges the page it consumed, whose bytes are kept
 * here when the slot is reused. A prefetch before the FA node is dispatched has no kernel to
 * wait for: its copies replace what they replace. */
static page_t consumed[LAYERS][STREAMS][PAGES];
static unsigned char waiting[LAYERS][STREAMS][PAGES], was_consumed[LAYERS][STREAMS][PAGES];
static int ring_cursor, pos[STREAMS], step_no = -1, generation;
static long write_no;
static FILE *truth;
static pthread_mutex_t runtime_lock = PTHREAD_MUTEX_INITIALIZER;
static kvrt_ring_fn ring_copy_fn;
static kvrt_learn_fn learn_fn;

/* -- bookkeeping ----------------------------------------------------------------------------- */

static int window(void) { return opt.layout_per_stream ? RESIDENT_PER_LAYER / STREAMS : RESIDENT_PER_LAYER; }
static int key_stream(int stream) { return opt.layout_per_stream ? stream : -1; }
static int key_s(int stream) { return opt.layout_per_stream ? stream : 0; }

static int resident_slot(int layer, int stream, int page) {
    int base = RING_SLOTS + layer * RESIDENT_PER_LAYER;
    return opt.layout_per_stream ? base + stream * window() + page : base + page;
}

static void init_host(void) {
    int l, s, p;
    for (l = 0; l < LAYERS; l++)
        for (s = 0; s < STREAMS; s++)
            for (p = 0; p < PAGES; p++) {
                page_t *pg = &host[l][s][p];
                memset(pg, 0, sizeof *pg);
                pg->tag.magic = MAGIC;
                pg->tag.layer = l;
                pg->tag.stream = s;
                pg->tag.page = p;
            }
}

/* mark_dirty_rows (§4.3): upstream clears every flag and divides the global row by 256 */
static void mark(const int *streams, int n, int tokens) {
    int64_t rows[2 * 2048];
    int32_t keys[3 * LAYERS * PAGES * STREAMS][3], outside[PAGES * STREAMS][2];
    int n_rows = 0, n_keys = 0, n_out = 0, i, t, l;
    if (!opt.layout_per_stream) memset(dirty, 0, sizeof dirty);
    for (i = 0; i < n; i++) {
        int s = streams[i], first = pos[s] / PAGE_TOKENS, last = (pos[s] + tokens - 1) / PAGE_TOKENS, cp;
        for (t = 0; t < tokens && n_rows < 2 * 2048; t++) rows[n_rows++] = (int64_t)s * KV_SIZE + pos[s] + t;
        for (cp = first; cp <= last; cp++) {
            int page = opt.layout_per_stream ? cp : (s * KV_SIZE) / PAGE_TOKENS + cp;
            if (page >= window()) {
                outside[n_out][0] = key_stream(s);
                outside[n_out][1] = page;
                n_out++;
                continue;
            }
            for (l = 0; l < LAYERS; l++) {
                dirty[l][key_s(s)][page] = 1;
                keys[n_keys][0] = l;
                keys[n_keys][1] = key_stream(s);
                keys[n_keys][2] = page;
                n_keys++;
            }
        }
    }
    KVTRACE_MARK_OUTSIDE(rows, n_rows, keys, n_keys, 0, outside, n_out);
}

/* SET_ROWS of one ubatch into one layer and stream: new rows, and each touched page's version */
static void write_rows(int layer, int s, int tokens) {
    int c0 = pos[s], c1 = pos[s] + tokens, c, p;
    int32_t keys[PAGES][3];
    int n_keys = 0;
    write_no++;
    for (c = c0; c < c1; c++) {
        row_t *r = &host[layer][s][c / PAGE_TOKENS].rows[c % PAGE_TOKENS];
        r->cell = c;
        r->value = (float)(1 + write_no % 1000) + 0.25f * (float)layer + 0.5f * (float)s;
    }
    for (p = c0 / PAGE_TOKENS; p <= (c1 - 1) / PAGE_TOKENS; p++) {
        host[layer][s][p].tag.version++;
        if (opt.layout_per_stream && p < window()) {
            keys[n_keys][0] = layer;
            keys[n_keys][1] = s;
            keys[n_keys][2] = p;
            n_keys++;
        } else if (!opt.layout_per_stream) {
            int gp = (s * KV_SIZE + p * PAGE_TOKENS) / PAGE_TOKENS;
            if (gp < window()) {
                keys[n_keys][0] = layer;
                keys[n_keys][1] = -1;
                keys[n_keys][2] = gp;
                n_keys++;
            }
        }
    }
    KVTRACE_WRITE(layer, s, c0, c1, (int64_t)s * KV_SIZE + c0, (int64_t)s * KV_SIZE + c1, keys,
                  n_keys);
}

/* the ring: in-process copy or the C++ shared object's */
static void ring_copy(int layer, int s, int page0, int n, int slot) {
    if (ring_copy_fn) {
        ring_copy_fn(&host[layer][s][page0], &slots[slot], (int)sizeof(page_t), layer, s, page0,
                     n, slot);
        return;
    }
    memcpy(&slots[slot], &host[layer][s][page0], (size_t)n * sizeof(page_t));
    KVTRACE_UPLOAD(layer, s, page0, page0 + n, slot, "ring", (int64_t)n * (int64_t)sizeof(page_t),
                   "ring", -1);
}

/* the gate: the view's pages still waiting in [slot, slot + n) are consumed before the copy */
static void consume(int layer, int s, int slot, int n) {
    for (int p = 0; p < PAGES; p++)
        if (waiting[layer][s][p] && ring_of[layer][s][p] >= slot && ring_of[layer][s][p] < slot + n) {
            consumed[layer][s][p] = slots[ring_of[layer][s][p]];
            waiting[layer][s][p] = 0;
            was_consumed[layer][s][p] = 1;
        }
}

/* copies pages [p0, p1) of one view into ring slots from the cursor, in runs that do not wrap;
 * `gated`: the view's attention is running (copies wait for its consumption) */
static void ring_pages(int layer, int s, int p0, int p1, int gated) {
    while (p0 < p1) {
        int n = p1 - p0;
        if (n > RING_SLOTS - ring_cursor) n = RING_SLOTS - ring_cursor;
        if (gated) consume(layer, s, ring_cursor, n);
        ring_copy(layer, s, p0, n, ring_cursor);
        for (int i = 0; i < n; i++) {
            ring_of[layer][s][p0 + i] = ring_cursor + i;
            waiting[layer][s][p0 + i] = 1;
            was_consumed[layer][s][p0 + i] = 0;
        }
        ring_cursor = (ring_cursor + n) % RING_SLOTS;
        p0 += n;
    }
}

/* -- the truth --------------------------------------------------------------------------------- */

typedef struct {
    int page, source, slot;
} served_t;

static const char *const source_names[3] = {"pool", "ring", "host"};

/* the bytes decide: equal to the host page now, or whose tag they carry */
static size_t judge(long long seq, int layer, int s, const served_t *sv, char *out, size_t room,
                    double *sum) {
    const page_t *want = &host[layer][s][sv->page];
    const page_t *got = sv->source == KVTRACE_HOST ? want
                        : sv->source == KVTRACE_RING && was_consumed[layer][s][sv->page]
                            ? &consumed[layer][s][sv->page]
                            : &slots[sv->slot];
    const char *cls;
    int lag = 0, i, n;
    char holder[96];
    *sum = 0.0;
    for (i = 0; i < PAGE_TOKENS; i++) *sum += got->rows[i].value;
    if (memcmp(got, want, sizeof *got) == 0) {
        cls = "exact";
    } else if (got->tag.magic == MAGIC && got->tag.layer == layer && got->tag.stream == s &&
               got->tag.page == sv->page) {
        cls = "stale";
        lag = want->tag.version - got->tag.version;
    } else {
        cls = "foreign";
    }
    if (got->tag.magic == MAGIC)
        snprintf(holder, sizeof holder, "{\"stream\":%d,\"layer\":%d,\"page\":%d}",
                 (int)got->tag.stream, (int)got->tag.layer, (int)got->tag.page);
    else
        snprintf(holder, sizeof holder, "null");
    n = snprintf(out, room,
                 "{\"seq\":%lld,\"step\":%d,\"layer\":%d,\"stream\":%d,\"page\":%d,"
                 "\"source\":\"%s\",\"slot\":%d,\"class\":\"%s\",\"writes_old\":%d,"
                 "\"holder\":%s}\n",
                 seq, step_no, layer, s, sv->page, source_names[sv->source],
                 sv->source == KVTRACE_HOST ? -1 : sv->slot, cls, lag, holder);
    return n > 0 && (size_t)n < room ? (size_t)n : 0;
}

/* one read: the trace event first (its seq ties the truth to it), then the truth of each page,
 * all of the read's lines in one write */
static double read_view(int layer, int s, const served_t *sv, int n) {
    static char buf[PAGES * 512];
    kvtrace_read r;
    double out = 0.0, page_sum;
    size_t used = 0;
    int i;
    memset(&r, 0, sizeof r);
    KVTRACE_READ_BEGIN(&r, layer, s);
    for (i = 0; i < n; i++) KVTRACE_READ_PAGE(&r, sv[i].page, sv[i].source, sv[i].slot);
    KVTRACE_READ_END(&r);
    for (i = 0; i < n; i++) {
        used += judge((long long)r.seq, layer, s, &sv[i], buf + used, sizeof buf - used,
                      &page_sum);
        out += page_sum;
    }
    memset(waiting[layer][s], 0, sizeof waiting[layer][s]); /* all read: the slots are free */
    memset(was_consumed[layer][s], 0, sizeof was_consumed[layer][s]);
    if (truth && used) {
        /* one write(2) for the whole read: stdio cuts a read's lines longer than its buffer
         * into several, and a SIGKILL between them left a read with half its pages' truth */
        size_t done = 0;
        fflush(truth);
        while (done < used) {
            ssize_t wrote = write(fileno(truth), buf + done, used - done);
            if (wrote <= 0) break;
            done += (size_t)wrote;
        }
    }
    return out;
}

static double reference(int layer, int s, int n_pages) {
    double sum = 0.0;
    int p, i;
    for (p = 0; p < n_pages; p++)
        for (i = 0; i < PAGE_TOKENS; i++) sum += host[layer][s][p].rows[i].value;
    return sum;
}

/* -- attention ------------------------------------------------------------------------------------ */

/* the streamed kernel's resident-read decision: upload what must be, read every page */
static double attend(int layer, int s, int tokens) {
    served_t sv[PAGES];
    int n_pages = (pos[s] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS, p;
    int w = window() < n_pages ? window() : n_pages;
    for (p = 0; p < w; p++) {
        int slot = resident_slot(layer, s, p);
        const char *reason = !loaded[layer][key_s(s)][p] ? "miss"
                             : dirty[layer][key_s(s)][p] ? "dirty"
                             : tokens > 1                ? "wide-query" : NULL;
        if (reason) {
            memcpy(&slots[slot], &host[layer][s][p], sizeof(page_t));
            loaded[layer][key_s(s)][p] = 1;
            dirty[layer][key_s(s)][p] = 0;
            KVTRACE_UPLOAD(layer, s, p, p + 1, slot, "resident", (int64_t)sizeof(page_t), reason,
                           key_stream(s));
        }
        sv[p].page = p;
        sv[p].source = KVTRACE_POOL;
        sv[p].slot = slot;
    }
    if (!opt.prefetch && w < n_pages) ring_pages(layer, s, w, n_pages, 1);
    for (p = w; p < n_pages; p++) {
        sv[p].page = p;
        sv[p].source = KVTRACE_RING;
        sv[p].slot = ring_of[layer][s][p];
    }
    return read_view(layer, s, sv, n_pages);
}

/* the fallback: ordinary flash attention over the host store, zero-copy */
static double attend_host(int layer, int s, int tokens) {
    served_t sv[PAGES];
    int n_pages = (pos[s] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS, p;
    for (p = 0; p < n_pages; p++) {
        sv[p].page = p;
        sv[p].source = KVTRACE_HOST;
        sv[p].slot = -1;
    }
    return read_view(layer, s, sv, n_pages);
}

static kvtrace_tensor tensor(const char *name, const char *type, int64_t ne0, int64_t ne1,
                             int64_t ne2, int64_t ne3, uint64_t nb0, uint64_t runtime) {
    kvtrace_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.type = type;
    t.buffer = runtime ? "CUDA_KV_Stream_Host" : "CUDA0";
    t.buffer_name = runtime ? "CUDA_KV_Stream_Host_buffer" : "CUDA0_buffer";
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = ne3;
    /* f16 rows of 256: token stride = all 4 KV heads, head stride = one row (§2.2) */
    t.nb[0] = nb0;
    t.nb[1] = nb0 * (uint64_t)ne0 * (runtime ? 4u : 1u);
    t.nb[2] = runtime ? nb0 * (uint64_t)ne0 : t.nb[1] * (uint64_t)ne1;
    t.nb[3] = runtime ? (uint64_t)KV_SIZE * t.nb[1] : t.nb[2] * (uint64_t)ne2;
    t.runtime = runtime;
    t.contiguous = !runtime;
    return t;
}

/* ggml_cuda_compute_forward, case FLASH_ATTN_EXT: this runtime's fits() can fail only on the
 * stream count; it names the failed lines in its own spelling (kvdiag normalises them) */
static void dispatch(int layer, const int *streams, int n, int tokens, double *out) {
    static const char *const failed[3] = {"Q->ne[3] == 1", "K->ne[3] == 1", "V->ne[3] == 1"};
    int64_t n_kv = 0;
    int fits = n == 1, i;
    const char *route = fits ? "streamed" : opt.dispatch_fits ? "fallback" : "abort";
    for (i = 0; i < n; i++) {
        int64_t v = ((pos[streams[i]] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS) * PAGE_TOKENS;
        if (v > n_kv) n_kv = v;
    }
    {
        kvtrace_tensor q = tensor("Qcur", "f32", 256, tokens, 24, n, 4, 0);
        kvtrace_tensor k = tensor("cache_k (view)", "f16", 256, n_kv, 4, n, 2, 0x7100);
        kvtrace_tensor v = tensor("cache_v (view)", "f16", 256, n_kv, 4, n, 2, 0x7100);
        kvtrace_tensor m = tensor("KQ_mask", "f16", n_kv, tokens, 1, n, 2, 0);
        kvtrace_tensor d = tensor("__fattn__", "f32", 256, 24, tokens, n, 4, 0);
        KVTRACE_FITS_RAW("__fattn__", layer, &q, &k, &v, &m, &d, fits, route,
                         opt.unevaluated ? NULL : failed, fits ? 0 : 3);
    }
    if (!fits && !opt.dispatch_fits) {
        if (truth) fflush(truth);
        KVTRACE_ABORT(__FILE__, __LINE__, "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed");
        fprintf(stderr, "%s:%d: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed\n",
                __FILE__, __LINE__);
        abort();
    }
    if (!fits)
        KVTRACE_WARN_LAYER("kv-stream-fallback", layer,
                           "fits() false: ordinary flash attention over the host buffer");
    if (learn_fn) learn_fn(layer, (const void *)(uintptr_t)(0x7f0000000000ull + (uint64_t)layer * 0x100000u));
    for (i = 0; i < n; i++) {
        int s = streams[i];
        out[s * LAYERS + layer] = fits ? attend(layer, s, tokens) : attend_host(layer, s, tokens);
    }
}

/* CRC-32 (IEEE) of the float32 outputs of every layer in graph order */
static uint32_t crc32_of(const float *v, int n) {
    const unsigned char *p = (const unsigned char *)v;
    uint32_t c = 0xffffffffu;
    size_t i;
    int k;
    for (i = 0; i < (size_t)n * sizeof(float); i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* one ubatch: the streams decoding (or prefilling) together */
static void ubatch(const int *streams, int n, int tokens) {
    int32_t ids[STREAMS];
    double out[STREAMS * LAYERS] = {0};
    int i, l;
    int64_t n_kv = 0;
    pthread_mutex_lock(&runtime_lock);
    for (i = 0; i < n; i++) {
        int64_t v = ((pos[streams[i]] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS) * PAGE_TOKENS;
        ids[i] = streams[i];
        if (v > n_kv) n_kv = v;
    }
    step_no++;
    KVTRACE_STEP(tokens > 1 ? "prefill" : "decode", ids, n, tokens, n_kv);
    mark(streams, n, tokens);
    if (opt.prefetch) { /* the buggy cross-layer prefetch: every layer's ring pages, up front */
        for (l = 0; l < LAYERS; l++)
            for (i = 0; i < n; i++) {
                int s = streams[i], n_pages = (pos[s] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
                if (window() < n_pages) ring_pages(l, s, window(), n_pages, 0);
            }
    }
    for (l = 0; l < LAYERS; l++) {
        for (i = 0; i < n; i++) write_rows(l, streams[i], tokens);
        dispatch(l, streams, n, tokens, out);
    }
    for (i = 0; i < n; i++) {
        int s = streams[i];
        float got[LAYERS], ref[LAYERS];
        double delta = 0.0;
        for (l = 0; l < LAYERS; l++) {
            int n_pages = (pos[s] + tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
            got[l] = (float)out[s * LAYERS + l];
            ref[l] = (float)reference(l, s, n_pages);
            if (got[l] - ref[l] > delta) delta = got[l] - ref[l];
            if (ref[l] - got[l] > delta) delta = ref[l] - got[l];
        }
        KVTRACE_OUTPUT(s, crc32_of(got, LAYERS), crc32_of(ref, LAYERS), 1, delta, 0.001);
        pos[s] += tokens;
    }
    if (opt.crash && step_no == opt.crash_at) {
        if (truth) fflush(truth);
        if (!strcmp(opt.crash, "abort")) abort();
        *nowhere = 1; /* SIGSEGV */
    }
    pthread_mutex_unlock(&runtime_lock);
}

/* a slot's request restarts: the resident cache is cleared wholesale (buffer clear, §1.5) */
static void restart(int s) {
    pthread_mutex_lock(&runtime_lock);
    pos[s] = 0;
    memset(loaded, 0, sizeof loaded);
    memset(dirty, 0, sizeof dirty);
    KVTRACE_INVALIDATE("buffer-clear", ++generation);
    pthread_mutex_unlock(&runtime_lock);
}

static void request(int s, int decode) {
    int one[1], i;
    one[0] = s;
    ubatch(one, 1, opt.prompt);
    for (i = 0; i < decode; i++) ubatch(one, 1, 1);
}

/* --threads: each stream's request runs on its own thread; the threads take turns ubatch by
 * ubatch (the runtime serialises ubatches anyway), so the file holds both threads' events
 * interleaved in a fixed order and the aliasing between the streams is the same every run */
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static int turn, finished[STREAMS];

static void take_turn(int s) {
    pthread_mutex_lock(&turn_lock);
    while (turn != s) pthread_cond_wait(&turn_cv, &turn_lock);
    pthread_mutex_unlock(&turn_lock);
}

static void pass_turn(int s, int done) {
    pthread_mutex_lock(&turn_lock);
    finished[s] = done;
    if (!finished[1 - s]) turn = 1 - s;
    pthread_cond_broadcast(&turn_cv);
    pthread_mutex_unlock(&turn_lock);
}

static void *thread_main(void *arg) {
    int s = (int)(intptr_t)arg, one[1], i, n = opt.steps * 3;
    one[0] = s;
    for (i = -1; i < n; i++) {
        take_turn(s);
        ubatch(one, 1, i < 0 ? opt.prompt : 1);
        pass_turn(s, i == n - 1);
    }
    return NULL;
}

static void run(void) {
    static const int both[2] = {0, 1};
    int i, one[1];
    if (opt.threads) {
        pthread_t t[STREAMS];
        turn = 1; /* slot 1 first, as in the alternate schedule */
        for (i = 0; i < STREAMS; i++) pthread_create(&t[i], NULL, thread_main, (void *)(intptr_t)i);
        for (i = 0; i < STREAMS; i++) pthread_join(t[i], NULL);
        return;
    }
    if (opt.forever) {
        for (long round = 0; !opt.rounds || round < opt.rounds; round++) {
            int s = (int)(round % 2);
            if (pos[s] + opt.prompt + 64 > KV_SIZE || round < 2) restart(s);
            request(s, 32);
            if (round == 0) {
                printf("ready\n");
                fflush(stdout);
            }
        }
        return;
    }
    if (opt.concurrent) {
        one[0] = 0;
        ubatch(one, 1, opt.prompt);
        one[0] = 1;
        ubatch(one, 1, opt.prompt);
        for (i = 0; i < opt.steps; i++) ubatch(both, 2, 1);
        one[0] = 0;
        for (i = 0; i < opt.steps; i++) ubatch(one, 1, 1);
        return;
    }
    request(1, opt.steps); /* slot 1 first (a fresh boot's first request) */
    request(0, opt.steps);
    one[0] = 1;
    for (i = 0; i < opt.steps; i++) ubatch(one, 1, 1); /* slot 1 again, after slot 0 */
}

static int usage(const char *why) {
    fprintf(stderr, "kvrt: %s\nusage: kvrt --truth FILE [--layout shared|per-stream] "
                    "[--dispatch membership|fits] [--schedule alternate|concurrent] "
                    "[--ring-prefetch] [--threads] [--dso PATH] [--unevaluated] [--forever] "
                    "[--steps N] [--prompt P]\n", why);
    return 2;
}

int main(int argc, char **argv) {
    kvtrace_plan plan;
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ring-prefetch")) opt.prefetch = 1;
        else if (!strcmp(a, "--threads")) opt.threads = 1;
        else if (!strcmp(a, "--unevaluated")) opt.unevaluated = 1;
        else if (!strcmp(a, "--forever")) opt.forever = 1;
        else if (!v) return usage("missing value");
        else if (!strcmp(a, "--layout")) opt.layout_per_stream = !strcmp(v, "per-stream"), i++;
        else if (!strcmp(a, "--dispatch")) opt.dispatch_fits = !strcmp(v, "fits"), i++;
        else if (!strcmp(a, "--schedule")) opt.concurrent = !strcmp(v, "concurrent"), i++;
        else if (!strcmp(a, "--dso")) opt.dso = v, i++;
        else if (!strcmp(a, "--truth")) opt.truth = v, i++;
        else if (!strcmp(a, "--steps")) opt.steps = atoi(v), i++;
        else if (!strcmp(a, "--prompt")) opt.prompt = atoi(v), i++;
        else if (!strcmp(a, "--rounds")) opt.rounds = atol(v), i++;
        else if (!strcmp(a, "--crash")) opt.crash = v, i++;
        else if (!strcmp(a, "--crash-at")) opt.crash_at = atol(v), i++;
        else return usage(a);
    }
    if (!opt.truth) return usage("--truth is required");
    if (opt.prompt < 1 || opt.prompt + opt.steps * 4 > KV_SIZE || opt.steps < 0)
        return usage("--prompt/--steps do not fit in the 2048-cell streams");
    truth = fopen(opt.truth, "w");
    if (!truth) return usage("cannot open the truth file");
    init_host();

    kvtrace_plan_defaults(&plan);
    plan.run_name = "kvrt";
    plan.build = "kernels/native_tests/kvrt/kvrt.c";
    plan.device_name = "host memory (kvrt)";
    plan.layout = opt.layout_per_stream ? "per-stream" : "shared";
    plan.dispatch = opt.dispatch_fits ? "fits" : "membership";
    plan.np = STREAMS;
    plan.kv_unified = 0;
    plan.n_stream = STREAMS;
    plan.layers = plan.streamed_layers = LAYERS;
    plan.kv_size = KV_SIZE;
    plan.pages_per_stream = PAGES;
    plan.page_bytes = (int64_t)sizeof(page_t);
    plan.pool_pages = POOL_SLOTS;
    plan.resident_pages_per_layer = RESIDENT_PER_LAYER;
    plan.ring_slots = RING_SLOTS;
    plan.stage_bytes = 1 << 20;
    plan.head_dim = 256;
    plan.n_head = 24;
    plan.n_head_kv = 4;
    plan.type_k = plan.type_v = "f16";
    KVTRACE_BOOT(&plan);

    if (opt.dso) { /* after the header line: the object's kinds come as a records event */
        void *lib = dlopen(opt.dso, RTLD_NOW | RTLD_LOCAL);
        if (!lib) return usage(dlerror());
        *(void **)(&ring_copy_fn) = dlsym(lib, "kvrt_ring_copy");
        *(void **)(&learn_fn) = dlsym(lib, "kvrt_learn");
        if (!ring_copy_fn || !learn_fn) return usage("the shared object lacks kvrt_ring_copy");
    }
    run();
    fclose(truth);
    KVTRACE_END("completed");
    return 0;
}
