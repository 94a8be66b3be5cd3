// ggml K/V block layouts and in-register dequantization to f16 pairs.
//
// Layouts (ggml-common.h, little endian, packed, 32 elements a block):
//   block_q8_0 { half d; int8 qs[32]; }                     34 bytes
//   block_q4_0 { half d; uint8 qs[16]; }                    18 bytes,
//                                                           byte j = elem j | elem j+16 << 4
//   block_q4_1 { half d; half m; uint8 qs[16]; }            20 bytes, value = q*d + m
//   block_q5_0 { half d; uint8 qh[4]; uint8 qs[16]; }       22 bytes, bit e of qh = bit 4 of elem e
//   block_q5_1 { half d; half m; uint8 qh[4]; uint8 qs[16]; } 24 bytes
// f16 and bf16 rows are plain arrays; kvdiag treats 32 of them as a 64-byte "block" so that
// every type is addressed the same way (block c of a head row holds elements 32c..32c+31).
//
// Dequantization follows ggml's dequantize_row_* and rounds the float value once to f16, the
// precision the attention's tensor-core products use (as ggml's CUDA FA does). The integer to
// f16 step uses the 0x6400 trick (f16 1024 + n is exact for 0 <= n < 1024), so it needs no
// conversion instructions; d*q is exact in f16 arithmetic before its single rounding.
#pragma once
#include "kvdiag_platform.cuh"

enum KvType {
    KV_F16 = 0, KV_BF16 = 1, KV_Q8_0 = 2, KV_Q4_0 = 3, KV_Q4_1 = 4, KV_Q5_0 = 5, KV_Q5_1 = 6
};

template <int T>
struct KvBlock;
template <> struct KvBlock<KV_F16> { static constexpr int bytes = 64; };
template <> struct KvBlock<KV_BF16> { static constexpr int bytes = 64; };
template <> struct KvBlock<KV_Q8_0> { static constexpr int bytes = 34; };
template <> struct KvBlock<KV_Q4_0> { static constexpr int bytes = 18; };
template <> struct KvBlock<KV_Q4_1> { static constexpr int bytes = 20; };
template <> struct KvBlock<KV_Q5_0> { static constexpr int bytes = 22; };
template <> struct KvBlock<KV_Q5_1> { static constexpr int bytes = 24; };

// Two integers 0..255 held in bytes 0 and 1 of x -> f16x2 of (1024 + n0, 1024 + n1).
KV_DEV kv_u32 kv_bytes_to_h2_biased(kv_u32 x) { return kv_byte_perm(x, 0x64646464u, 0x5140u); }

// Bytes 2 and 3 of x (0..255 each) -> f16x2 of (1024 + n2, 1024 + n3).
KV_DEV kv_u32 kv_bytes23_to_h2_biased(kv_u32 x) { return kv_byte_perm(x, 0x64646464u, 0x7362u); }

// Bits 0..3 of h4 moved to bit 4 of bytes 0..3: h4 * 0x00204081 places bit k at 8k (the four
// shifted copies do not overlap, so nothing carries), then each lands on bit 4 of its byte.
KV_DEV kv_u32 kv_q5_high_word(kv_u32 h4) { return ((h4 * 0x00204081u) & 0x01010101u) << 4; }

// Byte offsets of qs and qh (-1: none) inside the block, and whether the block has a min m.
template <int T> struct KvNibble;
#define KV_NIBBLE(T, QS, QH, MIN)             \
    template <> struct KvNibble<T> {            \
        static constexpr int qs = QS, qh = QH;  \
        static constexpr bool min = MIN;        \
    };
KV_NIBBLE(KV_Q4_0, 2, -1, false)
KV_NIBBLE(KV_Q4_1, 4, -1, true)
KV_NIBBLE(KV_Q5_0, 6, 2, false)
KV_NIBBLE(KV_Q5_1, 8, 4, true)
#undef KV_NIBBLE

// K rows of q8_0 are read in a different k order than the other types (kv_compute_tile,
// kv_fattn_partial's Q load): lane t takes elements 4t..4t+3 and 16+4t..16+4t+3 of each block
// as 32-bit words instead of 8 consecutive elements as 16-bit halves. With the K row stride
// = 16 mod 128 (FattnGeom), the 32 lanes of each load then hit 32 different banks; the
// consecutive-halves reads with stride 64 mod 128 were 4-way bank conflicts (320 shared-memory
// wavefronts per 16-cell tile and warp for a 256-wide head, now 64; tests/kernel_emu models
// only the values, the bank count is by hand: rows g = 0..7 at 68g words, lanes t at +t).
template <int T>
struct KvKSplit {
    static constexpr bool value = T == KV_Q8_0;
};

