"""Every screen renders the judgement (issue 15 §2): on traces of kvrt, a C runtime with its own
page-level truth (tests/native_runtime.py), and on model captures, the Pages glyphs, ``n``, the
Timeline's classes, the Fits conditions and the Overview's "not recorded" are the judgement's —
and for kvrt they are what the bytes in the slots say."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from native_runtime import Built, RuntimeRun, TruthPage, run
from textual.pilot import Pilot

from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.document import TraceDoc
from kvdiag.tui.pagestext import GLYPH
from kvdiag.tui.rows import FitsRows, TraceRows
from kvdiag.tui.screens.fits import FitsScreen
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.timeline import TimelineScreen
from kvdiag.tui.shown import pages_marked, shown
from tests.conftest import Capture
from tests.test_tui_pilot import drive, lines, show, text

Cell = tuple[int, int, int, str]


@pytest.fixture(scope="module")
def runs(kvrt: Built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, RuntimeRun]:
    out = tmp_path_factory.mktemp("kvrt")
    return {name: run(name, out, kvrt) for name in ("ring-reuse", "slot1-first", "unevaluated")}


def truth_cells(truth: Iterable[TruthPage], step: int) -> set[Cell]:
    """The cells a grid at ``step`` must mark: the pages of each (layer, stream)'s latest read
    up to that step that kvrt found stale or foreign in the slot's bytes."""
    pages = [t for t in truth if t.step <= step]
    last: dict[tuple[int, int], int] = {}
    for t in pages:
        last[(t.layer, t.stream)] = max(last.get((t.layer, t.stream), 0), t.seq)
    return {(t.stream, t.layer, t.page, GLYPH[t.cls]) for t in pages
            if t.seq == last[(t.layer, t.stream)] and t.cls != "exact"}


def doc_of(app: KvdiagApp) -> TraceDoc:
    doc = app.docs[0]
    assert isinstance(doc, TraceDoc) and doc.judged
    return doc


