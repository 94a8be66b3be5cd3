"""Findings: what an analysis rule concluded, with the evidence that supports it."""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class Severity(enum.IntEnum):
    """Ordered so that thresholds (``--fail-on``) compare numerically."""

    INFO = 10
    WARNING = 20
    ERROR = 30
    CRITICAL = 40

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(s.name.lower() for s in cls)
            raise ValueError(f"unknown severity {text!r} (one of {names})") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class Evidence(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a finding comes from: trace events (``seq``) or log lines (``source``/``line``)."""

    seq: int | None = None
    step: int | None = None
    layer: int | None = None
    stream: int | None = None
    page: int | None = None
    source: str | None = None
    line: int | None = None
    text: str | None = None


class Finding(msgspec.Struct, frozen=True, omit_defaults=True):
    """One rule's conclusion. ``rule`` ids are stable: CI scripts match on them."""

    rule: str
    severity: Severity
    title: str
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""
    details: dict[str, Any] = msgspec.field(default_factory=dict)
