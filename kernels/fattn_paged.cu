// Streamed flash attention over paged K/V (decode and prefill), and the ordinary zero-copy
// fallback, which reads every page from the pinned host store.
//
// Function (kvdiag.executors.numpy_exec defines the numbers): for stream i, query token t and
// head h, out = sum_c softmax_c(scale * q . K[c, h/G]) V[c, h/G] over cells c <= pos[i, t]
// (c < n_kv), G = n_head / n_head_kv. Pages of 256 cells come from the pool slot the page
// table names, or from the host store when the entry is -1.
//
// Work split (flash-decoding): a block owns one (stream, KV head, row tile, split). A row tile
// is 8 query rows r = token * G + j, so one tile of K/V serves every query head of the GQA
// group. The split's cells are cut in 16-cell tiles that the block's warps take from a
// shared counter (one block an SM, so warps and blocks finish together); each warp keeps its
// own online-softmax state, streams its next tile in with cp.async while it computes the
// current one, and the warps merge in shared memory at the end. A second kernel merges the
// splits. Both products run on tensor cores transposed (S^T = K Q^T, O^T = V^T P^T,
// mma.m16n8k16): the 16 cells / 16 head dims fill M and the 8 query rows fill N, so Q and O
// stay in registers (D/16 x 2 and D/16 x 4 of them) and K/V are dequantized straight from the
// raw page bytes into A fragments. Inside a 32-wide block of head dims the k order of the QK
// product and the row order of O are permuted so that each lane reads 8 (K) or 4 (V)
// consecutive elements of one ggml block; Q is loaded and O stored with the same permutation.
// The ordinary fallback (kv_fattn_rows) computes the same tiles, but a block's warps are KV
// heads that share every tile, so that the block reads whole rows of the host store.
// Both kernels take FattnParams by value (__grid_constant__); see kv_fattn_combine for the
// programmatic dependent launch of the merge.
#include "kvdiag_blocks.cuh"
#include "kvdiag_ring.cuh"

#define KV_PARAMS_MAGIC 0x6b76646961670001LL

// When a partial kernel lets the merge kernel (a programmatic dependent launch) be scheduled:
// 0 = at its exit, 1 = at its start, 2 = once its tiles are done (the default; H200 timings in
// benchmarks/results/kernel_optimisation_notes.txt).
#ifndef KVDIAG_PDL_TRIGGER
#define KVDIAG_PDL_TRIGGER 2
#endif

// Benchmark-only experiment switch (benchmarks/probe_timeline.py --defines): KVDIAG_SOL bit 1
// replaces the V dequantization by a mask of the raw words, bit 2 that of K (wrong outputs, the
// same shared-memory reads): the tile loop's speed of light without that arithmetic. Bit 4
// reads each pool tile as 16 consecutive head rows (a page's slices of head hk as if stored one
// after another: the same bytes a call, other rows) instead of a slice of 16 whole rows.
#ifndef KVDIAG_SOL
#define KVDIAG_SOL 0
#endif

// KVDIAG_KQ_MASK=1 builds the kernels that test an explicit KQ mask per cell (kv_mask_row); the
// executor compiles that build only for a unified cache holding several sequences, so the
// default tile loop carries no test.
#ifndef KVDIAG_KQ_MASK
#define KVDIAG_KQ_MASK 0
#endif

// Every field 8 bytes so that the host packs it as an int64 array (kvdiag/executors/
// cuda_kernels.py FATTN_FIELDS lists the same names in the same order).
struct FattnParams {
    kv_i64 magic;
    kv_i64 q, positions, page_table, streams, host_k, host_v, pool;
    kv_i64 part_o, part_ml, out;
    kv_i64 ring_counter, ring_records, ring_capacity;
    kv_i64 row_k, row_v, kv_size, page_bytes, v_offset, page_tokens, n_pages_tab;
    kv_i64 ns, T, n_head, n_head_kv, G, rows, n_kv, n_rowtiles;
    kv_i64 tiles_per_block, n_splits;
    kv_i64 layer, ring_slots, kernel_id, warp_smem;
    kv_i64 grid_order, interleave;  // see kv_fattn_partial
    kv_i64 kv_mask, mask_words;     // see kv_mask_row
    double scale_log2;
};

// KVDIAG_TIMELINE=1 (benchmarks/probe_timeline.py only; needs KVDIAG_INSTRUMENT=0, the ring's
// buffer holds the stamps): thread 0 of every block writes %globaltimer stamps (u64) to
// ring_records at slot (layer * blocks_per_call + block) * 8, where a call's blocks are the
// streamed kernel's grid followed by the merge kernel's. Streamed kernel: entry, first tile
// in shared memory (warp 0), tiles done (all warps), exit; merge kernel: entry, after the wait
// for the partial results, exit; then [4] = the SM (%smid); streamed kernel: [5] O rows in
// shared memory, [6] merge weights computed.
#ifndef KVDIAG_TIMELINE
#define KVDIAG_TIMELINE 0
#endif
#if KVDIAG_TIMELINE
template <int D>
KV_DEV kv_u64* kv_timeline_slot(const FattnParams& p, bool combine) {
    const kv_u64 partial = (kv_u64)p.n_splits * p.n_rowtiles * p.ns * p.n_head_kv;
    const kv_u64 per_call = partial + (kv_u64)p.rows * p.ns * p.n_head_kv * (D / 32);
    const kv_u64 block =
        blockIdx.x + (kv_u64)gridDim.x * (blockIdx.y + (kv_u64)gridDim.y * blockIdx.z);
    kv_u64* slot = (kv_u64*)p.ring_records +
                   ((kv_u64)p.layer * per_call + (combine ? partial : 0) + block) * 8;
    if (threadIdx.x == 0) slot[4] = kv_smid();
    return slot;
}
#define KV_STAMP(slot, k) \
    if (threadIdx.x == 0) (slot)[k] = kv_globaltimer()
#else
#define KV_STAMP(slot, k) (void)0
#endif

__host__ __device__ constexpr int kv_smem_stride(int bytes, int residue) {
    int s = (bytes + 15) / 16 * 16;
    while (s % 128 != residue) s += 16;
    return s;
}

template <int TK, int TV, int D, bool PAGED = true>
struct FattnGeom {
    static constexpr int HK = D / 32 * KvBlock<TK>::bytes;  // bytes of one head row of K
    static constexpr int HV = D / 32 * KvBlock<TV>::bytes;
    // Row strides in shared memory chosen against bank conflicts of the fragment reads: the
    // 16-byte K reads of 8 lanes span two rows (stride = 64 mod 128); q8_0 K is read as words
    // by 32 lanes over 8 rows (stride = 16 mod 128, kv_load_q8_0_split); the V reads of 16
    // lanes span four rows two apart (stride = 16 mod 128).
    static constexpr int SK = kv_smem_stride(HK, KvKSplit<TK>::value ? 16 : 64);
    static constexpr int SV = kv_smem_stride(HV, 16);
    static constexpr int STAGE = 16 * (SK + SV);
    // The streamed kernel double-buffers its tiles (cp.async from the pool overlaps compute);
    // the ordinary kernel (kv_fattn_rows) reads only the host store, where PCIe time dwarfs
    // compute: one buffer per warp, filled by the whole block.
    static constexpr int STAGES = PAGED ? 2 : 1;
    static constexpr int WARP = STAGES * STAGE;
};

