"""What the viewer says: event lines, fits explanations, page cells, sparklines, crash views,
source snippets, status lines (pure functions; no textual)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import msgspec
import numpy as np
import pytest
from rich.console import Console, RenderableType

from kvdiag.analysis.judgement.fits import FitsJudge
from kvdiag.analysis.judgement.ledger import PIECES
from kvdiag.analysis.replay import Holder, LastRead, PageCell, PagesGeometry, assemble
from kvdiag.model import events as ev
from kvdiag.model.frames import Frame
from kvdiag.tui.crashes import from_abort, group, resolve_source, snippet
from kvdiag.tui.eventtext import ReadJudged, describe
from kvdiag.tui.fitsdetail import condition_cells, explain, fits_detail
from kvdiag.tui.pagestext import cell_label, cell_mark, cell_words
from kvdiag.tui.sparkline import BLOCKS, cursor_columns, resample, sparkline
from tests.tui_samples import fits_fields


def render(renderable: RenderableType, width: int = 160) -> str:
    out = StringIO()
    Console(file=out, width=width, color_system=None, record=False).print(renderable)
    return out.getvalue()


def _pieces(*runs: tuple[int, int, int, int, int, int, int, int]) -> np.ndarray:
    """Ledger pieces (begin, end, source, slot, class, lag, holder layer, holder stream)."""
    rows = [(0, b, e, src, slot, cls, lag, hl, hs, b if hl >= 0 else -1, 1, 0, 7, 0)
            for b, e, src, slot, cls, lag, hl, hs in runs]
    return np.array(rows, dtype=np.dtype(PIECES))


def test_describe_events() -> None:
    read = ev.Read(seq=9, t_ns=0, step=3, layer=1, stream=1, pool=2, ring=1, host=0,
                   served=(ev.Served(2, 3, "ring", 0), ev.Served(0, 2, "pool", 4)))
    # the judgement's verdict, not the model's annotation (which says all exact here)
    annotated = msgspec.structs.replace(read, ranges=(ev.ReadRange(0, 3, "pool", 1, "exact"),))
    foreign = ReadJudged((1, 0, 2, 0), _pieces((0, 2, 0, 4, 2, 0, 1, 0)))
    assert describe(annotated, foreign) == (
        "pool 2 ring 1 host 0: 0-1 pool FOREIGN (s0's); 2 ring", "foreign")
    assert describe(read) == ("pool 2 ring 1 host 0: judging…", "")
    reuse = ReadJudged((2, 0, 1, 0), _pieces((2, 3, 1, 0, 2, 0, 3, 1)))
    assert describe(read, reuse) == ("pool 2 ring 1 host 0: 0-1 pool; 2 ring FOREIGN "
                                     "(L3 s1 p2's)", "foreign")
    empty = ReadJudged((2, 0, 1, 0), _pieces((1, 2, 0, 5, 2, 0, -1, -1)))
    assert describe(read, empty)[0] == ("pool 2 ring 1 host 0: 0 pool; 1 pool FOREIGN "
                                        "(empty slot); 2 ring")
    stale = ev.Read(seq=9, t_ns=0, step=3, layer=1, stream=1, pool=1, ring=0, host=0,
                    served=(ev.Served(2, 3, "pool", 6),))
    assert describe(stale, ReadJudged((0, 1, 0, 0), _pieces((2, 3, 0, 6, 1, 4, 1, 1)))) == (
        "pool 1 ring 0 host 0: 2 pool STALE -4v", "stale")
    no_upload = ReadJudged((0, 0, 0, 1), np.array(
        [(0, 2, 3, 0, 6, 3, 0, -1, -1, -1, -1, -1, -1, 2)], dtype=np.dtype(PIECES)))
    assert describe(stale, no_upload) == (
        "pool 1 ring 0 host 0: 2 pool NOT JUDGED (upload not recorded)", "")
    unserved = ev.Read(seq=9, t_ns=0, step=3, layer=1, stream=1, pool=2, ring=0, host=0,
                       ranges=(ev.ReadRange(0, 2, "pool", 0, "foreign"),))
    assert describe(unserved, ReadJudged((0, 0, 0, 2), _pieces()))[0].endswith(
        "not judged: read.served not recorded (where each page came from is unknown)")
    up = ev.Upload(seq=1, t_ns=0, step=0, layer=0, stream=1, pages=(0, 2), slot=10,
                   target="resident", bytes=950272, reason="miss")
    assert describe(up) == ("resident pages 0-1 -> slot 10 (miss) 928 KiB key (layer,page)", "")
    write = ev.Write(seq=2, t_ns=0, step=1, layer=0, stream=0, cells=(0, 300), rows=(0, 300),
                     dirty=((0, None, 0), (0, None, 1)), versions=((0, 1), (1, 1)))
    assert describe(write) == ("cells 0-300 rows 0-300 marked (0,-,0) (0,-,1) v p0=1 p1=1", "")
    out = ev.Output(seq=3, t_ns=0, step=2, stream=1, checksum="a", ref_checksum="b",
                    max_abs_delta=0.5, tolerance=1e-3, worst_layer=1)
    assert describe(out) == ("crc a ref b max|d| 0.5 > 0.001 worst layer 1", "diverged")
    fits = ev.Fits(seq=4, t_ns=0, step=0, **fits_fields(0, 512, 1, 2))
    text, mark = describe(fits, FitsJudge().verdict(fits))
    assert mark == "abort"
    assert text == "__fattn__-0 fits=FALSE route abort failed: Q.ne[3]==1, K.ne[3]==1, V.ne[3]==1"
    # a fork that did not evaluate: the conditions are the judgement's, and it says so
    native = msgspec.structs.replace(fits, failed=(), evaluated=False, route="fallback")
    assert describe(native, FitsJudge().verdict(native)) == (
        "__fattn__-0 fits=FALSE route fallback failed: Q.ne[3]==1, K.ne[3]==1, V.ne[3]==1 "
        "(evaluated by kvdiag)", "fits-false")
    ordinary = msgspec.structs.replace(fits, route="ordinary")
    assert describe(ordinary, FitsJudge().verdict(ordinary))[1] == ""  # not a bad outcome
    unknown = ev.Unknown("gpu_clock", 5, 0, 0, {"mhz": 7})
    assert describe(unknown) == ('gpu_clock {"mhz":7}', "")


def test_condition_cells_and_explanations() -> None:
    assert condition_cells("K.ne[3]==1") == {("K", "ne", 3)}
    assert condition_cells("K.ne[1]==V.ne[1]") == {("K", "ne", 1), ("V", "ne", 1)}
    assert condition_cells("K.runtime==V.runtime") == {("K", "runtime", -1),
                                                       ("V", "runtime", -1)}
    assert condition_cells("mode(K,V)!=UNSUPPORTED") == {("K", "type", -1), ("V", "type", -1)}
    assert condition_cells("V.nb[1]==row_size*V.ne[2]") == {("V", "nb", 1), ("V", "ne", 2),
                                                           ("V", "type", -1)}
    assert "several KV streams" in explain("K.ne[3]==1")
    assert explain("made-up") == "no explanation recorded for this condition"


def test_fits_detail_names_and_explains_each_failed_condition() -> None:
    fits = ev.Fits(seq=4, t_ns=0, step=0, **fits_fields(0, 512, 1, 2))
    text = render(fits_detail(fits, FitsJudge().verdict(fits)))
    assert "fits() = false, route abort" in text
    assert "3 failed condition(s), as the writer evaluated them:" in text
    for name in ("Q", "K", "V"):
        assert f"✗ {name}.ne[3]==1 ({name}.ne[3]=2)  " in text
    assert "the streamed kernel handles one" in text
    assert "routes on buffer membership" in text
    assert "1 not evaluable:\n  ? sinks==NULL: sinks not recorded" in text
    assert "22 held: K.runtime!=NULL, V.runtime!=NULL, K.runtime==V.runtime, Q.type==f32" in text
    ok = ev.Fits(seq=4, t_ns=0, step=0, **fits_fields(0, 512, 1, 1))
    shown = render(fits_detail(ok, FitsJudge().verdict(ok)))
    assert "no condition failed of the 25 kvdiag could evaluate" in shown


def test_fits_detail_of_an_unevaluated_native_decision_shows_the_judgement() -> None:
    """A fork's fits event with evaluated false and no failed list: the pane shows the
    conditions the judgement evaluates from the logged geometry, not "not evaluated"."""
    fits = ev.Fits(seq=4, t_ns=0, step=0, **{**fits_fields(1, 512, 1, 2), "failed": (),
                                            "evaluated": False, "route": "fallback"})
    verdict = FitsJudge().verdict(fits)
    assert verdict.by == "kvdiag" and verdict.failed == ("Q.ne[3]==1", "K.ne[3]==1",
                                                        "V.ne[3]==1")
    text = render(fits_detail(fits, verdict))
    assert "not evaluated" not in text
    assert "3 failed condition(s), evaluated by kvdiag from the logged geometry" in text
    assert "✗ K.ne[3]==1 (K.ne[3]=2)" in text
    assert "fell back to ordinary flash attention" in text
    # operands the writer did not record: each condition that needs them says so
    bare = ev.Tensor("", "", (0, 0, 0, 0), (0, 0, 0, 0))
    blind = msgspec.structs.replace(fits, q=bare, k=bare, v=bare, dst=bare, mask=None)
    blind_text = render(fits_detail(blind, FitsJudge().verdict(blind)))
    assert "✗ K.runtime!=NULL (K.runtime=NULL)" in blind_text
    assert "  ? K.ne[3]==1: K.ne[3] not recorded" in blind_text
    assert "✗ K.ne[3]" not in blind_text


def _snapshot() -> object:
    geo = PagesGeometry(layers=1, streams=(0, 1), pages=3, resident_per_layer=2,
                        layout="shared")
    # the judgement's runs: page 0 holds stream 0's page 0, page 1 an old copy, 2 exact
    reads = {(0, 1): ((0, 1, LastRead(5, "pool", 0, "foreign", 0, 0, 0)),
                      (1, 2, LastRead(5, "pool", 1, "stale", 2, 0, 1)),
                      (2, 3, LastRead(5, "ring", 1, "exact", 0, 0)))}
    slots = {(0, None, 0): 4, (0, None, 1): 5}
    holders = {4: Holder(0, 0, 0, 3), 5: Holder(0, 1, 1, 1)}
    return assemble(geo, 5, read_of=lambda layer, s: reads.get((layer, s)),
                    slot_of=slots.get, holder_of=holders.get,
                    version_of=lambda layer, s, p: 3, dirty=frozenset({(0, None, 1)}))


def test_page_cells_in_labels_and_words() -> None:
    snap = _snapshot()
    foreign, stale, ring = (snap.cell(1, 0, p) for p in range(3))  # type: ignore[attr-defined]
    assert foreign == PageCell(0, True, 3, 4, Holder(0, 0, 0, 3),
                               LastRead(5, "pool", 0, "foreign", 0, 0, 0), False)
    assert (cell_label(foreign), cell_mark(foreign, 5)) == ("P0:0v3", "foreign")
    assert (cell_label(stale), cell_mark(stale, 5)) == ("P1:1v1*", "stale")
    assert (cell_label(ring), cell_mark(ring, 5)) == ("R", "ring")
    assert cell_label(snap.cell(0, 0, 2)) == "·"  # type: ignore[attr-defined]
    assert cell_mark(snap.cell(0, 0, 2), 5) == "empty"  # type: ignore[attr-defined]
    words = cell_words(snap, 1, 0, 0)  # type: ignore[arg-type]
    assert words.startswith("step 5 · layer 0 · stream 1 · page 0: in the resident window, "
                            "bookkeeping key (0, -, 0) → pool slot 4.")
    assert "FOREIGN, stream 1 read stream 0's bytes (layer 0 stream 0 page 0)" in words
    assert "STALE, 2 version(s) behind" in cell_words(snap, 1, 0, 1)  # type: ignore[arg-type]
    assert "beyond the resident window" in cell_words(snap, 1, 0, 2)  # type: ignore[arg-type]
    assert [(s, layer, p) for s, layer, p, _ in snap.flagged()] == [  # type: ignore[attr-defined]
        (1, 0, 0), (1, 0, 1)]


def test_sparkline_scales_and_marks_the_cursor() -> None:
    values = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    line = sparkline(values, 8, cursor=3)
    assert line.plain == BLOCKS
    cursor_spans = [s for s in line.spans if s.style == "reverse"]
    assert [(s.start, s.end) for s in cursor_spans] == [(3, 4)]
    assert resample(np.arange(10.0), 5).tolist() == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert resample(np.array([1.0, np.nan, np.nan, 3.0]), 2).tolist() == [1.0, 3.0]
    assert cursor_columns(9, 10, 5) == range(4, 5) and cursor_columns(0, 10, 5) == range(0, 1)
    # fewer samples than columns: each sample is drawn wide, the cursor too
    wide = sparkline(np.array([0.0, 7.0]), 6, cursor=1)
    assert wide.plain == "▁▁▁███"
    assert [(sp.start, sp.end) for sp in wide.spans if sp.style == "reverse"] == [
        (3, 4), (4, 5), (5, 6)]
    with_gap = sparkline(np.array([1.0, np.nan, 3.0]), 3, lo=0.0)
    assert with_gap.plain[1] == " "
    assert sparkline(np.array([np.nan]), 4).plain == "no samples"


def test_crash_views_from_trace_aborts(tmp_path: Path) -> None:
    abort = ev.Abort(seq=5, t_ns=0, step=0, message="x.cu:12: GGML_ASSERT(fits) failed",
                     file="/src/ggml/x.cu", line=12, condition="fits",
                     backtrace=("ggml_print_backtrace", "ggml_abort", "kernel (inlined)", "main"))
    view = from_abort(0, abort)
    assert view.title == "fits" and view.fingerprint == "x.cu:12"
    assert [(f.function, f.inlined, f.in_app) for f in view.frames] == [
        ("ggml_print_backtrace", False, False), ("ggml_abort", False, False),
        ("kernel", True, True), ("main", False, True)]
    twice = group([view, from_abort(1, abort), from_abort(2, ev.Abort(
        seq=9, t_ns=0, step=1, message="other", file="y.cu", line=1))])
    assert [len(g) for g in twice] == [2, 1]
    assert Frame(index=0).in_app


def test_source_snippets_resolve_build_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    src = tmp_path / "ggml" / "src" / "x.cu"
    src.parent.mkdir(parents=True)
    src.write_text("\n".join(f"line {i}" for i in range(1, 21)) + "\n")
    assert resolve_source(str(src), []) == src
    # a path from the build machine resolves by its tail under a local checkout
    assert resolve_source("/home/ci/llama.cpp/ggml/src/x.cu", [tmp_path]) == src
    assert resolve_source("x.cu", [tmp_path / "ggml" / "src"]) is None  # a bare name never
    assert resolve_source("/nowhere/a/b.c", [tmp_path]) is None
    assert snippet(src, 12, 2) == [(10, "line 10"), (11, "line 11"), (12, "line 12"),
                                   (13, "line 13"), (14, "line 14")]
    assert snippet(src, 1, 1) == [(1, "line 1"), (2, "line 2")]


def test_page_words_say_whose_bytes_and_why_not_judged() -> None:
    """A ring slot another layer overwrote, an empty slot, a page the trace cannot judge."""
    geo = PagesGeometry(layers=2, streams=(0, 1), pages=3, resident_per_layer=1,
                        layout="per-stream")
    reads = {(1, 0): ((0, 1, LastRead(4, "pool", -1, "foreign", 0, -1, -1)),
                      (1, 2, LastRead(4, "ring", 1, "foreign", 0, 0, 2)),
                      (2, 3, LastRead(4, "ring", -1, "not judged", 0, -1, -1, 2)))}
    snap = assemble(geo, 4, read_of=lambda layer, s: reads.get((layer, s)),
                    slot_of=lambda key: None, holder_of=lambda slot: None,
                    version_of=lambda layer, s, p: 1, dirty=frozenset())
    words = [" ".join(cell_words(snap, 0, 1, p).split()) for p in range(3)]
    assert "FOREIGN, the slot held nothing (never uploaded, or emptied)" in words[0]
    assert ("FOREIGN, the slot held another layer's bytes (layer 0 stream 1 page 2)"
            in words[1])
    assert ("not judged (no upload into this kind of slot recorded: what the slot held is "
            "unknown)") in words[2]
    cells = snap.row(0, 1)
    assert [cell_mark(c, 4) for c in cells] == ["foreign", "foreign", "empty"]
    assert [c.flagged for c in cells] == [True, True, False]


def test_timeline_says_an_uploads_unknown_bytes() -> None:
    """A fork's upload of unknown size (-1, or null as kvtrace.h writes it) is described as
    unknown, not as "-0 KiB"; a zero-byte upload stays 0 KiB."""
    def up(nbytes: int | None) -> str:
        return describe(ev.Upload(seq=3, t_ns=0, step=2, layer=1, stream=0, pages=(5, 6),
                                  slot=3, target="ring", bytes=nbytes, reason="ring"))[0]

    assert up(-1) == up(None) == up(-4096) == "ring pages 5 -> slot 3 (ring) bytes unknown"
    assert up(0) == "ring pages 5 -> slot 3 (ring) 0 KiB"


def test_fits_detail_never_shows_an_unrecorded_stage_as_zero() -> None:
    """A fits event whose stage_bytes is 0 (not recorded: an import without the boot's sizes,
    a fork that left plan.stage_bytes unset) shows the header plan's stage marked as the
    header's, or unknown — not "stage_bytes 0"; a recorded stage is shown as recorded."""
    from kvdiag.tui.fitsdetail import stage_text

    fits = ev.Fits(seq=9, t_ns=0, step=3, **{**fits_fields(2, 1024, 1, 2), "stage_bytes": 0})
    shown = render(fits_detail(fits, FitsJudge().verdict(fits), plan_stage=475136))
    assert ("stage_bytes not recorded in this event; the header's plan says 475136 (from the "
            "header)") in shown
    assert "stage_bytes 0" not in shown
    assert stage_text(fits) == stage_text(fits, 0) == stage_text(fits, True) == (
        "stage_bytes unknown (not recorded)")
    assert "stage_bytes unknown (not recorded)" in render(
        fits_detail(fits, FitsJudge().verdict(fits)))
    recorded = msgspec.structs.replace(fits, stage_bytes=73728)
    assert stage_text(recorded, 475136) == "stage_bytes 73728"
