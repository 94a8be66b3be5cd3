"""Trace file I/O, format v1 (docs/trace-format.md): writer, streaming reader, summary.

Imports only msgspec and the standard library (no textual, cupy or pynvml).
"""

from __future__ import annotations

from kvdiag.trace.problems import Problem, ProblemKind
from kvdiag.trace.reader import TraceItem, TraceReader
from kvdiag.trace.version import EXTENSION, FORMAT_NAME, FORMAT_VERSION
from kvdiag.trace.writer import TraceWriter, make_header

__all__ = [
    "EXTENSION",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Problem",
    "ProblemKind",
    "TraceItem",
    "TraceReader",
    "TraceWriter",
    "make_header",
]
