"""Pages state at a step: the event-by-event replay, and the random-access query that must agree
with it at every step of real captures (no textual)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvdiag.analysis.judgement import Judge, LedgerSnapshot
from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import (
    Holder,
    LastRead,
    PagesGeometry,
    PagesSnapshot,
    Window,
    geometry_from_header,
    replay_steps,
    reshaped_window,
    write_pages,
)
from kvdiag.analysis.trace_index import IndexBuilder, header_end
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader
from tests.conftest import Capture
from tests.tui_samples import write_aliasing

ADAPTIVE = ("--adaptive", "--steps", "6", "--prompt-tokens", "1200")


class Judged:
    """A PagesQuery with the judgement's ledger of the whole (undamaged) trace."""

    def __init__(self, query: PagesQuery, ledger: LedgerSnapshot) -> None:
        self.query = query
        self.ledger = ledger

    def snapshot(self, step: int) -> PagesSnapshot:
        return self.query.snapshot(step, self.ledger)


def query_for(path: Path) -> tuple[Judged, dict[int, object], PagesGeometry]:
    with TraceReader.open(path) as reader:
        header = reader.header
        events = list(reader)
    geometry = geometry_from_header(header)
    source = LineSource.open(path)
    builder = IndexBuilder(source, header_end(source))
    for _ in builder.run():
        pass
    judgement = Judge(header, ledger=True).feed_all(events).snapshot()
    assert judgement.ledger is not None
    query = Judged(PagesQuery(builder.snapshot(), source, geometry), judgement.ledger)
    return query, replay_steps(geometry, events, header), geometry


@pytest.fixture(scope="module")
def aliasing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        return write_aliasing(tmp_path_factory.mktemp("replay") / "aliasing.kvtrace", mp)
    finally:
        mp.undo()


def test_geometry_comes_from_the_header(aliasing: Path) -> None:
    _, _, geo = query_for(aliasing)
    assert geo == PagesGeometry(layers=2, streams=(0, 1), pages=4, resident_per_layer=2,
                                layout="shared", ring_slots=2, pool_pages=6)
    assert geo.window() == 2 and geo.key(1, 1, 3) == (1, None, 3)
    per_stream = PagesGeometry(2, (0, 1), 4, 4, "per-stream")
    assert per_stream.window() == 2 and per_stream.key(1, 1, 3) == (1, 1, 3)


