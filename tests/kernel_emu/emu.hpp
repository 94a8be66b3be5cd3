// A small CUDA warp emulator for the kvdiag kernels (tests only).
//
// Every CUDA thread of a block is a cooperative fiber and the block's fibers run on one OS
// thread, switching at barriers (ucontext starts a fiber; _setjmp/_longjmp switch, which saves
// the signal-mask system call of swapcontext); blocks are spread over worker threads. Warp-level
// primitives exchange values through a per-warp table between two barrier phases, so the
// fragment layouts of mma.m16n8k16 and movmatrix (PTX ISA, "Matrix fragments for
// mma.m16n8k16", "movmatrix") are reproduced lane by lane. Shared memory starts filled with
// 0xFF bytes (NaN as f16 and f32), so a read of memory nothing wrote shows in the result.
// f16 arithmetic converts exactly to float/double and rounds once, as the hardware does.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <csetjmp>
#include <thread>
#include <ucontext.h>
#include <vector>

#define KVDIAG_EMULATE 1
#define KV_DEV inline
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __grid_constant__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// A barrier among cooperative fibers of one OS thread: arrive, then yield until the last
// participant has arrived.
void emu_yield();
struct EmuBarrier {
    int n;
    int count = 0;
    unsigned gen = 0;
    explicit EmuBarrier(int parties) : n(parties) {}
    void arrive_and_wait() {
        const unsigned my = gen;
        if (++count == n) {
            count = 0;
            ++gen;
            return;
        }
        while (gen == my) emu_yield();
    }
};

struct EmuWarp {
    EmuBarrier bar{32};
    uint32_t x[32][12];
    float f[32][4];
};

struct EmuBlock {
    EmuBarrier* bar;
    unsigned char* smem;
};

// A cp.async in flight: it lands (copy or zero fill) when its thread waits for its group.
struct EmuCopy {
    unsigned char* dst;
    const void* src;  // nullptr: zero fill
    int bytes;
};

struct EmuFiber {
    ucontext_t ctx;
    jmp_buf jb;
    bool started = false;
    std::vector<char> stack;
    dim3 tid;
    EmuWarp* warp;
    int lane;
    bool done = false;
    const std::function<void()>* body;
    std::vector<EmuCopy> open;                 // issued since the last commit
    std::vector<std::vector<EmuCopy>> groups;  // committed, oldest first
};

inline thread_local EmuWarp* emu_warp = nullptr;
inline thread_local EmuBlock* emu_block = nullptr;
inline thread_local int emu_lane = 0;
inline thread_local ucontext_t emu_sched_ctx;
inline thread_local jmp_buf emu_sched_jb;
inline thread_local EmuFiber* emu_current = nullptr;

inline void emu_yield() {
    if (!_setjmp(emu_current->jb)) _longjmp(emu_sched_jb, 1);
}

