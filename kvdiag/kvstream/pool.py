"""Pool sizing inside ``ggml_backend_cuda_kv_stream_runtime_new_for_device`` (brief §1.4).

One ``cudaMalloc`` of ``pool_bytes`` is split into ``pool_pages`` page slots: a transfer ring
(the first ``ring_slots`` slots) and ``resident_pages_per_layer`` slots for every streamed
layer. The conversion workspace of the F16 mode sits at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_RING_SLOTS = 8


class PoolError(ValueError):
    """The runtime constructor would refuse this pool (it returns no runtime)."""


@dataclass(frozen=True)
class PoolPlan:
    pool_bytes: int
    page_bytes: int
    conversion_bytes: int
    layer_count: int
    pool_pages: int
    min_ring_slots: int
    resident_pages_per_layer: int
    ring_slots: int

    @property
    def staging_bytes(self) -> int:
        return self.pool_bytes - self.conversion_bytes

    @property
    def resident_tokens_per_layer(self) -> int:
        return self.resident_pages_per_layer * 256


def plan_pool(
    pool_bytes: int,
    page_bytes: int,
    layer_count: int,
    conversion_bytes: int = 0,
    fixed_ring_slots: int | None = None,
) -> PoolPlan:
    """Steps 1–5 of the constructor. ``fixed_ring_slots`` models
    ``GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS`` (must be ≥ 1 and < pool_pages)."""
    if page_bytes <= 0:
        raise PoolError("page_bytes is 0")
    if layer_count <= 0:
        raise PoolError("no streamed layers")
    if conversion_bytes > pool_bytes:
        raise PoolError(
            f"conversion workspace {conversion_bytes} B exceeds the pool ({pool_bytes} B)"
        )
    staging = pool_bytes - conversion_bytes
    if staging // page_bytes <= layer_count:
        raise PoolError(
            f"pool of {staging // page_bytes} pages cannot hold one page per layer for "
            f"{layer_count} layers plus a ring"
        )
    pool_pages = staging // page_bytes
    min_slots = min(DEFAULT_MIN_RING_SLOTS, pool_pages - layer_count)
    if fixed_ring_slots is not None:
        if not 1 <= fixed_ring_slots < pool_pages:
            raise PoolError(
                f"invalid GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS={fixed_ring_slots} "
                f"for {pool_pages} pool pages"
            )
        min_slots = fixed_ring_slots
    resident = (pool_pages - min_slots) // layer_count
    if resident <= 0:
        raise PoolError(f"ring of {min_slots} slots leaves no resident page per layer")
    return PoolPlan(
        pool_bytes=pool_bytes,
        page_bytes=page_bytes,
        conversion_bytes=conversion_bytes,
        layer_count=layer_count,
        pool_pages=pool_pages,
        min_ring_slots=min_slots,
        resident_pages_per_layer=resident,
        ring_slots=pool_pages - resident * layer_count,
    )