// Rows of a host-store tile through registers: 16-byte loads, BATCH of them in flight per
// lane, then shared-memory stores. Zero-copy reads of head slices that start off a 32-byte
// boundary (q8_0: 272 of every 1088 bytes) ran at half speed through cp.async on an H200
// (benchmarks/results/probe_layouts.txt) and at full speed through plain loads.
template <int UPR, int SDST>
KV_DEV void kv_copy_rows_via_registers(kv_u8* dst, const kv_u8* src, kv_i64 pitch, int nvalid,
                                       int lane) {
    constexpr int UNITS = 16 * UPR;
    constexpr int BATCH = 4;
#pragma unroll
    for (int u0 = 0; u0 < UNITS; u0 += 32 * BATCH) {
        kv_v4 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int u = u0 + lane + 32 * b;
            const int r = u / UPR;
            v[b] = kv_v4{0u, 0u, 0u, 0u};
            if (u < UNITS && r < nvalid) {
                v[b] = *(const kv_v4*)(src + (kv_i64)r * pitch + (u - r * UPR) * 16);
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int u = u0 + lane + 32 * b;
            const int r = u / UPR;
            if (u < UNITS) *(kv_v4*)(dst + r * SDST + (u - r * UPR) * 16) = v[b];
        }
    }
}

// Rows of a pool tile straight into shared memory (cp.async): 16 rows of UPR units of VEC
// bytes, unit u = lane + 32k of the tile in row r = u / UPR. Since u * VEC = r * UPR * VEC +
// column, the source offset is lane * VEC + 32k * VEC (an immediate) + r * (pitch - row bytes),
// and likewise in shared memory, so each copy costs one multiply-add per side once the loop is
// unrolled; rows past nvalid are zero-filled by the copy itself (src-size 0) instead of a
// branch. The rolled loop with a branch took ~35 instructions per 16-byte copy, this ~7
// (SASS of kv_fattn_partial<q8_0, q5_1, 256>, nvcc 13.0).
template <int UPR, int SDST, int VEC, bool IN_PAGE>
KV_DEV void kv_copy_rows_async(kv_u8* dst, const kv_u8* src, kv_i64 pitch, int nvalid,
                               int lane) {
    constexpr int UNITS = 16 * UPR;
    constexpr int DGAP = SDST - UPR * VEC;
    const kv_u32 sgap = (kv_u32)pitch - UPR * VEC;  // a row of the store is far below 4 GiB
    const kv_u8* s0 = src + lane * VEC;
    const kv_shaddr d0 = kv_shaddr_of(dst);
#pragma unroll
    for (int u0 = 0; u0 < UNITS; u0 += 32) {
        const int u = u0 + lane;
        if (UNITS % 32 == 0 || u < UNITS) {
            const int r = u / UPR;
            const bool valid = r < nvalid;
            // An invalid row reads nothing. In a pool page every row of the tile exists (pages
            // hold whole tiles), so its address can stay; from the host store it is clamped.
            const kv_u8* natural = s0 + (kv_u64)((kv_u32)r * sgap) + u0 * VEC;
            const kv_u8* from = IN_PAGE || valid ? natural : src;
            kv_copy_async_zfill<VEC>(d0, r * DGAP + u * VEC, from, valid);
        }
    }
}

// Page of 16-cell tile `tile`. Pages are 256 cells in practice: a shift then, not the
// ~25-instruction integer division (the test is uniform across the warp).
KV_DEV int kv_tile_page(const FattnParams& p, int tile) {
    const int pt = (int)p.page_tokens;
    const int tpp = pt >> 4;
    return (tpp & (tpp - 1)) == 0 ? tile >> (kv_ffs((kv_u32)tpp) - 1) : tile * 16 / pt;
}

// Pool slot of the page holding tile `tile` of stream row i, -1 for the host store. Callers
// ask one tile ahead of the copy that uses it, so the page-table read overlaps a tile's
// compute instead of stalling the copy; a tile past the table reads nothing.
KV_DEV int kv_tile_slot(const FattnParams& p, int i, int tile) {
    const int page = kv_tile_page(p, tile);
    if (page < p.n_pages_tab) {
        return ((const kv_i32*)p.page_table)[(kv_i64)i * p.n_pages_tab + page];
    }
    return -1;
}

// Start copying the raw K and V rows of 16-cell tile `tile` (in pool slot `slot`, or the host
// store when -1) into `buf`; cells at or past lim_max are zero-filled (their V must be finite:
// 0 * NaN would poison the product).
template <int TK, int TV, int D, int VEC>
KV_DEV void kv_load_tile(const FattnParams& p, int i, int stream, int hk, int tile, int slot,
                         int lim_max, kv_u8* buf, int lane) {
    using G = FattnGeom<TK, TV, D>;
    static_assert(G::HK % VEC == 0 && G::HV % VEC == 0, "copy unit must divide a head row");
    const int c0 = tile * 16;
    const int pt = (int)p.page_tokens;
    const int page = kv_tile_page(p, tile);
    const kv_u8* kb;
    const kv_u8* vb;
    kv_i64 pk = p.row_k, pv = p.row_v;
    if (slot >= 0 && (KVDIAG_SOL & 4) != 0) {  // contiguous head slices (other rows)
        const kv_u8* base = (const kv_u8*)p.pool + (kv_i64)slot * p.page_bytes;
        kb = base + ((kv_i64)hk * pt + (c0 - page * pt)) * G::HK;
        vb = base + p.v_offset + ((kv_i64)hk * pt + (c0 - page * pt)) * G::HV;
        pk = G::HK;
        pv = G::HV;
    } else if (slot >= 0) {
        const kv_u8* base = (const kv_u8*)p.pool + (kv_i64)slot * p.page_bytes;
        kb = base + (kv_i64)(c0 - page * pt) * p.row_k + hk * G::HK;
        vb = base + p.v_offset + (kv_i64)(c0 - page * pt) * p.row_v + hk * G::HV;
    } else {
        const kv_i64 row = (kv_i64)stream * p.kv_size + c0;
        kb = (const kv_u8*)p.host_k + row * p.row_k + hk * G::HK;
        vb = (const kv_u8*)p.host_v + row * p.row_v + hk * G::HV;
    }
    const int nvalid = lim_max - c0 < 16 ? lim_max - c0 : 16;
    if constexpr (VEC == 16) {
        if (slot < 0) {
            kv_copy_rows_via_registers<G::HK / 16, G::SK>(buf, kb, p.row_k, nvalid, lane);
            kv_copy_rows_via_registers<G::HV / 16, G::SV>(buf + 16 * G::SK, vb, p.row_v, nvalid,
                                                          lane);
            return;
        }
    }
    // VEC 16 reaches here only from a pool page (host tiles went through registers above)
    constexpr bool IN_PAGE = VEC == 16;
    kv_copy_rows_async<G::HK / VEC, G::SK, VEC, IN_PAGE>(buf, kb, pk, nvalid, lane);
    kv_copy_rows_async<G::HV / VEC, G::SV, VEC, IN_PAGE>(buf + 16 * G::SK, vb, pv, nvalid, lane);
}

