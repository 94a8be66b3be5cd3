// The smallest use of kvtrace.h (what `kvdiag native --example` prints). Build and run:
//   g++ -std=c++17 -O2 -I "$(kvdiag native --include-dir)" kvtrace_example.cpp -o kvtrace_example -pthread
//   KVTRACE_FILE=example_%p.kvtrace ./kvtrace_example && kvdiag trace validate example_*.kvtrace
// Without KVTRACE_FILE every macro is one untaken branch and no file is written.
// In a runtime that includes ggml.h before kvtrace.h, the dispatcher logs its decision with
//   KVTRACE_FITS(dst, layer, fits_ok, fits_ok ? "streamed" : "fallback", nullptr, 0, k_rt, v_rt);
// and KVTRACE_INSTALL_ABORT_HOOK() records GGML_ASSERT failures (docs/native-bridge.md).
#include "kvtrace.h"

int main() {
    kvtrace_plan plan;
    kvtrace_plan_defaults(&plan);     // every field "unknown" (left out of the header)
    plan.run_name = "example";
    plan.page_bytes = 73728;
    plan.stage_bytes = 73728;
    plan.np = 1;
    KVTRACE_BOOT(&plan);              // header line: once, before any event

    const int32_t streams[1] = {0};
    KVTRACE_STEP("decode", streams, 1, /*tokens*/ 1, /*n_kv*/ 512);
    const int32_t dirty[1][3] = {{0, -1, 1}};   // {layer, stream (-1 = shared key), page}
    KVTRACE_WRITE(0, 0, /*cells*/ 300, 301, /*rows*/ 300, 301, dirty, 1);
    KVTRACE_UPLOAD(0, 0, /*pages*/ 0, 2, /*slot*/ 0, "resident", 2 * 73728, "miss", -1);

    kvtrace_read r;                   // one read event: pages 0-1 from the pool, 2 from host
    KVTRACE_READ_BEGIN(&r, 0, 0);
    KVTRACE_READ_PAGE(&r, 0, KVTRACE_POOL, 0);
    KVTRACE_READ_PAGE(&r, 1, KVTRACE_POOL, 1);
    KVTRACE_READ_PAGE(&r, 2, KVTRACE_HOST, -1);
    KVTRACE_READ_END(&r);

    KVTRACE_END("completed");         // also written at exit if never called
    return 0;
}
