"""The largest values the real runtime can hold, for every shape flag ``plan`` and ``capture``
take; a value past one is refused with the limit and where it comes from, before any sizing
(``plan --ctx 99999999999999999999`` once printed "OK" with a host buffer of 7e17 MiB).

Sources (ggml-org/llama.cpp unless stated; the G1 fork builds on the same files):

- ``common/common.h``: ``common_params`` holds ``n_ctx``, ``n_ubatch`` and ``n_parallel`` as
  ``int32_t``, and ``common/arg.cpp`` parses ``-c``, ``-ub`` and ``-np`` with its ``int``
  handler, so none can exceed INT32_MAX;
- ``src/llama-cparams.h``: ``LLAMA_MAX_SEQ`` is 256; ``llama_init_from_model`` refuses a
  larger ``n_seq_max`` ("n_seq_max must be <= 256");
- ``src/llama-hparams.h``: ``LLAMA_MAX_LAYERS`` is 512 (the per-layer arrays ``n_head_arr``,
  ``n_head_kv_arr``, ... have that length) and those arrays hold ``uint32_t``; ``n_embd_head_k``
  is ``uint32_t`` and ``n_embd_k_gqa()`` (head dim × KV heads) returns ``uint32_t``;
- ``--kv-stream-stage-mib`` (brief §1.1) is a numeric server flag like the others, parsed by
  the same ``int`` handler **[inference: the flag's parser is not quoted in the brief]**;
- ggml sizes a buffer in ``size_t`` and a tensor's elements in ``int64_t`` (``ggml.h``), so
  the ``CUDA_KV_Stream_Host`` buffer (brief §1.3, derived size) must stay below 2^63 bytes.
"""

from __future__ import annotations

from typing import Final

INT32_MAX: Final = 2**31 - 1
UINT32_MAX: Final = 2**32 - 1
LLAMA_MAX_SEQ: Final = 256
LLAMA_MAX_LAYERS: Final = 512
MAX_BUFFER_BYTES: Final = 2**63 - 1

#: flag → (largest value, where the limit comes from)
SHAPE_LIMITS: Final[dict[str, tuple[int, str]]] = {
    "ctx": (INT32_MAX, "llama.cpp keeps -c in an int32_t (common_params.n_ctx)"),
    "np": (LLAMA_MAX_SEQ, "llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h)"),
    "ubatch": (INT32_MAX, "llama.cpp keeps -ub in an int32_t (common_params.n_ubatch)"),
    "layers": (LLAMA_MAX_LAYERS, "llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h)"),
    "streamed-layers": (LLAMA_MAX_LAYERS, "llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h)"),
    "head-dim": (UINT32_MAX, "llama_hparams keeps the head dimension in a uint32_t"),
    "n-head": (UINT32_MAX, "llama_hparams keeps head counts in uint32_t (n_head_arr)"),
    "n-head-kv": (UINT32_MAX, "llama_hparams keeps head counts in uint32_t (n_head_kv_arr)"),
    "stage-mib": (INT32_MAX, "the server parses --kv-stream-stage-mib as an int"),
    "ring-slots": (INT32_MAX, "GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS is read as an int "
                              "[inference]"),
}


def over_limit(flag: str, value: int) -> str | None:
    """The refusal for ``--flag value`` past its limit, or None."""
    limit, why = SHAPE_LIMITS[flag]
    if value > limit:
        return f"--{flag} {value} is more than the runtime can hold: at most {limit:,} ({why})"
    return None
