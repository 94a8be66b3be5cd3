"""kvdiag: diagnostics for adaptive KV-cache streaming in llama.cpp-style CUDA runtimes."""

from __future__ import annotations

__version__ = "0.1.0"
