// A complete, small kv-stream runtime that writes a kvdiag trace through kvtrace.h -- what
// `kvdiag native --example` prints. Each KVTRACE_* macro sits where the same call goes in a
// llama.cpp fork (docs/native-bridge.md has the table); the rest is the runtime around it.
//
// Build and run (a C++17 compiler, nothing else):
//   c++ -std=c++17 -O2 -I "$(kvdiag native --include-dir)" kvtrace_example.cpp -o kvtrace_example -pthread
//   KVTRACE_FILE=upstream.kvtrace ./kvtrace_example           # the two upstream bugs
//   KVTRACE_FILE=fixed.kvtrace ./kvtrace_example --fixed      # both fixes
//   kvdiag check upstream.kvtrace; kvdiag check fixed.kvtrace; kvdiag diff upstream.kvtrace fixed.kvtrace
// Without KVTRACE_FILE every macro is one untaken branch: no file, no cost, arguments unevaluated.
//
// The runtime: 2 layers, 2 KV streams (two server slots) of 2048 cells, pages of 256 cells. The
// host store is authoritative; a device pool holds the first pages of each attention view
// (resident slots) and a transfer ring carries the rest. Instead of K/V bytes each page holds a
// stamp -- (layer, stream, page, version) -- so the runtime can say itself which pages it read
// right; it prints those counts, which `kvdiag check` derives from the trace alone.
//   upstream: resident slots keyed by (layer, page) and dirty pages found from global rows
//             (stream * 2048 + cell) / 256; the FA dispatcher routes on buffer membership, then
//             asserts fits() -- two streams in one ubatch abort.
//   --fixed:  keys (layer, stream, page), dirty page = cell / 256; dispatch on fits(), else the
//             ordinary attention reads the host store zero-copy, with a warning.
#include "kvtrace.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int LAYERS = 2, STREAMS = 2, CELLS = 2048, PAGE = 256, PAGES = CELLS / PAGE;
constexpr int RESIDENT_PER_LAYER = 4;  // pool slots of one layer, all streams together
constexpr int RING = 4, POOL = RING + LAYERS * RESIDENT_PER_LAYER;
constexpr long PAGE_BYTES = 4096;

struct Stamp {
    int layer = -1, stream = -1, page = -1, version = 0;
    bool operator==(const Stamp &o) const {
        return layer == o.layer && stream == o.stream && page == o.page && version == o.version;
    }
};

struct Runtime {
    bool fixed = false;
    int host_version[LAYERS][STREAMS][PAGES] = {};
    Stamp slot[POOL];                     // what each pool slot holds (ring slots first)
    bool loaded[LAYERS][STREAMS][PAGES] = {}, dirty[LAYERS][STREAMS][PAGES] = {};
    int ring_cursor = 0, pos[STREAMS] = {};
    long exact = 0, stale = 0, foreign = 0;

    void report() const {
        std::printf("pages read: exact %ld, stale %ld, foreign %ld\n", exact, stale, foreign);
        std::fflush(stdout);
    }

    // the bookkeeping key's stream: -1 = upstream's shared (layer, page) key
    int key(int stream) const { return fixed ? stream : -1; }
    int window() const { return fixed ? RESIDENT_PER_LAYER / STREAMS : RESIDENT_PER_LAYER; }
    int resident_slot(int layer, int stream, int page) const {
        int base = RING + layer * RESIDENT_PER_LAYER;
        return fixed ? base + stream * window() + page : base + page;
    }
    bool &flag(bool (&f)[LAYERS][STREAMS][PAGES], int layer, int stream, int page) {
        return f[layer][fixed ? stream : 0][page];
    }

    // llama side: the ubatch's rows go to the cache (set_input_k_idxs -> mark_dirty_rows)
    void mark(const std::vector<int> &streams, int tokens) {
        std::vector<int64_t> rows;
        std::vector<int32_t> keys;  // {layer, stream or -1, page} triples
        std::vector<int32_t> outside;
        std::memset(dirty, 0, sizeof dirty);  // mark_dirty_rows starts from clean flags
        for (int s : streams) {
            for (int t = 0; t < tokens; t++) rows.push_back((int64_t)s * CELLS + pos[s] + t);
            int first = pos[s] / PAGE, last = (pos[s] + tokens - 1) / PAGE;
            for (int cell_page = first; cell_page <= last; cell_page++) {
                // upstream divides the GLOBAL row by 256: stream 1's pages land beyond the window
                int page = fixed ? cell_page : (s * CELLS) / PAGE + cell_page;
                if (page >= window()) {
                    outside.insert(outside.end(), {key(s), page});
                    continue;
                }
                for (int l = 0; l < LAYERS; l++) {
                    flag(dirty, l, s, page) = true;
                    keys.insert(keys.end(), {l, key(s), page});
                }
            }
        }
        KVTRACE_MARK_OUTSIDE(rows.data(), rows.size(), keys.data(), keys.size() / 3, 0,
                             outside.data(), outside.size() / 2);
    }

