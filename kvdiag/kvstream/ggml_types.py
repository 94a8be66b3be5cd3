"""ggml type geometry: the table lives in :mod:`kvdiag.model.ggml_types` (the judgement's fits
predicate needs it, and analysis imports model only); re-exported here for the runtime model."""

from __future__ import annotations

from kvdiag.model.ggml_types import (
    KV_TYPES,
    TYPES,
    AttentionMode,
    GgmlType,
    attention_mode,
    ggml_type,
)

__all__ = ["KV_TYPES", "TYPES", "AttentionMode", "GgmlType", "attention_mode", "ggml_type"]
