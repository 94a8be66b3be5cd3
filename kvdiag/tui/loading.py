"""Loading a file into document snapshots, in a worker thread (no textual import).

A trace is indexed (``kvdiag.analysis.trace_index``), then its page-replay groups are built,
then it is analysed (``kvdiag.tui.digest``); a log is parsed by the post-mortem
scanner, optionally re-symbolized, and its lines indexed. Each stage publishes a new snapshot;
cancellation (the viewer closing) is checked between chunks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np

from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.log_index import build_log_index
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import geometry_from_header
from kvdiag.analysis.trace_index import FITS, READ, UPLOAD, WRITE, IndexBuilder, header_end
from kvdiag.errors import InputError
from kvdiag.trace.reader import TraceReader
from kvdiag.tui.clip import clip, clip_deep
from kvdiag.tui.digest import digest_trace
from kvdiag.tui.document import (
    ErrorDoc,
    LogDoc,
    PendingDoc,
    Publish,
    TraceDoc,
    detect_kind,
)

PUBLISH_EVERY_S = 0.2
YIELD_CHUNK = 1 << 20


class _Cancelled(Exception):
    """The viewer is closing: stop reading."""


def _never() -> bool:
    return False


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Symbols:
    """Binaries (and a separate debug-info directory) to symbolize log backtraces with."""

    binaries: tuple[str, ...] = ()
    debug_dir: str | None = None


NO_SYMBOLS = Symbols()


def load(path: str, publish: Publish, cancelled: Callable[[], bool] = _never,
         painted: Callable[[], object] = _nothing, symbols: Symbols = NO_SYMBOLS) -> None:
    """Load ``path``, publishing snapshots; failures are published as :class:`ErrorDoc`.

    ``painted`` is called after the first snapshot and should return once the viewer has drawn
    it (or soon anyway): the first frame then does not compete with the indexing pass.
    """
    try:
        kind = detect_kind(path)
        if kind == "trace":
            load_trace(path, publish, cancelled, painted)
        else:
            load_log(path, publish, symbols)
    except InputError as exc:
        publish(ErrorDoc(path, clip(str(exc))))
    except (OSError, MemoryError) as exc:
        publish(ErrorDoc(path, clip(f"{path}: {type(exc).__name__}: {exc}")))


def load_trace(path: str, publish: Publish, cancelled: Callable[[], bool] = _never,
               painted: Callable[[], object] = _nothing) -> None:
    t0 = time.perf_counter()
    with TraceReader.open(path) as reader:  # validates the header: InputError if not a trace
        header = clip_deep(reader.header)
    source = LineSource.open(path)
    builder = IndexBuilder(source, header_end(source))
    doc = TraceDoc(path, source, header, builder.snapshot(), stage="indexing")
    publish(doc)
    painted()
    last = time.perf_counter()
    for pos in builder.run(YIELD_CHUNK):
        if cancelled():
            return
        # Hand the GIL over between chunks: the UI thread waits for it after every select()
        # and would otherwise wait out the interpreter's 5 ms switch interval each time.
        time.sleep(0)
        now = time.perf_counter()
        if now - last >= PUBLISH_EVERY_S:
            last = now
            doc = replace(doc, index=builder.snapshot(), progress=pos / max(source.size, 1))
            publish(doc)
    index = builder.snapshot()
    t_index = time.perf_counter() - t0
    c = index.columns
    seen_layers = int(c["layer"].max()) + 1 if index.n else 0
    streams = np.unique(c["stream"][np.isin(c["kind"], (READ, WRITE, UPLOAD))])
    pages = int(index.columns["b"][c["kind"] == UPLOAD].max(initial=0))
    geometry = geometry_from_header(header, layers=seen_layers,
                                    streams=[int(s) for s in streams if s >= 0], pages=pages)
    doc = replace(doc, index=index, geometry=geometry, stage="analysing", progress=0.0,
                  fits_rows=np.flatnonzero(c["kind"] == FITS),
                  timings={"indexed_s": t_index})
    publish(doc)
    pages_query = PagesQuery(index, source, geometry)
    doc = replace(doc, pages=pages_query,
                  timings={**doc.timings, "pages_s": time.perf_counter() - t0})
    publish(doc)
    if cancelled():
        return
    state = {"last": time.perf_counter()}

    def progress(fraction: float) -> None:
        if cancelled():
            raise _Cancelled
        time.sleep(0)  # as above: let the UI thread in
        now = time.perf_counter()
        if now - state["last"] >= PUBLISH_EVERY_S:
            state["last"] = now
            publish(replace(doc, progress=fraction))

    try:
        digest = digest_trace(path, progress, every=256)
    except _Cancelled:
        return
    perf = None
    if index.kind_counts().get("timing"):
        from kvdiag.analysis.perf_trace import run_from_events

        with TraceReader.open(path) as reader:
            perf = run_from_events(Path(path).name, path, reader)
    publish(replace(doc, digest=digest, stage="ready", progress=1.0, perf=perf,
                    timings={**doc.timings, "analysed_s": time.perf_counter() - t0}))


class _Reporting:
    """A read-only stream that calls ``hook`` with every block read (the log parser reads in
    large blocks, so this is a few calls a second)."""

    def __init__(self, stream: BinaryIO, hook: Callable[[bytes], None]) -> None:
        self._stream = stream
        self._hook = hook

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._hook(data)
        return data

    def read1(self, n: int = -1) -> bytes:
        read1 = getattr(self._stream, "read1", None)
        data: bytes = read1(n) if read1 is not None else self._stream.read(n)
        self._hook(data)
        return data


def load_log(path: str, publish: Publish, symbols: Symbols = NO_SYMBOLS) -> None:
    from kvdiag.analysis.signatures import evaluate
    from kvdiag.postmortem.lines import open_log
    from kvdiag.postmortem.parse import LogParser
    from kvdiag.postmortem.perfscan import PerfScanner

    parser = LogParser()
    requests = PerfScanner(path)
    name, stream, closers = open_log(path)
    raw = closers[-1]  # the file itself, under any decompressor: its position is progress
    size = max(os.fstat(raw.fileno()).st_size, 1)
    last = [time.perf_counter()]

    def progress(data: bytes) -> None:
        requests.feed(data)  # the same blocks: the requests' timing for the Perf screen
        time.sleep(0)  # let the UI thread in (see load_trace)
        now = time.perf_counter()
        if now - last[0] >= PUBLISH_EVERY_S:
            last[0] = now
            fraction = min(raw.tell() / size, 1.0)
            publish(PendingDoc(path, f"reading the log {fraction:.0%}", progress=fraction))

    try:
        # the parser only calls read/read1 on it
        parser.feed(name, cast(BinaryIO, _Reporting(stream, progress)))
    finally:
        for c in closers:
            c.close()
    scan = clip_deep(parser.result())
    notes: list[str] = []
    if symbols.binaries:
        from kvdiag.postmortem.resymbolize import resymbolize

        try:
            scan = resymbolize(scan, symbols.binaries, symbols.debug_dir)
        except InputError as exc:
            # the log is still worth showing with the frames it printed
            notes.append(clip(f"backtraces not symbolized: {exc}"))
    findings = clip_deep(tuple(evaluate(scan)))
    publish(PendingDoc(path, "indexing the log's lines", progress=1.0))
    source = LineSource.open(path)
    index = build_log_index(source, scan, name)
    perf = requests.finish()
    publish(LogDoc(path, source, scan, findings, index, notes=tuple(notes),
                   perf=perf if perf.requests or perf.unfinished else None))
