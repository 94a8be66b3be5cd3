"""Names of the conditions of ``ggml_cuda_kv_stream_fattn_fits`` and what each means.

The runtime model (kvdiag.kvstream.fits) evaluates them; reports and the viewer explain them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

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
