// The C++ shared object of kvtrace_records.c: it writes upload, learn and mark events (with
// `outside`) into the same trace, so its kinds join what the process declares -- in the header
// line when it is linked, in a `records` event when it is dlopen()ed after the header. The
// upload sits in a function template: its instances count too (GCC ignores a section
// attribute on a static inside a template instance, which is why kvtrace.h uses an assembler
// directive).
//
// SPDX-License-Identifier: MIT
#include "kvtrace.h"

#include <array>
#include <cstdint>

extern "C" __attribute__((visibility("default"))) void kvrec_dso_emit(int layer);

namespace {
template <typename Layer> void upload_pages(Layer layer, int pages) {
    KVTRACE_UPLOAD(layer, 0, 0, pages, 4, "resident", pages * 4096, "miss", -1);
}
}  // namespace

extern "C" void kvrec_dso_emit(int layer) {
    const std::array<int64_t, 2> rows{{2048, 2049}};
    const int32_t outside[1][2] = {{1, 8}};
    KVTRACE_LEARN(layer, reinterpret_cast<const void *>(0x7000 + layer), 0);
    KVTRACE_MARK_OUTSIDE(rows.data(), rows.size(), nullptr, 0, 0, outside, 1);
    upload_pages(layer, 2);
}
