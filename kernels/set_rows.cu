// SET_ROWS into the pinned host store: quantize float rows on the GPU and write them zero-copy
// into rows stream * kv_size + cell of one layer's K or V tensor.
//
// One warp per 32-element block; lane e holds element e. The arithmetic is that of ggml's
// quantize_row_*_ref (ggml-quants.c) with every rounding spelled out (no FMA contraction), so
// the bytes equal kvdiag.executors.quant.quantize_rows for finite input:
//   q8_0: d = amax / 127, q = roundf(x * (1/d))
//   q4_0: max = first element of largest |x| (sign kept), d = max / -8,
//         q = MIN(15, (int8)(x * (1/d) + 8.5))
//   q4_1: d = (max - min) / 15, q = MIN(15, (int8)((x - min) * (1/d) + 0.5)), m = min
//   q5_0: as q4_0 with -16, 16.5 and MIN(31, .); q5_1: as q4_1 with 31 and no MIN
//   1/d is 0 when d is 0. f16: round to nearest even; bf16: ggml_compute_fp32_to_bf16.
// The block is assembled in shared memory and written as 16-bit words (every block size is
// even, so every block start is 2-byte aligned).
#include "kvdiag_blocks.cuh"
#include "kvdiag_ring.cuh"

#define KV_SET_ROWS_MAGIC 0x6b76646961670002LL

struct SetRowsParams {
    kv_i64 magic;
    kv_i64 src, cells, dst;  // src [n, width] f32; cells [n] int32; dst = layer tensor base
    kv_i64 row_bytes, kv_size, stream, n, width, page_tokens;
    kv_i64 ring_counter, ring_records, ring_capacity;
    kv_i64 layer, kernel_id;
};

// First lane (lowest element index) whose value equals `v`; ggml keeps the first of equal
// values in its strict-comparison scans, which decides the sign of a zero min/max.
KV_DEV int kv_first_lane_equal(float x, float v) {
    const kv_u32 b = kv_ballot(x == v);
    return b ? kv_ffs(b) - 1 : 0;
}

template <int T>
KV_DEV void kv_quantize_block(float x, int lane, kv_u8* blk) {
    kv_u16* h = (kv_u16*)blk;
    if constexpr (T == KV_F16) {
        h[lane] = kv_f2h(x);
    } else if constexpr (T == KV_BF16) {
        h[lane] = kv_f2bf(x);
    } else if constexpr (T == KV_Q8_0) {
        const float amax = kv_warp_max(fabsf(x));
        const float d = kv_fdiv(amax, 127.f);
        const float id = d != 0.f ? kv_frcp(d) : 0.f;
        const int q = (int)kv_roundf(kv_fmul(x, id));
        if (lane == 0) h[0] = kv_f2h(d);
        blk[2 + lane] = (kv_u8)(kv_i8)q;
    } else if constexpr (T == KV_Q4_0 || T == KV_Q5_0) {
        constexpr float div = T == KV_Q4_0 ? -8.f : -16.f;
        constexpr float bias = T == KV_Q4_0 ? 8.5f : 16.5f;
        constexpr int top = T == KV_Q4_0 ? 15 : 31;
        const float ax = fabsf(x);
        const float amax = kv_warp_max(ax);
        const int who = kv_first_lane_equal(ax, amax);
        const float vmax = amax > 0.f ? kv_u2f(kv_shfl(kv_f2u(x), who)) : 0.f;
        const float d = kv_fdiv(vmax, div);
        const float id = d != 0.f ? kv_frcp(d) : 0.f;
        const int qi = (int)(kv_i8)kv_f2i_trunc(kv_fadd(kv_fmul(x, id), bias));
        const kv_u32 q = (kv_u32)(kv_u8)(qi < top ? qi : top);
        const kv_u32 hi = kv_shfl(q, (lane + 16) & 31);
        if (lane == 0) h[0] = kv_f2h(d);
        constexpr int qs = T == KV_Q4_0 ? 2 : 6;
        if constexpr (T == KV_Q5_0) {
            const kv_u32 qh = kv_ballot((q >> 4) & 1u);
            if (lane == 0) {
                h[1] = (kv_u16)(qh & 0xffffu);
                h[2] = (kv_u16)(qh >> 16);
            }
            if (lane < 16) blk[qs + lane] = (kv_u8)((q & 0x0fu) | ((hi & 0x0fu) << 4));
        } else {
            // C stores xi0 | xi1 << 4 in a uint8 (xi0 <= 15 for finite input).
            if (lane < 16) blk[qs + lane] = (kv_u8)(q | (hi << 4));
        }
    } else {  // q4_1, q5_1
        constexpr float div = T == KV_Q4_1 ? 15.f : 31.f;
        const float mn0 = kv_warp_min(x);
        const float mx0 = kv_warp_max(x);
        const float vmin = kv_u2f(kv_shfl(kv_f2u(x), kv_first_lane_equal(x, mn0)));
        const float vmax = kv_u2f(kv_shfl(kv_f2u(x), kv_first_lane_equal(x, mx0)));
        const float d = kv_fdiv(kv_fsub(vmax, vmin), div);
        const float id = d != 0.f ? kv_frcp(d) : 0.f;
        const int qt = kv_f2i_trunc(kv_fadd(kv_fmul(kv_fsub(x, vmin), id), 0.5f));
        kv_u32 q;
        if constexpr (T == KV_Q4_1) {
            const int qi = (int)(kv_i8)qt;
            q = (kv_u32)(kv_u8)(qi < 15 ? qi : 15);
        } else {
            q = (kv_u32)(kv_u8)qt;  // no MIN(31, .) in quantize_row_q5_1_ref
        }
        const kv_u32 hi = kv_shfl(q, (lane + 16) & 31);
        if (lane == 0) {
            h[0] = kv_f2h(d);
            h[1] = kv_f2h(vmin);
        }
        if constexpr (T == KV_Q5_1) {
            const kv_u32 qh = kv_ballot((q >> 4) & 1u);
            if (lane == 0) {
                h[2] = (kv_u16)(qh & 0xffffu);
                h[3] = (kv_u16)(qh >> 16);
            }
            if (lane < 16) blk[8 + lane] = (kv_u8)((q & 0x0fu) | ((hi & 0x0fu) << 4));
        } else {
            if (lane < 16) blk[4 + lane] = (kv_u8)(q | (hi << 4));
        }
    }
}

