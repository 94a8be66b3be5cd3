"""Tensor geometry as ggml describes it: type, ``ne`` (elements per dim), ``nb`` (byte strides).

``ne[0]`` is the innermost dimension; ``nb[i]`` is the byte stride of dimension ``i``
(ggml.h, ``struct ggml_tensor``).
"""

from __future__ import annotations

import msgspec

Shape4 = tuple[int, int, int, int]


class Tensor(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One ggml tensor (or view) as seen by an op: what ``fits()`` and the dispatcher inspect.

    ``buffer`` is the buffer type name (``CUDA0``, ``CUDA_KV_Stream_Host``, ...); ``runtime``
    is the kv-stream runtime id that ``runtime_from_tensor`` would return (None = not
    streamed); ``data`` is the data pointer (views include their byte offset).
    """

    name: str
    type: str
    ne: Shape4
    nb: Shape4
    data: int = 0
    buffer: str = ""
    runtime: int | None = None
    contiguous: bool = True
    buffer_name: str = ""
    """``ggml_backend_buffer_name`` of the tensor's buffer, where the writer knew it (1.1)."""
    view_offs: int = 0
    """ggml's ``view_offs``: byte offset of a view into its source (1.1)."""
    base: int = 0
    """Data pointer of the view's source tensor (or of the tensor itself), 0 = unknown (1.1)."""
