"""The judgement's columns read straight from a trace's lines, for the kinds that make most of a
trace (write, upload, evict, read, fits; step, mark and output), without decoding them into
events.

Decoding is most of what judging a trace costs: on bench_tui's 1M-event trace, the reader's
decode took 1.3 s of the judging pass's 2.4 s of CPU (measured), most of it making the
events' objects and freeing them again. ``columns.c``'s ``Accumulator.scan`` (``linescan.h``)
takes the same columns from the lines' bytes, a line at a time, and stops at the first line it
is not sure of; the caller decodes from there as before (:meth:`Judge.scan
<kvdiag.analysis.judgement.judge.Judge.scan>`, :meth:`TraceReader.scanned
<kvdiag.trace.reader.TraceReader.scanned>`). A line is taken only where msgspec's decoder
would make the same event of it, with the types checked as strictly: the types are the
model's own, described here from ``msgspec.inspect`` (so a field added to or retyped in
:mod:`kvdiag.model.events` changes what the C pass checks with it; a type the description does
not cover makes its kind the decoder's alone). The decoder stays the reference:
tests/test_linescan.py holds columns, judgements and the reader's line numbers and problems
equal on real, random and hostile lines.
"""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi

from kvdiag.analysis.judgement import columns

(S_INT, S_STR, S_BOOL, S_NONE, S_LIT, S_TUPLE, S_VARTUPLE, S_OPT, S_STRUCT, S_ASTRUCT, S_FLOAT,
 S_OTHER) = range(12)
"""linescan.h's node types."""

KEYS = ("seq", "step", "layer", "stream", "cells", "versions", "pages", "slot", "bytes",
        "target", "reason", "pool", "ring", "host", "served", "ranges", "route", "result",
        "phase", "max_abs_delta", "tolerance")
"""linescan.h's K_* keys, in its order."""

_NEEDED: dict[int, dict[str, str]] = {
    columns.WRITE: {"seq": "int", "step": "int", "layer": "int", "stream": "int",
                    "cells": "pair", "versions": "pairs"},
    columns.UPLOAD: {"seq": "int", "step": "int", "layer": "int", "stream": "int",
                     "pages": "pair", "slot": "int", "bytes": "int?", "target": "lit",
                     "reason": "lit"},
    columns.EVICT: {"seq": "int", "step": "int", "slot": "int"},
    columns.READ: {"seq": "int", "step": "int", "layer": "int", "stream": "int", "pool": "int",
                   "ring": "int", "host": "int", "served": "runs", "ranges": "ranges"},
    columns.FITS: {"seq": "int", "step": "int", "layer": "int", "route": "lit",
                   "result": "bool"},
    columns.STEP: {"seq": "int", "step": "int", "phase": "lit"},
    columns.MARK: {"seq": "int", "step": "int"},
    columns.OUTPUT: {"seq": "int", "step": "int", "stream": "int", "max_abs_delta": "float?",
                     "tolerance": "float?"},
}
"""Per kind read here, the fields its columns take (add_events in columns.c) and the shape
linescan.h reads them in: a field of another shape leaves the kind to the decoder."""

_RUNS = ("int", "int", "lit", "int")
_RANGES = ("int", "int", "lit", "int", "lit", "int")
"""The array-like structs a read holds, by position: ``served`` (begin, end, source, slot) and
``ranges`` (begin, end, source, holder, cls, version_lag)."""


