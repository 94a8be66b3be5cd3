"""A line index of a server log for the viewer: byte offset and a kind per line.

Kinds come from two places. Lines that the post-mortem scan kept a record of (boot
configuration, kv-stream lines, instrumented fits lines, crashes, backtraces, problems) are
marked from the ``LogScan``, which cites each by source and line number. Slot lines (llama-server
``slot <fn>: id  N | task T | ...`` and ``id_slot=N``, domain brief §7.3) are too many for the
scan to keep, so they are found by one regular-expression pass over the raw bytes, which also
gives the server slot number the ``slot`` filter uses. Every other line is ``line``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from kvdiag.analysis.linesource import LineSource
from kvdiag.model.logrecords import LogLine, LogScan

LOG_KINDS: tuple[str, ...] = ("line", "boot", "slot", "stream", "fits", "crash", "backtrace",
                              "problem")
LOG_CODE = {k: i for i, k in enumerate(LOG_KINDS)}
# A literal first ("id") lets the regex engine skip ahead quickly (4x faster on a slot-heavy
# log than a pattern that starts with an anchor or a class); the word boundary before "id" is
# checked on the few bytes around each match instead.
_SLOT_BYTES = re.compile(rb"id(?: +(\d{1,4}) \| task|_slot=(\d{1,4})\b)")
# The older forms, searched only in a log that holds one (the pattern is several times slower):
# 2024's server_log JSON ("id_slot":N) and the slot_id key of before 2024-03 (text and JSON),
# and late 2023's LOG_TEE lines ("slot N is processing [task id: T]", "slot N released (…)",
# "slot N : in cache …", "slot N: context shift …"; kvdiag/postmortem/timinglines.py cites them)
_SLOT_OLDER = re.compile(
    rb'(?:"id_slot"|slot_id"?)[=:](\d{1,4})\b|slot (\d{1,4})(?: is processing| released| ?: )')
_OLDER_MARKS = (b'"id_slot"', b"slot_id", b"is processing [task", b"tokens in cache)")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_BLOCK = 16 << 20


@dataclass(eq=False)
class LogIndex:
    """Columns ``offset``, ``kind`` (codes into :data:`LOG_KINDS`) and ``slot`` (-1: none);
    row ``i`` is line ``i + 1``."""

    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.columns["offset"])

    def __len__(self) -> int:
        return self.n

    def kind_counts(self) -> dict[str, int]:
        counts = np.bincount(self.columns["kind"], minlength=len(LOG_KINDS))
        return {LOG_KINDS[i]: int(c) for i, c in enumerate(counts) if c}

    def row_of_line(self, line: int) -> int | None:
        return line - 1 if 1 <= line <= self.n else None


def line_offsets(source: LineSource) -> np.ndarray:
    """Start offset of every line (a final newline does not start an empty line); line 1
    starts after a NUL-filled start (LineSource.text_start)."""
    data = source.data
    size = len(data)
    pos = source.text_start
    parts = [np.full(1, pos, np.int64)] if pos < size else [np.zeros(0, np.int64)]
    while pos < size:
        block = np.frombuffer(data[pos : pos + _BLOCK], np.uint8)
        parts.append(np.flatnonzero(block == 10).astype(np.int64) + pos + 1)
        pos += _BLOCK
    offsets = np.concatenate(parts)
    if offsets.size and offsets[-1] >= size:
        offsets = offsets[:-1]
    return offsets


def build_log_index(source: LineSource, scan: LogScan, name: str | None = None) -> LogIndex:
    """Index ``source``; records of ``scan`` whose source is ``name`` mark their lines."""
    offsets = line_offsets(source)
    n = len(offsets)
    kind = np.zeros(n, np.int8)
    slot = np.full(n, -1, np.int16)
    data = source.data
    starts: list[int] = []
    numbers: list[int] = []
    older = any(data.find(mark) >= 0 for mark in _OLDER_MARKS)
    for rx in (_SLOT_BYTES, _SLOT_OLDER) if older else (_SLOT_BYTES,):
        for m in rx.finditer(data):
            at = m.start()
            if at > 0 and data[at - 1] in _WORD:
                continue  # "valid  1 | task" is not a slot line
            starts.append(at)
            numbers.append(int(m.group(1) or m.group(2)))
    if starts:
        # one binary search for all matches: a server log is mostly slot lines
        rows = np.searchsorted(offsets, np.array(starts, np.int64), side="right") - 1
        ok = (rows >= 0) & (rows < n)
        kind[rows[ok]] = LOG_CODE["slot"]
        slot[rows[ok]] = np.minimum(np.array(numbers, np.int64)[ok], np.iinfo(np.int16).max)
    source_name = name if name is not None else source.name

    def mark(where: LogLine | None, code: str) -> None:
        if where is not None and where.source == source_name and 1 <= where.line <= n:
            kind[where.line - 1] = LOG_CODE[code]

    for boot in scan.boots:
        for where in boot.evidence:
            mark(where, "boot")
    for se in (*scan.stream_events, *scan.config_failures):
        mark(se.where, "stream")
    for fl in scan.fits:
        mark(fl.where, "fits")
    for crash in scan.crashes:
        for fl in crash.fits:
            mark(fl.where, "fits")
        if crash.backtrace is not None:
            mark(crash.backtrace.where, "backtrace")
        for stack in crash.python:
            mark(stack.where, "backtrace")
        for part in (crash.abort, crash.error, crash.signal):
            if part is not None:
                mark(part.where, "crash")
        mark(crash.where, "crash")
    for p in scan.problems:
        if p.line is not None and p.source == source_name and 1 <= p.line <= n:
            kind[p.line - 1] = LOG_CODE["problem"]
    for col in (offsets, kind, slot):
        col.flags.writeable = False
    return LogIndex({"offset": offsets, "kind": kind, "slot": slot})
