// kvdemo: ggml_cuda_kv_stream_fattn_fits(dst) restated over the real FLASH_ATTN_EXT node (§2.1-2.2).
//
// Every condition is evaluated and each failing one is named with the names kvdiag uses
// (kvdiag/kvstream/fits.py), in the order the runtime tests them, so the program can hand
// the failed list to KVTRACE_FITS (evaluated: true).
#pragma once

#include "ggml.h"
#include "kv_stream.h"

#include <string>
#include <vector>

namespace kvdemo {

struct FitsResult {
    bool ok = false;
    std::vector<std::string> failed;
    Runtime * k_runtime = nullptr;
    Runtime * v_runtime = nullptr;
    bool membership() const { return k_runtime != nullptr || v_runtime != nullptr; }
};

FitsResult evaluate_fits(const ggml_tensor * dst);

// The bare predicate upstream asserts on: its name appears in the GGML_ASSERT text.
bool kv_stream_fattn_fits(const ggml_tensor * dst);

}  // namespace kvdemo