    // SET_ROWS into the kv-stream buffer: the host store changes
    void write(int layer, int s, int tokens) {
        int c0 = pos[s], c1 = pos[s] + tokens;
        for (int p = c0 / PAGE; p <= (c1 - 1) / PAGE; p++) host_version[layer][s][p]++;
        KVTRACE_WRITE(layer, s, c0, c1, (int64_t)s * CELLS + c0, (int64_t)s * CELLS + c1,
                      nullptr, 0);
    }

    // the streamed kernel's resident-read decision: upload what must be, read every page
    void attend(int layer, int s, int tokens, uint32_t &crc, uint32_t &ref) {
        int n_pages = (pos[s] + tokens + PAGE - 1) / PAGE;
        std::vector<int> from(n_pages);
        for (int p = 0; p < n_pages; p++) {
            if (p < window()) {
                int sl = resident_slot(layer, s, p);
                const char *reason = !flag(loaded, layer, s, p) ? "miss"
                                     : flag(dirty, layer, s, p) ? "dirty"
                                     : tokens > 1               ? "wide-query" : nullptr;
                if (reason) {
                    slot[sl] = {layer, s, p, host_version[layer][s][p]};
                    flag(loaded, layer, s, p) = true;
                    KVTRACE_UPLOAD(layer, s, p, p + 1, sl, "resident", PAGE_BYTES, reason, key(s));
                }
                from[p] = sl;
            } else {  // beyond the window: through the ring, copied right before the read
                slot[ring_cursor] = {layer, s, p, host_version[layer][s][p]};
                KVTRACE_UPLOAD(layer, s, p, p + 1, ring_cursor, "ring", PAGE_BYTES, "ring", -1);
                from[p] = ring_cursor;
                ring_cursor = (ring_cursor + 1) % RING;
            }
        }
        kvtrace_read r = {};
        KVTRACE_READ_BEGIN(&r, layer, s);
        for (int p = 0; p < n_pages; p++) {
            const Stamp got = slot[from[p]], want{layer, s, p, host_version[layer][s][p]};
            KVTRACE_READ_PAGE(&r, p, p < window() ? KVTRACE_POOL : KVTRACE_RING, from[p]);
            if (got == want) exact++;
            else if (got.layer == layer && got.stream == s && got.page == p) stale++;
            else foreign++;
            crc = crc * 31u + (uint32_t)(got.version * 7 + got.stream * 3 + got.page);
            ref = ref * 31u + (uint32_t)(want.version * 7 + want.stream * 3 + want.page);
        }
        KVTRACE_READ_END(&r);
    }

    // the fallback: ordinary flash attention over the host store, zero-copy: always right
    void attend_host(int layer, int s, int tokens, uint32_t &crc, uint32_t &ref) {
        int n_pages = (pos[s] + tokens + PAGE - 1) / PAGE;
        kvtrace_read r = {};
        KVTRACE_READ_BEGIN(&r, layer, s);
        for (int p = 0; p < n_pages; p++) {
            KVTRACE_READ_PAGE(&r, p, KVTRACE_HOST, -1);
            exact++;
            crc = ref = ref * 31u + (uint32_t)(host_version[layer][s][p] * 7 + s * 3 + p);
        }
        KVTRACE_READ_END(&r);
    }

    // one ubatch: the streams decoding (or prefilling) together
    void ubatch(const std::vector<int> &streams, int tokens) {
        int32_t ids[STREAMS];
        for (size_t i = 0; i < streams.size(); i++) ids[i] = streams[i];
        KVTRACE_STEP(tokens > 1 ? "prefill" : "decode", ids, streams.size(), tokens,
                     ((pos[streams[0]] + tokens + PAGE - 1) / PAGE) * PAGE);
        mark(streams, tokens);
        uint32_t crc[STREAMS] = {}, ref[STREAMS] = {};
        for (int l = 0; l < LAYERS; l++) {
            for (int s : streams) write(l, s, tokens);
            dispatch(l, streams, tokens, crc, ref);
        }
        for (int s : streams) {
            pos[s] += tokens;
            // the output against a fully resident reference (here: the host's stamps)
            KVTRACE_OUTPUT(s, crc[s], ref[s], 1, crc[s] == ref[s] ? 0.0 : 1.0, 0.0);
        }
    }

