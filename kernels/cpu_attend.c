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

/* P.V one V row pair at a time: each output row stays in cache and gets
 * out = p[j]*v[j] + out, then out = p[j+1]*v[j+1] + out, for ascending j; V streams through
 * once per head. With AVX one register holds 8 columns; a lane's arithmetic is the same at
 * any width, and the columns past the last full register are done one by one. */
typedef float v8sf __attribute__((vector_size(32)));

#define PV_HEAD(VEC, LANES, TARGET, SUFFIX)                                                  \
    TARGET static void pv_head##SUFFIX(long rows, long n, long dv, const float *p,          \
                                       long p_rs, const float *v, long v_rs, float *out,     \
                                       long o_rs)                                            \
    {                                                                                        \
        long cv = dv - dv % LANES;                                                           \
        for (long r = 0; r < rows; r++) memset(out + r * o_rs, 0, (size_t)dv * sizeof(float)); \
        long j = 0;                                                                          \
        for (; j + 2 <= n; j += 2) {                                                         \
            const float *v0 = v + j * v_rs, *v1 = v0 + v_rs;                                 \
            for (long r = 0; r < rows; r++) {                                                \
                float s0 = p[r * p_rs + j], s1 = p[r * p_rs + j + 1];                        \
                VEC a0, a1;                                                                  \
                for (int l = 0; l < LANES; l++) {                                            \
                    a0[l] = s0;                                                              \
                    a1[l] = s1;                                                              \
                }                                                                            \
                float *o = out + r * o_rs;                                                   \
                for (long c = 0; c < cv; c += LANES) {                                       \
                    VEC x, b0, b1;                                                           \
                    memcpy(&x, o + c, sizeof x);                                             \
                    memcpy(&b0, v0 + c, sizeof b0);                                          \
                    memcpy(&b1, v1 + c, sizeof b1);                                          \
                    x = a0 * b0 + x;                                                         \
                    x = a1 * b1 + x;                                                         \
                    memcpy(o + c, &x, sizeof x);                                             \
                }                                                                            \
                for (long c = cv; c < dv; c++) {                                             \
                    o[c] = s0 * v0[c] + o[c];                                                \
                    o[c] = s1 * v1[c] + o[c];                                                \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (; j < n; j++) {                                                                 \
            const float *v0 = v + j * v_rs;                                                  \
            for (long r = 0; r < rows; r++) {                                                \
                float s0 = p[r * p_rs + j];                                                  \
                float *o = out + r * o_rs;                                                   \
                for (long c = 0; c < dv; c++) o[c] = s0 * v0[c] + o[c];                      \
            }                                                                                \
        }                                                                                    \
    }

PV_HEAD(v4sf, 4, , _sse)
PV_HEAD(v8sf, 8, __attribute__((target("avx"))), _avx)

/* out[h, r, c] = sum over j in order of P[h, r, j] * V[h, j, c], for h < heads, r < rows,
 * c < dv (strides in floats; the last axis of each operand is contiguous). */
void kv_pv(long heads, long rows, long n, long dv,
           const float *p, long p_hs, long p_rs,
           const float *v, long v_hs, long v_rs,
           float *out, long o_hs, long o_rs)
{
    const int avx = __builtin_cpu_supports("avx");
    for (long h = 0; h < heads; h++) {
        if (avx)
            pv_head_avx(rows, n, dv, p + h * p_hs, p_rs, v + h * v_hs, v_rs, out + h * o_hs, o_rs);
        else
            pv_head_sse(rows, n, dv, p + h * p_hs, p_rs, v + h * v_hs, v_rs, out + h * o_hs, o_rs);
    }
}
