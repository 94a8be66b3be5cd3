/* What the header line's "records" declares: the kinds of the macros compiled into the process.
 * tests/test_native_header.py builds this program (C99) in three ways with the C++ shared object
 * kvtrace_records_dso.cpp (-fvisibility=hidden):
 *
 *   -DKVREC_LINKED         linked against the shared object: its kinds are in the header line
 *   (plain)  dlopen PATH   the shared object is dlopen()ed after the header line: a `records`
 *                          event adds its kinds
 *   -DKVTRACE_NO_SECTIONS  no sections: only what KVTRACE_DECLARE names is declared; with
 *                          argument "undeclared" nothing is, and the header has no "records"
 *
 * The program writes step, write and read; an invalidate is compiled in but never runs (it is
 * still a kind the process can write).
 *
 * SPDX-License-Identifier: MIT
 */
#include "kvtrace.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

void kvrec_dso_emit(int layer);

int main(int argc, char **argv) {
    static const int32_t streams[1] = {0};
    const char *mode = argc > 1 ? argv[1] : "";
    kvtrace_plan plan;
    kvtrace_read r;
#ifdef KVTRACE_NO_SECTIONS
    if (strcmp(mode, "undeclared") != 0) KVTRACE_DECLARE("step, write read");
#endif
    kvtrace_plan_defaults(&plan);
    plan.run_name = "records";
    KVTRACE_BOOT(&plan);
    KVTRACE_STEP("decode", streams, 1, 1, 256);
    KVTRACE_WRITE(0, 0, 10, 11, 10, 11, NULL, 0);
    KVTRACE_READ_BEGIN(&r, 0, 0);
    KVTRACE_READ_PAGE(&r, 0, KVTRACE_HOST, -1);
    KVTRACE_READ_END(&r);
    if (strcmp(mode, "invalidate") == 0) KVTRACE_INVALIDATE("buffer-clear", 1);
#ifdef KVREC_LINKED
    kvrec_dso_emit(0);
#else
    if (strcmp(mode, "dlopen") == 0 && argc > 2) {
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        void (*emit)(int);
        if (!lib) {
            fprintf(stderr, "%s\n", dlerror());
            return 3;
        }
        *(void **)(&emit) = dlsym(lib, "kvrec_dso_emit");
        if (!emit) return 4;
        emit(1);
    }
#endif
#ifdef KVTRACE_NO_SECTIONS
    if (strcmp(mode, "late") == 0) KVTRACE_DECLARE("adapt nonsense");
#endif
    return 0;
}
