// kvdemo — the two-slot KV-streaming failure classes reproduced against a REAL ggml.
//
// The K/V cache is built as llama_kv_cache builds it without a unified cache (one K and one V
// tensor per layer [n_embd_k_gqa, kv_size, n_stream], per-ubatch views made with ggml_view_4d
// as get_k does; §4.1 of /work/shared/docs/kv-stream-domain.md) in a buffer of a buffer type
// named CUDA_KV_Stream_Host (kv_stream.cpp). Every ubatch builds the real FLASH_ATTN_EXT
// node per layer (Q reshaped and permuted as build_attn_mha does, an f16 KQ mask), evaluates
// the fits() predicate on the node's tensors, dispatches by buffer membership (upstream: a
// real GGML_ASSERT, so ggml_abort runs) or by the full predicate (the fix: ordinary attention
// over the host bytes plus a warning), and drives the resident cache bookkeeping (shared
// (layer, page) keys or per-stream (layer, stream, page) keys). Page bytes are copied into a
// host array standing for the device pool; attention is computed from the bytes each page
// was served from and compared with attention over the host bytes only.
//
// Every decision is written through kernels/kvtrace.h (KVTRACE_FILE=path enables it).
//
//   kvdemo --schedule two-slot-concurrent|slot1-first --layout shared|per-stream
//          --dispatch membership|fits [--layers N] [--ctx N] [--pool-mib N] [--prompt N]
//          [--decode N] [--ubatch N] [--n-head N] [--n-head-kv N] [--seed N]
// Exit: 0 completed, 2 bad usage, SIGABRT from ggml_abort on the upstream fits assert.
#include "attend.h"
#include "fits.h"
#include "kv_stream.h"
#include "options.h"
#include "schedule.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kvtrace.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using namespace kvdemo;

namespace {

constexpr double TOLERANCE = 1e-3;

int64_t pad256(int64_t n) { return (n + PAGE_TOKENS - 1) / PAGE_TOKENS * PAGE_TOKENS; }

// The whole program state of one run.
struct Demo {
    Options opt;
    ggml_type type_k = GGML_TYPE_Q8_0, type_v = GGML_TYPE_Q5_1;
    int64_t kv_size = 0, n_embd_k = 0, n_embd_v = 0;
    int n_stream = 0;
    Runtime * rt = nullptr;
    std::vector<ggml_tensor *> k_l, v_l;
    std::vector<std::vector<int>> cell_req, cell_pos;  // per stream: owner request and position
    std::map<int, int> req_last_cell;

    // -- one ubatch -------------------------------------------------------------------------

    void write_rows(int layer, int stream, int request, const std::vector<int> & cells, const MarkResult & mark) {
        // SET_ROWS of this run of cells into the host tensors at global rows (cpy_k/cpy_v, §4.1)
        std::mt19937 gen(opt.seed * 1000003u + (uint32_t) (layer * 7919 + stream * 104729 + request * 31 + cells[0]));
        std::normal_distribution<float> dist;
        std::vector<float> row((size_t) std::max(n_embd_k, n_embd_v));
        for (ggml_tensor * t : {k_l[layer], v_l[layer]}) {
            const auto * traits = ggml_get_type_traits(t->type);
            for (int c : cells) {
                for (auto & x : row) {
                    x = dist(gen);
                }
                const int64_t global = (int64_t) stream * kv_size + c;
                traits->from_float_ref(row.data(), static_cast<uint8_t *>(t->data) + global * t->nb[1], t->ne[0]);
            }
        }
        // the keys THIS write's rows marked (format 1.1): its pages, filtered from the mark
        std::set<std::pair<int, int>> pages;
        for (int c : cells) {
            const int64_t global = (int64_t) stream * kv_size + c;
            pages.insert(rt->cache.layout() == Layout::shared ? std::make_pair(-1, (int) (global / PAGE_TOKENS))
                                                             : std::make_pair(stream, c / PAGE_TOKENS));
        }
        std::vector<int32_t> keys;
        for (const Key & k : mark.keys) {
            if (std::get<0>(k) == layer && pages.count({std::get<1>(k), std::get<2>(k)})) {
                keys.insert(keys.end(), {std::get<0>(k), std::get<1>(k), std::get<2>(k)});
            }
        }
        const int c0 = cells.front(), c1 = cells.back() + 1;
        const int64_t base = (int64_t) stream * kv_size;
        KVTRACE_WRITE(layer, stream, c0, c1, base + c0, base + c1,
                      reinterpret_cast<const int32_t (*)[3]>(keys.data()), (int) (keys.size() / 3));
    }