// w = f16x2 of elements (4t, 4t+1), (4t+2, 4t+3), (16+4t, 17+4t), (18+4t, 19+4t) of the q8_0
// block at byte `off` of a 4-byte aligned row (off is a constant once the caller's loop is
// unrolled, so the alignment test folds). Byte pairs go to bytes 0 and 2 of a word with zeros
// between (byte_perm with a zero source: no constant register), then one XOR both flips the
// int8 sign bit and sets the f16 exponent of 1024: (q + 128) + 1024, exact, as
// kv_bytes_to_h2_biased gives it.
KV_DEV void kv_load_q8_0_split(const kv_u8* row, int off, int t, kv_u32* w) {
    const kv_u32 d = *(const kv_u16*)(row + off);
    const kv_u32 d2 = d | (d << 16);
    const kv_u32* rw = (const kv_u32*)row;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int b = off + 2 + 16 * h;  // byte of element 16h
        kv_u32 lo, hi;
        if ((b & 3) == 0) {
            const kv_u32 x = rw[(b >> 2) + t];
            lo = kv_byte_perm(x, 0u, 0x4140u);
            hi = kv_byte_perm(x, 0u, 0x4342u);
        } else {  // 2 mod 4: the four bytes straddle two words
            const kv_u32 x0 = rw[(b >> 2) + t];
            const kv_u32 x1 = rw[(b >> 2) + t + 1];
            lo = kv_byte_perm(x0, 0u, 0x4342u);
            hi = kv_byte_perm(x1, 0u, 0x4140u);
        }
        w[2 * h] = kv_hmul2(kv_hsub2(lo ^ 0x64806480u, 0x64806480u), d2);
        w[2 * h + 1] = kv_hmul2(kv_hsub2(hi ^ 0x64806480u, 0x64806480u), d2);
    }
}

// w[k] = f16x2 of elements e0+2k, e0+2k+1 of the 32-element block at `blk` (2-byte aligned;
// 16-byte aligned for f16/bf16 with N == 8, 8-byte aligned with N == 4). N is 4 or 8 and e0 is
// a multiple of N.
template <int T, int N>
KV_DEV void kv_load_h2(const kv_u8* blk, int e0, kv_u32* w) {
    const kv_u16* h = (const kv_u16*)blk;
    if constexpr (T == KV_F16 || T == KV_BF16) {
        kv_u32 r[N / 2];
        if constexpr (N == 8) {
            kv_v4 v = *(const kv_v4*)(blk + 2 * e0);
            r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
        } else {
            kv_v2 v = *(const kv_v2*)(blk + 2 * e0);
            r[0] = v.x; r[1] = v.y;
        }
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
            if constexpr (T == KV_F16) {
                w[k] = r[k];
            } else {
                w[k] = kv_pack_f2(kv_bf2f((kv_u16)(r[k] & 0xffffu)), kv_bf2f((kv_u16)(r[k] >> 16)));
            }
        }
    } else if constexpr (T == KV_Q8_0) {
        const kv_u32 d = h[0];
        const kv_u32 d2 = d | (d << 16);
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
            const kv_u32 x = (kv_u32)h[1 + e0 / 2 + k] ^ 0x8080u;  // int8 -> q + 128
            w[k] = kv_hmul2(kv_hsub2(kv_bytes_to_h2_biased(x), 0x64806480u), d2);
        }
    } else {  // q4_0, q4_1, q5_0, q5_1: four elements per 32-bit word of nibbles
        using NB = KvNibble<T>;
        constexpr bool aligned = KvBlock<T>::bytes % 4 == 0 && NB::qs % 4 == 0;
        kv_u32 d2, m2 = 0u;
        if constexpr (NB::min) {  // d and m are adjacent halves of one aligned word
            const kv_u32 dm = *(const kv_u32*)blk;
            d2 = kv_byte_perm(dm, 0u, 0x1010u);
            m2 = kv_byte_perm(dm, 0u, 0x3232u);
        } else {
            d2 = (kv_u32)h[0] | ((kv_u32)h[0] << 16);
        }
        kv_u32 qh = 0u;
        if constexpr (NB::qh >= 0) {
            qh = aligned ? *(const kv_u32*)(blk + NB::qh)
                         : (kv_u32)h[NB::qh / 2] | ((kv_u32)h[NB::qh / 2 + 1] << 16);
        }
        constexpr kv_u32 bias =
            T == KV_Q4_0 ? 0x64086408u : (T == KV_Q5_0 ? 0x64106410u : 0x64006400u);
        const int shift = e0 >= 16 ? 4 : 0;
#pragma unroll
        for (int k4 = 0; k4 < N / 4; ++k4) {
            const int off = NB::qs + (e0 & 15) + 4 * k4;
            const kv_u32 raw = aligned ? *(const kv_u32*)(blk + off)
                                       : (kv_u32)h[off / 2] | ((kv_u32)h[off / 2 + 1] << 16);
            kv_u32 x = (raw >> shift) & 0x0f0f0f0fu;
            if constexpr (NB::qh >= 0) x |= kv_q5_high_word((qh >> (e0 + 4 * k4)) & 0xfu);
            const kv_u32 lo = kv_hsub2(kv_bytes_to_h2_biased(x), bias);
            const kv_u32 hi = kv_hsub2(kv_bytes23_to_h2_biased(x), bias);
            if constexpr (NB::min) {
                w[2 * k4] = kv_hfma2(lo, d2, m2);
                w[2 * k4 + 1] = kv_hfma2(hi, d2, m2);
            } else {
                w[2 * k4] = kv_hmul2(lo, d2);
                w[2 * k4 + 1] = kv_hmul2(hi, d2);
            }
        }
    }
}
