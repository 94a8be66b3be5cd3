"""The FLASH_ATTN_EXT dispatcher in ``ggml_cuda_compute_forward`` (brief §3).

``membership`` is upstream: route to ``ggml_cuda_kv_stream_fattn`` when K or V sits in a
kv-stream buffer, which then asserts fits() — a non-fitting node aborts the process.
``fits`` is the arm117 fix (ef3b119f): route on the full predicate; a member node that does
not fit runs the ordinary ``ggml_cuda_flash_attn_ext`` reading the host-mapped buffer
zero-copy, with a warning.
"""

from __future__ import annotations

from kvdiag.kvstream.config import Dispatch
from kvdiag.kvstream.fits import FitsResult
from kvdiag.model.events import Route

FITS_ASSERT = "ggml_cuda_kv_stream_fattn_fits(dst)"


def route(policy: Dispatch, result: FitsResult) -> Route:
    if policy == "membership":
        if not result.membership:
            return "ordinary"
        return "streamed" if result.ok else "abort"
    if result.ok:
        return "streamed"
    return "fallback" if result.membership else "ordinary"


def assert_message(file: str, line: int) -> str:
    """The line ggml_abort prints: ``<file>:<line>: GGML_ASSERT(<cond>) failed``."""
    return f"{file}:{line}: GGML_ASSERT({FITS_ASSERT}) failed"


def fallback_warning(layer: int, failed: tuple[str, ...]) -> str:
    """kvdiag's wording; the port's exact WARN text is not public (brief §9)."""
    return (
        f"kv-stream FA node of layer {layer} does not fit the streamed kernel "
        f"({', '.join(failed)}); falling back to ordinary flash attention over the "
        "host-mapped KV buffer (zero-copy)"
    )


#: The frames ggml_print_backtrace would show for the fits abort (modelled; addresses omitted).
ABORT_BACKTRACE: tuple[str, ...] = (
    "ggml_print_backtrace",
    "ggml_abort",
    "ggml_cuda_kv_stream_fattn (inlined)",
    "ggml_cuda_compute_forward (inlined)",
    "ggml_cuda_graph_evaluate_and_capture",
    "ggml_backend_cuda_graph_compute",
    "ggml_backend_sched_compute_splits",
    "llama_context::graph_compute",
    "llama_context::decode",
    "server_context::update_slots",
)
