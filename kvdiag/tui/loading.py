"""Loading a file into document snapshots, in a worker thread (no textual import).

A trace is indexed (:mod:`kvdiag.analysis.trace_index`) and judged
(:mod:`kvdiag.tui.judging`) in one pass over its bytes: each block of lines the indexer reads is
fed to the trace's one Judge right behind it — in this thread, or for a big file in a child
process reading the same blocks on another core (:mod:`kvdiag.tui.judgeproc`), whose ledger
file becomes the trace's judgement cache (:mod:`kvdiag.tui.judgecache`): a big trace opened
again has its findings at once, and only the index is built again. Every
:data:`PUBLISH_EVERY_S` a snapshot is published with the index so far and the judgement of a
prefix of it (:class:`~kvdiag.tui.digest.TraceDigest`); when the index is complete the page
replay's groups are built, and the document is ready when the judgement is. A log is parsed by
the post-mortem scanner, optionally re-symbolized, and its lines indexed. Cancellation (the
viewer closing) is checked between blocks.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from kvdiag.analysis.judgement.classes import MAX_PAGE
from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.log_index import build_log_index
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import PagesGeometry, geometry_from_header
from kvdiag.analysis.trace_index import (
    FITS,
    READ,
    UPLOAD,
    WRITE,
    IndexBuilder,
    TraceIndex,
    header_end,
    line_blocks,
)
from kvdiag.errors import InputError
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.trace.reader import TraceReader
from kvdiag.tui.clip import clip, clip_deep
from kvdiag.tui.digest import DigestBuilder, TraceDigest
from kvdiag.tui.document import (
    ErrorDoc,
    LogDoc,
    PendingDoc,
    Publish,
    TraceDoc,
    detect_kind,
    trace_source,
)
from kvdiag.tui.judgecache import Cached, CacheKey, Committer, key_of, ledger_file, read_cached
from kvdiag.tui.judgeproc import Failed, JudgeProcess
from kvdiag.tui.judging import JudgingPass

PUBLISH_EVERY_S = 0.2
JUDGING_PUBLISH_S = 1.0
"""Once the index is complete, the judged prefix is published this often: each snapshot makes
the screens draw again, CPU the judging process on another core could use (bench_tui: a tenth
of a core while the Judge finished alone)."""
CHILD_DELTA_S = 0.5
"""How often a judging process sends what it judged. A delta carries the rows judged since the
last one (each row travels once; a thread of the viewer reads the pipe as it is written), so
the process's peak memory grows with the rows in one delta: on bench_tui's 5M-event trace its
peak RSS was 106-109 MiB at one delta a second and 94-99 MiB at one every half second, with no
more CPU (measured, alternated runs). (Before rows travelled once, a delta resent every row not
yet sealed in a block, up to 3.6 MB, and at one every 0.2 s the process spent half its time
blocked on the pipe.)"""
YIELD_CHUNK = 1 << 20
PROCESS_MIN_BYTES = 64 << 20
"""Traces this big are judged in a child process (starting one costs a few tenths of a
second; a smaller trace is judged in that time)."""


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


class _Judging:
    """The judging pass behind the indexer: in this thread (``feed`` gets each block), in a
    child process (it reads the blocks itself, into the ledger file ``ledger``), or none where
    the judgement came from the cache (``cached``)."""

    def __init__(self, path: str, child: bool, ledger: tuple[int, Committer] | None = None,
                 key: CacheKey | None = None, cached: Cached | None = None) -> None:
        self.builder = DigestBuilder()
        self.failed: str | None = None
        self.local = self.remote = None
        self.committer = ledger[1] if ledger is not None else None
        if cached is not None and cached.delta is not None:
            self.builder.add(cached.delta)
        elif child:
            assert ledger is not None
            self.remote = JudgeProcess(path, CHILD_DELTA_S, ledger[0], key)
        else:
            self.local = JudgingPass(path)

    @property
    def digest(self) -> TraceDigest | None:
        return self.builder.latest

    @property
    def done(self) -> bool:
        d = self.builder.latest
        return self.failed is not None or (d is not None and d.done)

    def feed(self, block: bytes, offset: int) -> None:
        if self.local is not None:
            self.local.feed(block, offset)

    def update(self, *, end: bool = False, wait: float = 0.0) -> None:
        """Take what the pass has judged (``end``: the indexer has fed it the whole file)."""
        if self.local is not None:
            if end:
                self.local.finish()
            self.builder.add(self.local.delta(done=end))
            return
        if self.remote is None:
            return
        for item in self.remote.receive(wait):
            if isinstance(item, Failed):
                self.failed = item.message
            else:
                self.builder.add(item)
        if self.remote.completed and self.committer is not None:
            self.committer.complete()

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()


def load_trace(path: str, publish: Publish, cancelled: Callable[[], bool] = _never,
               painted: Callable[[], object] = _nothing, *,
               judge_in_process: bool | None = None) -> None:
    """Index and judge ``path`` (``judge_in_process``: the Judge in a child process, in this
    thread, or — None — by the file's size)."""
    t0 = time.perf_counter()
    with TraceReader.open(path) as reader:  # validates the header: InputError if not a trace
        header = clip_deep(reader.header)
    source = trace_source(path)  # a segment set or a compressed trace: joined in memory
    start = header_end(source)
    builder = IndexBuilder(source, start)
    doc = TraceDoc(path, source, header, builder.snapshot(), stage="indexing")
    publish(doc)
    child = source.size >= PROCESS_MIN_BYTES if judge_in_process is None else judge_in_process
    # the judgement of a big trace is cached: one plain file (not a set or a .zst), by key
    key = key_of(path) if child and not source.compressed and os.path.isfile(path) else None
    cached = read_cached(key) if key is not None else None
    if cached is not None and cached.note is not None:
        doc = replace(doc, notes=(clip(cached.note),))
    with _ledger(child, cached, key) as ledger:
        # a judging process starts before the first frame is drawn: its start-up (imports,
        # half a second) runs on another core while the viewer paints
        judging = _Judging(path, child, ledger, key, cached)
        if judging.done:  # from the cache: the findings now, the index as it comes
            doc = replace(doc, digest=judging.digest, timings={"cached": 1.0})
            publish(doc)
        painted()
        try:
            _index_and_judge(doc, builder, judging, publish, cancelled, t0)
        finally:
            judging.close()


@contextlib.contextmanager
def _ledger(child: bool, cached: Cached | None, key: CacheKey | None
            ) -> Iterator[tuple[int, Committer] | None]:
    """The ledger file a judging process writes (none without one, or with a cached
    judgement)."""
    if not child or (cached is not None and cached.delta is not None):
        yield None
        return
    with ledger_file(key) as ledger:
        yield ledger


def _index_and_judge(doc: TraceDoc, builder: IndexBuilder, judging: _Judging,
                     publish: Publish, cancelled: Callable[[], bool], t0: float) -> None:
    source = doc.source
    last = time.perf_counter()
    for offset, block in line_blocks(source, builder.pos, YIELD_CHUNK):
        if cancelled():
            return
        builder.add(block, offset)
        judging.feed(block, offset)
        # Hand the GIL over between chunks: the UI thread waits for it after every select()
        # and would otherwise wait out the interpreter's 5 ms switch interval each time.
        time.sleep(0)
        now = time.perf_counter()
        if now - last >= PUBLISH_EVERY_S:
            last = now
            judging.update()
            doc = replace(doc, index=builder.snapshot(), progress=builder.pos / max(source.size, 1),
                          digest=judging.digest)
            publish(doc)
    builder.done = True
    index = builder.snapshot()
    t_index = time.perf_counter() - t0
    c = index.columns
    geometry = geometry_from_header(doc.header, **seen_shape(index))
    judging.update(end=judging.local is not None)
    doc = replace(doc, index=index, geometry=geometry, stage="judging",
                  progress=_judged(judging.digest, source.size), digest=judging.digest,
                  fits_rows=np.flatnonzero(c["kind"] == FITS),
                  timings={**doc.timings, "indexed_s": t_index})
    publish(doc)
    pages_query = PagesQuery(index, source, geometry)
    doc = replace(doc, pages=pages_query,
                  timings={**doc.timings, "pages_s": time.perf_counter() - t0})
    publish(doc)
    last = time.perf_counter()
    while not judging.done:
        if cancelled():
            return
        judging.update(wait=PUBLISH_EVERY_S)
        now = time.perf_counter()
        if judging.digest is not doc.digest and (judging.done or
                                                 now - last >= JUDGING_PUBLISH_S):
            last = now
            doc = replace(doc, digest=judging.digest,
                          progress=_judged(judging.digest, source.size))
            publish(doc)
    timings = {**doc.timings, "judged_s": time.perf_counter() - t0}
    if judging.failed is not None:
        publish(replace(doc, stage="ready", progress=1.0, judge_error=clip(judging.failed),
                        timings=timings))
        return
    wider = judged_width(geometry, judging.digest)
    if wider is not geometry:  # the grid rebuilt once, for the pages only the judgement saw
        geometry = wider
        doc = replace(doc, geometry=geometry, pages=PagesQuery(index, source, geometry))
    perf = None
    if index.kind_counts().get("timing"):
        from kvdiag.analysis.perf_trace import run_from_events

        with TraceReader.open(doc.path) as reader:
            perf = run_from_events(Path(doc.path).name, doc.path, reader)
    publish(replace(doc, digest=judging.digest, stage="ready", progress=1.0, timings=timings,
                    perf=perf))


def judged_width(geometry: PagesGeometry, digest: TraceDigest | None) -> PagesGeometry:
    """``geometry`` widened to every page the judgement found read stale, foreign or not
    judged: a read of pages beyond every write and upload (past the cells written — a padded
    ``n_kv`` — or a page never filled) shows in no event the index keeps, only in the judged
    pieces. The same geometry when nothing is wider."""
    if digest is None:
        return geometry
    widest = digest.widest_page  # taken where the rows were made: the mapped table untouched
    if widest <= geometry.pages:
        return geometry
    return replace(geometry, pages=min(widest, MAX_PAGE))


def seen_shape(index: TraceIndex, lo: int = 0) -> dict[str, Any]:
    """What the index rows from ``lo`` on show of the page grid's shape, as
    :func:`~kvdiag.analysis.replay.geometry_from_header` takes it: layers (the highest + 1),
    the streams read, written or uploaded, and pages (the highest upload end, or the page
    after the highest cell written: pages read from the host or a ring slot without an upload
    of theirs — a fallback's zero-copy read — have no upload to say they exist)."""
    c = {k: v[lo:] for k, v in index.columns.items()}
    kind = c["kind"]
    # three compares, not isin: isin widens millions of codes to int64 first (40 MiB on 5M)
    streams = np.unique(c["stream"][(kind == READ) | (kind == WRITE) | (kind == UPLOAD)])
    written = int(c["b"][kind == WRITE].max(initial=0))  # cells are stream-local, half-open
    return {"layers": int(c["layer"].max()) + 1 if len(c["layer"]) else 0,
            "streams": [int(s) for s in streams if s >= 0],
            "pages": min(max(int(c["b"][kind == UPLOAD].max(initial=0)),
                             -(-written // PAGE_TOKENS)), MAX_PAGE)}


def _judged(digest: TraceDigest | None, size: int) -> float:
    return 0.0 if digest is None else digest.position / max(size, 1)


def load_log(path: str, publish: Publish, symbols: Symbols = NO_SYMBOLS) -> None:
    from kvdiag.analysis.signatures import evaluate
    from kvdiag.files.inputs import Tapped
    from kvdiag.files.logs import open_log
    from kvdiag.postmortem.parse import LogParser
    from kvdiag.postmortem.perfscan import PerfScanner

    parser = LogParser()
    requests = PerfScanner(path)
    log = open_log(path)
    name, stream, closers = log.name, log.stream, log.closers
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
        parser.feed(name, cast(BinaryIO, Tapped(stream, progress)),
                    leading_nuls=log.leading_nuls)
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
    if source.broken is not None:
        notes.append(clip(f"{name}: read up to where it breaks: {source.broken}"))
    index = build_log_index(source, scan, name)
    perf = requests.finish()
    publish(LogDoc(path, source, scan, findings, index, notes=tuple(notes),
                   perf=perf if perf.requests or perf.unfinished else None))
