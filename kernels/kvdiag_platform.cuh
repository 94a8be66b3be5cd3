// Platform layer of the kvdiag kernels: integer types, fp16/bf16 bit conversions and the few
// warp-level primitives the kernels use (mma.sync, movmatrix, shuffles, cp.async).
//
// The same kernel sources compile three ways:
//   * NVRTC (CuPy RawModule, __CUDACC_RTC__): no system headers, so only builtins are used;
//   * nvcc --ptx -arch=sm_90 (the compile test);
//   * a host C++ compiler with KVDIAG_EMULATE defined (tests/kernel_emu): the includer first
//     provides the emulated primitives under the same names, then includes the kernels, so the
//     fragment layouts are checked on a CPU against the NumPy reference.
// PTX semantics cited below are those of the PTX ISA 8.x manual ("Warp-level matrix fragment
// for mma.m16n8k16", "movmatrix", "cp.async").
#pragma once

typedef unsigned char kv_u8;
typedef signed char kv_i8;
typedef unsigned short kv_u16;
typedef unsigned int kv_u32;
typedef int kv_i32;
typedef unsigned long long kv_u64;
typedef long long kv_i64;

#ifndef KVDIAG_INSTRUMENT
#define KVDIAG_INSTRUMENT 1
#endif

#define KV_NEG_INF (-__int_as_float(0x7f800000))

#ifndef KVDIAG_EMULATE

#define KV_DEV __device__ __forceinline__

extern __shared__ __align__(16) kv_u8 kv_dynamic_smem[];

KV_DEV kv_u8* kv_smem() { return kv_dynamic_smem; }
KV_DEV void kv_syncthreads() { __syncthreads(); }
KV_DEV void kv_syncwarp() { __syncwarp(); }
KV_DEV void kv_threadfence() { __threadfence(); }

