/* CPU attention products of kvdiag's NumPy executor for a few query rows per KV head
 * (decode), rounding exactly as the np.einsum calls they replace.
 *
 * NumPy's einsum (numpy/_core/src/multiarray/einsum_sumprod.c.src, built for the x86-64 SSE
 * baseline: 4 float lanes, multiply then add, no fused multiply-add) reduces
 *   "hqd,hdk->hqk" with d contiguous in both operands (scores = Q.K^T) in
 *     sum_of_products_contig_contig_outstride0_two: per 16 elements, lane-wise
 *     acc = a3*b3 + acc; acc = a2*b2 + acc; acc = a1*b1 + acc; acc = a0*b0 + acc
 *     (a_m, b_m = elements 4m..4m+3 of the 16), a zero-padded 4-lane step for a tail, then
 *     the SSE3 horizontal sum (l0 + l1) + (l2 + l3), added to the zeroed output;
 *   "hqd,hdk->hqk" with the reduced axis strided in the second operand (P.V) in
 *     sum_of_products_stride0_contig_outcontig_two: for each reduced index in order,
 *     out = p*v + out over the contiguous output row, from zero.
 * The Python side checks these functions against np.einsum before it uses them
 * (kvdiag/executors/cpu_kernels.py) and keeps einsum where they differ.
 *
 * Build: cc -O3 -ffp-contract=off -fno-fast-math -shared -fPIC (no -m flags: the SSE2 baseline,
 * and AVX only in functions marked for it, chosen at run time).
 */
#include <stddef.h>
#include <string.h>

typedef float v4sf __attribute__((vector_size(16)));

static inline v4sf ld4(const float *p)
{
    v4sf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void st4(float *p, v4sf v) { memcpy(p, &v, sizeof v); }

static inline v4sf ld4_tillz(const float *p, long count)
{
    v4sf v = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(&v, p, (size_t)(count < 4 ? count : 4) * sizeof(float));
    return v;
}

static inline float hsum(v4sf a) { return (a[0] + a[1]) + (a[2] + a[3]); }

/* R query rows against one K row: the einsum dot product of each. */
#define SCORES_ROWS(R)                                                                       \
    static void scores_rows_##R(const float *q, long q_rs, const float *kc, long d,         \
                                float *out, long o_rs)                                       \
    {                                                                                        \
        v4sf acc[R];                                                                         \
        for (int r = 0; r < R; r++) acc[r] = (v4sf){0.0f, 0.0f, 0.0f, 0.0f};                \
        long i = 0;                                                                          \
        for (; i + 16 <= d; i += 16) {                                                       \
            v4sf b3 = ld4(kc + i + 12), b2 = ld4(kc + i + 8);                                \
            v4sf b1 = ld4(kc + i + 4), b0 = ld4(kc + i);                                     \
            for (int r = 0; r < R; r++) {                                                    \
                const float *qr = q + r * q_rs + i;                                          \
                v4sf t = acc[r];                                                             \
                t = ld4(qr + 12) * b3 + t;                                                   \
                t = ld4(qr + 8) * b2 + t;                                                    \
                t = ld4(qr + 4) * b1 + t;                                                    \
                t = ld4(qr) * b0 + t;                                                        \
                acc[r] = t;                                                                  \
            }                                                                                \
        }                                                                                    \
        for (; i < d; i += 4) {                                                              \
            v4sf b = ld4_tillz(kc + i, d - i);                                               \
            for (int r = 0; r < R; r++)                                                      \
                acc[r] = ld4_tillz(q + r * q_rs + i, d - i) * b + acc[r];                    \
        }                                                                                    \
        for (int r = 0; r < R; r++) out[r * o_rs] = 0.0f + hsum(acc[r]);                    \
    }

SCORES_ROWS(1)
SCORES_ROWS(2)
SCORES_ROWS(3)
SCORES_ROWS(4)
SCORES_ROWS(5)
SCORES_ROWS(6)

/* out[h, r, c] = Q[h, r, :] . K[h, c, :] for h < heads, r < rows, c < cols (strides in
 * floats; the last axis of each operand is contiguous). */
void kv_scores(long heads, long rows, long cols, long d,
               const float *q, long q_hs, long q_rs,
               const float *k, long k_hs, long k_rs,
               float *out, long o_hs, long o_rs)
{
    for (long h = 0; h < heads; h++) {
        for (long r0 = 0; r0 < rows; r0 += 6) {
            long rb = rows - r0 < 6 ? rows - r0 : 6;
            const float *qh = q + h * q_hs + r0 * q_rs;
            float *oh = out + h * o_hs + r0 * o_rs;
            for (long c = 0; c < cols; c++) {
                const float *kc = k + h * k_hs + c * k_rs;
                switch (rb) {
                case 6: scores_rows_6(qh, q_rs, kc, d, oh + c, o_rs); break;
                case 5: scores_rows_5(qh, q_rs, kc, d, oh + c, o_rs); break;
                case 4: scores_rows_4(qh, q_rs, kc, d, oh + c, o_rs); break;
                case 3: scores_rows_3(qh, q_rs, kc, d, oh + c, o_rs); break;
                case 2: scores_rows_2(qh, q_rs, kc, d, oh + c, o_rs); break;
                default: scores_rows_1(qh, q_rs, kc, d, oh + c, o_rs); break;
                }
            }
        }
    }
}

