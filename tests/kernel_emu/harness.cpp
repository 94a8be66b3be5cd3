// C entry points over the emulated kvdiag kernels, loaded by tests/test_kernels_emulated.py with
// ctypes. Parameter blocks are packed by kvdiag.executors.cuda_kernels exactly as for the GPU;
// here their pointers are host addresses of NumPy arrays.
#include "emu.hpp"

#include "fattn_paged.cu"
#include "set_rows.cu"

template <int TK, int TV, int D, int VEC, bool PAGED>
static void run_fattn(const FattnParams* p, int gx, int gy, int gz, int threads, int smem) {
    const dim3 grid{(unsigned)gx, (unsigned)gy, (unsigned)gz};
    if constexpr (PAGED) {
        emu_launch(grid, (unsigned)threads, (size_t)smem,
                   [p] { kv_fattn_partial<TK, TV, D, VEC>(*p); });
    } else {
        emu_launch(grid, (unsigned)threads, (size_t)smem,
                   [p] { kv_fattn_rows<TK, TV, D, VEC>(*p); });
    }
    emu_launch(dim3{(unsigned)p->rows, (unsigned)(p->ns * p->n_head_kv), (unsigned)(D / 32)}, 256,
               0, [p] { kv_fattn_combine<D>(*p); });
}

// The (K type, V type, head dim, copy unit) combinations the tests exercise.
#define KVDIAG_EMU_CASES(X)        \
    X(KV_F16, KV_F16, 64, 16)      \
    X(KV_BF16, KV_BF16, 64, 16)    \
    X(KV_Q8_0, KV_Q8_0, 64, 4)     \
    X(KV_Q4_0, KV_Q4_0, 64, 4)     \
    X(KV_Q4_1, KV_Q4_1, 64, 8)     \
    X(KV_Q5_0, KV_Q5_0, 64, 4)     \
    X(KV_Q5_1, KV_Q5_1, 64, 16)    \
    X(KV_Q8_0, KV_Q5_1, 256, 16)   \
    X(KV_F16, KV_F16, 256, 16)     \
    X(KV_Q8_0, KV_Q4_1, 128, 8)    \
    X(KV_Q5_0, KV_Q8_0, 96, 2)     \
    X(KV_Q4_1, KV_Q5_1, 128, 16)

extern "C" int emu_fattn(int tk, int tv, int d, int vec, int paged, const void* params, int gx,
                         int gy, int gz, int threads, int smem) {
    const FattnParams* p = (const FattnParams*)params;
#define KV_EMU_CASE(TK, TV, D, VEC)                                             \
    if (tk == TK && tv == TV && d == D && vec == VEC) {                         \
        if (paged) run_fattn<TK, TV, D, VEC, true>(p, gx, gy, gz, threads, smem); \
        else run_fattn<TK, TV, D, VEC, false>(p, gx, gy, gz, threads, smem);      \
        return 0;                                                               \
    }
    KVDIAG_EMU_CASES(KV_EMU_CASE)
    return -1;
}

extern "C" int emu_fattn_warp_bytes(int tk, int tv, int d, int paged) {
#define KV_EMU_GEOM(TK, TV, D, VEC)                                                   \
    if (tk == TK && tv == TV && d == D)                                               \
        return paged ? FattnGeom<TK, TV, D, true>::WARP : FattnGeom<TK, TV, D, false>::WARP;
    KVDIAG_EMU_CASES(KV_EMU_GEOM)
    return -1;
}

extern "C" int emu_set_rows(int type, const void* params, int grid, int threads, int smem) {
    const SetRowsParams* p = (const SetRowsParams*)params;
    const dim3 g{(unsigned)grid, 1, 1};
    switch (type) {
        case KV_F16: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_F16>(p); }); return 0;
        case KV_BF16: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_BF16>(p); }); return 0;
        case KV_Q8_0: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_Q8_0>(p); }); return 0;
        case KV_Q4_0: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_Q4_0>(p); }); return 0;
        case KV_Q4_1: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_Q4_1>(p); }); return 0;
        case KV_Q5_0: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_Q5_0>(p); }); return 0;
        case KV_Q5_1: emu_launch(g, threads, smem, [p] { kv_set_rows<KV_Q5_1>(p); }); return 0;
        default: return -1;
    }
}
