// Device-side event ring: kernels append fixed 32-byte records that the host drains after
// each step (kvdiag/executors/device_records.py decodes them). With -D KVDIAG_INSTRUMENT=0 every
// append compiles to nothing, which is how the benchmark measures the ring's cost.
//
// Record (8 x int32): kernel, block, layer, stream, page, source, slot, aux.
//   source: 0 = resident pool slot, 1 = ring slot, 2 = host store (zero-copy)
//   slot:   pool slot index, -1 for the host store
//   aux:    fattn: the KV head; set_rows: the stream-local page (page holds the global-row page)
// A full ring keeps counting, so the host can report how many records were dropped.
#pragma once
#include "kvdiag_platform.cuh"

enum KvKernelId {
    KV_KERNEL_FATTN_STREAMED = 1,
    KV_KERNEL_FATTN_ORDINARY = 2,
    KV_KERNEL_SET_ROWS_K = 3,
    KV_KERNEL_SET_ROWS_V = 4,
};

enum KvSource { KV_SRC_POOL = 0, KV_SRC_RING = 1, KV_SRC_HOST = 2 };

struct KvRing {
    kv_u32* counter;   // records appended since the last drain (may exceed capacity)
    kv_i32* records;   // capacity x 8 int32
    kv_u32 capacity;
};

KV_DEV void kv_ring_put(const KvRing& ring, int kernel, int block, int layer, int stream, int page,
                        int source, int slot, int aux) {
#if KVDIAG_INSTRUMENT
    if (ring.records == nullptr) return;
    const kv_u32 idx = kv_atomic_add(ring.counter, 1u);
    if (idx >= ring.capacity) return;
    kv_v4* rec = (kv_v4*)(ring.records + (kv_u64)idx * 8u);
    rec[0] = kv_v4{(kv_u32)kernel, (kv_u32)block, (kv_u32)layer, (kv_u32)stream};
    rec[1] = kv_v4{(kv_u32)page, (kv_u32)source, (kv_u32)slot, (kv_u32)aux};
#else
    (void)ring; (void)kernel; (void)block; (void)layer; (void)stream; (void)page;
    (void)source; (void)slot; (void)aux;
#endif
}