    std::vector<PageSource> host_pages(const ggml_tensor * fa, int view) const {
        const ggml_tensor * k = fa->src[1];
        const ggml_tensor * v = fa->src[2];
        std::vector<PageSource> out;
        for (int64_t p = 0; p < k->ne[1] / PAGE_TOKENS; ++p) {
            out.push_back({static_cast<const uint8_t *>(k->data) + view * k->nb[3] + p * PAGE_TOKENS * k->nb[1],
                           static_cast<const uint8_t *>(v->data) + view * v->nb[3] + p * PAGE_TOKENS * v->nb[1]});
        }
        return out;
    }

    void copy_page(const PageSource & host, int slot) {
        uint8_t * dst = rt->slot_bytes(slot);
        std::memcpy(dst, host.k, (size_t) rt->k_page_bytes);
        std::memcpy(dst + rt->v_offset, host.v, (size_t) (rt->plan.page_bytes - rt->v_offset));
    }

    PageSource slot_pages(int slot) {
        uint8_t * s = rt->slot_bytes(slot);
        return {s, s + rt->v_offset};
    }

    // ggml_cuda_kv_stream_fattn restated: the upstream assert, then the streamed read of the
    // single stream the view covers: resident pages through the (layer, page) or (layer,
    // stream, page) bookkeeping, the rest through the ring.
    std::vector<PageSource> kv_stream_fattn(const ggml_tensor * dst, int tokens, bool & first_fa) {
        GGML_ASSERT(kv_stream_fattn_fits(dst));
        const ggml_tensor * k = dst->src[1];
        ResidentCache & cache = rt->cache;
        int index;
        bool learned = false;
        int stream;
        if (cache.layout() == Layout::shared) {
            // §1.5: a prefill graph's first attention clears the maps and relearns identities
            // from whatever view pointers it sees; the stream is not part of the key
            if (tokens > 1 && first_fa) {
                cache.forget_layers();
                KVTRACE_LEARN(-1, 0, 1);
            }
            index = cache.learn(k->data, learned);
            if (index < 0) {
                GGML_ASSERT(cache.next_layer() < cache.layer_count());
            }
            if (learned) {
                KVTRACE_LEARN(index, (uint64_t) (uintptr_t) k->data, 0);
            }
            stream = (int) (k->view_offs / k->view_src->nb[2]);
        } else {
            // the fix: layer from the K tensor base, stream from the view's byte offset
            index = cache.learn(k->view_src->data, learned);
            GGML_ASSERT(index >= 0);
            if (learned) {
                KVTRACE_LEARN(index, (uint64_t) (uintptr_t) k->view_src->data, 0);
            }
            stream = (int) (k->view_offs / k->view_src->nb[2]);
        }
        first_fa = false;
        const int n_pages = (int) (k->ne[1] / PAGE_TOKENS);
        const std::vector<PageSource> host = host_pages(dst, 0);
        std::vector<PageSource> served((size_t) n_pages);
        std::vector<int> slot_of((size_t) n_pages, -1);
        struct Up { int page, slot; const char * reason; };
        std::vector<Up> resident;
        const int window = cache.window(index);
        for (int p = 0; p < std::min(window, n_pages); ++p) {
            const Key key = cache.key(index, stream, p);
            const int slot = cache.slot(key);
            const char * reason = cache.plan_page(key, tokens, p == n_pages - 1);
            if (reason) {
                copy_page(host[(size_t) p], slot);
                cache.uploaded(key);
                resident.push_back({p, slot, reason});
            }
            slot_of[(size_t) p] = slot;
            served[(size_t) p] = slot_pages(slot);
        }
        const int key_stream = cache.layout() == Layout::shared ? -1 : stream;
        for (size_t i = 0; i < resident.size();) {  // batches of consecutive pages and slots
            size_t n = 1;
            while (i + n < resident.size() && (int) n < COPY_BATCH_PAGES &&
                   resident[i + n].page == resident[i].page + (int) n &&
                   resident[i + n].slot == resident[i].slot + (int) n &&
                   std::strcmp(resident[i + n].reason, resident[i].reason) == 0) {
                ++n;
            }
            KVTRACE_UPLOAD(index, stream, resident[i].page, resident[i].page + (int) n, resident[i].slot,
                           "resident", (int64_t) n * rt->plan.page_bytes, resident[i].reason, key_stream);
            i += n;
        }
        const int ring = (int) rt->plan.ring_slots;
        for (int p = window; p < n_pages;) {  // the rest streams through the ring (§1.6)
            int run = 1;
            while (p + run < n_pages && run < std::min(COPY_BATCH_PAGES, ring) && rt->ring_cursor + run < ring) {
                ++run;
            }
            for (int j = 0; j < run; ++j) {
                copy_page(host[(size_t) (p + j)], rt->ring_cursor + j);
                slot_of[(size_t) (p + j)] = rt->ring_cursor + j;
                served[(size_t) (p + j)] = slot_pages(rt->ring_cursor + j);
            }
            KVTRACE_UPLOAD(index, stream, p, p + run, rt->ring_cursor, "ring", (int64_t) run * rt->plan.page_bytes,
                           "ring", -1);
            rt->ring_cursor = (rt->ring_cursor + run) % ring;
            p += run;
        }
        kvtrace_read r;
        KVTRACE_READ_BEGIN(&r, index, stream);
        for (int p = 0; p < n_pages; ++p) {
            KVTRACE_READ_PAGE(&r, p, p < window ? KVTRACE_POOL : KVTRACE_RING, slot_of[(size_t) p]);
        }
        KVTRACE_READ_END(&r);
        return served;
    }

