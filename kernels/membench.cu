// Read-bandwidth probes for the kernel benchmark: the same streaming read run over device
// memory (the HBM limit) and over pinned, host-mapped memory (the zero-copy PCIe limit).
// Every thread keeps four independent 16-byte loads in flight; the XOR of everything read
// goes to `sink` only when it equals an impossible key, so the loads cannot be removed.
#include "kvdiag_platform.cuh"

extern "C" __global__ void __launch_bounds__(256)
kv_read_bandwidth(const kv_v4* __restrict__ src, kv_i64 n_vec, kv_u32* __restrict__ sink) {
    const kv_i64 stride = (kv_i64)gridDim.x * blockDim.x;
    kv_i64 idx = (kv_i64)blockIdx.x * blockDim.x + threadIdx.x;
    kv_u32 acc = 0u;
    for (; idx + 3 * stride < n_vec; idx += 4 * stride) {
        const kv_v4 a = src[idx];
        const kv_v4 b = src[idx + stride];
        const kv_v4 c = src[idx + 2 * stride];
        const kv_v4 d = src[idx + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; idx < n_vec; idx += stride) {
        const kv_v4 a = src[idx];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

// Chunked read probe, shaped like an attention warp streaming its tiles: each warp reads
// chunks of 16 rows of `seg` bytes spaced `pitch` apart (seg == pitch: one contiguous chunk),
// one chunk after another. order 0: warp w takes chunks w, w + W, ... (all warps sweep one
// moving window); order 1: warp w takes its own contiguous run of chunks (like contiguous
// splits). mode 0: 16-byte loads into registers, consumed before the next chunk; mode 1:
// cp.async into shared memory, double buffered as kv_fattn_partial does. Dynamic shared
// memory: 2 x 16 x seg bytes per warp (mode 1).
extern "C" __global__ void __launch_bounds__(128)
kv_read_chunks(const kv_u8* __restrict__ src, kv_i64 nbytes, int seg, int pitch, int order,
               int mode, kv_u32* __restrict__ sink) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const kv_i64 nw = (kv_i64)gridDim.x * (blockDim.x >> 5);
    const kv_i64 w = (kv_i64)blockIdx.x * (blockDim.x >> 5) + warp;
    const kv_i64 chunk_span = 16LL * pitch;
    const kv_i64 n_chunks = nbytes / chunk_span;
    const int units = 16 * (seg / 16);
    const int per_row = seg / 16;
    kv_i64 c0 = w, c1 = n_chunks, cstep = nw;
    if (order) {
        const kv_i64 per = (n_chunks + nw - 1) / nw;
        c0 = w * per;
        c1 = c0 + per < n_chunks ? c0 + per : n_chunks;
        cstep = 1;
    }
    kv_u32 acc = 0u;
    if (mode == 0) {
        for (kv_i64 c = c0; c < c1; c += cstep) {
            const kv_u8* base = src + c * chunk_span;
            for (int u = lane; u < units; u += 32) {
                const int r = u / per_row;
                const kv_v4 v = *(const kv_v4*)(base + (kv_i64)r * pitch + (u - r * per_row) * 16);
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
        }
    } else {
        kv_u8* buf = kv_smem() + warp * 2 * 16 * seg;
        int stage = 0;
        auto issue = [&](kv_i64 c, kv_u8* dst) {
            const kv_u8* base = src + c * chunk_span;
            for (int u = lane; u < units; u += 32) {
                const int r = u / per_row;
                kv_copy_async<16>(dst + u * 16, base + (kv_i64)r * pitch + (u - r * per_row) * 16);
            }
        };
        if (c0 < c1) issue(c0, buf);
        kv_copy_commit();
        for (kv_i64 c = c0; c < c1; c += cstep) {
            if (c + cstep < c1) issue(c + cstep, buf + (stage ^ 1) * 16 * seg);
            kv_copy_commit();
            kv_copy_wait<1>();
            kv_syncwarp();
            const kv_u32* b = (const kv_u32*)(buf + stage * 16 * seg);
            for (int u = lane; u < units; u += 32) acc ^= b[u * 4];
            kv_syncwarp();
            stage ^= 1;
        }
        kv_copy_wait<0>();
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
