// kvdemo: CUDA_KV_Stream_Host buffer type, pool sizing and resident bookkeeping (see kv_stream.h).
#include "kv_stream.h"

#include "ggml-backend-impl.h"
#include "kvtrace.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kvdemo {

const char * const KV_STREAM_BUFFER_NAME = "CUDA_KV_Stream_Host";

bool plan_pool(int64_t pool_bytes, int64_t page_bytes, int layer_count, PoolPlan & out,
               std::string & error) {
    if (page_bytes <= 0 || layer_count <= 0) {
        error = "page_bytes or layer_count is 0";
        return false;
    }
    const int64_t pool_pages = pool_bytes / page_bytes;
    if (pool_pages <= layer_count) {
        error = "pool of " + std::to_string(pool_pages) + " pages cannot hold one page per layer for " +
                std::to_string(layer_count) + " layers plus a ring";
        return false;
    }
    const int64_t min_slots = std::min<int64_t>(DEFAULT_MIN_RING_SLOTS, pool_pages - layer_count);
    const int64_t resident = (pool_pages - min_slots) / layer_count;
    if (resident <= 0) {
        error = "ring leaves no resident page per layer";
        return false;
    }
    out.pool_bytes = pool_bytes;
    out.page_bytes = page_bytes;
    out.pool_pages = pool_pages;
    out.min_ring_slots = min_slots;
    out.resident_pages_per_layer = resident;
    out.ring_slots = pool_pages - resident * layer_count;  // step 5: the remainder
    return true;
}

// -- resident cache ------------------------------------------------------------------------

ResidentCache::ResidentCache(Layout layout, int layer_count, int pages_per_layer, int ring_slots,
                             int n_stream, int64_t kv_size)
    : layout_(layout), layer_count_(layer_count), layer_pages_(layer_count, pages_per_layer),
      layer_offsets_(layer_count), ring_slots_(ring_slots), n_stream_(n_stream), kv_size_(kv_size),
      precise_(layer_count, false) {
    for (int i = 0; i < layer_count; ++i) {
        layer_offsets_[i] = i * pages_per_layer;
    }
}

int ResidentCache::window(int layer) const {
    // per-stream splits each layer's pages evenly between the streams: same pool budget
    return layout_ == Layout::shared ? layer_pages_[layer] : layer_pages_[layer] / n_stream_;
}

Key ResidentCache::key(int layer, int stream, int page) const {
    return Key(layer, layout_ == Layout::shared ? -1 : stream, page);
}

int ResidentCache::slot(const Key & key) const {
    const auto [layer, stream, page] = key;
    GGML_ASSERT(page >= 0 && page < window(layer));  // upstream's (layer, page) bound assert
    const int base = ring_slots_ + layer_offsets_[layer];
    return stream < 0 ? base + page : base + stream * window(layer) + page;
}

void ResidentCache::forget_layers() {
    layer_by_k_.clear();
    next_layer_ = 0;
}

int ResidentCache::learn(const void * k_ptr, bool & is_new) {
    is_new = false;
    auto it = layer_by_k_.find(k_ptr);
    if (it != layer_by_k_.end()) {
        return it->second;
    }
    if (next_layer_ >= layer_count_) {
        return -1;
    }
    is_new = true;
    layer_by_k_[k_ptr] = next_layer_;
    return next_layer_++;
}

MarkResult ResidentCache::mark_dirty_rows(const std::vector<int64_t> & rows) {
    MarkResult result;
    if (layout_ == Layout::shared) {
        // upstream clears every flag first (§4.3 step 1); per-stream keeps a mark until its
        // page is uploaded, so a ubatch whose attention fell back cannot lose its writes
        dirty_.clear();
    }
    std::fill(precise_.begin(), precise_.end(), true);
    std::set<std::pair<int, int>> pages;  // (stream|-1, page)
    for (int64_t row : rows) {
        if (row < 0) {  // §4.3 step 2: every page mutable and dirty
            result.all = true;
            for (int layer = 0; layer < layer_count_; ++layer) {
                for (int s = 0; s < (layout_ == Layout::shared ? 1 : n_stream_); ++s) {
                    for (int p = 0; p < window(layer); ++p) {
                        Key k = key(layer, s, p);
                        dirty_.insert(k);
                        result.keys.push_back(k);
                    }
                }
            }
            return result;
        }
        if (layout_ == Layout::shared) {
            pages.insert({-1, (int) (row / PAGE_TOKENS)});  // global row / 256: no stream term
        } else {
            pages.insert({(int) (row / kv_size_), (int) (row % kv_size_ / PAGE_TOKENS)});
        }
    }
    for (const auto & [stream, page] : pages) {
        bool inside = false;
        for (int layer = 0; layer < layer_count_; ++layer) {
            if (page < window(layer)) {
                inside = true;
                Key k(layer, stream, page);
                dirty_.insert(k);
                result.keys.push_back(k);
            }
        }
        if (!inside) {
            result.outside.emplace_back(stream, page);
        }
    }
    std::sort(result.keys.begin(), result.keys.end());
    return result;
}

const char * ResidentCache::plan_page(const Key & key, int q_width, bool last_chunk) const {
    if (!loaded_.count(key)) {
        return "miss";
    }
    if (precise_[std::get<0>(key)]) {
        return dirty_.count(key) ? "dirty" : nullptr;
    }
    if (q_width > 1) {
        return "wide-query";
    }
    return last_chunk ? "last-chunk" : nullptr;
}