    void fill_inputs(ggml_tensor * q_cur, int layer, int step) {
        std::mt19937 gen(opt.seed * 7u + (uint32_t) (layer * 65537 + step * 257 + 1));
        std::normal_distribution<float> dist;
        auto * q = static_cast<float *>(q_cur->data);
        for (int64_t i = 0; i < ggml_nelements(q_cur); ++i) {
            q[i] = dist(gen);
        }
    }

    void fill_mask(ggml_tensor * mask, const Ubatch & ub, int s0, int ns) {
        // each token sees the cells its own sequence wrote at positions <= its own
        const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
        const ggml_fp16_t ninf = ggml_fp32_to_fp16(-std::numeric_limits<float>::infinity());
        const int64_t n_kv = mask->ne[0];
        for (int i = 0; i < ns; ++i) {
            const Lane * lane = nullptr;
            for (const Lane & l : ub.lanes) {
                lane = l.stream == s0 + i ? &l : lane;
            }
            for (int t = 0; t < ub.tokens; ++t) {
                auto * row = reinterpret_cast<ggml_fp16_t *>(static_cast<uint8_t *>(mask->data) + t * mask->nb[1] + i * mask->nb[3]);
                for (int64_t c = 0; c < n_kv; ++c) {
                    const bool seen = lane && cell_req[s0 + i][c] == lane->requests[t] && cell_pos[s0 + i][c] <= lane->positions[t];
                    row[c] = seen ? zero : ninf;
                }
            }
        }
    }

