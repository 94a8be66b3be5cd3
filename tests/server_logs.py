"""llama-server logs written by the tests themselves, in the real formats (not a test module).

Line shapes follow the domain brief: the ``<min>.<ss>.<ms>.<us> <L> `` prefix (§7.1), boot
lines (§5.1, §7.2), slot lines (§7.3: ``slot <func 12>: id <%2d> | task <t> | <msg>``), the
``print_timing`` block in its older shape (one log call: header, then three lines without the
slot prefix) and its newer shape (one line each, then ``graphs reused``), and the
``kv_stream_adapt`` lines (§5.3). Outer prefixes: llama-server router ``[ 8080] ``, journald,
docker compose — each physical line carries them, continuation lines too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Shape = Literal["newer", "older"]
Outer = Literal["none", "router", "journald", "compose"]


@dataclass(frozen=True)
class Turn:
    """One request: what the server logs for it."""

    slot: int
    task: int
    depth_start: int
    """task.n_tokens: the prompt with what the cache kept."""
    cached: int
    decode_tokens: int
    decode_tps: float
    prompt_tps: float = 1500.0
    truncated: bool = False
    n_ctx_slot: int = 65536
    graphs: int | None = None
    """The cumulative ``graphs reused`` value printed (newer shape only)."""
    during: tuple[str, ...] = ()
    """kv-stream lines logged while it decodes (``W`` level), in order."""

    @property
    def prompt_tokens(self) -> int:
        return self.depth_start - self.cached

    @property
    def depth_end(self) -> int:
        return self.depth_start + self.decode_tokens

    @property
    def decode_ms(self) -> float:
        return self.decode_tokens * 1000.0 / self.decode_tps

    @property
    def prompt_ms(self) -> float:
        return self.prompt_tokens * 1000.0 / self.prompt_tps if self.prompt_tokens else 0.0


def _fig(ms: float, n: int) -> str:
    if n == 0:
        return f"{ms:10.2f} ms / {n:5d} tokens (    -nan ms per token,     -nan tokens per second)"
    return (f"{ms:10.2f} ms / {n:5d} tokens ({ms / n:8.2f} ms per token, "
            f"{n * 1000.0 / ms:8.2f} tokens per second)")


@dataclass
class ServerLog:
    """A log being written: ``boot``, ``requests`` (interleaved when several), ``line``."""

    shape: Shape = "newer"
    outer: Outer = "none"
    release_first: bool = False
    """Late 2024's order (older shape only): ``stop processing: n_past = …`` before the
    ``print_timing`` block, and ``n_prompt_tokens`` in ``new prompt``
    (tests/test_perf_release_first.py says where from)."""
    us: int = 1_000_000
    lines: list[str] = field(default_factory=list)

    def _prefix(self) -> str:
        if self.outer == "router":
            return "[ 8080] "
        if self.outer == "journald":
            return "Mar 03 10:11:12 gpu-host llama-server[4242]: "
        if self.outer == "compose":
            return "llama-1  | "
        return ""

    def stamp(self, level: str = "I") -> str:
        self.us += 1371
        us = self.us
        return (f"{us // 60_000_000}.{(us // 1_000_000) % 60:02d}.{(us // 1000) % 1000:03d}."
                f"{us % 1000:03d} {level} ")

    def line(self, text: str, level: str = "I") -> None:
        self.lines.append(self._prefix() + self.stamp(level) + text)

    def raw(self, text: str) -> None:
        """A line without llama.cpp's prefix (a continuation of the message before it)."""
        self.lines.append(self._prefix() + text)

    def boot(self, *, stage_mib: int | None = 2048, layers: int = 16, streamed: int = 9,
             ctx: int = 65536, np: int = 1, type_k: str = "q8_0", type_v: str = "q5_1",
             head_dim: int = 256, n_head: int = 24, n_head_kv: int = 4) -> None:
        self.us = max(self.us, 1000)
        self.line(f"print_info: n_head           = {n_head}")
        self.line(f"print_info: n_head_kv        = {n_head_kv}")
        self.line(f"print_info: n_embd_head_k    = {head_dim}")
        self.line(f"print_info: n_embd_head_v    = {head_dim}")
        self.line("llama_context: constructing llama_context")
        self.line(f"llama_context: n_seq_max     = {np}")
        self.line(f"llama_context: n_ctx         = {ctx}")
        self.line(f"llama_context: n_ctx_seq     = {ctx // np}")
        self.line("llama_context: n_batch       = 2048")
        self.line("llama_context: n_ubatch      = 512")
        self.line("llama_context: flash_attn    = enabled")
        self.line("llama_context: kv_unified    = false")
        row = {"q8_0": 272, "q5_1": 192, "q4_0": 144, "f16": 512}
        if stage_mib:
            self.line(f"llama_context: experimental block KV streaming enabled, pool = {stage_mib} "
                      "MiB")
            if streamed < layers:
                self.line(f"llama_kv_cache: KV streaming device filter = CUDA0 ({streamed} layers)")
            mib = ctx * streamed * (row[type_k] + row[type_v]) * n_head_kv / 2**20
            self.line(f"llama_kv_cache: CUDA_KV_Stream_Host KV buffer size = {mib:8.2f} MiB")
        total = ctx * layers * (row[type_k] + row[type_v]) * n_head_kv / 2**20
        self.line(f"llama_kv_cache: size = {total:8.2f} MiB ({ctx:6d} cells, {layers:3d} layers, "
                  f" {np}/{np} seqs), K ({type_k}): {total / 2:8.2f} MiB, V ({type_v}): "
                  f"{total / 2:8.2f} MiB")
        self.line("srv  llama_server: server is listening on http://127.0.0.1:8080")
        self.line("srv  update_slots: all slots are idle")

    def _request_items(self, t: Turn) -> list[list[tuple[str, str | None]]]:
        """The request as items; each item is lines that stay together: (text, level) where a
        None level is a continuation line without llama.cpp's prefix."""
        s = f"id {t.slot:2d} | task {t.task} |"
        items: list[list[tuple[str, str | None]]] = [
            [(f"slot get_availabl: id {t.slot:2d} | task -1 | selected slot by LRU, "
              f"t_last = {self.us}", "I")],
            [(f"slot launch_slot_: {s} processing task, is_child = 0", "I")],
            [(f"slot update_slots: {s} new prompt, n_ctx_slot = {t.n_ctx_slot}, n_keep = 0, "
              f"{'n_prompt_tokens' if self.release_first else 'task.n_tokens'} = "
              f"{t.depth_start}", "I")],
        ]
        if self.shape == "newer":
            items.append([(f"slot update_slots: {s} n_tokens = {t.cached}, memory_seq_rm "
                           f"[{t.cached}, end)", "I")])
        else:
            items.append([(f"slot update_slots: {s} kv cache rm [{t.cached}, end)", "I")])
        done = t.cached
        while done + 2048 < t.depth_start:
            done += 2048
            items.append([(f"slot update_slots: {s} prompt processing progress, n_tokens = "
                           f"{done}, batch.n_tokens = 2048, progress = "
                           f"{done / t.depth_start:.6f}", "I")])
        items.append([(f"slot update_slots: {s} prompt done, n_tokens = {t.depth_start}, "
                       f"batch.n_tokens = {t.depth_start - done}", "I")])
        items += [[(text, "W")] for text in t.during]
        if self.shape == "newer":
            block = [
                (f"slot print_timing: {s} prompt eval time = {_fig(t.prompt_ms, t.prompt_tokens)}",
                 "I"),
                (f"slot print_timing: {s}        eval time = {_fig(t.decode_ms, t.decode_tokens)}",
                 "I"),
                (f"slot print_timing: {s}       total time = {t.prompt_ms + t.decode_ms:10.2f} ms "
                 f"/ {t.prompt_tokens + t.decode_tokens:5d} tokens", "I"),
            ]
            if t.graphs is not None:
                block.append((f"slot print_timing: {s}    graphs reused = {t.graphs:10d}", "I"))
            items.append(block)
        else:
            if self.release_first:
                items.append([(f"slot      release: {s} stop processing: n_past = "
                               f"{t.depth_end}, truncated = {int(t.truncated)}", "I")])
            items.append([
                (f"slot print_timing: {s} ", "I"),
                (f"prompt eval time = {_fig(t.prompt_ms, t.prompt_tokens)}", None),
                (f"       eval time = {_fig(t.decode_ms, t.decode_tokens)}", None),
                (f"      total time = {t.prompt_ms + t.decode_ms:10.2f} ms / "
                 f"{t.prompt_tokens + t.decode_tokens:5d} tokens", None),
            ])
        if not (self.release_first and self.shape == "older"):
            items.append([(f"slot      release: {s} stop processing: n_tokens = {t.depth_end}, "
                           f"truncated = {int(t.truncated)}", "I")])
        return items

    def requests(self, *turns: Turn) -> None:
        """The turns' lines; several turns run concurrently, their items interleaved."""
        queues = [self._request_items(t) for t in turns]
        while any(queues):
            for q in queues:
                if q:
                    for text, level in q.pop(0):
                        if level is None:
                            self.raw(text)
                        else:
                            self.line(text, level)
        self.line("srv  update_slots: all slots are idle")
        self.line("srv  log_server_r: done request: POST /v1/chat/completions 127.0.0.1 200")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def adapt_line(active: int, resident: int, ring: int, samples: int = 0, misses: int = 0,
               busy: float = 0.0, peak: int = 0) -> str:
    """The ``LLAMA_KV_STREAM_TRACE`` line (brief §5.3)."""
    return (f"kv_stream_adapt: active {active}, resident {resident}, ring {ring}, samples "
            f"{samples}, misses {misses}, copy busy {busy:.1f}%, peak {peak}")


