// Does every pool slot named by a page table hold the bytes of the host page it stands for?
// One block per (slot, stream, page) triple; a difference anywhere sets *differ. The runner
// asks this (reads_match_host) to know that a streamed read equals the resident reference
// without computing the reference a second time.
#include "kvdiag_platform.cuh"

KV_DEV bool kv_bytes_differ(const kv_u8* a, const kv_u8* b, kv_i64 n) {
    bool diff = false;
    if ((((kv_u64)a | (kv_u64)b | (kv_u64)n) & 15u) == 0u) {
        const kv_v4* x = (const kv_v4*)a;
        const kv_v4* y = (const kv_v4*)b;
        for (kv_i64 k = threadIdx.x; k < n / 16; k += blockDim.x) {
            const kv_v4 u = x[k], v = y[k];
            diff |= (u.x != v.x) | (u.y != v.y) | (u.z != v.z) | (u.w != v.w);
        }
    } else {
        for (kv_i64 k = threadIdx.x; k < n; k += blockDim.x) diff |= a[k] != b[k];
    }
    return diff;
}

extern "C" __global__ void __launch_bounds__(256)
kv_pages_differ(const kv_u8* __restrict__ pool, const kv_u8* __restrict__ host_k,
                const kv_u8* __restrict__ host_v, const kv_i32* __restrict__ triples,
                kv_i64 row_k, kv_i64 row_v, kv_i64 kv_size, kv_i64 page_tokens,
                kv_i64 page_bytes, kv_i64 v_offset, kv_u32* __restrict__ differ) {
    const kv_i64 slot = triples[3 * blockIdx.x];
    const kv_i64 stream = triples[3 * blockIdx.x + 1];
    const kv_i64 page = triples[3 * blockIdx.x + 2];
    kv_i64 rows = page_tokens;
    if ((page + 1) * page_tokens > kv_size) rows = kv_size - page * page_tokens;
    const kv_i64 first = stream * kv_size + page * page_tokens;
    const kv_u8* slot_base = pool + slot * page_bytes;
    bool diff = kv_bytes_differ(slot_base, host_k + first * row_k, rows * row_k);
    diff |= kv_bytes_differ(slot_base + v_offset, host_v + first * row_v, rows * row_v);
    if (__syncthreads_or(diff) && threadIdx.x == 0) atomicOr(differ, 1u);
}