inline void __trap() { std::abort(); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
using std::fabs;
inline float fabsf(float x) { return std::fabs(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float roundf(float a) { return std::round(a); }

inline unsigned char* kv_smem() { return emu_block->smem; }
inline void kv_syncthreads() { emu_block->bar->arrive_and_wait(); }
inline void kv_syncwarp() { emu_warp->bar.arrive_and_wait(); }
// One launch at a time runs to completion here: the dependent-launch controls have nothing
// to order.
inline unsigned long long kv_globaltimer() { return 0ull; }
inline unsigned kv_smid() { return 0u; }
inline void kv_grid_wait() {}
inline void kv_grid_launch_dependents() {}
inline void kv_threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline uint32_t emu_exchange(uint32_t v, int src) {
    emu_warp->x[emu_lane][0] = v;
    emu_warp->bar.arrive_and_wait();
    const uint32_t r = emu_warp->x[src & 31][0];
    emu_warp->bar.arrive_and_wait();
    return r;
}
inline uint32_t kv_shfl_xor(uint32_t v, int mask) { return emu_exchange(v, emu_lane ^ mask); }
inline uint32_t kv_shfl(uint32_t v, int src) { return emu_exchange(v, src); }
inline uint32_t kv_ballot(bool pred) {
    emu_warp->x[emu_lane][0] = pred ? 1u : 0u;
    emu_warp->bar.arrive_and_wait();
    uint32_t r = 0;
    for (int l = 0; l < 32; ++l) r |= emu_warp->x[l][0] << l;
    emu_warp->bar.arrive_and_wait();
    return r;
}
inline uint32_t kv_atomic_add(uint32_t* p, uint32_t v) {
    return std::atomic_ref<uint32_t>(*p).fetch_add(v);
}
inline uint32_t kv_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t b = (uint64_t)x | ((uint64_t)y << 32);
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) {
        const int sel = (s >> (4 * k)) & 7;
        r |= (uint32_t)((b >> (8 * sel)) & 0xff) << (8 * k);
    }
    return r;
}
inline float kv_exp2(float x) { return std::exp2(x); }
inline int kv_ffs(uint32_t x) { return x ? __builtin_ffs((int)x) : 0; }
inline float kv_fmul(float a, float b) { return a * b; }
inline float kv_fadd(float a, float b) { return a + b; }
inline float kv_fsub(float a, float b) { return a - b; }
inline float kv_fdiv(float a, float b) { return a / b; }
inline float kv_frcp(float a) { return 1.0f / a; }
inline int kv_f2i_trunc(float a) {
    if (std::isnan(a)) return 0;
    if (a >= 2147483648.0f) return 2147483647;
    if (a <= -2147483648.0f) return (int)0x80000000u;
    return (int)a;
}
inline float kv_roundf(float a) { return std::round(a); }

// IEEE binary16 <-> binary32, round to nearest even (as cvt.rn.f16.f32).
inline uint16_t kv_f2h(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {                                     // result subnormal or zero
        const float a = __int_as_float((int)ax);
        const float scaled = a * 16777216.0f;  // exact: a < 2^-14
        const float r = std::nearbyint(scaled);
        return (uint16_t)(sign | (uint32_t)r);
    }
    const uint32_t mant_odd = (ax >> 13) & 1u;
    const uint32_t v = ax + 0xfffu + mant_odd;  // round the 13 dropped bits to nearest even
    return (uint16_t)(sign | ((v - 0x38000000u) >> 13));
}
inline float kv_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    const uint32_t m = h & 0x3ffu;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 0x400u), (int)e - 25);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u |= sign;
    std::memcpy(&v, &u, 4);
    return v;
}
inline uint16_t emu_d2h(double d) {
    // double -> f16 with one rounding: go through float only when that is exact enough (an
    // f16-representable neighbourhood survives float rounding for every value used here).
    return kv_f2h((float)d);
}
inline uint32_t emu_h2op(uint32_t a, uint32_t b, uint32_t c, int op) {
    uint32_t r = 0;
    for (int k = 0; k < 2; ++k) {
        const double x = kv_h2f((uint16_t)(a >> (16 * k)));
        const double y = kv_h2f((uint16_t)(b >> (16 * k)));
        const double z = kv_h2f((uint16_t)(c >> (16 * k)));
        const double v = op == 0 ? x - y : (op == 1 ? x * y : x * y + z);
        r |= (uint32_t)emu_d2h(v) << (16 * k);
    }
    return r;
}
inline uint32_t kv_hsub2(uint32_t a, uint32_t b) { return emu_h2op(a, b, 0, 0); }
inline uint32_t kv_hmul2(uint32_t a, uint32_t b) { return emu_h2op(a, b, 0, 1); }
inline uint32_t kv_hfma2(uint32_t a, uint32_t b, uint32_t c) { return emu_h2op(a, b, c, 2); }

inline float emu_half(uint32_t reg, int hi) { return kv_h2f((uint16_t)(reg >> (16 * hi))); }

// D = A*B + D for one lane: the fragments of the whole warp are gathered first.
inline void kv_mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    EmuWarp& w = *emu_warp;
    for (int k = 0; k < 4; ++k) w.x[emu_lane][k] = a[k];
    w.x[emu_lane][4] = b[0];
    w.x[emu_lane][5] = b[1];
    w.bar.arrive_and_wait();
    const int g = emu_lane >> 2, t = emu_lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0);
        const int col = 2 * t + (e & 1);
        double acc = 0.0;
        for (int kk = 0; kk < 16; ++kk) {
            const int la = (row & 7) * 4 + (kk & 7) / 2;
            const int ra = (row >= 8 ? 1 : 0) + (kk >= 8 ? 2 : 0);
            const int lb = col * 4 + (kk & 7) / 2;
            const int rb = kk >= 8 ? 1 : 0;
            acc += (double)emu_half(w.x[la][ra], kk & 1) *
                   (double)emu_half(w.x[lb][4 + rb], kk & 1);
        }
        out[e] = (float)((double)d[e] + acc);
    }
    w.bar.arrive_and_wait();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline uint32_t kv_movmatrix_trans(uint32_t x) {
    EmuWarp& w = *emu_warp;
    w.x[emu_lane][0] = x;
    w.bar.arrive_and_wait();
    uint32_t r = 0;
    for (int h = 0; h < 2; ++h) {
        const int row = 2 * (emu_lane & 3) + h;  // element [row][col] of the source matrix
        const int col = emu_lane >> 2;
        const uint32_t src = w.x[row * 4 + col / 2][0];
        r |= ((src >> (16 * (col & 1))) & 0xffffu) << (16 * h);
    }
    w.bar.arrive_and_wait();
    return r;
}

