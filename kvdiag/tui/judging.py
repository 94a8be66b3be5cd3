"""The judging pass: the trace's one Judge, fed the blocks of lines the indexer reads
(no textual import).

Each block is read as ``kvdiag check`` reads its file
(:meth:`~kvdiag.trace.reader.TraceReader.decode_scanning`: the same events and line-numbered
problems; the lines the Judge reads straight into its columns, the others decoded a slice at a
time) and streamed to ``Judge(header, ledger=True)`` as ``check`` streams its reader (pages
judged many thousand events at a time, across blocks); a line that is not an event is skipped
with ``judge.skip()`` so that ledger rows stay index rows. Beside the Judge the pass keeps what
the screens show and the Judge does not hold: telemetry samples, kv_stream_adapt's partition,
abort events. :meth:`JudgingPass.delta` hands over what changed since the last call
(:class:`~kvdiag.tui.digest.Delta`); the loader runs the pass in its own thread right behind the
indexer, or in a child process for big files (:mod:`kvdiag.tui.judgeproc`).
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvdiag.analysis.judgement import trace_judge
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader, holds
from kvdiag.tui.digest import (
    TABLES,
    Delta,
    TableDelta,
    marks_of,
    partition_series,
    telemetry_series,
)

_SIDE: dict[type, str] = {ev.Telemetry: "telemetry", ev.Adapt: "partition",
                          ev.Repartition: "partition", ev.Abort: "abort"}
"""Events kept beside the Judge, by list (adapt and repartition in one, in file order)."""
_SIDE_TYPES = tuple(_SIDE)


class _Decoded:
    """A block's events for :meth:`Judge.feed_all`'s streamed path (anything with a
    ``blocks()`` method)."""

    def __init__(self, judging: JudgingPass, block: bytes) -> None:
        self.judging, self.block = judging, block

    def blocks(self) -> Iterator[list[Any]]:
        return self.judging.decoded(self.block)

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(self.blocks())


class JudgingPass:
    """Judges the blocks of one trace given in file order (:meth:`feed`), from the first line
    after the header."""

    def __init__(self, path: str | Path, *, hand_over: bool = False,
                 reader: TraceReader | None = None, scan: bool = True) -> None:
        # the reader validates the header (InputError) and then only decodes what it is given;
        # a followed file's reader is made from the header line already read (``reader``)
        if reader is None:
            with TraceReader.open(path) as reader:
                pass
        self.reader = reader
        if reader.segments is not None:
            # a segment set's gaps and left-out files are said by the joined stream as it is
            # read (the blocks fed here come from the joined bytes): read it once for them
            with TraceReader.open(path) as whole:
                for _ in whole:
                    pass
            reader.problems.extend(p for p in whole.problems if p.kind in ("gap", "segment"))
            reader.allow_skipped(whole.skipped_seqs)
        self.judge = trace_judge(reader, ledger=True, name=str(path))
        self.hand_over = hand_over
        self.scan = scan
        """Lines are read straight into the Judge's columns where it can (:meth:`decoded`);
        False: every line is decoded (the reference the tests hold the other to)."""
        """Deltas carry the ledger's sealed blocks away (a pass in another process): the
        viewer keeps them, this pass forgets them."""
        self.position = 0
        """The byte just after the last block fed."""
        self._sent = [0] * len(TABLES)
        self._problems = 0
        self._side: dict[str, list[Any]] = {k: [] for k in _SIDE.values()}
        self._widest = 0
        """One past the highest page read stale, foreign or not judged so far (the pieces
        table's ``end``, taken here where the rows are: a viewer reading it from the mapped
        ledger would map the whole table in)."""

    def feed(self, block: bytes, offset: int) -> None:
        """Judge ``block``, the next lines of the file, from byte ``offset``."""
        self.judge.feed_all(_Decoded(self, block), hold=True)
        self.position = offset + len(block)

    def decoded(self, block: bytes) -> Iterator[list[Any]]:
        """The events of ``block`` for the Judge's streamed path, as the reader gives them
        (:meth:`TraceReader.decode_scanning`: the lines the Judge reads straight into its
        columns, :meth:`Judge.scan`, never become events; the others are decoded a slice at a
        time, and the Judge takes their fields out while the decoder has just made them). A
        line that is not an event is skipped with ``judge.skip()`` where it is, so that ledger
        rows stay index rows: the Judge judges what it was given before it counts the skipped
        row."""
        judge, side = self.judge, self._side
        for decoded in self.reader.decode_scanning(block, judge.scan if self.scan else None):
            # the kinds kept beside are rare: a slice's types are looked at in C, and its
            # events one by one only where one of them is among them
            nones, kept = holds(decoded, _SIDE_TYPES)
            if kept:
                for e in [e for e in decoded if type(e) in _SIDE]:
                    side[_SIDE[type(e)]].append(e)
            if not nones:
                yield decoded  # type: ignore[misc]
                continue
            run: list[Any] = []
            for e in decoded:
                if e is not None:
                    run.append(e)
                    continue
                if run:
                    yield run
                    run = []
                judge.skip()
            if run:
                yield run

    def finish(self) -> None:
        """The file ends here."""
        self.reader.finish()

    def delta(self, *, done: bool = False) -> Delta:
        """What was judged since the previous delta (everything, for the first)."""
        judgement = self.judge.snapshot()
        led = self.judge.ledger
        assert led is not None and judgement.ledger is not None
        parts: list[tuple[tuple[np.ndarray, ...], np.ndarray | None, int]] = []
        if self.hand_over:
            for table in led.tables():
                sealed, open_rows, n = table.take()
                parts.append((tuple(sealed), open_rows, n))
        else:
            for i, name in enumerate(TABLES):
                t = getattr(judgement.ledger, name)
                parts.append((t.blocks[self._sent[i]:t.sealed],
                              t.blocks[t.sealed] if len(t.blocks) > t.sealed else None, t.n))
                self._sent[i] = t.sealed
        tables = [TableDelta(*p) for p in parts]
        pieces = parts[TABLES.index("pieces")]
        for b in (*pieces[0], *(() if pieces[1] is None else (pieces[1],))):
            if len(b):
                self._widest = max(self._widest, int(b["end"].max()))
        marks_sealed = marks_of([p[0] for p in parts])
        marks_open = marks_of([() if p[1] is None else (p[1],) for p in parts])
        side = self._side
        self._side = {k: [] for k in _SIDE.values()}
        problems = self.reader.problems[self._problems:]
        self._problems = len(self.reader.problems)
        return Delta(
            rows=self.judge.rows, position=self.position,
            judgement=dataclasses.replace(judgement, ledger=None), tables=tuple(tables),
            telemetry=telemetry_series(side["telemetry"]),
            partition=partition_series(side["partition"]), aborts=tuple(side["abort"]),
            problems=tuple(problems), truncated=self.reader.truncated, done=done,
            marks_sealed=marks_sealed, marks_open=marks_open, widest_page=self._widest)
