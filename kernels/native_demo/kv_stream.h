// kvdemo: the kv-stream runtime restated over real ggml objects (host memory only).
//
// What is restated, and from where (facts: /work/shared/docs/kv-stream-domain.md, cited "§"):
//  - the buffer type named CUDA_KV_Stream_Host (§1.2): is_host, CPU alignment, alloc size =
//    nbytes; clear/memset on it resets the resident cache and bumps a generation counter;
//  - runtime_from_tensor (§1.2): buffer membership only (tensor->buffer's type), returning the
//    runtime held by the buffer's context;
//  - pool sizing of the runtime constructor (§1.4);
//  - the resident cache bookkeeping (§1.5, §4.3): fixed window, (layer, page) keys (upstream,
//    "shared") or (layer, stream, page) keys (the fix, "per-stream"), the upload rule, layer
//    identity learned from K view pointers, mark_dirty_rows on global rows.
// The device pool is host memory here: "uploads" are memcpy of page bytes into it.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kvdemo {

constexpr int PAGE_TOKENS = 256;          // §1.3: the resident cache refuses any other value
constexpr int64_t V_ALIGN = 128;          // §1.3: V plane at the K bytes rounded up to 128
constexpr int COPY_BATCH_PAGES = 32;      // §1.6: consecutive pages per upload batch
constexpr int DEFAULT_MIN_RING_SLOTS = 8; // §1.4 step 3
extern const char * const KV_STREAM_BUFFER_NAME;  // "CUDA_KV_Stream_Host"

enum class Layout { shared, per_stream };

struct PoolPlan {
    int64_t pool_bytes = 0;
    int64_t page_bytes = 0;
    int64_t pool_pages = 0;
    int64_t min_ring_slots = 0;
    int64_t resident_pages_per_layer = 0;
    int64_t ring_slots = 0;
};

// §1.4 steps 1-5; false (with the reason) where the constructor returns no runtime.
bool plan_pool(int64_t pool_bytes, int64_t page_bytes, int layer_count, PoolPlan & out,
               std::string & error);

// (layer, stream, page); stream -1 stands for "no stream" (the shared layout's key).
using Key = std::tuple<int, int, int>;

struct MarkResult {
    std::vector<Key> keys;                       // keys marked dirty
    std::vector<std::pair<int, int>> outside;    // (stream|-1, page) outside every window
    bool all = false;                            // a negative row dirtied every page
};

class ResidentCache {
public:
    ResidentCache(Layout layout, int layer_count, int pages_per_layer, int ring_slots,
                  int n_stream, int64_t kv_size);

    Layout layout() const { return layout_; }
    int layer_count() const { return layer_count_; }
    int next_layer() const { return next_layer_; }

    // pages 0..window-1 of a view of this layer are resident
    int window(int layer) const;
    Key key(int layer, int stream, int page) const;
    // pool slot of a key: ring slots come first, then each layer's area (§1.5)
    int slot(const Key & key) const;

    // layer identity: a number per K pointer, first come first served; -1 when every layer
    // number is taken (the caller asserts next_layer < layer_count, as upstream does)
    void forget_layers();
    int learn(const void * k_ptr, bool & is_new);

    // §4.3: once per ubatch with the global rows (stream × kv_size + cell)
    MarkResult mark_dirty_rows(const std::vector<int64_t> & rows);

    // §1.5 upload rule; nullptr (no upload) or "miss"/"dirty"/"wide-query"/"last-chunk"
    const char * plan_page(const Key & key, int q_width, bool last_chunk) const;
    void uploaded(const Key & key);
    void invalidate();

private:
    Layout layout_;
    int layer_count_;
    std::vector<int> layer_pages_;
    std::vector<int> layer_offsets_;
    int ring_slots_;
    int n_stream_;
    int64_t kv_size_;
    std::set<Key> loaded_;
    std::set<Key> dirty_;
    std::vector<bool> precise_;
    std::map<const void *, int> layer_by_k_;
    int next_layer_ = 0;
};

// The runtime object a kv-stream buffer points at (§1.2): page geometry, the pool standing
// for the device's cudaMalloc, the resident cache, the ring cursor and the generation.
struct Runtime {
    Runtime(const PoolPlan & plan, int64_t v_offset, int64_t k_page_bytes, Layout layout,
            int layer_count, int n_stream, int64_t kv_size);

    PoolPlan plan;
    int64_t v_offset;
    int64_t k_page_bytes;
    int64_t stage_bytes;        // = page_bytes in the resident runtime (§2.1)
    std::vector<uint8_t> pool;  // pool_pages × page_bytes; slot s at s × page_bytes
    ResidentCache cache;
    int ring_cursor = 0;
    int generation = 0;

    uint8_t * slot_bytes(int slot) { return pool.data() + (size_t) slot * (size_t) plan.page_bytes; }
    // wholesale invalidation (§1.5): traced as an `invalidate` event
    void invalidate(const char * reason);
};

// The CUDA_KV_Stream_Host buffer type bound to one runtime (ggml-backend-impl.h interface).
ggml_backend_buffer_type_t kv_stream_buffer_type(Runtime * runtime);

// runtime_from_tensor (§1.2): non-null iff tensor->buffer is of the kv-stream type.
Runtime * runtime_from_tensor(const ggml_tensor * tensor);

}  // namespace kvdemo
