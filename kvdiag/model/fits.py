"""``ggml_cuda_kv_stream_fattn_fits(dst)`` condition by condition, over operands as a trace
logs them (kv-stream-domain.md §2.1–§2.2, G1 form).

The runtime returns a bare bool; this evaluates every condition in the order the runtime tests
them (runtime identity first, then geometry) and says for each one whether it **held**,
**failed** (with the logged values it tested) or is **unknown**: not evaluable because the
trace does not record a field it reads. That last state matters for imported logs, whose
``fits=false`` line gives dst's shape and the K/V runtimes but not K's strides
(docs/log-import.md: an operand's unknown ``ne``/``nb`` is ``[0,0,0,0]``, an unknown type
``""``, an unknown ``stage_bytes`` 0), so a partially known geometry still evaluates what it
can.

One fact fills gaps: ``ggml_flash_attn_ext`` builds its result with
``ne = {V.ne[0], Q.ne[2], Q.ne[1], Q.ne[3]}`` (ggml.c), so where Q's (or V's) shape is not
recorded, ``dst.ne`` gives ``Q.ne[1..3]`` and ``V.ne[0]``; the condition's values then say
where they came from (``Q.ne[3]=2 from dst.ne[3]``).

Both the runtime model (:mod:`kvdiag.kvstream.fits`, which routes on it) and the judgement
(:mod:`kvdiag.analysis.judgement`, which evaluates logged decisions) use this one predicate.
Condition names are those of :data:`kvdiag.model.conditions.EXPLAIN`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kvdiag.model.geometry import Tensor
from kvdiag.model.ggml_types import TYPES, AttentionMode, GgmlType, attention_mode, ggml_type
from kvdiag.model.pages import PAGE_TOKENS, V_ALIGN, round_up

KV_STREAM_HEAD_DIM = 256
FATTN_KQ_STRIDE = 256
_UNKNOWN_SHAPE = (0, 0, 0, 0)

State = Literal["held", "failed", "unknown"]


class Condition(msgspec.Struct, frozen=True, omit_defaults=True):
    """One condition of the predicate for one decision."""

    name: str
    state: State
    values: str = ""
    """The logged values it tested, ``"Q.ne[3]=2"`` (held or failed)."""
    why: str = ""
    """Why it is unknown: ``"K.nb not recorded"``."""

    def text(self) -> str:
        """``"Q.ne[3]==1 (Q.ne[3]=2)"``, or the bare name when nothing was read."""
        return f"{self.name} ({self.values})" if self.values else self.name


class _Missing(Exception):
    """A field the condition reads is not recorded."""


def block_tokens(k: Tensor, v: Tensor, stage_bytes: int) -> int:
    """``kv_stream_block_tokens``: the largest multiple of 256 ≤ n_kv whose K bytes (all KV
    heads, padded to 128) plus V bytes fit in ``stage_bytes``; 0 if none."""
    row_k = ggml_type(k.type).row_bytes(k.ne[0]) * k.ne[2]
    row_v = ggml_type(v.type).row_bytes(v.ne[0]) * v.ne[2]
    tokens = k.ne[1] // PAGE_TOKENS * PAGE_TOKENS
    while tokens > 0:
        if round_up(row_k * tokens, V_ALIGN) + row_v * tokens <= stage_bytes:
            return tokens
        tokens -= PAGE_TOKENS
    return 0


class _Operands:
    """Field access that records what a condition read and refuses what is not recorded."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dst: Tensor | None,
                 mask_known: bool) -> None:
        self.t: dict[str, Tensor | None] = {"Q": q, "K": k, "V": v, "mask": mask}
        self.dst = dst
        self.mask_known = mask_known
        self.read: list[str] = []

    def tensor(self, name: str) -> Tensor:
        t = self.t[name]
        if t is None:
            raise _Missing(f"{name} not recorded")
        return t

    def ne(self, name: str, i: int) -> int:
        t = self.tensor(name)
        if t.ne != _UNKNOWN_SHAPE:
            self.read.append(f"{name}.ne[{i}]={t.ne[i]}")
            return t.ne[i]
        # ggml_flash_attn_ext: dst.ne = {V.ne[0], Q.ne[2], Q.ne[1], Q.ne[3]}
        src = {("Q", 1): 2, ("Q", 2): 1, ("Q", 3): 3, ("V", 0): 0}.get((name, i))
        d = self.dst
        if src is not None and d is not None and d.ne != _UNKNOWN_SHAPE:
            self.read.append(f"{name}.ne[{i}]={d.ne[src]} from dst.ne[{src}]")
            return d.ne[src]
        raise _Missing(f"{name}.ne[{i}] not recorded")

    def nb(self, name: str, i: int) -> int:
        t = self.tensor(name)
        if t.nb == _UNKNOWN_SHAPE:
            raise _Missing(f"{name}.nb not recorded")
        self.read.append(f"{name}.nb[{i}]={t.nb[i]}")
        return t.nb[i]

    def type(self, name: str) -> str:
        t = self.tensor(name)
        if not t.type:
            raise _Missing(f"{name}.type not recorded")
        self.read.append(f"{name}.type={t.type}")
        return t.type

    def ggml(self, name: str) -> GgmlType:
        type_name = self.type(name)
        gt = TYPES.get(type_name.lower())
        if gt is None:
            raise _Missing(f"{name}.type {type_name} is not a type kvdiag knows")
        return gt

    def runtime(self, name: str) -> int | None:
        value = self.tensor(name).runtime
        self.read.append(f"{name}.runtime={'NULL' if value is None else value}")
        return value

    def mask(self) -> Tensor | None:
        if not self.mask_known:
            raise _Missing("mask not recorded")
        return self.t["mask"]