def grid_glyphs(app: KvdiagApp) -> list[str]:
    """The glyph column of every cell drawn in the grids' layer rows (9 columns per cell)."""
    out: list[str] = []
    for row in lines(app):
        for panel in row.split("││"):
            panel = panel.strip("│")
            if panel[:1] == "L" and panel[1:2].isdigit():
                out += [panel[4 + 9 * i] for i in range((len(panel) - 4) // 9)]
    return out


@pytest.mark.parametrize("name", ["ring-reuse", "slot1-first"])
def test_pages_marks_the_cells_kvrt_read_wrong_and_n_finds_them(
        runs: dict[str, RuntimeRun], name: str) -> None:
    """GIVEN a kvrt trace (ring slots reused by another layer; the upstream (layer, page) keys)
    WHEN Pages opens and n is pressed THEN n lands on the first step where kvrt read a wrong
    page, and at every step the grid marks exactly the pages whose latest read kvrt found
    stale (~) or foreign (!) — none at step 0 of slot1-first."""
    result = runs[name]
    bad_steps = sorted({t.step for t in result.truth if t.cls != "exact"})

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "home")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        doc = doc_of(app)
        if bad_steps[0] > 0:
            assert grid_glyphs(app).count("!") + grid_glyphs(app).count("~") == 0
            await show(pilot, "n")
        assert app.step == bad_steps[0]
        want = truth_cells(result.truth, app.step)
        assert want and set(pages_marked(doc, app.step)) == want
        glyphs = grid_glyphs(app)
        assert glyphs.count("!") == sum(1 for c in want if c[3] == "!")
        assert glyphs.count("~") == sum(1 for c in want if c[3] == "~")
        # the info line counts the step's wrong pages; after n the cursor is on one of them
        assert f"{len(want)} stale/foreign page read(s) at this step" in text(app)
        if bad_steps[0] > 0:
            here = screen.location()
            assert any(c[:3] == (here.stream, here.layer, here.page) for c in want)
        for step in range(doc.index.last_step + 1):
            assert set(pages_marked(doc, step)) == truth_cells(result.truth, step), step
        await show(pilot, "N")
        assert app.step == bad_steps[0]  # nothing before the first one

    drive([result.trace], script)


def test_pages_names_whose_bytes_a_reused_ring_slot_held(runs: dict[str, RuntimeRun]) -> None:
    """The cell of a ring page whose slot another layer overwrote says so (kvrt's holder)."""
    result = runs["ring-reuse"]
    other_layer = next(t for t in result.truth if t.cls == "foreign" and t.source == "ring"
                       and t.holder is not None and t.holder[1] != t.layer)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        from kvdiag.tui.navigation import Target
        screen.go_to(Target("pages", 0, step=other_layer.step, layer=other_layer.layer,
                            stream=other_layer.stream, page=other_layer.page))
        await pilot.pause()
        words = " ".join(text(app).split())
        assert other_layer.holder is not None
        hs, hl, hp = other_layer.holder
        assert (f"Read at this step from ring: FOREIGN, the slot held another layer's bytes "
                f"(layer {hl} stream {hs} page {hp})") in words

    drive([result.trace], script)


def test_timeline_shows_each_reads_class(runs: dict[str, RuntimeRun]) -> None:
    """Every read row of the Timeline carries the class kvrt found (foreign before stale) and
    names the classes in its text; the visible rows show them."""
    result = runs["ring-reuse"]
    worst: dict[int, str] = {}
    for t in result.truth:
        if t.cls == "foreign" or (t.cls == "stale" and worst.get(t.seq) != "foreign"):
            worst[t.seq] = t.cls
        worst.setdefault(t.seq, "")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "2")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        rows = screen.rows
        assert isinstance(rows, TraceRows)
        seen = 0
        for i in range(len(rows)):
            cells, mark = rows.row(i)
            if cells[3] != "read":
                continue
            seq = int(str(cells[0]))
            assert mark == worst[seq], seq
            summary = str(cells[6])
            assert ("FOREIGN" in summary) == (worst[seq] == "foreign" or "FOREIGN" in summary)
            if worst[seq]:
                assert worst[seq].upper() in summary
            seen += 1
        assert seen == len(worst)
        screen.set_filter("kind:read")
        await pilot.pause()
        visible = [r for r in lines(app) if " read " in r]
        assert visible and any("ring FOREIGN (L" in r for r in visible)
        assert all("judging" not in r for r in visible)

    drive([result.trace], script)


def test_fits_shows_the_conditions_of_an_unevaluated_native_decision(
        runs: dict[str, RuntimeRun]) -> None:
    """kvrt's --unevaluated fits events name no failed condition (evaluated false): the Fits
    screen shows the conditions the judgement evaluates from the logged geometry, where it used
    to say "not evaluated"."""
    result = runs["unevaluated"]

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "3")
        rows = [r for r in lines(app) if "fallback" in r and "FALSE" in r]
        assert rows and all("Q.ne[3]==1" in r and "not evaluated" not in r for r in rows)
        fits = app.screen
        assert isinstance(fits, FitsScreen) and isinstance(fits.rows, FitsRows)
        first = next(i for i in range(len(fits.rows)) if fits.rows.row(i)[0][4] == "fallback")
        fits.table.go_to(first)
        await pilot.pause()
        screen = " ".join(text(app).split())
        assert "failed condition(s), evaluated by kvdiag from the logged geometry" in screen
        assert "✗ Q.ne[3]==1 (Q.ne[3]=2)" in screen
        assert "fell back to ordinary flash attention" in screen
        assert "conditions not evaluated" not in screen

    drive([result.trace], script)


def _without(trace: Path, kind: str, dest: Path, *, undeclare: bool) -> Path:
    """``trace`` with every ``kind`` event removed (and, with ``undeclare``, the kind taken out
    of the header's declaration of what the writer records)."""
    with trace.open("rb") as src, dest.open("wb") as out:
        header = json.loads(src.readline())
        if undeclare and isinstance(header.get("records"), list):
            header["records"] = [r for r in header["records"] if r.split(".")[0] != kind]
        out.write(json.dumps(header).encode() + b"\n")
        for line in src:
            if json.loads(line).get("kind") != kind:
                out.write(line)
    return dest