/* R rows of P times 16 columns of V over n rows of V, added in order to what ``out`` holds.
 * With AVX one register holds 8 columns; each lane's arithmetic is the same at any width. */
typedef float v8sf __attribute__((vector_size(32)));

#define PV_BLOCK 16

#define PV_ROWS(R, TARGET, SUFFIX)                                                           \
    TARGET static void pv_rows_##R##SUFFIX(const float *p, long p_rs, long n,               \
                                           const float *v, long v_rs, float *out, long o_rs) \
    {                                                                                        \
        v8sf acc0[R], acc1[R];                                                               \
        for (int r = 0; r < R; r++) {                                                        \
            memcpy(&acc0[r], out + r * o_rs, sizeof acc0[r]);                                \
            memcpy(&acc1[r], out + r * o_rs + 8, sizeof acc1[r]);                            \
        }                                                                                    \
        for (long j = 0; j < n; j++) {                                                       \
            const float *vj = v + j * v_rs;                                                  \
            v8sf b0, b1;                                                                     \
            memcpy(&b0, vj, sizeof b0);                                                      \
            memcpy(&b1, vj + 8, sizeof b1);                                                  \
            for (int r = 0; r < R; r++) {                                                    \
                float s = p[r * p_rs + j];                                                   \
                v8sf sv = {s, s, s, s, s, s, s, s};                                          \
                acc0[r] = sv * b0 + acc0[r];                                                 \
                acc1[r] = sv * b1 + acc1[r];                                                 \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < R; r++) {                                                        \
            memcpy(out + r * o_rs, &acc0[r], sizeof acc0[r]);                                \
            memcpy(out + r * o_rs + 8, &acc1[r], sizeof acc1[r]);                            \
        }                                                                                    \
    }

#define PV_ALL(TARGET, SUFFIX)                                                               \
    PV_ROWS(1, TARGET, SUFFIX)                                                               \
    PV_ROWS(2, TARGET, SUFFIX)                                                               \
    PV_ROWS(3, TARGET, SUFFIX)                                                               \
    PV_ROWS(4, TARGET, SUFFIX)                                                               \
    PV_ROWS(5, TARGET, SUFFIX)                                                               \
    PV_ROWS(6, TARGET, SUFFIX)                                                               \
    TARGET static void pv_block##SUFFIX(long rb, const float *ph, long p_rs, long n,        \
                                        const float *v, long v_rs, float *out, long o_rs)    \
    {                                                                                        \
        switch (rb) {                                                                        \
        case 6: pv_rows_6##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                   \
        case 5: pv_rows_5##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                   \
        case 4: pv_rows_4##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                   \
        case 3: pv_rows_3##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                   \
        case 2: pv_rows_2##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                   \
        default: pv_rows_1##SUFFIX(ph, p_rs, n, v, v_rs, out, o_rs); break;                  \
        }                                                                                    \
    }

PV_ALL(, _sse)
PV_ALL(__attribute__((target("avx"))), _avx)

/* out[h, r, c] = sum over j in order of P[h, r, j] * V[h, j, c], for h < heads, r < rows,
 * c < dv (strides in floats; the last axis of each operand is contiguous). */
void kv_pv(long heads, long rows, long n, long dv,
           const float *p, long p_hs, long p_rs,
           const float *v, long v_hs, long v_rs,
           float *out, long o_hs, long o_rs)
{
    const int avx = __builtin_cpu_supports("avx");
    for (long h = 0; h < heads; h++) {
        for (long r0 = 0; r0 < rows; r0 += 6) {
            long rb = rows - r0 < 6 ? rows - r0 : 6;
            const float *ph = p + h * p_hs + r0 * p_rs;
            float *oh = out + h * o_hs + r0 * o_rs;
            const float *vh = v + h * v_hs;
            long c16 = dv - dv % 16;
            for (long r = 0; r < rb; r++) memset(oh + r * o_rs, 0, (size_t)c16 * sizeof(float));
            /* blocks of V rows small enough to stay in cache while every column is done */
            for (long j0 = 0; j0 < n; j0 += PV_BLOCK) {
                long nb = n - j0 < PV_BLOCK ? n - j0 : PV_BLOCK;
                /* the next block's rows, while this one is computed */
                for (long j = j0 + PV_BLOCK; j < j0 + PV_BLOCK + nb && j < n; j++)
                    for (long c = 0; c < dv; c += 16) __builtin_prefetch(vh + j * v_rs + c);
                for (long c = 0; c < c16; c += 16) {
                    if (avx)
                        pv_block_avx(rb, ph + j0, p_rs, nb, vh + j0 * v_rs + c, v_rs, oh + c, o_rs);
                    else
                        pv_block_sse(rb, ph + j0, p_rs, nb, vh + j0 * v_rs + c, v_rs, oh + c, o_rs);
                }
            }
            long c = c16;
            for (; c < dv; c++) {
                for (long r = 0; r < rb; r++) {
                    float acc = 0.0f;
                    for (long j = 0; j < n; j++) acc = ph[r * p_rs + j] * vh[j * v_rs + c] + acc;
                    oh[r * o_rs + c] = acc;
                }
            }
        }
    }
}