// Grid-stride over (row, block) pairs, one warp each; dynamic shared memory: 64 bytes a warp.
template <int T>
__global__ void __launch_bounds__(256) kv_set_rows(const SetRowsParams* __restrict__ pp) {
    const SetRowsParams& p = *pp;
    if (p.magic != KV_SET_ROWS_MAGIC) __trap();
    constexpr int BB = KvBlock<T>::bytes;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    kv_u8* blk = kv_smem() + warp * 64;
    const int nblk = (int)(p.width / 32);
    const kv_i64 total = p.n * nblk;
    const kv_i32* cells = (const kv_i32*)p.cells;
    for (kv_i64 wi = (kv_i64)blockIdx.x * (blockDim.x >> 5) + warp; wi < total;
         wi += (kv_i64)gridDim.x * (blockDim.x >> 5)) {
        const kv_i64 row = wi / nblk;
        const int b = (int)(wi - row * nblk);
        const float x = ((const float*)p.src)[row * p.width + b * 32 + lane];
        const kv_i64 cell = cells[row];
        const kv_i64 grow = p.stream * p.kv_size + cell;
        kv_syncwarp();  // the previous block's words were read before this one overwrites blk
        kv_quantize_block<T>(x, lane, blk);
        kv_syncwarp();
        kv_u16* dst = (kv_u16*)((kv_u8*)p.dst + grow * p.row_bytes + b * BB);
        if (lane < BB / 2) dst[lane] = ((const kv_u16*)blk)[lane];
#if KVDIAG_INSTRUMENT
        // One record per run of rows in the same page: page = the global-row page (the
        // upstream (layer, page) key), aux = the stream-local page.
        if (b == 0 && lane == 0) {
            const int pt = (int)p.page_tokens;
            const bool first = row == 0 || cells[row - 1] / pt != cell / pt;
            if (first) {
                const KvRing ring{(kv_u32*)p.ring_counter, (kv_i32*)p.ring_records,
                                  (kv_u32)p.ring_capacity};
                kv_ring_put(ring, (int)p.kernel_id, blockIdx.x, (int)p.layer, (int)p.stream,
                            (int)(grow / pt), KV_SRC_HOST, -1, (int)(cell / pt));
            }
        }
#endif
    }
}

#if !defined(__CUDACC_RTC__) && !defined(KVDIAG_EMULATE)
template __global__ void kv_set_rows<KV_F16>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_BF16>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_Q8_0>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_Q4_0>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_Q4_1>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_Q5_0>(const SetRowsParams*);
template __global__ void kv_set_rows<KV_Q5_1>(const SetRowsParams*);
#endif
