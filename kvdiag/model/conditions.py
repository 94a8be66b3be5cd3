"""Names of the conditions of ``ggml_cuda_kv_stream_fattn_fits`` and what each means.

The runtime model (kvdiag.kvstream.fits) evaluates them; reports and the viewer explain them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from kvdiag.model.geometry import Tensor

#: Plain-words explanations of each condition, for reports and the TUI detail pane.
EXPLAIN: dict[str, str] = {
    "K.runtime!=NULL": "K is not in a CUDA_KV_Stream_Host buffer (runtime_from_tensor is null)",
    "V.runtime!=NULL": "V is not in a CUDA_KV_Stream_Host buffer (runtime_from_tensor is null)",
    "K.runtime==V.runtime": "K and V belong to different kv-stream runtimes",
    "Q.type==f32": "the streamed kernel takes an f32 query",
    "mode(K,V)!=UNSUPPORTED": "no streamed attention mode for this K/V type pair",
    "Q.ne[0]==256": "query head dim must be 256 (KV_STREAM_HEAD_DIM)",
    "V.ne[0]==256": "value head dim must be 256 (KV_STREAM_HEAD_DIM)",
    "Q.ne[1]>=1": "no query tokens",
    "Q.ne[3]==1": "the query spans several KV streams (slots); the streamed kernel handles one",
    "K.ne[3]==1": "the K view spans several KV streams (slots); the streamed kernel handles one",
    "V.ne[3]==1": "the V view spans several KV streams (slots); the streamed kernel handles one",
    "K.ne[1]==V.ne[1]": "K and V views have different n_kv",
    "K.ne[2]==V.ne[2]": "K and V views have different KV head counts",
    "K.ne[1]%256==0": "n_kv is not a multiple of FATTN_KQ_STRIDE (256)",
    "K.nb[0]==type_size": "K has gaps inside a block row",
    "V.nb[0]==type_size": "V has gaps inside a block row",
    "K.nb[1]>=row_size": "K token stride is shorter than one row",
    "V.nb[1]>=row_size": "V token stride is shorter than one row",
    "K.nb[1]==row_size*K.ne[2]": "K token stride is not all KV heads of one token",
    "V.nb[1]==row_size*V.ne[2]": "V token stride is not all KV heads of one token",
    "K.nb[2]==row_size": "K head stride is not one row",
    "V.nb[2]==row_size": "V head stride is not one row",
    "mask.type==f16": "the KQ mask must be f16",
    "mask.contiguous": "the KQ mask must be contiguous",
    "sinks==NULL": "attention sinks are not supported on the streamed path",
    "block_tokens(stage_bytes)>0": "not even one 256-token page of K and V fits in stage_bytes",
}


#: The canonical names, the words ``failed`` lists in a fits event (kvdiag/kvstream/fits.py
#: evaluates them in this order).
CANONICAL: frozenset[str] = frozenset(EXPLAIN)

_SPACE = re.compile(r"\s+")
_SRC = re.compile(r"\b(?:dst\.)?src\[([0-4])\]")
_SRC_NAMES = ("Q", "K", "V", "mask", "sinks")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_OPERANDS = {"q": "Q", "k": "K", "v": "V", "mask": "mask", "dst": "dst", "sinks": "sinks"}
# ggml/runtime spellings of the words the canonical names use (brief §2.2; ggml.h names the
# types GGML_TYPE_*, the G1 source its constants KV_STREAM_HEAD_DIM and FATTN_KQ_STRIDE)
_CONSTANTS = {"nullptr": "NULL", "null": "NULL", "KV_STREAM_HEAD_DIM": "256",
              "FATTN_KQ_STRIDE": "256"}
_REWRITES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"\bGGML_TYPE_([A-Z0-9_]+)\b"), lambda m: m.group(1).lower()),
    (re.compile(r"\b\w*runtime_from_tensor\((Q|K|V)\)"), r"\1.runtime"),
    (re.compile(r"\bggml_is_contiguous\((\w+)\)"), r"\1.contiguous"),
    (re.compile(r"\b\w*block_tokens\([^()]*\)"), "block_tokens(stage_bytes)"),
    (re.compile(r"\b\w*mode\([^()]*\)(!=)\w*UNSUPPORTED\b"), r"mode(K,V)\1UNSUPPORTED"),
    (re.compile(r"\bggml_type_size\([^()]*\)"), "type_size"),
    (re.compile(r"\bggml_row_size\((?:[^()]|\([^()]*\))*\)"), "row_size"),
    (re.compile(r"^!(sinks)$"), r"\1==NULL"),
    (re.compile(r"^(\d+)(==|!=)(.+)$"), r"\3\2\1"),
)
#: Equivalent forms a runtime may test instead (same meaning, other words).
_SAME = {"Q.ne[1]>0": "Q.ne[1]>=1", "V.runtime==K.runtime": "K.runtime==V.runtime",
         "V.ne[1]==K.ne[1]": "K.ne[1]==V.ne[1]", "V.ne[2]==K.ne[2]": "K.ne[2]==V.ne[2]",
         "sinks==0": "sinks==NULL", "K.runtime!=0": "K.runtime!=NULL",
         "V.runtime!=0": "V.runtime!=NULL", "block_tokens(stage_bytes)!=0":
         "block_tokens(stage_bytes)>0"}


def canonical(name: str) -> str:
    """The canonical name of a condition a writer spelled its own way.

    A fork through kernels/kvtrace.h logs the conditions its predicate tested in its own words
    (``Q->ne[3] == 1``, ``q.ne[3]==1``, ``dst->src[1]->ne[3] == 1``); kvdiag names them as
    :data:`EXPLAIN` does (``Q.ne[3]==1``). Blanks go, ``->`` becomes ``.``, ``src[0..4]`` of
    the FA node becomes Q, K, V, mask, sinks (brief §2.2), operand names take their canonical
    case, and the ggml spellings of types, constants and helpers (``GGML_TYPE_F32``,
    ``KV_STREAM_HEAD_DIM``, ``runtime_from_tensor(K) != nullptr``, ``ggml_is_contiguous(mask)``)
    become the canonical words. A name that is still not canonical is returned in that
    normalised spelling (docs/native-bridge.md, "Condition names")."""
    if name in CANONICAL:
        return name
    text = _SPACE.sub("", name).replace("->", ".")
    text = _SRC.sub(lambda m: _SRC_NAMES[int(m.group(1))], text)
    text = _IDENT.sub(_word, text)
    for pattern, repl in _REWRITES:
        text = pattern.sub(repl, text)
    return _SAME.get(text, text)


def _word(m: re.Match[str]) -> str:
    word = m.group(0)
    return _CONSTANTS.get(word) or _OPERANDS.get(word.lower(), word)


def canonical_all(names: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`canonical` of each name; the same tuple when all are canonical already."""
    if all(n in CANONICAL for n in names):
        return names
    return tuple(canonical(n) for n in names)


_OPERAND = re.compile(r"\b(Q|K|V|mask|dst)\.(ne|nb)\[([0-3])\]|\b(Q|K|V|mask|dst)\.(type|runtime)\b")


def observed(condition: str, tensors: Mapping[str, Tensor | None]) -> str:
    """``condition`` with the logged values of the tensor fields it tests, as
    ``"Q.ne[3]==1 (Q.ne[3]=2)"``; the bare name where the event does not hold a field it
    names (``tensors`` maps ``Q``, ``K``, ``V``, ``mask``, ``dst`` to the fits event's
    tensors)."""
    values: dict[str, str] = {}
    for m in _OPERAND.finditer(condition):
        if m.group(1):
            name, field, index = m.group(1), m.group(2), int(m.group(3))
            tensor = tensors.get(name)
            if tensor is not None:
                values[m.group(0)] = str(getattr(tensor, field)[index])
        else:
            name, field = m.group(4), m.group(5)
            tensor = tensors.get(name)
            if tensor is not None:
                value = getattr(tensor, field)
                values[m.group(0)] = "NULL" if value is None else str(value)
    if not values:
        return condition
    return f"{condition} ({', '.join(f'{k}={v}' for k, v in values.items())})"