def _layout(op: _Operands, name: str) -> list[tuple[str, object]]:
    def row() -> int:
        gt = op.ggml(name)
        n = op.ne(name, 0)
        return gt.row_bytes(n) if n % gt.block_elems == 0 else -1

    return [
        (f"{name}.nb[0]==type_size", lambda: op.nb(name, 0) == op.ggml(name).block_bytes),
        (f"{name}.nb[1]>=row_size", lambda: op.nb(name, 1) >= row()),
        (f"{name}.nb[1]==row_size*{name}.ne[2]",
         lambda: op.nb(name, 1) == row() * op.ne(name, 2)),
        (f"{name}.nb[2]==row_size", lambda: op.nb(name, 2) == row()),
    ]


def _stage_fits(op: _Operands, stage_bytes: int) -> bool:
    if stage_bytes <= 0:
        raise _Missing("stage_bytes not recorded")
    k, v = op.tensor("K"), op.tensor("V")
    for name in ("K", "V"):
        op.ggml(name)
        op.ne(name, 0)
        op.ne(name, 1)
        op.ne(name, 2)
    op.read.append(f"stage_bytes={stage_bytes}")
    return block_tokens(k, v, stage_bytes) > 0


def conditions(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, stage_bytes: int,
               native_quants: bool = True, sinks: bool | None = False, *,
               dst: Tensor | None = None, mask_known: bool = True) -> tuple[Condition, ...]:
    """Every condition of the predicate, held / failed / unknown.

    A null ``mask`` passes ("mask absent, or f16 and contiguous", kv-stream-domain.md §2.2)
    unless ``mask_known`` is false (the writer did not record the mask at all). ``sinks``
    None: not recorded (a trace's fits event has no sinks field).
    ``native_quants`` is GGML_CUDA_FA_ALL_QUANTS (the runtime's default build has it on)."""
    op = _Operands(q, k, v, mask, dst, mask_known)

    def mode() -> bool:
        kt, vt = op.ggml("K"), op.ggml("V")
        return attention_mode(kt.name, vt.name, native_quants) != AttentionMode.UNSUPPORTED

    def same_runtime() -> bool:
        kr, vr = op.runtime("K"), op.runtime("V")
        return kr is None or vr is None or kr == vr

    def no_sinks() -> bool:
        if sinks is None:
            raise _Missing("sinks not recorded")
        return not sinks

    def mask_ok(test: str) -> bool:
        m = op.mask()
        if m is None:
            return True
        if test == "type":
            return op.type("mask") == "f16"
        op.read.append(f"mask.contiguous={m.contiguous}")
        return m.contiguous

    checks: list[tuple[str, object]] = [
        ("K.runtime!=NULL", lambda: op.runtime("K") is not None),
        ("V.runtime!=NULL", lambda: op.runtime("V") is not None),
    ]
    if k.runtime is not None and v.runtime is not None:
        checks.append(("K.runtime==V.runtime", same_runtime))
    checks += [
        ("Q.type==f32", lambda: op.type("Q") == "f32"),
        ("mode(K,V)!=UNSUPPORTED", mode),
        ("Q.ne[0]==256", lambda: op.ne("Q", 0) == KV_STREAM_HEAD_DIM),
        ("V.ne[0]==256", lambda: op.ne("V", 0) == KV_STREAM_HEAD_DIM),
        ("Q.ne[1]>=1", lambda: op.ne("Q", 1) >= 1),
        ("Q.ne[3]==1", lambda: op.ne("Q", 3) == 1),
        ("K.ne[3]==1", lambda: op.ne("K", 3) == 1),
        ("V.ne[3]==1", lambda: op.ne("V", 3) == 1),
        ("K.ne[1]==V.ne[1]", lambda: op.ne("K", 1) == op.ne("V", 1)),
        ("K.ne[2]==V.ne[2]", lambda: op.ne("K", 2) == op.ne("V", 2)),
        ("K.ne[1]%256==0", lambda: op.ne("K", 1) % FATTN_KQ_STRIDE == 0),
        *_layout(op, "K"),
        *_layout(op, "V"),
        ("mask.type==f16", lambda: mask_ok("type")),
        ("mask.contiguous", lambda: mask_ok("contiguous")),
        ("sinks==NULL", no_sinks),
        ("block_tokens(stage_bytes)>0", lambda: _stage_fits(op, stage_bytes)),
    ]
    out: list[Condition] = []
    for name, test in checks:
        op.read = []
        try:
            ok = test()  # type: ignore[operator]
        except _Missing as missing:
            out.append(Condition(name, "unknown", why=str(missing)))
            continue
        values = ", ".join(dict.fromkeys(op.read))
        out.append(Condition(name, "held" if ok else "failed", values))
    return tuple(out)


def failed(conds: tuple[Condition, ...]) -> tuple[str, ...]:
    """Names of the conditions that failed, in the runtime's order."""
    return tuple(c.name for c in conds if c.state == "failed")