def partition_line(r0: int, r1: int, s0: int, s1: int, miss: float, busy: float) -> str:
    return (f"kv_stream_adapt: adaptive KV partition: resident pages/layer {r0} -> {r1}, ring "
            f"slots {s0} -> {s1}, miss {miss:.1f}%, copy busy {busy:.1f}%")


CAP_ROOM = 200
"""Tokens a capped turn has left to decode (see :func:`session`)."""


def session(turns: int, new_tokens: int, output: int, tps: list[float], *, slot: int = 0,
            first_task: int = 0, ctx: int = 65536, graphs_per_token: float | None = None,
            during: dict[int, tuple[str, ...]] | None = None) -> list[Turn]:
    """A multi-turn session on one slot: each turn sends the conversation so far plus
    ``new_tokens`` and decodes ``output`` tokens (the cache keeps the conversation). A turn
    that no longer fits is capped by the context: the client trims its prompt to leave
    ``CAP_ROOM`` tokens, and the context stops its decode there (``truncated = 1``)."""
    out: list[Turn] = []
    depth = 0
    graphs = 0
    for k in range(turns):
        start = depth + new_tokens
        if start + output > ctx:
            start = min(start, ctx - CAP_ROOM)
            depth = min(depth, start)
        decode = min(output, ctx - start - 1)
        if graphs_per_token is not None:
            graphs += int(decode * graphs_per_token)
        out.append(Turn(slot=slot, task=first_task + k, depth_start=start, cached=depth,
                        decode_tokens=decode, decode_tps=tps[k], truncated=decode < output,
                        n_ctx_slot=ctx, graphs=graphs if graphs_per_token is not None else None,
                        during=(during or {}).get(k, ())))
        depth = start + decode
    return out
