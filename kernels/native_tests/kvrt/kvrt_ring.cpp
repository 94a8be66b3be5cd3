// kvrt's C++ shared object: the ring copier and the layer-identity learn, written in C++ and
// loaded by the program with dlopen() after the trace's header line (kvrt --dso PATH). It
// includes kvtrace.h itself, so its events go into the same trace and its kinds (learn) are
// declared by a `records` event when it is loaded.
//
// SPDX-License-Identifier: MIT
#include "kvtrace.h"

#include <cstdint>
#include <cstring>
#include <set>

#include "kvrt.h"

extern "C" {
__attribute__((visibility("default"))) void kvrt_ring_copy(const void *src, void *dst,
                                                           int page_bytes, int layer,
                                                           int stream, int page0, int n,
                                                           int slot);
__attribute__((visibility("default"))) void kvrt_learn(int layer, const void *k_ptr);
}

void kvrt_ring_copy(const void *src, void *dst, int page_bytes, int layer, int stream, int page0,
                    int n, int slot) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * static_cast<std::size_t>(page_bytes));
    KVTRACE_UPLOAD(layer, stream, page0, page0 + n, slot, "ring",
                   static_cast<std::int64_t>(n) * page_bytes, "ring", -1);
}

void kvrt_learn(int layer, const void *k_ptr) {
    static std::set<const void *> seen;  // called under the runtime's lock
    if (seen.insert(k_ptr).second) KVTRACE_LEARN(layer, k_ptr, 0);
}