// O^T tile += V^T P^T. xa..xd hold one f16 pair (two consecutive head dims: rows g and g + 8
// of the tile) of the lane's cells 2t, 2t+1, 2t+8 and 2t+9; the A fragment wants the cell
// pairs side by side, so the halves are regrouped by cell.
KV_DEV void kv_mma_v(float (&acc)[4], kv_u32 xa, kv_u32 xb, kv_u32 xc, kv_u32 xd,
                     const kv_u32 (&pb)[2]) {
    const kv_u32 a[4] = {kv_byte_perm(xa, xb, 0x5410u), kv_byte_perm(xa, xb, 0x7632u),
                         kv_byte_perm(xc, xd, 0x5410u), kv_byte_perm(xc, xd, 0x7632u)};
    kv_mma_16816(acc, a, pb);
}

// KVDIAG_SOL: four words of a block's bytes (lane part k) masked to small f16 values.
KV_DEV void kv_sol_words(const kv_u8* blk, int k, kv_u32* w) {
    const kv_u32* rw = (const kv_u32*)(blk - ((kv_u64)blk & 3u));
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = rw[2 * j + k] & 0x03ff03ffu;
}

// One 16-cell tile: S^T = K Q^T, online softmax of the lane's two rows (2t, 2t+1), O^T += V^T P^T.
// A row sees cell c0 + k when it is below the row's limit and bit k of its vis word is set.
template <int TK, int TV, int D>
KV_DEV void kv_compute_tile(const kv_u8* buf, int c0, int lim0, int lim1, kv_u32 vis0,
                            kv_u32 vis1, float sl,
                            const kv_u32 (&qf)[D / 16][2], float (&o)[D / 16][4], float& m0,
                            float& m1, float& l0, float& l1, int g, int t) {
    using G = FattnGeom<TK, TV, D>;
    constexpr int BK = KvBlock<TK>::bytes;
    constexpr int BV = KvBlock<TV>::bytes;
    float sa[4] = {0.f, 0.f, 0.f, 0.f};
    float sb[4] = {0.f, 0.f, 0.f, 0.f};  // second accumulator: halves the mma dependency chain
    const kv_u8* k0 = buf + g * G::SK;
    const kv_u8* k1 = buf + (g + 8) * G::SK;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        kv_u32 w0[4], w1[4];
        if constexpr ((KVDIAG_SOL & 2) != 0) {
            kv_sol_words(k0 + c * BK, t, w0);
            kv_sol_words(k1 + c * BK, t, w1);
        } else if constexpr (KvKSplit<TK>::value) {
            kv_load_q8_0_split(k0, c * BK, t, w0);  // cell g, elements 4t.. and 16+4t..
            kv_load_q8_0_split(k1, c * BK, t, w1);  // cell g+8
        } else {
            kv_load_h2<TK, 8>(k0 + c * BK, 8 * t, w0);  // cell g, elements 8t..8t+7 of block c
            kv_load_h2<TK, 8>(k1 + c * BK, 8 * t, w1);  // cell g+8
        }
        const kv_u32 a0[4] = {w0[0], w1[0], w0[1], w1[1]};
        const kv_u32 a1[4] = {w0[2], w1[2], w0[3], w1[3]};
        kv_mma_16816(sa, a0, qf[2 * c]);
        kv_mma_16816(sb, a1, qf[2 * c + 1]);
    }
    // Accumulator element k: cell g (k < 2) or g+8, query row 2t + (k & 1).
    const int ca = c0 + g;
    const int cb = ca + 8;
    const float v0 = ca < lim0 && (vis0 >> g & 1u) ? (sa[0] + sb[0]) * sl : KV_NEG_INF;
    const float v1 = ca < lim1 && (vis1 >> g & 1u) ? (sa[1] + sb[1]) * sl : KV_NEG_INF;
    const float v2 = cb < lim0 && (vis0 >> (g + 8) & 1u) ? (sa[2] + sb[2]) * sl : KV_NEG_INF;
    const float v3 = cb < lim1 && (vis1 >> (g + 8) & 1u) ? (sa[3] + sb[3]) * sl : KV_NEG_INF;
    float mx0 = fmaxf(v0, v2);
    float mx1 = fmaxf(v1, v3);
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {
        mx0 = fmaxf(mx0, kv_u2f(kv_shfl_xor(kv_f2u(mx0), m)));
        mx1 = fmaxf(mx1, kv_u2f(kv_shfl_xor(kv_f2u(mx1), m)));
    }
    const float mn0 = fmaxf(m0, mx0);
    const float mn1 = fmaxf(m1, mx1);
    const bool e0 = mn0 == KV_NEG_INF;
    const bool e1 = mn1 == KV_NEG_INF;
    const float al0 = e0 ? 1.f : kv_exp2(m0 - mn0);
    const float al1 = e1 ? 1.f : kv_exp2(m1 - mn1);
    const kv_u32 h01 = kv_pack_f2(e0 ? 0.f : kv_exp2(v0 - mn0), e1 ? 0.f : kv_exp2(v1 - mn1));
    const kv_u32 h23 = kv_pack_f2(e0 ? 0.f : kv_exp2(v2 - mn0), e1 ? 0.f : kv_exp2(v3 - mn1));
    // The denominator sums the same f16-rounded weights that multiply V.
    l0 = l0 * al0 + (kv_lo_f(h01) + kv_lo_f(h23));
    l1 = l1 * al1 + (kv_hi_f(h01) + kv_hi_f(h23));
    m0 = mn0;
    m1 = mn1;
    // Once the running maxima settle, most tiles leave every row's max unchanged: skip the
    // D/4 multiplies then (the vote keeps the branch uniform across the warp).
    if (kv_ballot(al0 != 1.f || al1 != 1.f)) {
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
            o[mt][0] *= al0;
            o[mt][1] *= al1;
            o[mt][2] *= al0;
            o[mt][3] *= al1;
        }
    }
    // h01 holds P^T[cell g][rows 2t, 2t+1]; its transpose is the B fragment P^T[cells 2t..][row g].
    const kv_u32 pb[2] = {kv_movmatrix_trans(h01), kv_movmatrix_trans(h23)};
    const kv_u8* vr = buf + 16 * G::SK;
    const kv_u8* va = vr + (2 * t) * G::SV;
    const kv_u8* vb = va + G::SV;
    const kv_u8* vc = vr + (2 * t + 8) * G::SV;
    const kv_u8* vd = vc + G::SV;
    if constexpr (D % 64 == 0) {
        // Rows g and g+8 of O^T tile 4q+j are head dims 64q + 8g + 2j and the dim after it:
        // the lane reads elements 8(g%4)..+7 of block 2q + g/4 for each of its four cells.
#pragma unroll
        for (int q = 0; q < D / 64; ++q) {
            const int off = (2 * q + (g >> 2)) * BV;
            kv_u32 xa[4], xb[4], xc[4], xd[4];  // cells 2t, 2t+1, 2t+8, 2t+9
            if constexpr ((KVDIAG_SOL & 1) != 0) {
                kv_sol_words(va + off, g & 3, xa);
                kv_sol_words(vb + off, g & 3, xb);
                kv_sol_words(vc + off, g & 3, xc);
                kv_sol_words(vd + off, g & 3, xd);
            } else {
                kv_load_h2<TV, 8>(va + off, 8 * (g & 3), xa);
                kv_load_h2<TV, 8>(vb + off, 8 * (g & 3), xb);
                kv_load_h2<TV, 8>(vc + off, 8 * (g & 3), xc);
                kv_load_h2<TV, 8>(vd + off, 8 * (g & 3), xd);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) kv_mma_v(o[4 * q + j], xa[j], xb[j], xc[j], xd[j], pb);
        }
    } else {
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
            kv_u32 xa[2], xb[2], xc[2], xd[2];  // cells 2t, 2t+1, 2t+8, 2t+9: elements 4g..4g+3
            kv_load_h2<TV, 4>(va + c * BV, 4 * g, xa);
            kv_load_h2<TV, 4>(vb + c * BV, 4 * g, xb);
            kv_load_h2<TV, 4>(vc + c * BV, 4 * g, xc);
            kv_load_h2<TV, 4>(vd + c * BV, 4 * g, xd);
            // Row g of O^T tile 2c+j is head dim 32c + 4g + 2j, row g+8 the dim after it.
#pragma unroll
            for (int j = 0; j < 2; ++j) kv_mma_v(o[2 * c + j], xa[j], xb[j], xc[j], xd[j], pb);
        }
    }
}

