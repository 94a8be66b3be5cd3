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