KV_DEV kv_u32 kv_shfl_xor(kv_u32 v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
KV_DEV kv_u32 kv_shfl(kv_u32 v, int src) { return __shfl_sync(0xffffffffu, v, src); }
KV_DEV kv_u32 kv_ballot(bool pred) { return __ballot_sync(0xffffffffu, pred); }
KV_DEV kv_u32 kv_atomic_add(kv_u32* p, kv_u32 v) { return atomicAdd(p, v); }
KV_DEV kv_u32 kv_byte_perm(kv_u32 x, kv_u32 y, kv_u32 s) { return __byte_perm(x, y, s); }
KV_DEV float kv_exp2(float x) { return exp2f(x); }
KV_DEV int kv_ffs(kv_u32 x) { return __ffs(x); }

// IEEE single operations with the rounding spelled out so that no FMA contraction changes a
// result that ggml's reference C code computes as two roundings.
KV_DEV float kv_fmul(float a, float b) { return __fmul_rn(a, b); }
KV_DEV float kv_fadd(float a, float b) { return __fadd_rn(a, b); }
KV_DEV float kv_fsub(float a, float b) { return __fsub_rn(a, b); }
KV_DEV float kv_fdiv(float a, float b) { return __fdiv_rn(a, b); }
KV_DEV float kv_frcp(float a) { return __frcp_rn(a); }
KV_DEV int kv_f2i_trunc(float a) { return __float2int_rz(a); }
KV_DEV float kv_roundf(float a) { return roundf(a); }

KV_DEV kv_u16 kv_f2h(float f) {
    kv_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
KV_DEV float kv_h2f(kv_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f16x2 arithmetic with explicit .rn: PTX may contract unrounded mul/add into fma.
KV_DEV kv_u32 kv_hsub2(kv_u32 a, kv_u32 b) {
    kv_u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
KV_DEV kv_u32 kv_hmul2(kv_u32 a, kv_u32 b) {
    kv_u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
KV_DEV kv_u32 kv_hfma2(kv_u32 a, kv_u32 b, kv_u32 c) {
    kv_u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// D = A*B + D, m16n8k16, A row-major f16 (4 regs), B col-major f16 (2 regs), D f32 (4 regs).
KV_DEV void kv_mma_16816(float* d, const kv_u32* a, const kv_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Transpose of an 8x8 b16 matrix held one row pair per lane (lane l: row l/4, cols 2(l%4)..+1).
KV_DEV kv_u32 kv_movmatrix_trans(kv_u32 x) {
    kv_u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

KV_DEV kv_u32 kv_smem_addr(const void* p) {
    kv_u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (kv_u32)a;
}

// Copy VEC bytes global -> shared. 16/8/4 go through cp.async (no register staging, so the
// next tile streams in while the current one is computed); 2 is a plain load and store.
template <int VEC>
KV_DEV void kv_copy_async(void* dst_smem, const void* src_global) {
    if constexpr (VEC == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kv_smem_addr(dst_smem)),
                     "l"(src_global));
    } else if constexpr (VEC == 8 || VEC == 4) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(kv_smem_addr(dst_smem)),
                     "l"(src_global), "n"(VEC));
    } else {
        *(kv_u16*)dst_smem = *(const kv_u16*)src_global;
    }
}
// A shared-memory address as the copy instructions take it (32 bits), so that offsets added
// to it stay 32-bit arithmetic.
typedef kv_u32 kv_shaddr;
KV_DEV kv_shaddr kv_shaddr_of(void* p) { return kv_smem_addr(p); }

// Copy VEC bytes global -> shared at dst + off, or write VEC zero bytes when !valid
// (cp.async's src-size operand: nothing is read from src then, so no branch; callers still
// pass an address inside the buffer).
template <int VEC>
KV_DEV void kv_copy_async_zfill(kv_shaddr dst, int off, const void* src_global, bool valid) {
    const kv_u32 d = dst + (kv_u32)off;
    if constexpr (VEC == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src_global),
                     "r"(valid ? 16 : 0));
    } else if constexpr (VEC == 8 || VEC == 4) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src_global),
                     "n"(VEC), "r"(valid ? VEC : 0));
    } else {
        const kv_u16 v = valid ? *(const kv_u16*)src_global : (kv_u16)0;
        asm volatile("st.shared.u16 [%0], %1;" ::"r"(d), "h"(v));
    }
}
KV_DEV void kv_copy_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
KV_DEV void kv_copy_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The GPU-wide nanosecond timer (PTX %globaltimer), comparable across SMs.
KV_DEV kv_u64 kv_globaltimer() {
    kv_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The SM this thread runs on (PTX %smid).
KV_DEV kv_u32 kv_smid() {
    kv_u32 s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

// Programmatic dependent launch (PTX griddepcontrol, sm_90): a kernel launched with
// programmatic stream serialization may start before the kernel ahead of it in the stream has
// finished; kv_grid_wait blocks until that kernel has completed and its memory is visible.
// kv_grid_launch_dependents lets the dependent kernel start once every block of this one has
// called it (or exited). Both are no-ops without such a launch, and before sm_90.
KV_DEV void kv_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
KV_DEV void kv_grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#endif  // KVDIAG_EMULATE

// ---- helpers common to every platform ----------------------------------------------------

struct __align__(16) kv_v4 { kv_u32 x, y, z, w; };
struct __align__(8) kv_v2 { kv_u32 x, y; };

KV_DEV kv_u32 kv_pack_h2(kv_u16 lo, kv_u16 hi) { return (kv_u32)lo | ((kv_u32)hi << 16); }
KV_DEV kv_u32 kv_pack_f2(float lo, float hi) { return kv_pack_h2(kv_f2h(lo), kv_f2h(hi)); }
KV_DEV float kv_lo_f(kv_u32 h2) { return kv_h2f((kv_u16)(h2 & 0xffffu)); }
KV_DEV float kv_hi_f(kv_u32 h2) { return kv_h2f((kv_u16)(h2 >> 16)); }
KV_DEV float kv_u2f(kv_u32 u) { return __int_as_float((int)u); }
KV_DEV kv_u32 kv_f2u(float f) { return (kv_u32)__float_as_int(f); }

// GGML_FP32_TO_BF16 (ggml-impl.h ggml_compute_fp32_to_bf16): round to nearest even on the bit
// pattern; NaN keeps its top bits with the quiet bit forced.
KV_DEV kv_u16 kv_f2bf(float f) {
    kv_u32 u = kv_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (kv_u16)((u >> 16) | 64u);
    return (kv_u16)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}
KV_DEV float kv_bf2f(kv_u16 b) { return kv_u2f((kv_u32)b << 16); }

KV_DEV float kv_warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, kv_u2f(kv_shfl_xor(kv_f2u(v), m)));
    return v;
}
KV_DEV float kv_warp_min(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fminf(v, kv_u2f(kv_shfl_xor(kv_f2u(v), m)));
    return v;
}
KV_DEV int kv_warp_max_i(int v) {
    for (int m = 16; m > 0; m >>= 1) {
        int o = (int)kv_shfl_xor((kv_u32)v, m);
        v = v > o ? v : o;
    }
    return v;
}