// A parameter block packed for another layout, or a mask for a build that ignores it, stops
// the kernel (cuda_kernels.FATTN_FIELDS and FattnLayout mirror this file).
template <int WARP>
KV_DEV void kv_check_params(const FattnParams& p) {
    if (p.magic != KV_PARAMS_MAGIC || p.warp_smem != WARP || (!KVDIAG_KQ_MASK && p.kv_mask != 0)) {
        __trap();
    }
}

// Cells visible to query row r: pos + 1 of its token, at most n_kv; none past the last row.
KV_DEV int kv_row_limit(const FattnParams& p, const kv_i32* pos, int r) {
    if (r >= p.rows) return 0;
    const int v = pos[r / (int)p.G] + 1;
    return v < p.n_kv ? v : (int)p.n_kv;
}

// An explicit KQ mask (kv_mask != 0: a unified cache holding several sequences in one stream,
// where `cell <= position` is not the rule): bit c of word c / 32 of the row [stream i][token]
// of mask_words words says whether cell c is visible (the positions are then n_kv - 1, so the
// limits only stop at n_kv). The query row's mask row, or nullptr for every cell.
KV_DEV const kv_u32* kv_mask_row(const FattnParams& p, int i, int r) {
    if (!KVDIAG_KQ_MASK || p.kv_mask == 0 || r >= p.rows) return nullptr;
    return (const kv_u32*)p.kv_mask + ((kv_i64)i * p.T + r / (int)p.G) * p.mask_words;
}

// Visibility bits of the 16 cells from c0 (a multiple of 16) in a mask row.
KV_DEV kv_u32 kv_tile_vis(const kv_u32* mrow, int c0) {
    if (!KVDIAG_KQ_MASK || mrow == nullptr) return 0xffffu;
    return (mrow[c0 >> 5] >> (c0 & 16)) & 0xffffu;
}

// Q^T B fragments of row tile rt for KV head hk, k order permuted like the K fragments: lane
// (g, t) holds query row g, head dims 32c + 8t .. 32c + 8t + 7 for every block c (q8_0 K:
// 32c + 4t .. + 3 and 32c + 16 + 4t .. + 3, kv_load_q8_0_split). Rows past the last are zero.
template <int TK, int D>
KV_DEV void kv_load_q(const FattnParams& p, int i, int hk, int rt, int g, int t,
                      kv_u32 (&qf)[D / 16][2]) {
    constexpr bool KSPLIT = KvKSplit<TK>::value;
    const int qx = KSPLIT ? 4 * t : 8 * t;
    const int qy = KSPLIT ? 16 + 4 * t : 8 * t + 4;
    const int r = rt * 8 + g;
    const float* q = nullptr;
    if (r < p.rows) {
        const int gq = (int)p.G;
        const int tok = r / gq;
        const int head = hk * gq + (r - tok * gq);
        q = (const float*)p.q + (((kv_i64)i * p.T + tok) * p.n_head + head) * D;
    }
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        if (q != nullptr) {
            const kv_v4 x = *(const kv_v4*)(q + 32 * c + qx);
            const kv_v4 y = *(const kv_v4*)(q + 32 * c + qy);
            qf[2 * c][0] = kv_pack_f2(kv_u2f(x.x), kv_u2f(x.y));
            qf[2 * c][1] = kv_pack_f2(kv_u2f(x.z), kv_u2f(x.w));
            qf[2 * c + 1][0] = kv_pack_f2(kv_u2f(y.x), kv_u2f(y.y));
            qf[2 * c + 1][1] = kv_pack_f2(kv_u2f(y.z), kv_u2f(y.w));
        } else {
            qf[2 * c][0] = qf[2 * c][1] = qf[2 * c + 1][0] = qf[2 * c + 1][1] = 0u;
        }
    }
}