    void step(const Ubatch & ub) {
        for (const Lane & l : ub.lanes) {
            for (size_t j = 0; j < l.cells.size(); ++j) {
                req_last_cell[l.requests[j]] = std::max(req_last_cell[l.requests[j]], l.cells[j]);
                cell_req[l.stream][l.cells[j]] = l.requests[j];
                cell_pos[l.stream][l.cells[j]] = l.positions[j];
            }
        }
        int last = 0;
        for (int r : ub.requests) {
            last = std::max(last, req_last_cell[r] + 1);
        }
        const int64_t n_kv = std::min<int64_t>(kv_size, std::max<int64_t>(PAGE_TOKENS, pad256(last)));
        KVTRACE_STEP(ub.prefill() ? "prefill" : "decode", ub.streams.data(), (int) ub.streams.size(), ub.tokens, (int) n_kv);

        // set_input_k_idxs: global rows = stream × kv_size + cell, handed to mark_dirty_rows
        std::vector<int64_t> rows;
        for (const Lane & l : ub.lanes) {
            for (int c : l.cells) {
                rows.push_back((int64_t) l.stream * kv_size + c);
            }
        }
        const MarkResult mark = rt->cache.mark_dirty_rows(rows);
        std::vector<int32_t> keys, outside;
        for (const Key & k : mark.keys) {
            keys.insert(keys.end(), {std::get<0>(k), std::get<1>(k), std::get<2>(k)});
        }
        for (const auto & [s, p] : mark.outside) {
            outside.insert(outside.end(), {s, p});
        }
        KVTRACE_MARK_OUTSIDE(rows.data(), (int) rows.size(), reinterpret_cast<const int32_t (*)[3]>(keys.data()),
                     (int) (keys.size() / 3), mark.all ? 1 : 0,
                     reinterpret_cast<const int32_t (*)[2]>(outside.data()), (int) (outside.size() / 2));

        // the graph: one FLASH_ATTN_EXT node per layer over views of the cache tensors
        const int s0 = ub.streams.front(), ns = ub.streams.back() - s0 + 1;
        const int64_t d = opt.head_dim;
        ggml_init_params params = {(size_t) (16 * opt.layers + 16) * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
        ggml_context * ctx = ggml_init(params);
        ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, ub.tokens, 1, ns);
        ggml_set_name(mask, "attn_inp_kq_mask");
        std::vector<ggml_tensor *> q_cur, fa;
        for (int il = 0; il < opt.layers; ++il) {
            ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, opt.n_head, (int64_t) ub.tokens * ns);
            ggml_format_name(q, "Qcur-%d", il);
            q_cur.push_back(q);
            q = ggml_permute(ctx, ggml_reshape_4d(ctx, q, d, opt.n_head, ub.tokens, ns), 0, 2, 1, 3);
            ggml_tensor * views[2];
            for (int kv = 0; kv < 2; ++kv) {
                ggml_tensor * t = kv == 0 ? k_l[il] : v_l[il];
                const int64_t n_embd = t->ne[0];
                // get_k (§4.1): [head_dim, n_head_kv, n_kv, ns] at stream s0
                ggml_tensor * view = ggml_view_4d(ctx, t, d, opt.n_head_kv, n_kv, ns, ggml_row_size(t->type, d),
                                                  ggml_row_size(t->type, n_embd), ggml_row_size(t->type, n_embd * kv_size),
                                                  ggml_row_size(t->type, n_embd * kv_size) * s0);
                views[kv] = ggml_permute(ctx, view, 0, 2, 1, 3);
            }
            ggml_tensor * node = ggml_flash_attn_ext(ctx, q, views[0], views[1], mask, 1.0f / std::sqrt((float) d), 0.0f, 0.0f);
            ggml_flash_attn_ext_set_prec(node, GGML_PREC_F32);
            ggml_format_name(node, "__fattn__-%d", il);
            fa.push_back(node);
        }
        ggml_backend_buffer_t compute = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
        GGML_ASSERT(compute != nullptr);
        fill_mask(mask, ub, s0, ns);

