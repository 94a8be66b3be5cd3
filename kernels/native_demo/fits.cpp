// kvdemo: the fits() predicate over the real node (see fits.h).
#include "fits.h"

namespace kvdemo {

namespace {

constexpr int64_t KV_STREAM_HEAD_DIM = 256;  // §1.9
constexpr int64_t FATTN_KQ_STRIDE = 256;      // §2.2 (fattn-common.cuh)

// §1.7: the type pairs the streamed kernel can attend over (both G1 modes: DIRECT for
// the direct_attention types, F16 for the decode_f16 storage types); UNSUPPORTED otherwise.
bool mode_supported(ggml_type k, ggml_type v) {
    auto storable = [](ggml_type t) {
        switch (t) {
            case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
            case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0:
            case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL:
                return true;
            default:
                return false;
        }
    };
    return storable(k) && storable(v);
}

// ggml_row_size when ne[0] fills whole blocks, else -1 (no row size can match)
int64_t row_size(const ggml_tensor * t) {
    return t->ne[0] % ggml_blck_size(t->type) == 0 ? (int64_t) ggml_row_size(t->type, t->ne[0]) : -1;
}

// kv_stream_block_tokens (§2.2): the largest multiple of 256 <= n_kv whose K bytes (all KV
// heads, padded to 128) plus V bytes fit in stage_bytes; 0 if none
int64_t block_tokens(const ggml_tensor * k, const ggml_tensor * v, int64_t stage_bytes) {
    const int64_t rk = row_size(k) * k->ne[2];
    const int64_t rv = row_size(v) * v->ne[2];
    if (rk <= 0 || rv <= 0) {
        return 0;
    }
    for (int64_t tokens = k->ne[1] / PAGE_TOKENS * PAGE_TOKENS; tokens > 0; tokens -= PAGE_TOKENS) {
        const int64_t kb = (rk * tokens + V_ALIGN - 1) / V_ALIGN * V_ALIGN;
        if (kb + rv * tokens <= stage_bytes) {
            return tokens;
        }
    }
    return 0;
}

void layout_conditions(const char * n, const ggml_tensor * t, std::vector<std::pair<std::string, bool>> & out) {
    const std::string name(n);
    const int64_t row = row_size(t);
    out.emplace_back(name + ".nb[0]==type_size", (int64_t) t->nb[0] == (int64_t) ggml_type_size(t->type));
    out.emplace_back(name + ".nb[1]>=row_size", (int64_t) t->nb[1] >= row);
    out.emplace_back(name + ".nb[1]==row_size*" + name + ".ne[2]", (int64_t) t->nb[1] == row * t->ne[2]);
    out.emplace_back(name + ".nb[2]==row_size", (int64_t) t->nb[2] == row);
}

}  // namespace

FitsResult evaluate_fits(const ggml_tensor * dst) {
    // §2.1 step 1 is an assert, not a return
    GGML_ASSERT(dst != nullptr && dst->op == GGML_OP_FLASH_ATTN_EXT);
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];
    GGML_ASSERT(q && k && v);

    FitsResult r;
    r.k_runtime = runtime_from_tensor(k);
    r.v_runtime = runtime_from_tensor(v);
    std::vector<std::pair<std::string, bool>> c;
    c.emplace_back("K.runtime!=NULL", r.k_runtime != nullptr);
    c.emplace_back("V.runtime!=NULL", r.v_runtime != nullptr);
    if (r.k_runtime && r.v_runtime) {
        c.emplace_back("K.runtime==V.runtime", r.k_runtime == r.v_runtime);
    }
    const int64_t stage_bytes = r.k_runtime ? r.k_runtime->stage_bytes : 0;
    c.emplace_back("Q.type==f32", q->type == GGML_TYPE_F32);
    c.emplace_back("mode(K,V)!=UNSUPPORTED", mode_supported(k->type, v->type));
    c.emplace_back("Q.ne[0]==256", q->ne[0] == KV_STREAM_HEAD_DIM);
    c.emplace_back("V.ne[0]==256", v->ne[0] == KV_STREAM_HEAD_DIM);
    c.emplace_back("Q.ne[1]>=1", q->ne[1] >= 1);
    c.emplace_back("Q.ne[3]==1", q->ne[3] == 1);
    c.emplace_back("K.ne[3]==1", k->ne[3] == 1);
    c.emplace_back("V.ne[3]==1", v->ne[3] == 1);
    c.emplace_back("K.ne[1]==V.ne[1]", k->ne[1] == v->ne[1]);
    c.emplace_back("K.ne[2]==V.ne[2]", k->ne[2] == v->ne[2]);
    c.emplace_back("K.ne[1]%256==0", k->ne[1] % FATTN_KQ_STRIDE == 0);
    layout_conditions("K", k, c);
    layout_conditions("V", v, c);
    c.emplace_back("mask.type==f16", mask == nullptr || mask->type == GGML_TYPE_F16);
    c.emplace_back("mask.contiguous", mask == nullptr || ggml_is_contiguous(mask));
    c.emplace_back("sinks==NULL", sinks == nullptr);
    c.emplace_back("block_tokens(stage_bytes)>0", block_tokens(k, v, stage_bytes) > 0);
    for (const auto & [name, ok] : c) {
        if (!ok) {
            r.failed.push_back(name);
        }
    }
    r.ok = r.failed.empty();
    return r;
}

bool kv_stream_fattn_fits(const ggml_tensor * dst) {
    return evaluate_fits(dst).ok;
}

}  // namespace kvdemo
