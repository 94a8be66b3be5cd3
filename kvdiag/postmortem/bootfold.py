"""Folding boot-time ``ConfigItem`` records into one ``BootConfig`` per server start.

A new boot begins with ``llama_context: constructing llama_context`` (or, in older logs, the
first context line) once the previous boot has finished (the server said it was ready). Within
one boot the first value of a key wins: a draft/MTP context constructed after the target
context prints its own ``n_ctx`` and KV buffers, and never streams (domain brief §1.1).
"""

from __future__ import annotations

from typing import Any

from kvdiag.model.logrecords import BootConfig, ConfigItem, LogLine

MAX_BOOTS = 256
MAX_EVIDENCE = 24
_FIELDS = frozenset(BootConfig.__struct_fields__)
RESTART_KEYS = frozenset({"construct", "n_ctx", "n_seq_max"})
"""Keys that start a new boot once the current one is ready."""


class _Boot:
    def __init__(self, where: LogLine) -> None:
        self.where = where
        self.values: dict[str, Any] = {}
        self.kv_buffers: dict[str, float] = {}
        self.evidence: list[LogLine] = []
        self.ready = False
        self.contexts = 0

    def add(self, item: ConfigItem) -> None:
        key = item.key
        if key == "construct":
            self.contexts += 1
            return
        if key == "ready":
            self.ready = True
            return
        if self.contexts > 1 and key != "model":
            return  # a second (draft/MTP) context of the same boot
        if key.startswith("kv_buffer:"):
            self.kv_buffers.setdefault(key.split(":", 1)[1], float(item.value))
        elif key in _FIELDS and key not in self.values:
            self.values[key] = item.value
        else:
            return
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(item.where)

    def final(self) -> BootConfig:
        vals = dict(self.values)
        if vals.get("kv_stream") is None and any("KV_Stream" in b for b in self.kv_buffers):
            vals["kv_stream"] = True
        return BootConfig(
            source=self.where.source, line=self.where.line, kv_buffers=dict(self.kv_buffers),
            evidence=tuple(self.evidence), **vals,
        )


class BootAccumulator:
    """Keeps the boots seen so far; ``add`` says whether the item started a new boot."""

    def __init__(self) -> None:
        self.boots: list[_Boot] = []

    @property
    def ready(self) -> bool:
        return bool(self.boots) and self.boots[-1].ready

    def served(self) -> None:
        """A request was launched: the current boot was ready, whatever its ready line (one
        the grammar may not know, such as 2023's ``llama server listening at``)."""
        if self.boots:
            self.boots[-1].ready = True

    def add(self, item: ConfigItem) -> bool:
        cur = self.boots[-1] if self.boots else None
        started = False
        if cur is None or cur.where.source != item.where.source or (
            cur.ready and item.key in RESTART_KEYS
        ):
            if len(self.boots) >= MAX_BOOTS:
                self.boots.pop(0)
            cur = _Boot(item.where)
            self.boots.append(cur)
            started = True
        cur.add(item)
        return started

    def boots_final(self) -> list[BootConfig]:
        return [b.final() for b in self.boots]