        std::map<int, uint32_t> crc, ref_crc;
        std::map<int, float> delta;
        bool first_fa = true;
        for (int il = 0; il < opt.layers; ++il) {
            for (const Lane & l : ub.lanes) {  // SET_ROWS of this layer, one per run of cells
                for (size_t j = 0; j < l.cells.size();) {
                    size_t n = 1;
                    while (j + n < l.cells.size() && l.requests[j + n] == l.requests[j] && l.cells[j + n] == l.cells[j] + (int) n) {
                        ++n;
                    }
                    write_rows(il, l.stream, l.requests[j], std::vector<int>(l.cells.begin() + j, l.cells.begin() + j + n), mark);
                    j += n;
                }
            }
            fill_inputs(q_cur[il], il, ub.index);
            ggml_tensor * node = fa[il];
            const FitsResult f = evaluate_fits(node);
            const char * route;
            if (opt.dispatch == "membership") {
                route = !f.membership() ? "ordinary" : f.ok ? "streamed" : "abort";
            } else {
                route = f.ok ? "streamed" : f.membership() ? "fallback" : "ordinary";
            }
            std::vector<const char *> failed;
            for (const auto & s : f.failed) {
                failed.push_back(s.c_str());
            }
            // never NULL: the program evaluated every condition (NULL would log evaluated:false)
            static const char * const none[1] = {nullptr};
            KVTRACE_FITS(node, il, f.ok ? 1 : 0, route, failed.empty() ? none : failed.data(), (int) failed.size(),
                         f.k_runtime, f.v_runtime);
            std::vector<std::vector<PageSource>> sources((size_t) ns);
            if (opt.dispatch == "membership" ? f.membership() : f.ok) {
                sources[0] = kv_stream_fattn(node, ub.tokens, first_fa);
            } else {
                if (f.membership()) {
                    std::string msg = "kv-stream FA node of layer " + std::to_string(il) +
                                      " does not fit the streamed kernel (";
                    for (size_t j = 0; j < f.failed.size(); ++j) {
                        msg += (j ? ", " : "") + f.failed[j];
                    }
                    msg += "); falling back to ordinary flash attention over the host-mapped KV buffer (zero-copy)";
                    KVTRACE_WARN("kv-stream-fallback", msg.c_str());
                }
                for (int i = 0; i < ns; ++i) {
                    sources[(size_t) i] = host_pages(node, i);
                    if (f.membership() && std::count(ub.streams.begin(), ub.streams.end(), s0 + i)) {
                        kvtrace_read r;
                        KVTRACE_READ_BEGIN(&r, il, s0 + i);
                        for (int p = 0; p < (int) (n_kv / PAGE_TOKENS); ++p) {
                            KVTRACE_READ_PAGE(&r, p, KVTRACE_HOST, -1);
                        }
                        KVTRACE_READ_END(&r);
                    }
                }
            }
            const int64_t per_view = node->ne[0] * node->ne[1] * node->ne[2];
            std::vector<float> ref((size_t) per_view);
            for (int i = 0; i < ns; ++i) {
                const int s = s0 + i;
                if (!std::count(ub.streams.begin(), ub.streams.end(), s)) {
                    continue;
                }
                float * out = reinterpret_cast<float *>(static_cast<uint8_t *>(node->data) + i * node->nb[3]);
                attend(node, i, sources[(size_t) i], out);
                attend(node, i, host_pages(node, i), ref.data());  // the reference: host bytes only
                float worst = 0.0f;
                for (int64_t e = 0; e < per_view; ++e) {
                    worst = std::max(worst, std::fabs(out[e] - ref[(size_t) e]));
                }
                delta[s] = std::max(delta[s], worst);
                crc[s] = crc32(crc[s], out, (size_t) per_view * sizeof(float));
                ref_crc[s] = crc32(ref_crc[s], ref.data(), (size_t) per_view * sizeof(float));
            }
        }
        for (int s : ub.streams) {
            KVTRACE_OUTPUT(s, crc[s], ref_crc[s], 1, (double) delta[s], TOLERANCE);
            std::printf("step %d stream %d max|delta| %.6g\n", ub.index, s, (double) delta[s]);
        }
        ggml_backend_buffer_free(compute);
        ggml_free(ctx);
    }
};

}  // namespace