class _Description:
    """The model's types as linescan.h's flat tables."""

    def __init__(self) -> None:
        self.nodes: list[tuple[int, int, int]] = []
        self.kids: list[int] = []
        self.fields: list[tuple[str, int, int]] = []
        self.lits: list[str] = []
        self._structs: dict[type, int] = {}

    def node(self, t: mi.Type) -> int:
        if isinstance(t, mi.StructType) and t.cls in self._structs:
            return self._structs[t.cls]
        at = len(self.nodes)
        self.nodes.append((S_OTHER, 0, 0))
        self.nodes[at] = self._make(t, at)
        return at

    def _make(self, t: mi.Type, at: int) -> tuple[int, int, int]:
        if isinstance(t, mi.IntType):
            plain = (t.gt, t.ge, t.lt, t.le, t.multiple_of) == (None,) * 5
            return (S_INT if plain else S_OTHER, 0, 0)
        if isinstance(t, mi.StrType):
            plain = (t.min_length, t.max_length, t.pattern) == (None,) * 3
            return (S_STR if plain else S_OTHER, 0, 0)
        if isinstance(t, mi.BoolType):
            return (S_BOOL, 0, 0)
        if isinstance(t, mi.FloatType):
            plain = (t.gt, t.ge, t.lt, t.le, t.multiple_of) == (None,) * 5
            return (S_FLOAT if plain else S_OTHER, 0, 0)
        if isinstance(t, mi.NoneType):
            return (S_NONE, 0, 0)
        if isinstance(t, mi.LiteralType):
            names = [v for v in t.values if type(v) is str and v.isascii()]
            if len(names) != len(t.values):
                return (S_OTHER, 0, 0)
            first = len(self.lits)
            self.lits += names
            return (S_LIT, first, len(t.values))
        if isinstance(t, mi.UnionType):
            others = [u for u in t.types if not isinstance(u, mi.NoneType)]
            if len(t.types) == 2 and len(others) == 1:
                return (S_OPT, self.node(others[0]), 0)
            return (S_OTHER, 0, 0)
        if isinstance(t, mi.TupleType):
            items = [self.node(u) for u in t.item_types]
            first = len(self.kids)
            self.kids += items
            return (S_TUPLE, first, len(items))
        if isinstance(t, mi.VarTupleType):
            if (t.min_length, t.max_length) != (None, None):
                return (S_OTHER, 0, 0)
            return (S_VARTUPLE, self.node(t.item_type), 0)
        if isinstance(t, mi.StructType):
            self._structs[t.cls] = at
            if t.forbid_unknown_fields or t.tag_field not in (None, "kind"):
                return (S_OTHER, 0, 0)
            kept = t.fields
            if not all(f.encode_name.isidentifier() and f.encode_name.isascii() for f in kept):
                return (S_OTHER, 0, 0)  # linescan.h's quoted() reads names without escapes
            first = len(self.fields)
            self.fields += [("", 0, 0)] * len(kept)
            for i, f in enumerate(kept):
                self.fields[first + i] = (f.encode_name, int(f.required), self.node(f.type))
            return (S_ASTRUCT if t.array_like else S_STRUCT, first, len(kept))
        return (S_OTHER, 0, 0)

    def shape(self, node: int) -> str:
        """What a field's node is, in :data:`_NEEDED`'s words ('' for none of them)."""
        kind, a, n = self.nodes[node]
        if kind == S_INT:
            return "int"
        if kind == S_BOOL:
            return "bool"
        if kind == S_LIT:
            return "lit"
        if kind == S_FLOAT:
            return "float"
        if kind == S_OPT and self.shape(a) in ("int", "float"):
            return self.shape(a) + "?"
        if kind == S_TUPLE and n == 2 and all(self.shape(k) == "int" for k in self.kids[a:a + 2]):
            return "pair"
        if kind == S_VARTUPLE:
            item = self.shape(a)
            if item == "pair":
                return "pairs"
            ik, ia, i_n = self.nodes[a]
            if ik == S_ASTRUCT:
                got = tuple(self.shape(self.fields[ia + j][2]) for j in range(i_n))
                return {_RUNS: "runs", _RANGES: "ranges"}.get(got, "")
        return ""


def describe() -> tuple[tuple[Any, ...], ...]:
    """scan_configure's arguments for the model's kinds read here (those whose fields have the
    shapes the C pass reads; the others are left to the decoder)."""
    d = _Description()
    roots: list[tuple[int, str, int, tuple[int, ...]]] = []
    for code, needed in _NEEDED.items():
        t = columns.TYPE_OF[code]
        info = mi.type_info(t)
        assert isinstance(info, mi.StructType)
        node = d.node(info)
        kind, first, n = d.nodes[node]
        if kind != S_STRUCT or info.tag_field != "kind" or not isinstance(info.tag, str):
            continue
        by_name = {d.fields[first + i][0]: i for i in range(n)}
        at = [-1] * len(KEYS)
        ok = True
        for name, shape in needed.items():
            i = by_name.get(name)
            if i is None or d.shape(d.fields[first + i][2]) != shape:
                ok = False
                break
            # a field the columns need is given, or its default is what the C pass assumes:
            # an empty tuple, or None for a field that may be null (read as null)
            f = info.fields[i]
            if not f.required and f.default != () and not (shape.endswith("?")
                                                           and f.default is None):
                ok = False
                break
            at[KEYS.index(name)] = i
        if ok:
            roots.append((code, info.tag, node, tuple(at)))
    return (tuple(d.nodes), tuple(d.kids), tuple(d.fields), tuple(d.lits), tuple(roots))


_configured: list[bool] = []


def ready(acc: Any) -> bool:
    """Whether ``acc`` (an accumulator of the C columns) can take lines: its module was handed
    the model's description (once per process)."""
    if not _configured:
        c = columns.compiled_module()
        ok = False
        if c is not None and hasattr(c, "scan_configure"):
            try:
                c.scan_configure(*describe())
                ok = True
            except (TypeError, ValueError, OverflowError):
                ok = False
        _configured.append(ok)
    return _configured[0] and hasattr(acc, "scan")