void ResidentCache::uploaded(const Key & key) {
    loaded_.insert(key);
    dirty_.erase(key);
}

void ResidentCache::invalidate() {
    loaded_.clear();
    dirty_.clear();
    std::fill(precise_.begin(), precise_.end(), false);
    forget_layers();
}

// -- runtime -------------------------------------------------------------------------------

Runtime::Runtime(const PoolPlan & plan_, int64_t v_offset_, int64_t k_page_bytes_, Layout layout,
                 int layer_count, int n_stream, int64_t kv_size)
    : plan(plan_), v_offset(v_offset_), k_page_bytes(k_page_bytes_), stage_bytes(plan_.page_bytes),
      pool((size_t) plan_.pool_bytes, 0),
      cache(layout, layer_count, (int) plan_.resident_pages_per_layer, (int) plan_.ring_slots,
            n_stream, kv_size) {}

void Runtime::invalidate(const char * reason) {
    cache.invalidate();
    ring_cursor = 0;
    ++generation;
    KVTRACE_INVALIDATE(reason, generation);
}

// -- the buffer type -----------------------------------------------------------------------

namespace {

struct BufferContext {
    void * data;
    Runtime * runtime;
};

BufferContext * ctx_of(ggml_backend_buffer_t buffer) {
    return static_cast<BufferContext *>(buffer->context);
}

void buffer_free(ggml_backend_buffer_t buffer) {
    std::free(ctx_of(buffer)->data);
    delete ctx_of(buffer);
}

void * buffer_get_base(ggml_backend_buffer_t buffer) { return ctx_of(buffer)->data; }

void buffer_memset_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor, uint8_t value,
                          size_t offset, size_t size) {
    std::memset(static_cast<uint8_t *>(tensor->data) + offset, value, size);
    ctx_of(buffer)->runtime->invalidate("buffer-clear");  // §1.2: memset resets the cache
}

void buffer_set_tensor(ggml_backend_buffer_t, ggml_tensor * tensor, const void * data,
                       size_t offset, size_t size) {
    std::memcpy(static_cast<uint8_t *>(tensor->data) + offset, data, size);
}

void buffer_get_tensor(ggml_backend_buffer_t, const ggml_tensor * tensor, void * data,
                       size_t offset, size_t size) {
    std::memcpy(data, static_cast<const uint8_t *>(tensor->data) + offset, size);
}

bool buffer_cpy_tensor(ggml_backend_buffer_t, const ggml_tensor * src, ggml_tensor * dst) {
    if (src->buffer && ggml_backend_buffer_is_host(src->buffer)) {
        std::memcpy(dst->data, src->data, ggml_nbytes(src));
        return true;
    }
    return false;
}

void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    std::memset(ctx_of(buffer)->data, value, buffer->size);
    ctx_of(buffer)->runtime->invalidate("buffer-clear");
}

const ggml_backend_buffer_i BUFFER_IFACE = {
    /* .free_buffer   = */ buffer_free,
    /* .get_base      = */ buffer_get_base,
    /* .init_tensor   = */ nullptr,
    /* .memset_tensor = */ buffer_memset_tensor,
    /* .set_tensor    = */ buffer_set_tensor,
    /* .get_tensor    = */ buffer_get_tensor,
    /* .set_tensor_2d = */ nullptr,
    /* .get_tensor_2d = */ nullptr,
    /* .cpy_tensor    = */ buffer_cpy_tensor,
    /* .clear         = */ buffer_clear,
    /* .reset         = */ nullptr,
};

const char * buft_get_name(ggml_backend_buffer_type_t) { return KV_STREAM_BUFFER_NAME; }

size_t buft_get_alignment(ggml_backend_buffer_type_t) { return 32; }  // ggml's TENSOR_ALIGNMENT

ggml_backend_buffer_t buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    // stands for cudaHostAlloc(Mapped | WriteCombined) (§1.2): plain aligned host memory
    void * data = nullptr;
    if (posix_memalign(&data, 64, size ? size : 1) != 0) {
        return nullptr;
    }
    auto * ctx = new BufferContext{data, static_cast<Runtime *>(buft->context)};
    return ggml_backend_buffer_init(buft, BUFFER_IFACE, ctx, size);
}

bool buft_is_host(ggml_backend_buffer_type_t) { return true; }

}  // namespace

ggml_backend_buffer_type_t kv_stream_buffer_type(Runtime * runtime) {
    static ggml_backend_buffer_type buft = {
        /* .iface = */ {
            /* .get_name       = */ buft_get_name,
            /* .alloc_buffer   = */ buft_alloc_buffer,
            /* .get_alignment  = */ buft_get_alignment,
            /* .get_max_size   = */ nullptr,
            /* .get_alloc_size = */ nullptr,
            /* .is_host        = */ buft_is_host,
        },
        /* .device  = */ nullptr,
        /* .context = */ nullptr,
    };
    buft.context = runtime;
    return &buft;
}

Runtime * runtime_from_tensor(const ggml_tensor * tensor) {
    if (tensor == nullptr || tensor->buffer == nullptr) {
        return nullptr;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(tensor->buffer);
    if (buft->iface.get_name != buft_get_name) {
        return nullptr;
    }
    return ctx_of(tensor->buffer)->runtime;
}

}  // namespace kvdemo