int main(int argc, char ** argv) {
    Demo demo;
    demo.opt = parse(argc, argv);
    const Options & o = demo.opt;
    demo.n_stream = o.np;  // not unified: one stream per slot (§4.1)
    demo.kv_size = pad256(pad256(o.ctx) / o.np);
    demo.n_embd_k = (int64_t) o.head_dim * o.n_head_kv;
    demo.n_embd_v = demo.n_embd_k;
    const int64_t k_page = (int64_t) ggml_row_size(demo.type_k, o.head_dim) * o.n_head_kv * PAGE_TOKENS;
    const int64_t v_offset = (k_page + V_ALIGN - 1) / V_ALIGN * V_ALIGN;
    const int64_t page_bytes = v_offset + (int64_t) ggml_row_size(demo.type_v, o.head_dim) * o.n_head_kv * PAGE_TOKENS;
    PoolPlan pool;
    std::string err;
    if (!plan_pool((int64_t) o.pool_mib << 20, page_bytes, o.layers, pool, err)) {
        usage("the runtime would refuse this pool: " + err);
    }
    const Layout layout = o.layout == "shared" ? Layout::shared : Layout::per_stream;
    Runtime rt(pool, v_offset, k_page, layout, o.layers, demo.n_stream, demo.kv_size);
    demo.rt = &rt;
    const int window = rt.cache.window(0);
    if (demo.kv_size / PAGE_TOKENS - window > pool.ring_slots) {
        usage("the ring (" + std::to_string(pool.ring_slots) + " slots) cannot hold the pages beyond the window");
    }
    std::vector<Ubatch> ubatches;
    try {
        ubatches = make_ubatches(named_schedule(o.schedule, o.prompt, o.decode), demo.n_stream, o.ubatch, demo.kv_size);
    } catch (const std::exception & e) {
        usage(e.what());
    }

    const std::string run_name = "kvdemo " + o.schedule + " " + o.layout + " " + o.dispatch;
    const std::string build = std::string("ggml ") + ggml_version() + " (" + KVDEMO_GGML_SOURCE + ")";
    kvtrace_plan plan;
    kvtrace_plan_defaults(&plan);
    plan.run_name = run_name.c_str();
    plan.build = build.c_str();
    plan.device_name = "host (CUDA_KV_Stream_Host and the pool emulated in host memory)";
    plan.layout = o.layout.c_str();
    plan.dispatch = o.dispatch.c_str();
    plan.np = o.np;
    plan.kv_unified = 0;
    plan.page_bytes = page_bytes;
    plan.v_offset = v_offset;
    plan.pool_pages = pool.pool_pages;
    plan.resident_pages_per_layer = pool.resident_pages_per_layer;
    plan.ring_slots = pool.ring_slots;
    plan.stage_bytes = rt.stage_bytes;
    plan.kv_size = demo.kv_size;
    plan.pages_per_stream = demo.kv_size / PAGE_TOKENS;
    plan.streamed_layers = o.layers;
    plan.layers = o.layers;
    plan.n_stream = demo.n_stream;
    plan.head_dim = o.head_dim;
    plan.n_head = o.n_head;
    plan.n_head_kv = o.n_head_kv;
    plan.type_k = ggml_type_name(demo.type_k);
    plan.type_v = ggml_type_name(demo.type_v);
    // the trace opens here, after every usage check: a refused command line leaves no trace
    KVTRACE_INSTALL_ABORT_HOOK();
    KVTRACE_BOOT(&plan);
    KVTRACE_WARN("multiseq-opt-in", "block KV streaming with 2 KV streams (-np 2 without --kv-unified): "
                                    "the G1 validator refuses this boot; kvdemo runs it as the arm117 port's opt-in did");

    // the cache tensors, as llama_kv_cache creates them, in one CUDA_KV_Stream_Host buffer
    ggml_init_params params = {(size_t) (2 * o.layers + 2) * ggml_tensor_overhead(), nullptr, true};
    ggml_context * kv_ctx = ggml_init(params);
    for (int il = 0; il < o.layers; ++il) {
        demo.k_l.push_back(ggml_new_tensor_3d(kv_ctx, demo.type_k, demo.n_embd_k, demo.kv_size, demo.n_stream));
        demo.v_l.push_back(ggml_new_tensor_3d(kv_ctx, demo.type_v, demo.n_embd_v, demo.kv_size, demo.n_stream));
        ggml_format_name(demo.k_l.back(), "cache_k_l%d", il);
        ggml_format_name(demo.v_l.back(), "cache_v_l%d", il);
    }
    ggml_backend_buffer_t kv_buf = ggml_backend_alloc_ctx_tensors_from_buft(kv_ctx, kv_stream_buffer_type(&rt));
    GGML_ASSERT(kv_buf != nullptr);
    ggml_backend_buffer_clear(kv_buf, 0);  // llama_kv_cache clears its buffers: the cache resets
    std::printf("kv buffer %s type %s size %zu runtime %" PRIu64 "\n", ggml_backend_buffer_name(kv_buf),
                ggml_backend_buft_name(ggml_backend_buffer_get_type(kv_buf)), ggml_backend_buffer_get_size(kv_buf),
                (uint64_t) (uintptr_t) &rt);
    for (int il = 0; il < o.layers; ++il) {
        std::printf("layer %d k %" PRIu64 " v %" PRIu64 " stream_stride %zu\n", il, (uint64_t) (uintptr_t) demo.k_l[il]->data,
                    (uint64_t) (uintptr_t) demo.v_l[il]->data, demo.k_l[il]->nb[2]);
    }
    std::printf("plan page_bytes %" PRId64 " pool_pages %" PRId64 " resident/layer %" PRId64 " ring %" PRId64
                " window %d kv_size %" PRId64 "\n", page_bytes, pool.pool_pages, pool.resident_pages_per_layer,
                pool.ring_slots, window, demo.kv_size);
    std::fflush(stdout);

    demo.cell_req.assign((size_t) demo.n_stream, std::vector<int>((size_t) demo.kv_size, -1));
    demo.cell_pos.assign((size_t) demo.n_stream, std::vector<int>((size_t) demo.kv_size, -1));
    for (const Ubatch & ub : ubatches) {
        demo.step(ub);
    }
    KVTRACE_END("completed");
    ggml_backend_buffer_free(kv_buf);
    ggml_free(kv_ctx);
    return 0;
}
