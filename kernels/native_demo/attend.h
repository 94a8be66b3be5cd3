// kvdemo: the data plane. Attention of one stream of a real FLASH_ATTN_EXT node, computed on
// the CPU from whatever bytes each 256-token page is served from (a pool slot copy, or the
// authoritative host tensor), so a stale or foreign pool copy changes the numbers.
//
// Reads the node's real operands: Q (f32, through its permuted strides), the f16 KQ mask,
// K/V geometry (types, ne, nb) and the scale in the node's op_params; dequantizes K/V rows
// with ggml's own type traits (to_float).
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvdemo {

struct PageSource {
    const uint8_t * k;  // token 0 of the page, K plane (token stride K->nb[1])
    const uint8_t * v;  // token 0 of the page, V plane (token stride V->nb[1])
};

// Output of view index `view` (0..ns-1) of `dst`, laid out as dst's slice
// [tokens][n_head][D_v] (float), written to `out`.
void attend(const ggml_tensor * dst, int view, const std::vector<PageSource> & pages, float * out);

// zlib's CRC-32 (kvdiag compares checksums written as 8 hex digits)
uint32_t crc32(uint32_t crc, const void * data, size_t n);

}  // namespace kvdemo