    // ggml_cuda_compute_forward, case GGML_OP_FLASH_ATTN_EXT
    void dispatch(int layer, const std::vector<int> &streams, int tokens, uint32_t *crc,
                  uint32_t *ref) {
        const int64_t ns = (int64_t)streams.size();
        kvtrace_tensor q = tensor("Qcur", "f32", 256, tokens, 24, ns, 0);
        kvtrace_tensor k = tensor("cache_k (view)", "q8_0", 256, CELLS, 4, ns, 0x5000);
        kvtrace_tensor v = tensor("cache_v (view)", "q8_0", 256, CELLS, 4, ns, 0x5000);
        kvtrace_tensor d = tensor("__fattn__", "f32", 256, 24, tokens, ns, 0);
        // this runtime's fits() tests one condition of the real predicate: one stream
        static const char *const failed[] = {"Q->ne[3] == 1", "K->ne[3] == 1", "V->ne[3] == 1"};
        const bool fits = ns == 1;
        const char *route = fits ? "streamed" : fixed ? "fallback" : "abort";
        KVTRACE_FITS_RAW("__fattn__", layer, &q, &k, &v, nullptr, &d, fits, route, failed,
                         fits ? 0 : 3);
        if (!fits && !fixed) {  // upstream: routed on membership, then GGML_ASSERT(fits)
            // the trace's abort and the line on stderr (what postmortem reads) say the same
            static const char assert_text[] =
                "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed";
            const int line = __LINE__;
            KVTRACE_ABORT(__FILE__, line, assert_text);
            report();
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, line, assert_text);
            std::abort();
        }
        if (!fits) {
            KVTRACE_WARN_LAYER("kv-stream-fallback", layer,
                               "fits() false: ordinary flash attention over the host buffer");
        }
        for (int s : streams) {
            if (fits) attend(layer, s, tokens, crc[s], ref[s]);
            else attend_host(layer, s, tokens, crc[s], ref[s]);
        }
    }

    static kvtrace_tensor tensor(const char *name, const char *type, int64_t ne0, int64_t ne1,
                                 int64_t ne2, int64_t ne3, uint64_t runtime) {
        kvtrace_tensor t;
        std::memset(&t, 0, sizeof t);
        t.name = name;
        t.type = type;
        t.buffer = runtime ? "CUDA_KV_Stream_Host" : "CUDA0";
        t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = ne2; t.ne[3] = ne3;
        t.runtime = runtime;
        t.contiguous = 1;
        return t;
    }
};

}  // namespace

int main(int argc, char **argv) {
    static Runtime rt;
    rt.fixed = argc > 1 && std::strcmp(argv[1], "--fixed") == 0;

    // where the runtime has sized itself: the header line
    kvtrace_plan plan;
    kvtrace_plan_defaults(&plan);  // every field "unknown" until set
    plan.run_name = rt.fixed ? "example (fixed)" : "example (upstream)";
    plan.layout = rt.fixed ? "per-stream" : "shared";
    plan.dispatch = rt.fixed ? "fits" : "membership";
    plan.np = STREAMS;
    plan.kv_unified = 0;
    plan.n_stream = STREAMS;
    plan.layers = plan.streamed_layers = LAYERS;
    plan.kv_size = CELLS;
    plan.page_bytes = PAGE_BYTES;
    plan.pool_pages = POOL;
    plan.resident_pages_per_layer = RESIDENT_PER_LAYER;
    plan.ring_slots = RING;
    KVTRACE_BOOT(&plan);
    // the buffer type clears the pool it allocated (ggml_backend_buffer_clear): no slot holds
    // a page yet. Record every wholesale clear: without it a cleared slot looks loaded.
    KVTRACE_INVALIDATE("buffer-clear", 0);

    // slot 1 serves a request first, then slot 0; then slot 1 again; then both at once
    rt.ubatch({1}, 600);
    for (int i = 0; i < 3; i++) rt.ubatch({1}, 1);
    rt.ubatch({0}, 600);
    for (int i = 0; i < 3; i++) rt.ubatch({0}, 1);
    for (int i = 0; i < 2; i++) rt.ubatch({1}, 1);
    for (int i = 0; i < 2; i++) rt.ubatch({0, 1}, 1);

    rt.report();
    KVTRACE_END("completed");  // also written at exit() if never called
    return 0;
}