// Offset (floats) of the 16-byte unit holding floats c..c+3 (c a multiple of 4) of row r in the
// swizzled merge rows: the unit's low 3 bits are XORed with (t & 1) | (t & 2) << 1, t = (r >> 1)
// & 3. kv_store_o's quarter warps (lanes g in {2p, 2p + 1}, t in 0..3, rows 2t or 2t + 1,
// units 16q + 2g + {0, 1}) then cover the 8 bank groups exactly once; plain rows of D floats
// put the 4 lanes t on the same banks.
KV_DEV int kv_swizzle(int r, int c) {
    const int t = (r >> 1) & 3;
    return (((c >> 2) ^ ((t & 1) | ((t & 2) << 1))) << 2);
}

// A warp's unnormalized O^T as 8 query rows of D floats in head-dim order (row r at dst + r*D;
// SWZ: units placed by kv_swizzle); lane (g, t) holds rows 2t and 2t + 1.
template <int D, bool SWZ = false>
KV_DEV void kv_store_o(float* dst, const float (&o)[D / 16][4], int g, int t) {
    auto at = [&](int r, int c) -> float* { return dst + r * D + (SWZ ? kv_swizzle(r, c) : c); };
    if constexpr (D % 64 == 0) {
#pragma unroll
        for (int q = 0; q < D / 64; ++q) {
            const int c = 64 * q + 8 * g;
            const float(&a)[4] = o[4 * q];
            const float(&b)[4] = o[4 * q + 1];
            const float(&e)[4] = o[4 * q + 2];
            const float(&f)[4] = o[4 * q + 3];
            *(kv_v4*)at(2 * t, c) = kv_v4{kv_f2u(a[0]), kv_f2u(a[2]), kv_f2u(b[0]), kv_f2u(b[2])};
            *(kv_v4*)at(2 * t, c + 4) =
                kv_v4{kv_f2u(e[0]), kv_f2u(e[2]), kv_f2u(f[0]), kv_f2u(f[2])};
            *(kv_v4*)at(2 * t + 1, c) =
                kv_v4{kv_f2u(a[1]), kv_f2u(a[3]), kv_f2u(b[1]), kv_f2u(b[3])};
            *(kv_v4*)at(2 * t + 1, c + 4) =
                kv_v4{kv_f2u(e[1]), kv_f2u(e[3]), kv_f2u(f[1]), kv_f2u(f[3])};
        }
    } else {
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
            *(kv_v4*)at(2 * t, 32 * c + 4 * g) =
                kv_v4{kv_f2u(o[2 * c][0]), kv_f2u(o[2 * c][2]), kv_f2u(o[2 * c + 1][0]),
                      kv_f2u(o[2 * c + 1][2])};
            *(kv_v4*)at(2 * t + 1, 32 * c + 4 * g) =
                kv_v4{kv_f2u(o[2 * c][1]), kv_f2u(o[2 * c][3]), kv_f2u(o[2 * c + 1][1]),
                      kv_f2u(o[2 * c + 1][3])};
        }
    }
}

// A warp's online-softmax state before its first tile: O = 0, running maxima -inf, sums 0.
template <int D>
KV_DEV void kv_start_rows(float (&o)[D / 16][4], float& m0, float& m1, float& l0, float& l1) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    m0 = m1 = KV_NEG_INF;
    l0 = l1 = 0.f;
}

// The row sums of a warp's lanes (each lane summed its own cells) over the 8 lanes of a row.
KV_DEV void kv_sum_rows(float& l0, float& l1) {
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {
        l0 += kv_u2f(kv_shfl_xor(kv_f2u(l0), m));
        l1 += kv_u2f(kv_shfl_xor(kv_f2u(l1), m));
    }
}

