/* One writer per process across shared objects: built three times by
 * tests/test_native_header.py, as libkvt_a.so (-DKVT_PART=1), libkvt_b.so (-DKVT_PART=2), both
 * with -fvisibility=hidden, and as the program (no KVT_PART) linked against both. Each part
 * includes kvtrace.h and writes warn events; the trace must hold one header and one seq
 * sequence, as when libggml-cuda.so and libllama.so both include the header.
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#if defined(KVT_PART)
__attribute__((visibility("default"))) void kvt_part_emit(int n);
#if KVT_PART == 1
#define kvt_part_emit kvt_a_emit
#define KVT_CODE "part-a"
#else
#define kvt_part_emit kvt_b_emit
#define KVT_CODE "part-b"
#endif
__attribute__((visibility("default"))) void kvt_part_emit(int n) {
    int i;
    for (i = 0; i < n; i++) KVTRACE_WARN(KVT_CODE, "from a shared object");
}
#else
#include <stdlib.h>
void kvt_a_emit(int n);
void kvt_b_emit(int n);
int main(int argc, char **argv) {
    int i, n = argc > 1 ? atoi(argv[1]) : 10;
    KVTRACE_WARN("main", "from the program");
    for (i = 0; i < n; i++) {
        kvt_a_emit(1);
        kvt_b_emit(1);
        KVTRACE_WARN("main", "from the program");
    }
    return 0;
}
#endif
