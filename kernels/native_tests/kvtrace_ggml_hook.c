/* kvtrace.h with a real ggml (C11): KVTRACE_FITS on a real GGML_OP_FLASH_ATTN_EXT node over
 * ggml_view_4d views, all in a real backend buffer (ggml-base's CPU buffer type), then a
 * failing GGML_ASSERT through the abort hook.
 * tests/test_native_header.py builds it against the ggml-base that tests/native_build.py
 * caches, and runs it with and without a callback installed before the hook ("prior").
 *
 * SPDX-License-Identifier: MIT
 */
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "kvtrace.h"

#include <stdio.h>
#include <string.h>

static int prior_calls;

static void prior(const char *message) {
    prior_calls++;
    fprintf(stderr, "prior callback %d: %s\n", prior_calls, message);
}

int main(int argc, char **argv) {
    static const char *const failed[2] = {"Q->ne[3] == 1", "K->ne[3] == 1"};
    struct ggml_init_params params = {1u << 20, NULL, true}; /* tensors go in a buffer */
    struct ggml_context *ctx = ggml_init(params);
    /* K/V cache of one layer: 1024 q8_0 values per cell (4 heads x 256), 512 cells, 2 streams;
     * the per-stream 4-D view of stream 1 starts at nb[2] of the 3-D tensor */
    struct ggml_tensor *cache = ggml_new_tensor_3d(ctx, GGML_TYPE_Q8_0, 1024, 512, 2);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 256, 1, 24, 1);
    struct ggml_tensor *k, *v, *fa;
    ggml_set_name(cache, "cache_k_l0");
    ggml_set_name(q, "Qcur-0");
    k = ggml_view_4d(ctx, cache, 256, 512, 4, 1, cache->nb[1], 272, cache->nb[2], cache->nb[2]);
    v = ggml_view_4d(ctx, cache, 256, 512, 4, 1, cache->nb[1], 272, cache->nb[2], 0);
    fa = ggml_flash_attn_ext(ctx, q, k, v, NULL, 0.0625f, 0.0f, 0.0f);
    ggml_set_name(fa, "__fattn__-0");
    /* allocates cache, q and the node, and points the views into the same buffer */
    if (ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type()) == NULL)
        return 3;
    if (argc > 1 && strcmp(argv[1], "prior") == 0) ggml_set_abort_callback(prior);
    KVTRACE_INSTALL_ABORT_HOOK();
    KVTRACE_INSTALL_ABORT_HOOK(); /* a second install must not make the hook its own prior */
    KVTRACE_FITS(fa, 0, 0, "abort", failed, 2, (void *)0x5000, (void *)0x5000);
    KVTRACE_FITS(fa, -1, 1, "streamed", NULL, 0, (void *)0x5000, NULL);
    printf("cache=%llu k=%llu v=%llu\n", (unsigned long long)(uintptr_t)cache->data,
           (unsigned long long)(uintptr_t)k->data, (unsigned long long)(uintptr_t)v->data);
    fflush(stdout);
    GGML_ASSERT(ggml_nelements(k) == 1 && "kvtrace hook test");
    return 0;
}