def test_overview_says_what_a_trace_without_uploads_does_not_record(
        runs: dict[str, RuntimeRun], tmp_path: Path) -> None:
    """A fork that never calls KVTRACE_UPLOAD: the Overview names the kind and what it hides,
    and no page read from a slot is marked (not judged: ``?``), not "exact"."""
    trace = _without(runs["slot1-first"].trace, "upload", tmp_path / "no-upload.kvtrace",
                     undeclare=True)
    view = shown(str(trace), steps=[1])
    assert view.not_recorded == ("upload",)
    assert not any(c[3] in "!~" for c in view.pages[1]) and view.pages[1]

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        screen = " ".join(text(app).split())
        assert "not recorded: upload (as its writer declares)" in screen
        assert ("upload not recorded — slot contents: no page read from a pool or ring slot "
                "is judged") in screen
        await show(pilot, "4", "right")
        assert "?P" in text(app) and "!P" not in text(app)

    drive([trace], script)


def test_model_capture_without_writes_says_so(captured: Capture, tmp_path: Path) -> None:
    """A model capture (no declaration: completeness inferred) with its write events removed."""
    path, _ = captured("slot1-first", "shared", "membership")
    trace = _without(path, "write", tmp_path / "no-write.kvtrace", undeclare=False)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        screen = " ".join(text(app).split())
        assert "not recorded: write (inferred from what the trace contains" in screen
        assert "write not recorded — page versions" in screen

    drive([trace], script)


def test_model_capture_pages_and_n_follow_the_judgement(captured: Capture) -> None:
    """On a model capture with the aliasing bug, n goes to the first step with a stale or
    foreign read the judgement lists, and the grid marks exactly the stale and foreign pages of
    each view's latest read in the ledger (not the model's annotation)."""
    path, _ = captured("slot1-first", "shared", "membership")
    view = shown(str(path))
    first = min(view.scrubber["foreign"] + view.scrubber["stale"])

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "home", "n")
        assert app.step == first > 0
        doc = doc_of(app)
        digest = doc.digest
        assert digest is not None
        ledger = digest.ledger
        reads = ledger.reads.array
        rows = doc.index.cutoff(first)
        want: set[Cell] = set()
        for layer, stream in {(int(r["layer"]), int(r["stream"])) for r in reads}:
            mine = reads[(reads["layer"] == layer) & (reads["stream"] == stream)
                         & (reads["row"] < rows)]
            if mine.size:
                read = ledger.read_at(int(mine["row"][-1]))
                assert read is not None
                for p in ledger.pieces_of(read):
                    glyph = {1: "~", 2: "!"}.get(int(p["cls"]))
                    want |= {(stream, layer, page, glyph) for page in range(p["begin"], p["end"])
                             if glyph is not None}
        marked = pages_marked(doc, first)
        assert want and set(marked) == want and marked == view.pages[first]
        glyphs = grid_glyphs(app)
        assert glyphs.count("!") + glyphs.count("~") == len(want)

    drive([path], script)


def test_fits_screen_without_fits_events_says_not_recorded(captured: Capture,
                                                            tmp_path: Path) -> None:
    """GIVEN the capture whose fits decisions the judgement finds mismatched (two slots,
    membership dispatch) with every fits event taken out THEN the Fits screen says fits is not
    recorded and what that hides, as check does — not "mismatch 0, fallback 0"."""
    path, _ = captured("two-slot-concurrent", "shared", "membership")
    trace = _without(path, "fits", tmp_path / "no-fits.kvtrace", undeclare=False)
    assert "fits" in shown(str(trace), steps=[0]).not_recorded

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "3")
        screen = " ".join(text(app).split())
        assert ("0 fits() decision(s), 0 false · routes: - · fits not recorded: dispatch "
                "decisions: fits-dispatch-mismatch and fallback are not judged") in screen
        assert "mismatch 0" not in screen

    drive([trace], script)