// cp.async as the hardware orders it: a copy lands only once its own thread has waited for
// its group (cp.async.wait_group), and other threads see it only after a barrier that
// follows that wait, so a kernel that reads a tile too early reads the previous one.
template <int VEC>
inline void kv_copy_async(void* dst, const void* src) {
    emu_current->open.push_back(EmuCopy{(unsigned char*)dst, src, VEC});
}
typedef unsigned char* kv_shaddr;
inline kv_shaddr kv_shaddr_of(void* p) { return (kv_shaddr)p; }
template <int VEC>
inline void kv_copy_async_zfill(kv_shaddr dst, int off, const void* src, bool valid) {
    emu_current->open.push_back(EmuCopy{dst + off, valid ? src : nullptr, VEC});
}
inline void kv_copy_commit() {
    emu_current->groups.push_back(std::move(emu_current->open));
    emu_current->open.clear();
}
template <int N>
inline void kv_copy_wait() {
    auto& gs = emu_current->groups;
    while (gs.size() > (size_t)N) {
        for (const EmuCopy& c : gs.front()) {
            if (c.src) std::memcpy(c.dst, c.src, c.bytes);
            else std::memset(c.dst, 0, c.bytes);
        }
        gs.erase(gs.begin());
    }
}

inline void emu_fiber_entry(unsigned lo, unsigned hi) {
    EmuFiber* f = (EmuFiber*)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    (*f->body)();
    f->done = true;
    _longjmp(emu_sched_jb, 1);
}

// One block: its fibers run round-robin until all are done.
inline void emu_run_block(dim3 grid, dim3 bid, unsigned threads, size_t smem_bytes,
                          const std::function<void()>& body) {
    std::vector<unsigned char> smem(smem_bytes + 16, 0xff);
    EmuBarrier bar((int)threads);
    EmuBlock blk{&bar, smem.data()};
    std::vector<std::unique_ptr<EmuWarp>> warps;
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<EmuWarp>());
    std::vector<std::unique_ptr<EmuFiber>> fibers;
    for (unsigned tid = 0; tid < threads; ++tid) {
        auto f = std::make_unique<EmuFiber>();
        f->stack.resize(1 << 18);
        f->tid = dim3{tid, 0, 0};
        f->warp = warps[tid / 32].get();
        f->lane = (int)(tid & 31);
        f->body = &body;
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack.data();
        f->ctx.uc_stack.ss_size = f->stack.size();
        f->ctx.uc_link = &emu_sched_ctx;
        const uintptr_t ptr = (uintptr_t)f.get();
        makecontext(&f->ctx, (void (*)())emu_fiber_entry, 2, (unsigned)(ptr & 0xffffffffu),
                    (unsigned)(ptr >> 32));
        fibers.push_back(std::move(f));
    }
    blockIdx = bid;
    blockDim = dim3{threads, 1, 1};
    gridDim = grid;
    emu_block = &blk;
    for (bool running = true; running;) {
        running = false;
        for (auto& f : fibers) {
            if (f->done) continue;
            running = true;
            threadIdx = f->tid;
            emu_warp = f->warp;
            emu_lane = f->lane;
            emu_current = f.get();
            if (!_setjmp(emu_sched_jb)) {
                if (!f->started) {
                    f->started = true;
                    swapcontext(&emu_sched_ctx, &f->ctx);
                } else {
                    _longjmp(f->jb, 1);
                }
            }
        }
    }
}

// Run `body` as a kernel over `grid`: blocks are shared out among worker threads.
inline void emu_launch(dim3 grid, unsigned threads, size_t smem_bytes,
                       const std::function<void()>& body) {
    const unsigned total = grid.x * grid.y * grid.z;
    std::atomic<unsigned> next{0};
    auto worker = [&] {
        for (unsigned b = next++; b < total; b = next++) {
            const dim3 bid{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
            emu_run_block(grid, bid, threads, smem_bytes, body);
        }
    };
    const unsigned n = std::max(1u, std::min(total, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned k = 0; k < n; ++k) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
}