// The streamed kernel: every tile from the pool slot the page table names (the host store
// for -1). Parameters by value (__grid_constant__): every field is a constant-bank operand,
// with no dependent global load before the first useful one.
template <int TK, int TV, int D, int VEC>
__global__ void __launch_bounds__(384, 1) kv_fattn_partial(const __grid_constant__ FattnParams p) {
    using G = FattnGeom<TK, TV, D>;
    kv_check_params<G::WARP>(p);
#if KVDIAG_TIMELINE
    kv_u64* const stamp = kv_timeline_slot<D>(p, false);
    bool first_tile = true;
#endif
    KV_STAMP(stamp, 0);
    if (KVDIAG_PDL_TRIGGER == 1) kv_grid_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    // grid_order 0: blockIdx = (split, row tile, stream x KV head); 1: the KV heads of one split
    // are consecutive blocks (x = stream x KV head, z = split), so they run side by side and
    // read the same token rows at about the same time.
    const int split = p.grid_order ? blockIdx.z : blockIdx.x;
    const int rt = blockIdx.y;
    const int ih = p.grid_order ? blockIdx.x : blockIdx.z;
    const int nhk = (int)p.n_head_kv;
    const int i = ih / nhk;
    const int hk = ih - i * nhk;
    const int stream = ((const kv_i32*)p.streams)[i];
    const kv_i32* pos = (const kv_i32*)p.positions + (kv_i64)i * p.T;
    // The first tile's page-table entry depends only on the launch shape: read it alongside the
    // positions rather than after them.
    const int nsp = (int)p.n_splits;
    const bool inter = p.interleave != 0;
    const int tb = inter ? split : split * (int)p.tiles_per_block;
    const int step = inter ? nsp : 1;  // tile j of the block is tb + j * step
    const int slot0 = kv_tile_slot(p, i, tb + warp * step);
    // Tiles after each warp's first come from a counter in shared memory (interleave 0), so
    // that the warps finish together however the SM's schedulers favour them; the block is
    // the only one on its SM (FattnLayout / warps_per_block), so nothing else competes either.
    // Interleaved, warp w takes tiles tb + (w + j * warps) * step.
    kv_u32* const steal = (kv_u32*)(kv_smem() + nwarps * G::WARP);
    if (threadIdx.x == 0) *steal = (kv_u32)(tb + nwarps);
    kv_syncthreads();
    int seq = tb + (warp + nwarps) * step;
    auto claim = [&]() -> int {
        if (inter) {
            const int v = seq;
            seq += nwarps * step;
            return v;
        }
        kv_u32 v = 0u;
        if (lane == 0) v = kv_atomic_add(steal, 1u);
        return (int)kv_shfl(v, 0);
    };

    const int lim0 = kv_row_limit(p, pos, rt * 8 + 2 * t);
    const int lim1 = kv_row_limit(p, pos, rt * 8 + 2 * t + 1);
    const int lim_max = kv_warp_max_i(kv_row_limit(p, pos, rt * 8 + (lane & 7)));
    const kv_u32* const mrow0 = kv_mask_row(p, i, rt * 8 + 2 * t);
    const kv_u32* const mrow1 = kv_mask_row(p, i, rt * 8 + 2 * t + 1);
    const float sl = (float)p.scale_log2;

    // interleave 0: the split owns tiles [tb, te); 1: it owns tiles split, split + n_splits, ...
    // so that all blocks together sweep the cells front to back. Warps take the block's tiles
    // in turn either way.
    const int n_tiles = (lim_max + 15) / 16;
    const int te = inter ? n_tiles
                         : (tb + (int)p.tiles_per_block < n_tiles ? tb + (int)p.tiles_per_block
                                                                  : n_tiles);
    // The first tile's copy goes out before Q is read, so that the two loads overlap instead
    // of following each other (positions -> copy, not positions -> Q -> copy).
    kv_u8* wbuf = kv_smem() + warp * G::WARP;
    int tile = tb + warp * step;
    if (tile < te) {
        kv_load_tile<TK, TV, D, VEC>(p, i, stream, hk, tile, slot0, lim_max, wbuf, lane);
    }
    kv_copy_commit();
    int next = claim();  // copied while `tile` is computed; its page-table entry read now
    int slot = kv_tile_slot(p, i, next);

#if KVDIAG_INSTRUMENT
    // One record per page this block read; interleaved, a page goes to the block that owns its
    // first tile (every page read is still recorded once per KV head, with its source). Here,
    // while the first tile is on its way, before Q and O take their registers.
    if (warp == 0 && tb < te) {
        const KvRing ring{(kv_u32*)p.ring_counter, (kv_i32*)p.ring_records,
                          (kv_u32)p.ring_capacity};
        const int tpp = (int)p.page_tokens / 16;
        const int block = split + nsp * (rt + (int)p.n_rowtiles * ih);
        const int p0 = inter ? 0 : tb / tpp;
        const int p1 = (te - 1) / tpp;
        for (int page = p0 + lane; page <= p1; page += 32) {
            if (inter && (page * tpp) % nsp != split) continue;
            int ps = -1;
            if (page < p.n_pages_tab) {
                ps = ((const kv_i32*)p.page_table)[(kv_i64)i * p.n_pages_tab + page];
            }
            const int src = ps < 0 ? KV_SRC_HOST : (ps < p.ring_slots ? KV_SRC_RING : KV_SRC_POOL);
            kv_ring_put(ring, (int)p.kernel_id, block, (int)p.layer, stream, page, src, ps, hk);
        }
    }
#endif
    kv_u32 qf[D / 16][2];
    kv_load_q<TK, D>(p, i, hk, rt, g, t, qf);

    float o[D / 16][4], m0, m1, l0, l1;
    kv_start_rows<D>(o, m0, m1, l0, l1);


    int stage = 0;
    while (tile < te) {
        if (next < te) {
            kv_load_tile<TK, TV, D, VEC>(p, i, stream, hk, next, slot, lim_max,
                                         wbuf + (stage ^ 1) * G::STAGE, lane);
        }
        const int after = next < te ? claim() : te;
        slot = kv_tile_slot(p, i, after);  // used by the next iteration
        kv_copy_commit();
        kv_copy_wait<1>();
        kv_syncwarp();
#if KVDIAG_TIMELINE
        if (first_tile) {
            KV_STAMP(stamp, 1);
            first_tile = false;
        }
#endif
        kv_compute_tile<TK, TV, D>(wbuf + stage * G::STAGE, tile * 16, lim0, lim1,
                                   kv_tile_vis(mrow0, tile * 16), kv_tile_vis(mrow1, tile * 16),
                                   sl, qf, o, m0, m1, l0, l1, g, t);
        kv_syncwarp();
        stage ^= 1;
        tile = next;
        next = after;
    }
    kv_copy_wait<0>();
    if (KVDIAG_PDL_TRIGGER == 2) kv_grid_launch_dependents();
    kv_sum_rows(l0, l1);

    // Merge the warps of the block: cm = [warp][row][m, l]; cw = [warp][row] the weights
    // exp2(m_w - max); co = [warp][row][D] the unnormalized O rows, 16-byte units swizzled
    // (kv_swizzle) so that the stores and the loads of a quarter warp hit 32 different banks.
    kv_syncthreads();
    KV_STAMP(stamp, 2);
    float* cm = (float*)kv_smem();
    float* cw = cm + 16 * nwarps;
    float* co = cw + 8 * nwarps;
    if (g == 0) {
        cm[(warp * 8 + 2 * t) * 2] = m0;
        cm[(warp * 8 + 2 * t) * 2 + 1] = l0;
        cm[(warp * 8 + 2 * t + 1) * 2] = m1;
        cm[(warp * 8 + 2 * t + 1) * 2 + 1] = l1;
    }
    kv_store_o<D, true>(co + warp * 8 * D, o, g, t);
    kv_syncthreads();
    KV_STAMP(stamp, 5);
    const kv_i64 item = ((kv_i64)ih * p.n_rowtiles + rt) * p.n_splits + split;
    float* po = (float*)p.part_o + item * 8 * D;
    float* pml = (float*)p.part_ml + item * 16;
    const int rows = (int)p.rows;
    // thread (w, rr): warp w's weight for row rr; thread (0, rr) also the row's max and sum
    if ((int)threadIdx.x < 8 * nwarps) {
        const int w = threadIdx.x >> 3;
        const int rr = threadIdx.x & 7;
        float mm = KV_NEG_INF;
#pragma unroll 4
        for (int v = 0; v < nwarps; ++v) mm = fmaxf(mm, cm[(v * 8 + rr) * 2]);
        const float mw = cm[(w * 8 + rr) * 2];
        cw[w * 8 + rr] = mw == KV_NEG_INF ? 0.f : kv_exp2(mw - mm);
        if (w == 0 && rt * 8 + rr < rows) {
            float ll = 0.f;
#pragma unroll 4
            for (int v = 0; v < nwarps; ++v) {
                const float m = cm[(v * 8 + rr) * 2];
                ll += m == KV_NEG_INF ? 0.f : cm[(v * 8 + rr) * 2 + 1] * kv_exp2(m - mm);
            }
            pml[rr * 2] = mm;
            pml[rr * 2 + 1] = ll;
        }
    }
    kv_syncthreads();
    KV_STAMP(stamp, 6);
    for (int e = threadIdx.x; e < 8 * (D / 4); e += blockDim.x) {
        const int rr = e / (D / 4);
        const int d4 = (e - rr * (D / 4)) * 4;
        if (rt * 8 + rr >= rows) continue;
        const int at = kv_swizzle(rr, d4);
        float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
#pragma unroll 4
        for (int w = 0; w < nwarps; ++w) {
            const float s = cw[w * 8 + rr];  // 0 for a warp without cells (its O is 0)
            const kv_v4 x = *(const kv_v4*)(co + w * 8 * D + rr * D + at);
            acc0 += kv_u2f(x.x) * s;
            acc1 += kv_u2f(x.y) * s;
            acc2 += kv_u2f(x.z) * s;
            acc3 += kv_u2f(x.w) * s;
        }
        *(kv_v4*)(po + rr * D + d4) = kv_v4{kv_f2u(acc0), kv_f2u(acc1), kv_f2u(acc2), kv_f2u(acc3)};
    }
    KV_STAMP(stamp, 3);
}

