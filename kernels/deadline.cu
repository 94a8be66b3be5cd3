// Deadline sampling, as the runtime samples its transfer ring (domain brief §1.6): after each
// upload the copy stream publishes the upload's sequence number; just before the attention
// waits for that copy, a one-thread kernel on the compute stream reads the published number.
// Still below the upload's own number means the copy had not landed when the consumer arrived:
// a missed deadline. counters[0] counts samples, counters[1] misses.
#include "kvdiag_platform.cuh"

extern "C" __global__ void kv_publish(kv_u32* flag, kv_u32 seq) {
    *((volatile kv_u32*)flag) = seq;
}

extern "C" __global__ void kv_deadline_sample(const kv_u32* flag, kv_u32 seq, kv_u32* counters) {
    const kv_u32 seen = *((const volatile kv_u32*)flag);
    counters[0] += 1u;
    if (seen < seq) counters[1] += 1u;
}