def test_aliasing_trace_step_by_step(aliasing: Path) -> None:
    """GIVEN slot 1 prefills, slot 0 re-uploads the shared keys, slot 1 decodes
    THEN the pages show slot 1's pages held by slot 0's bytes: a foreign read."""
    query, ref, _ = query_for(aliasing)
    s0 = query.snapshot(0)
    cell = s0.cell(1, 0, 0)
    assert cell.slot == 2 and cell.holder == Holder(0, 1, 0, 1)
    assert cell.read == LastRead(0, "pool", 1, "exact", 0, 0) and cell.resident
    assert s0.cell(0, 0, 0).holder == Holder(0, 1, 0, 1)  # shared key: stream 0 sees it too
    assert s0.cell(1, 0, 2).slot is None and not s0.cell(1, 0, 2).resident
    s1 = query.snapshot(1)
    assert s1.cell(1, 1, 1).holder == Holder(1, 0, 1, 1)  # slot 0's upload replaced it
    assert s1.cell(0, 1, 0).dirty and s1.cell(1, 1, 0).dirty  # (layer, page) keys: both
    assert s1.flagged() == []
    s2 = query.snapshot(2)
    assert not s2.cell(0, 1, 0).dirty  # dirty marks belong to the step that made them
    foreign = s2.cell(1, 0, 0)
    # the judgement's holder: slot 2 held layer 0 stream 0 page 0 (slot 0's upload)
    assert foreign.read == LastRead(2, "pool", 0, "foreign", 0, 0, 0) and foreign.flagged
    assert s2.cell(1, 0, 1).read == LastRead(2, "pool", 0, "foreign", 0, 0, 1)
    assert s2.cell(1, 0, 1).version == 2 and s2.cell(1, 0, 1).holder == Holder(0, 0, 1, 1)
    assert [(s, layer, p) for s, layer, p, _ in s2.flagged()] == [
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert s2.relearn_step == 1 and s2.learned == ((0, 0x7F3A00000000), (1, 0x7F3A00100000))
    for step, snap in ref.items():
        got = query.snapshot(step)
        assert got.cells() == snap.cells(), step  # type: ignore[attr-defined]
        assert got.flagged() == snap.flagged()  # type: ignore[attr-defined]


@pytest.mark.parametrize("scenario, layout, extra", [
    ("slot1-first", "shared", ()), ("slot1-first", "per-stream", ()),
    # the prefill and a few decode steps are enough to exercise the ring (and are quick)
    ("pool-pressure", "shared", ("--steps", "6", "--prompt-tokens", "1300")),
    # adaptive: a repartition (4 MiB) and a decode layout that splits some layers (8 MiB)
    ("pool-pressure", "shared", (*ADAPTIVE, "--stage-mib", "4")),
    ("pool-pressure", "shared", (*ADAPTIVE, "--stage-mib", "8")),
])
def test_query_equals_replay_on_captures(captured: Capture, scenario: str, layout: str,
                                         extra: tuple[str, ...]) -> None:
    """GIVEN a capture of a core scenario THEN at every step the random-access query gives
    exactly the cells and flagged reads of the event-by-event replay."""
    path, _ = captured(scenario, layout, "membership", *extra)
    query, ref, geo = query_for(path)
    assert len(ref) >= 9
    for step, snap in ref.items():
        got = query.snapshot(step)
        assert got.cells() == snap.cells(), f"step {step}"  # type: ignore[attr-defined]
        assert got.flagged() == snap.flagged()  # type: ignore[attr-defined]
        assert (got.learned, got.relearn_step) == (snap.learned, snap.relearn_step)  # type: ignore[attr-defined]
        assert got.shape == snap.shape, f"step {step}"  # type: ignore[attr-defined]
    last = query.snapshot(max(ref))
    flagged = last.flagged()
    if scenario == "slot1-first" and layout == "shared":
        # slot 1's third request reads slot 0's resident bytes
        assert flagged and {s for s, *_ in flagged} == {1}
        assert {r.cls for *_, r in flagged} == {"foreign"}
        assert all(r.holder == 0 for *_, r in flagged)
        assert all(last.cell(s, layer, p).holder.stream == 0  # type: ignore[union-attr]
                   for s, layer, p, _ in flagged)
    else:
        assert flagged == []
    if layout == "per-stream":
        assert geo.layout == "per-stream" and geo.window() == geo.resident_per_layer // 2
        assert last.learned == ()  # the fixed layout does not learn layers from pointers


@pytest.mark.parametrize("scenario, extra", [
    ("pool-pressure", ("--steps", "6", "--prompt-tokens", "1300")),
    ("pool-pressure", (*ADAPTIVE, "--stage-mib", "8")),
])
def test_query_reuses_answers_only_where_they_hold(captured: Capture, scenario: str,
                                                   extra: tuple[str, ...]) -> None:
    """GIVEN one query asked about the steps backwards, then in a scrambled order (a scrubber
    going left, a jump) THEN each step's cells equal the replay's: an answer kept from another
    step (a slot's holder, a page's version, a key's slot) is used only for cutoffs with the
    same events before them, across uploads, evictions and the adaptive invalidate."""
    path, _ = captured(scenario, "shared", "membership", *extra)
    query, ref, _ = query_for(path)
    steps = sorted(ref)
    assert len(steps) >= 9
    order = steps[::-1] + steps[1::3] + steps[::2] + steps[-1:] + steps[:1]
    for step in order:
        got = query.snapshot(step)
        assert got.cells() == ref[step].cells(), f"step {step}"  # type: ignore[attr-defined]
    known = query.query._known_holders
    assert known and any(h is not None for *_, h in known.values())


def test_write_pages() -> None:
    assert write_pages((0, 256)) == range(0, 1)
    assert write_pages((255, 257)) == range(0, 2)
    assert write_pages((600, 601)) == range(2, 3)
    assert write_pages((5, 5)) == range(0)


def _reads_and_windows(path: Path) -> tuple[list[ev.Read], dict[int, PagesSnapshot]]:
    query, ref, _ = query_for(path)
    with TraceReader.open(path) as reader:
        reads = [e for e in reader if isinstance(e, ev.Read)]
    return reads, {step: query.snapshot(step) for step in ref}


@pytest.mark.parametrize("stage, shapes", [
    # 4 MiB: resident 1 → 0 pages/layer at step 4 (the ring grows); every layer streams
    ("4", {3: ((1, 1, 1, 1), ""), 4: ((0, 0, 0, 0),
                                      "decode layout: layers 0,1,2,3 stream 5 pages "
                                      "(step 4: repartition 1→0)")}),
    # 8 MiB: the decode layout at step 4 keeps all 5 pages of layer 3, layers 0-2 keep 1
    ("8", {3: ((2, 2, 2, 2), ""), 4: ((1, 1, 1, 5),
                                      "decode layout: layers 0,1,2 stream 4 pages, the "
                                      "others keep all 5 resident")}),
])
def test_adaptive_window_follows_the_reshapes(captured: Capture, stage: str,
                                              shapes: dict[int, tuple[tuple[int, ...], str]]
                                              ) -> None:
    """GIVEN an adaptive capture THEN the window per layer changes at the step of the
    invalidate as its adapt line says, the pool slots are forgotten there, and every read of
    the next step served from the pool exactly the pages below the window it left."""
    path, code = captured("pool-pressure", "shared", "membership", *ADAPTIVE, "--stage-mib", stage)
    assert code == 0
    reads, snaps = _reads_and_windows(path)
    for step, (caps, note) in shapes.items():
        snap = snaps[step]
        assert tuple(snap.window(layer) for layer in range(4)) == caps, step
        assert snap.window_note() == note
        assert [snap.cell(0, layer, p).resident for layer in range(4) for p in range(6)] == [
            p < caps[layer] for layer in range(4) for p in range(6)]
    # the clear at step 4 forgot every holder and key; step 5 uploads the new window
    assert all(snaps[4].cell(0, layer, 0).holder is None for layer in range(4))
    checked = 0
    for read in reads:
        if read.step == 0:
            continue
        window = snaps[read.step - 1].window(read.layer)
        total = read.pool + read.ring + read.host
        assert read.pool == min(window, total), (read.step, read.layer)
        checked += 1
    assert checked >= 20


def test_reshaped_window_of_odd_adapt_lines() -> None:
    """A zero ring, a negative resident count or a layout below the resident count (a broken
    or hostile line) still gives a window, never a division by zero."""
    geo = PagesGeometry(layers=4, streams=(0,), pages=8, resident_per_layer=2, layout="shared")
    line = ev.Adapt(seq=1, t_ns=0, step=3, active=2048, resident=1, ring=0, layout=5)
    got = reshaped_window(geo, line, None)
    assert got is not None and sum(got.per_layer) == 4 and max(got.per_layer) <= 5
    assert reshaped_window(geo, ev.Adapt(seq=1, t_ns=0, step=3, active=0, resident=-3, ring=4),
                           None) == Window((0, 0, 0, 0), "window: 0 pages/layer")
    assert reshaped_window(geo, ev.Adapt(seq=1, t_ns=0, step=3, active=0, resident=3, ring=4,
                                         layout=2), None).per_layer == (3, 3, 3, 3)  # type: ignore[union-attr]
    assert reshaped_window(geo, None, None) is None


def _split_reads_trace(path: Path) -> Path:
    """A native-shaped trace whose runtime writes each view's read as two events per step —
    its resident part, then its ring part (a fork may; kvtrace.h itself splits a read past
    KVTRACE_READ_RUNS runs) — with the shared key letting stream 1 read stream 0's pool
    copy of page 0, and a second step whose ring part is read before the pool part."""
    header = {"format": "kvtrace", "version": "1.2", "kvdiag_version": "kvtrace.h 1.2",
              "created": "2026-12-01T00:00:00+00:00", "backend": "native",
              "device": {"name": "unknown"},
              "scenario": {"name": "split-reads", "source": "native",
                           "config": {"np": 2, "layout": "shared", "dispatch": "fits"}},
              "plan": {"page_bytes": 4096, "pool_pages": 5, "resident_pages_per_layer": 3,
                       "ring_slots": 2, "streamed_layers": 1, "layers": 1, "n_stream": 2,
                       "pages_per_stream": 3},
              "extra": {}, "records": ["step", "write", "upload", "read", "warn", "end"]}
    events: list[dict[str, object]] = []

    def emit(kind: str, step: int, **fields: object) -> None:
        events.append({"kind": kind, "seq": len(events) + 1, "t_ns": 1000 * (len(events) + 1),
                       "step": step, **fields})

    def read(step: int, stream: int, served: list[list[object]]) -> None:
        counts = {src: sum(int(r[1]) - int(r[0]) for r in served if r[2] == src)  # type: ignore[call-overload]
                  for src in ("pool", "ring", "host")}
        emit("read", step, layer=0, stream=stream, **counts, served=served)

    for step in (0, 1):
        emit("step", step, phase="decode", streams=[0, 1], tokens=1, n_kv=768)
        for stream in (0, 1):
            emit("write", step, layer=0, stream=stream, cells=[step, step + 1],
                 rows=[stream * 768 + step, stream * 768 + step + 1], dirty=[[0, None, 0]])
        emit("upload", step, layer=0, stream=0, pages=[0, 2], slot=2, target="resident",
             bytes=8192, reason="dirty")
        for stream in (0, 1):
            emit("upload", step, layer=0, stream=stream, pages=[2, 3], slot=stream,
                 target="ring", bytes=4096, reason="ring")
            pool = [[0, 2, "pool", 2]]
            ring = [[2, 3, "ring", stream]]
            for part in ((pool, ring) if step == 0 else (ring, pool)):
                read(step, stream, part)
    emit("end", 1, status="completed", steps=2, events=len(events))
    path.write_text("\n".join(json.dumps(x) for x in (header, *events)) + "\n")
    return path


def test_a_view_read_in_several_events_shows_every_page(tmp_path: Path) -> None:
    """GIVEN a runtime that writes one step's read of a view as several read events
    THEN the Pages state at that step has every page those events read, with the judgement's
    class, and flags exactly the pages the judgement finds foreign (query and replay alike)."""
    path = _split_reads_trace(tmp_path / "split.kvtrace")
    query, ref, _ = query_for(path)
    with TraceReader.open(path) as reader:
        judgement = Judge(reader.header).feed_all(list(reader)).snapshot()
    # stream 1's pages 0 and 1 come from pool slots 2-3, which hold stream 0's copies
    assert judgement.residency["read_classes"]["foreign"] == 4
    for step in (0, 1):
        snap = query.snapshot(step)
        assert snap.cells() == ref[step].cells()  # type: ignore[attr-defined]
        for stream in (0, 1):
            reads = snap.reads(stream, 0)
            assert [r.source if r else None for r in reads] == ["pool", "pool", "ring"]
            assert all(r is not None and r.step == step for r in reads)
        assert [(s, p, r.cls) for s, _, p, r in snap.flagged()] == [
            (1, 0, "foreign"), (1, 1, "foreign")]
        assert snap.flagged() == ref[step].flagged()  # type: ignore[attr-defined]


def _native_trace(path: Path, name: str, plan: dict[str, int], records: list[str],
                  lines: list[dict[str, Any]], steps: int) -> Path:
    """A trace as a one-stream fork writes it through kvtrace.h: a header declaring
    ``records``, the events of ``lines`` numbered in order, an End after ``steps`` steps."""
    header = {"format": "kvtrace", "version": "1.2", "kvdiag_version": "kvtrace.h 1.2",
              "created": "2026-12-01T00:00:00+00:00", "backend": "native",
              "device": {"name": "unknown"},
              "scenario": {"name": name, "source": "native",
                           "config": {"np": 1, "layout": "shared", "dispatch": "fits"}},
              "plan": {**plan, "streamed_layers": 1, "n_stream": 1}, "extra": {},
              "records": records}
    events = [{**e, "seq": i + 1, "t_ns": 10 * (i + 1)} for i, e in enumerate(lines)]
    events.append({"kind": "end", "seq": len(events) + 1, "t_ns": 100, "step": steps - 1,
                   "status": "completed", "steps": steps, "events": len(events)})
    path.write_text("\n".join(json.dumps(x) for x in (header, *events)) + "\n")
    return path


def test_the_grid_has_the_pages_read_beyond_every_upload(tmp_path: Path) -> None:
    """GIVEN a runtime without pages_per_stream in its plan whose view covers two pages but
    that uploads only page 0, reading page 1 from a ring slot nothing was copied into (the
    judgement: foreign, the slot held nothing) and, the next step, from the host (a fallback)
    THEN the Pages grid has page 1 and marks it as the judgement does (it was one column
    wide: the pages came from the highest upload only)."""
    from kvdiag.tui.shown import shown

    lines = [
        {"kind": "step", "step": 0, "phase": "prefill", "streams": [0], "tokens": 300,
         "n_kv": 512},
        {"kind": "write", "step": 0, "layer": 0, "stream": 0, "cells": [0, 300],
         "rows": [0, 300], "dirty": [[0, None, 0], [0, None, 1]]},
        {"kind": "upload", "step": 0, "layer": 0, "stream": 0, "pages": [0, 1], "slot": 2,
         "target": "resident", "bytes": 4096, "reason": "miss"},
        {"kind": "read", "step": 0, "layer": 0, "stream": 0, "pool": 1, "ring": 1, "host": 0,
         "served": [[0, 1, "pool", 2], [1, 2, "ring", 0]]},
        {"kind": "step", "step": 1, "phase": "decode", "streams": [0], "tokens": 1,
         "n_kv": 512},
        {"kind": "read", "step": 1, "layer": 0, "stream": 0, "pool": 0, "ring": 0, "host": 2,
         "served": [[0, 2, "host", -1]]},
    ]
    path = _native_trace(tmp_path / "no-ring-upload.kvtrace", "no-ring-upload",
                         {"page_bytes": 4096, "pool_pages": 3, "resident_pages_per_layer": 1,
                          "ring_slots": 2},
                         ["step", "write", "upload", "read", "warn", "end"], lines, 2)
    view = shown(str(path), steps=[0, 1])
    assert view.reads[4] == (1, 0, 1, 0)  # the judgement: page 0 exact, page 1 foreign
    assert view.pages[0] == [(0, 0, 1, "!")]
    assert view.pages[1] == []  # read from the host at step 1: nothing flagged


def test_the_grid_has_the_pages_read_beyond_every_write_and_upload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a runtime that pads its attention past the cells written (n_kv rounded up) and
    reads two pages nothing wrote or uploaded, from ring slots nothing was copied into (the
    judgement: foreign) THEN the Pages grid has those columns and marks them as the judgement
    does (no event the index keeps names them: only the judged pieces do)."""
    from kvdiag.tui.shown import load_document, shown

    lines = [
        {"kind": "step", "step": 0, "phase": "prefill", "streams": [0], "tokens": 300,
         "n_kv": 1024},
        {"kind": "write", "step": 0, "layer": 0, "stream": 0, "cells": [0, 300],
         "rows": [0, 300], "dirty": [[0, None, 0], [0, None, 1]]},
        {"kind": "upload", "step": 0, "layer": 0, "stream": 0, "pages": [0, 2], "slot": 4,
         "target": "resident", "bytes": 8192, "reason": "miss"},
        {"kind": "read", "step": 0, "layer": 0, "stream": 0, "pool": 2, "ring": 2, "host": 0,
         "served": [[0, 2, "pool", 4], [2, 4, "ring", 0]]},
    ]
    path = _native_trace(tmp_path / "padded.kvtrace", "padded-n-kv",
                         {"page_bytes": 4096, "pool_pages": 6, "resident_pages_per_layer": 2,
                          "ring_slots": 4},
                         ["step", "write", "upload", "read", "invalidate", "warn", "end"],
                         lines, 1)
    view = shown(str(path), steps=[0])
    assert view.reads[4] == (2, 0, 2, 0)  # the judgement: pages 2 and 3 foreign
    assert view.pages[0] == [(0, 0, 2, "!"), (0, 0, 3, "!")]
    doc = load_document(str(path))
    assert doc.geometry is not None and doc.geometry.pages == 4
    # judged in a child process, then read back from the judgement cache: the same width
    from kvdiag.tui.document import Document, TraceDoc
    from kvdiag.tui.loading import load_trace

    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(tmp_path / "cache"))
    for cached in (False, True):
        docs: list[Document] = []
        load_trace(str(path), docs.append, judge_in_process=True)
        last = docs[-1]
        assert isinstance(last, TraceDoc) and last.geometry is not None
        assert last.geometry.pages == 4 and ("cached" in last.timings) == cached
