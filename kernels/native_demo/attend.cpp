// kvdemo: attention over page sources (see attend.h).
#include "attend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvdemo {

namespace {

constexpr int PAGE = 256;

// every row of one plane (K or V) of the served pages, as float [n_kv][heads][D]
std::vector<float> dequantize(const ggml_tensor * t, const std::vector<PageSource> & pages, bool v_plane) {
    const int64_t d = t->ne[0], n_kv = t->ne[1], heads = t->ne[2];
    const auto * traits = ggml_get_type_traits(t->type);
    std::vector<float> out((size_t) (n_kv * heads * d));
    for (int64_t c = 0; c < n_kv; ++c) {
        const PageSource & p = pages[(size_t) (c / PAGE)];
        const uint8_t * token = (v_plane ? p.v : p.k) + (c % PAGE) * t->nb[1];
        for (int64_t h = 0; h < heads; ++h) {
            float * dst = out.data() + (c * heads + h) * d;
            const uint8_t * row = token + h * t->nb[2];
            if (t->type == GGML_TYPE_F32) {
                std::memcpy(dst, row, (size_t) d * sizeof(float));
            } else {
                traits->to_float(row, dst, d);
            }
        }
    }
    return out;
}

float dot(const float * a, const float * b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) {
        s0 += a[i] * b[i];
    }
    return (s0 + s1) + (s2 + s3);
}

}  // namespace

void attend(const ggml_tensor * dst, int view, const std::vector<PageSource> & pages, float * out) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    float scale;
    std::memcpy(&scale, dst->op_params, sizeof(float));
    const int64_t d = q->ne[0], tokens = q->ne[1], n_head = q->ne[2], n_kv = k->ne[1];
    const int64_t dv = v->ne[0], gqa = n_head / k->ne[2];
    const std::vector<float> kf = dequantize(k, pages, false);
    const std::vector<float> vf = dequantize(v, pages, true);
    std::vector<float> score((size_t) n_kv);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < tokens; ++t) {
        const auto * mrow = reinterpret_cast<const ggml_fp16_t *>(
            static_cast<const uint8_t *>(mask->data) + t * mask->nb[1] + (view % mask->ne[3]) * mask->nb[3]);
        for (int64_t h = 0; h < n_head; ++h) {
            const auto * qrow = reinterpret_cast<const float *>(
                static_cast<const uint8_t *>(q->data) + t * q->nb[1] + h * q->nb[2] + view * q->nb[3]);
            const int64_t kvh = h / gqa;
            float best = neg_inf;
            for (int64_t c = 0; c < n_kv; ++c) {
                const float m = ggml_fp16_to_fp32(mrow[c]);
                score[(size_t) c] = m == neg_inf ? neg_inf
                                                 : scale * dot(qrow, kf.data() + (c * k->ne[2] + kvh) * d, d) + m;
                best = std::max(best, score[(size_t) c]);
            }
            float * o = out + (t * n_head + h) * dv;
            std::fill(o, o + dv, 0.0f);
            if (best == neg_inf) {
                continue;  // a token that sees no cell (a stream without tokens in this ubatch)
            }
            float sum = 0.0f;
            for (int64_t c = 0; c < n_kv; ++c) {
                if (score[(size_t) c] == neg_inf) {
                    continue;
                }
                const float p = std::exp(score[(size_t) c] - best);
                sum += p;
                const float * vrow = vf.data() + (c * v->ne[2] + kvh) * dv;
                for (int64_t e = 0; e < dv; ++e) {
                    o[e] += p * vrow[e];
                }
            }
            for (int64_t e = 0; e < dv; ++e) {
                o[e] /= sum;
            }
        }
    }
}

uint32_t crc32(uint32_t crc, const void * data, size_t n) {
    static uint32_t table[256];
    static bool ready = false;
    if (!ready) {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int j = 0; j < 8; ++j) {
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            }
            table[i] = c;
        }
        ready = true;
    }
    const auto * p = static_cast<const uint8_t *>(data);
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) {
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    }
    return ~crc;
}

}  // namespace kvdemo