template <int VEC> struct KvVec;
template <> struct KvVec<16> { typedef kv_v4 type; };
template <> struct KvVec<8> { typedef kv_v2 type; };
template <> struct KvVec<4> { typedef kv_u32 type; };
template <> struct KvVec<2> { typedef kv_u16 type; };

// 16 rows of a head group's span of the host store (the group's heads side by side in each
// row: the whole row when the group is every KV head) into the warps' tile buffers, through
// registers. Unit u (VEC bytes) of the span lies in row r = u / (UPH * hg) and belongs to head
// c / UPH of the group (c = its unit within the row), whose warp buffer starts WARP bytes after
// the previous one; rows at or past nvalid are zero-filled.
template <int UPH, int SDST, int WARP, int VEC>
KV_DEV void kv_copy_group_rows(kv_u8* dst, const kv_u8* src, kv_i64 pitch, int nvalid, int hg) {
    using V = typename KvVec<VEC>::type;
    constexpr int BATCH = 4;
    const int per_row = UPH * hg;
    const int units = 16 * per_row;
    const int nt = (int)blockDim.x;
    for (int u0 = (int)threadIdx.x; u0 < units; u0 += BATCH * nt) {
        V v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int u = u0 + b * nt;
            const int r = u / per_row;
            v[b] = V{};
            if (u < units && r < nvalid) {
                v[b] = *(const V*)(src + (kv_i64)r * pitch + (u - r * per_row) * VEC);
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int u = u0 + b * nt;
            if (u < units) {
                const int r = u / per_row;
                const int c = u - r * per_row;
                const int h = c / UPH;
                *(V*)(dst + h * WARP + r * SDST + (c - h * UPH) * VEC) = v[b];
            }
        }
    }
}

// The ordinary (non-streamed) flash attention: every tile zero-copy from the pinned host
// store. A block owns (stream, head group, row tile, split); its warps are the group's
// consecutive KV heads (warp w: head hk0 + w). For each tile the whole block copies the
// group's span of 16 K rows and 16 V rows -- one unbroken chunk of memory when the group is
// every head -- and then each warp computes its own head. Reading whole rows keeps the PCIe
// reads full and aligned: a q8_0 head slice (272 of 1088 bytes) or a q5_1 one (192 of 768)
// starts and ends inside 32-byte sectors and 128-byte lines, and per-head reads of those ran
// at 83-89% of the zero-copy limit. Each warp writes its own split result (no warp merge).
template <int TK, int TV, int D, int VEC>
__global__ void __launch_bounds__(128, 3) kv_fattn_rows(const __grid_constant__ FattnParams p) {
    using G = FattnGeom<TK, TV, D, false>;
    kv_check_params<G::WARP>(p);
    if (KVDIAG_PDL_TRIGGER == 1) kv_grid_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int hg = blockDim.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int split = blockIdx.x;
    const int rt = blockIdx.y;
    const int nhk = (int)p.n_head_kv;
    const int groups = nhk / hg;
    const int i = blockIdx.z / groups;
    const int hk0 = (blockIdx.z - i * groups) * hg;
    const int hk = hk0 + warp;
    const int stream = ((const kv_i32*)p.streams)[i];
    const kv_i32* pos = (const kv_i32*)p.positions + (kv_i64)i * p.T;
    const int lim0 = kv_row_limit(p, pos, rt * 8 + 2 * t);
    const int lim1 = kv_row_limit(p, pos, rt * 8 + 2 * t + 1);
    const kv_u32* const mrow0 = kv_mask_row(p, i, rt * 8 + 2 * t);
    const kv_u32* const mrow1 = kv_mask_row(p, i, rt * 8 + 2 * t + 1);
    // the same in every warp of the block: the tile loop below is uniform
    const int lim_max = kv_warp_max_i(kv_row_limit(p, pos, rt * 8 + (lane & 7)));
    const float sl = (float)p.scale_log2;
    kv_u32 qf[D / 16][2];
    kv_load_q<TK, D>(p, i, hk, rt, g, t, qf);

    float o[D / 16][4], m0, m1, l0, l1;
    kv_start_rows<D>(o, m0, m1, l0, l1);
    const int tb = split * (int)p.tiles_per_block;
    const int n_tiles = (lim_max + 15) / 16;
    const int te = tb + (int)p.tiles_per_block < n_tiles ? tb + (int)p.tiles_per_block : n_tiles;
    const int ih = i * nhk + hk;

#if KVDIAG_INSTRUMENT
    // One record per (KV head, page) the block read.
    if (tb < te) {
        const KvRing ring{(kv_u32*)p.ring_counter, (kv_i32*)p.ring_records,
                          (kv_u32)p.ring_capacity};
        const int tpp = (int)p.page_tokens / 16;
        const int block = split + (int)p.n_splits * (rt + (int)p.n_rowtiles * ih);
        for (int page = tb / tpp + lane; page <= (te - 1) / tpp; page += 32) {
            kv_ring_put(ring, (int)p.kernel_id, block, (int)p.layer, stream, page, KV_SRC_HOST,
                        -1, hk);
        }
    }
#endif

    const kv_u8* kbase = (const kv_u8*)p.host_k + hk0 * G::HK;
    const kv_u8* vbase = (const kv_u8*)p.host_v + hk0 * G::HV;
    kv_u8* wbuf = kv_smem() + warp * G::WARP;
    for (int tile = tb; tile < te; ++tile) {
        const kv_i64 row = (kv_i64)stream * p.kv_size + tile * 16;
        const int nvalid = lim_max - tile * 16 < 16 ? lim_max - tile * 16 : 16;
        kv_syncthreads();  // every warp is done with the previous tile
        kv_copy_group_rows<G::HK / VEC, G::SK, G::WARP, VEC>(kv_smem(), kbase + row * p.row_k,
                                                             p.row_k, nvalid, hg);
        kv_copy_group_rows<G::HV / VEC, G::SV, G::WARP, VEC>(
            kv_smem() + 16 * G::SK, vbase + row * p.row_v, p.row_v, nvalid, hg);
        kv_syncthreads();
        kv_compute_tile<TK, TV, D>(wbuf, tile * 16, lim0, lim1, kv_tile_vis(mrow0, tile * 16),
                                   kv_tile_vis(mrow1, tile * 16), sl, qf, o, m0, m1, l0, l1, g, t);
    }
    if (KVDIAG_PDL_TRIGGER == 2) kv_grid_launch_dependents();
    kv_sum_rows(l0, l1);
    const kv_i64 item = ((kv_i64)ih * p.n_rowtiles + rt) * p.n_splits + split;
    kv_store_o<D>((float*)p.part_o + item * 8 * D, o, g, t);
    if (g == 0) {
        float* pml = (float*)p.part_ml + item * 16;
        pml[(2 * t) * 2] = m0;
        pml[(2 * t) * 2 + 1] = l0;
        pml[(2 * t + 1) * 2] = m1;
        pml[(2 * t + 1) * 2 + 1] = l1;
    }
}

