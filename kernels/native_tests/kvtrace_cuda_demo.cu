// kvtrace.h from a .cu file: a trivial kernel plus a step, a fits decision (RAW form, no ggml),
// an upload, a read and the end event, all written by host code around the launch.
//
// Build (tests/test_native_header.py compiles it; the lead runs it on a GPU):
//   nvcc -std=c++17 -O2 -I kernels -o kvtrace_cuda_demo kernels/native_tests/kvtrace_cuda_demo.cu
// Run:
//   KVTRACE_FILE=demo_%p.kvtrace ./kvtrace_cuda_demo && kvdiag trace validate demo_*.kvtrace
// Exit status: 0 when the kernel ran and its result is right, 1 on a CUDA error or a wrong
// result (the trace then ends "error" with the CUDA error text in a warn event).
//
// SPDX-License-Identifier: MIT
#include "kvtrace.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

__global__ void add_one(int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

static int fail(const char *what, cudaError_t err) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    KVTRACE_WARN("cuda-error", cudaGetErrorString(err));
    KVTRACE_END_REASON("error", what);
    return 1;
}

int main() {
    const int n = 1024;
    const int32_t streams[1] = {0};
    int *d = nullptr;
    int host[n];
    cudaDeviceProp prop;
    std::memset(&prop, 0, sizeof prop);
    cudaError_t err = cudaGetDeviceProperties(&prop, 0);

    kvtrace_plan plan;
    kvtrace_plan_defaults(&plan);
    plan.run_name = "kvtrace_cuda_demo";
    plan.build = "kernels/native_tests/kvtrace_cuda_demo.cu";
    plan.device_name = err == cudaSuccess ? prop.name : "unknown";
    plan.np = 1;
    plan.kv_unified = 1;
    plan.page_bytes = 73728;
    plan.stage_bytes = 73728;
    KVTRACE_BOOT(&plan);
    if (err != cudaSuccess) return fail("cudaGetDeviceProperties", err);

    KVTRACE_STEP("decode", streams, 1, 1, n);
    kvtrace_tensor t[4];
    std::memset(t, 0, sizeof t);
    const char *names[4] = {"q", "k", "v", "dst"};
    for (int i = 0; i < 4; i++) {
        t[i].name = names[i];
        t[i].type = i == 1 ? "q8_0" : i == 2 ? "q5_1" : "f32";
        t[i].buffer = (i == 1 || i == 2) ? "CUDA_KV_Stream_Host" : "CUDA0";
        t[i].ne[0] = 256; t[i].ne[1] = n; t[i].ne[2] = 4; t[i].ne[3] = 1;
        t[i].contiguous = 1;
    }
    for (int i = 0; i < n; i++) host[i] = i;
    if ((err = cudaMalloc(&d, sizeof host)) != cudaSuccess) return fail("cudaMalloc", err);
    t[3].data = (uint64_t)(uintptr_t)d;
    KVTRACE_FITS_RAW("demo_fattn", 0, &t[0], &t[1], &t[2], nullptr, &t[3], 1, "streamed",
                     nullptr, 0);
    if ((err = cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice)) != cudaSuccess)
        return fail("cudaMemcpy H2D", err);
    KVTRACE_UPLOAD(0, 0, 0, 1, 0, "resident", sizeof host, "miss", 0);
    add_one<<<(n + 255) / 256, 256>>>(d, n);
    if ((err = cudaGetLastError()) != cudaSuccess) return fail("launch", err);
    if ((err = cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy D2H", err);
    kvtrace_read r;
    KVTRACE_READ_BEGIN(&r, 0, 0);
    KVTRACE_READ_PAGE(&r, 0, KVTRACE_POOL, 0);
    KVTRACE_READ_END(&r);
    cudaFree(d);
    for (int i = 0; i < n; i++) {
        if (host[i] != i + 1) {
            std::fprintf(stderr, "wrong result at %d: %d\n", i, host[i]);
            KVTRACE_END_REASON("error", "wrong kernel result");
            return 1;
        }
    }
    std::printf("kvtrace_cuda_demo: kernel ok on %s\n", prop.name);
    KVTRACE_END("completed");
    return 0;
}
