/* kvrt's shape, shared by the program (kvrt.c) and its C++ shared object (kvrt_ring.cpp).
 * 3 layers x 2 streams x 2048 cells in pages of 256; a pool of 16 slots: the ring (0..3), then
 * 4 resident slots per layer (pool_pages = layers x resident_pages_per_layer + ring_slots).
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef KVRT_H
#define KVRT_H

#define LAYERS 3
#define STREAMS 2
#define KV_SIZE 2048
#define PAGE_TOKENS 256
#define PAGES (KV_SIZE / PAGE_TOKENS)
#define RESIDENT_PER_LAYER 4
#define RING_SLOTS 4
#define POOL_SLOTS (RING_SLOTS + LAYERS * RESIDENT_PER_LAYER)

#ifdef __cplusplus
extern "C" {
#endif
/* copy n pages of page_bytes from the host store (src) into ring slots from `slot` (dst), and
 * record the upload */
typedef void (*kvrt_ring_fn)(const void *src, void *dst, int page_bytes, int layer, int stream,
                             int page0, int n, int slot);
/* the resident cache's layer-identity learn: first sight of a K view pointer */
typedef void (*kvrt_learn_fn)(int layer, const void *k_ptr);
#ifdef __cplusplus
}
#endif

#endif