// Merge the splits of every query row: grid (rows, ns * n_head_kv, D / 32), 256 threads; warp w
// owns head dims 32 * blockIdx.z + 4w .. +3 and its lanes stride over the splits. One pass:
// each lane merges its splits online, four splits' loads issued together, then the lanes merge
// (the partial results are read once, in one round trip for up to 128 splits). Launched with
// programmatic stream serialization where the GPU has it, this kernel's blocks start while the
// partial kernel finishes and wait for its results only where they read them.
template <int D>
__global__ void __launch_bounds__(256) kv_fattn_combine(const __grid_constant__ FattnParams p) {
    if (p.magic != KV_PARAMS_MAGIC) __trap();
#if KVDIAG_TIMELINE
    kv_u64* const stamp = kv_timeline_slot<D>(p, true);
#endif
    KV_STAMP(stamp, 0);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r = blockIdx.x;
    const int ih = blockIdx.y;
    const int d = 32 * blockIdx.z + 4 * warp;
    const int nhk = (int)p.n_head_kv;
    const int i = ih / nhk;
    const int hk = ih - i * nhk;
    const int rt = r / 8;
    const int rr = r - rt * 8;
    const int nsp = (int)p.n_splits;
    const kv_i64 item0 = ((kv_i64)ih * p.n_rowtiles + rt) * nsp;
    const float* pml = (const float*)p.part_ml + item0 * 16 + rr * 2;
    const float* po = (const float*)p.part_o + item0 * 8 * D + rr * D + d;
    kv_grid_wait();  // from here on the partial kernel's results are complete and visible
    KV_STAMP(stamp, 1);
    float mm = KV_NEG_INF, ll = 0.f, acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
    for (int s0 = lane; s0 < nsp; s0 += 128) {
        float ms[4], ls[4];
        kv_v4 xs[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int s = s0 + 32 * k;
            ms[k] = KV_NEG_INF;
            ls[k] = 0.f;
            xs[k] = kv_v4{0u, 0u, 0u, 0u};
            if (s < nsp) {
                const kv_v2 ml = *(const kv_v2*)(pml + (kv_i64)s * 16);
                ms[k] = kv_u2f(ml.x);
                ls[k] = kv_u2f(ml.y);
                xs[k] = *(const kv_v4*)(po + (kv_i64)s * 8 * D);
            }
        }
        float mx = mm;
#pragma unroll
        for (int k = 0; k < 4; ++k) mx = fmaxf(mx, ms[k]);
        if (mx == KV_NEG_INF) continue;
        const float sc = kv_exp2(mm - mx);  // 0 while mm is still -inf
        ll *= sc;
        acc0 *= sc;
        acc1 *= sc;
        acc2 *= sc;
        acc3 *= sc;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (ms[k] == KV_NEG_INF) continue;
            const float w = kv_exp2(ms[k] - mx);
            ll += ls[k] * w;
            acc0 += kv_u2f(xs[k].x) * w;
            acc1 += kv_u2f(xs[k].y) * w;
            acc2 += kv_u2f(xs[k].z) * w;
            acc3 += kv_u2f(xs[k].w) * w;
        }
        mm = mx;
    }
    const float top = kv_warp_max(mm);
    const float sc = mm == KV_NEG_INF ? 0.f : kv_exp2(mm - top);
    ll *= sc;
    acc0 *= sc;
    acc1 *= sc;
    acc2 *= sc;
    acc3 *= sc;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        ll += kv_u2f(kv_shfl_xor(kv_f2u(ll), m));
        acc0 += kv_u2f(kv_shfl_xor(kv_f2u(acc0), m));
        acc1 += kv_u2f(kv_shfl_xor(kv_f2u(acc1), m));
        acc2 += kv_u2f(kv_shfl_xor(kv_f2u(acc2), m));
        acc3 += kv_u2f(kv_shfl_xor(kv_f2u(acc3), m));
    }
    if (lane == 0) {
        const int gq = (int)p.G;
        const int tok = r / gq;
        const int head = hk * gq + (r - tok * gq);
        const float inv = ll > 0.f ? 1.f / ll : 0.f;
        float* out = (float*)p.out + (((kv_i64)i * p.T + tok) * p.n_head + head) * D + d;
        *(kv_v4*)out = kv_v4{kv_f2u(acc0 * inv), kv_f2u(acc1 * inv), kv_f2u(acc2 * inv),
                             kv_f2u(acc3 * inv)};
    }
    KV_STAMP(stamp, 2);
}

#if !defined(__CUDACC_RTC__) && !defined(KVDIAG_EMULATE)
// nvcc builds (the compile test) instantiate a representative set; the executor compiles the
// exact instantiation it needs through NVRTC.
#define KV_FATTN_INST(TK, TV, D, VEC)                                                       \
    template __global__ void kv_fattn_partial<TK, TV, D, VEC>(                              \
        const __grid_constant__ FattnParams);                                               \
    template __global__ void kv_fattn_rows<TK, TV, D, VEC>(const __grid_constant__ FattnParams);
KV_FATTN_INST(KV_F16, KV_F16, 256, 16)
KV_FATTN_INST(KV_BF16, KV_BF16, 256, 16)
KV_FATTN_INST(KV_Q8_0, KV_Q8_0, 256, 16)
KV_FATTN_INST(KV_Q4_0, KV_Q4_0, 256, 16)
KV_FATTN_INST(KV_Q4_1, KV_Q4_1, 256, 16)
KV_FATTN_INST(KV_Q5_0, KV_Q5_0, 256, 16)
KV_FATTN_INST(KV_Q5_1, KV_Q5_1, 256, 16)
KV_FATTN_INST(KV_Q8_0, KV_Q5_1, 256, 16)
KV_FATTN_INST(KV_F16, KV_F16, 64, 16)
KV_FATTN_INST(KV_Q8_0, KV_Q4_0, 128, 4)
KV_FATTN_INST(KV_Q5_0, KV_Q8_0, 96, 2)
template __global__ void kv_fattn_combine<64>(const __grid_constant__ FattnParams);
template __global__ void kv_fattn_combine<96>(const __grid_constant__ FattnParams);
template __global__ void kv_fattn_combine<128>(const __grid_constant__ FattnParams);
template __global__ void kv_fattn_combine<256>(const __grid_constant__ FattnParams);
#endif
