"""The Pages screen and footer at 80×24 (issue 11 item 16) and dirty marks outside the resident
window (item 11): glyphs as well as colours, a legend, labelled non-streamed layers, and a
marker on the page a 1.1 ``mark`` put outside every window."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvdiag.analysis.replay import PagesGeometry
from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence, Finding, Severity
from kvdiag.trace import writer as writer_module
from kvdiag.trace.writer import TraceWriter
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.compare import Alignment, aligned_step
from kvdiag.tui.eventtext import describe
from kvdiag.tui.marks import place
from kvdiag.tui.navigation import SCREENS
from kvdiag.tui.screens.findings import FindingRows, evidence_count
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.widgets.pages_grid import PagesGrid
from kvdiag.tui.widgets.virtual_table import VirtualTable
from tests.conftest import Capture
from tests.test_tui_pilot import drive, lines, show, text
from tests.tui_samples import (
    FakeClock,
    header,
    write_aliasing,
    write_marks,
    write_samples,
)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_samples(tmp_path_factory.mktemp("marks"),
                         aliasing=write_aliasing, marks=write_marks)


def grid_row(app: KvdiagApp, label: str) -> str:
    return next(r for r in lines(app) if r.startswith(f"│{label} "))


def test_the_footer_fits_80_columns_on_every_screen(samples: dict[str, Path]) -> None:
    """Every screen's footer ends with the palette key in the last columns (nothing cut, no
    stray character from overflowing text in the last column) and keeps Help and Quit."""
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        for key, screen in zip("12345678", SCREENS, strict=True):
            await show(pilot, key)
            footer = lines(app)[-1]
            assert len(footer) == 80 and footer.endswith("▏^p palette "), (screen, footer)
            assert "12345678 Screens ? Help q Quit" in footer, (screen, footer)

    drive([samples["aliasing"]], script, size=(80, 24))


def test_pages_marks_stale_and_foreign_by_glyph_with_a_legend(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "right", "right")
        row = grid_row(app, "L0")
        left, right = row.split("││")
        assert "  P0:0v1" in left and "!P0:0v1" in right  # read exactly at step 1; foreign now
        legend = " ".join(text(app).split())
        assert ("! foreign read (another stream's, layer's or page's bytes) · ~ stale read "
                "(older version) · ? not judged") in legend

    drive([samples["aliasing"]], script, size=(80, 24))


def test_pages_shows_marks_outside_the_window(samples: dict[str, Path]) -> None:
    """GIVEN slot 1's rows marked as global pages 4-5 (outside a 2-page window) THEN the pages
    they belong to (stream 1 pages 0-1) carry ``^``, the info line counts them, the cell says
    the resident copy is never refreshed, and layer 2 (not streamed) is labelled."""
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        screen = text(app)
        assert "2 page(s) marked outside the window (^)" in screen
        left, right = grid_row(app, "L0").split("││")
        assert "P1:0v1^" in right and "P1:1v1^" in right and "^" not in left
        assert grid_row(app, "L2").count("L2  not streamed: K/V in device memory") == 2
        await show(pilot, "right", "tab", "right_square_bracket")
        screen = " ".join(text(app).split())
        assert "1 page(s) marked outside the window (^)" in screen
        left, right = grid_row(app, "L1").split("││")
        assert "~P1:1v1^" in right and "P1:0v1 " in right
        assert ("step 1 · layer 0 · stream 1 · page 1: in the resident window" in screen)
        assert ("Marked at this step (mark #10) as global page 5 (stream 1 page 1): outside "
                "the window: this page's resident copy is never refreshed.") in screen
        await show(pilot, "down", "down")
        assert "layer 2 is not streamed (the plan streams layers 0-1)" in " ".join(
            text(app).split())

    drive([samples["marks"]], script, size=(100, 30))


def test_outside_pairs_land_on_their_grid_cells() -> None:
    shared = PagesGeometry(layers=2, streams=(0, 1), pages=4, resident_per_layer=2,
                           layout="shared")
    assert place(shared, None, 5) == (1, 1)  # global page 5 = stream 1's page 1
    assert place(shared, None, 2) == (0, 2)
    assert place(shared, None, 8) == (None, None)  # beyond the last stream
    per = PagesGeometry(layers=2, streams=(0, 1), pages=4, resident_per_layer=2,
                        layout="per-stream")
    assert place(per, 1, 3) == (1, 3) and place(per, 2, 0) == (None, None)


def test_timeline_text_of_marks_and_writes() -> None:
    mark = ev.Mark(seq=2, t_ns=0, step=0, rows=((1024, 1324),),
                   outside=((None, 4), (None, 5)))
    assert describe(mark) == ("rows 1024-1323: marked no key; outside the window: (-,4) (-,5): "
                              "their resident copies are never refreshed", "outside")
    inside = ev.Mark(seq=3, t_ns=0, step=0, rows=((0, 300), (700, 701)),
                     keys=((0, None, 0), (0, None, 1), (1, None, 0)))
    assert describe(inside) == ("rows 0-299 700: marked (0,-,0) (0,-,1) (1,-,0)", "")
    everything = ev.Mark(seq=4, t_ns=0, step=0, rows=((-1, 0),), all=True)
    assert describe(everything)[0] == "rows -1: a negative row: EVERY page dirty"
    many = ev.Mark(seq=5, t_ns=0, step=0, rows=tuple((i, i + 1) for i in range(0, 40, 2)),
                   outside=tuple((1, p) for p in range(30)))
    text_, _ = describe(many)
    assert "0 2 4 6 8 10 12 14 … (first 8 of 20 runs)" in text_
    assert "(1,7) … (first 8 of 30 pages)" in text_
    write = ev.Write(seq=6, t_ns=0, step=0, layer=0, stream=1, cells=(0, 1), rows=(1024, 1025),
                     dirty=((0, 1, 0),))
    assert describe(write)[0] == "cells 0-1 rows 1024-1025 marked (0,1,0)"


def test_timeline_shows_mark_events(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "2")
        screen = text(app)
        assert "mark" in screen
        assert "rows 1024-1323: marked no key; outside the window: (-,4) (-,5)" in screen
        table = app.screen.query_one("#timeline", VirtualTable)
        table.go_to(1)  # the mark of step 0
        await show(pilot, "enter")
        pages = app.screen
        assert isinstance(pages, PagesScreen)
        loc = pages.location()
        assert (app.step, loc.stream, loc.page) == (0, 1, 0)  # global page 4 = stream 1 page 0
        assert "Marked at this step (mark #2) as global page 4 (stream 1 page 0)" in " ".join(
            text(app).split())

    drive([samples["marks"]], script, size=(160, 30))


def test_evidence_counts_say_when_they_are_the_first_of_more() -> None:
    evidence = tuple(Evidence(seq=i, step=i) for i in range(20))
    cut = Finding("foreign-page-read", Severity.ERROR, "t", evidence, details={"count": 144})
    whole = Finding("stale-page-read", Severity.ERROR, "t", evidence[:3], details={"count": 3})
    plain = Finding("abort", Severity.ERROR, "t", evidence[:2])
    assert evidence_count(cut) == (20, 144) and evidence_count(whole) == (3, 3)
    assert evidence_count(plain) == (2, 2)
    rows = FindingRows([cut, whole, plain])
    assert [rows.row(i)[0][3] for i in range(3)] == ["20 of 144", "3", "2"]


# -- two traces of one schedule side by side (issue 10 §4) -----------------------------------


def test_aligned_step_is_the_same_number_while_the_other_has_it() -> None:
    assert aligned_step(3, 14) == Alignment(3, True)
    assert aligned_step(20, 14) == Alignment(14, False)


def test_pages_compares_two_traces_of_one_schedule(captured: Capture) -> None:
    """GIVEN slot1-first captured with shared and with per-stream bookkeeping WHEN c is pressed
    on Pages THEN the selected stream of both is shown side by side at the same step, the info
    line counts the cells read differently, tab changes the stream of both, o swaps the sides,
    and c again goes back to one file's streams."""
    shared, _ = captured("slot1-first", "shared", "membership")
    per_stream, _ = captured("slot1-first", "per-stream", "membership")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "c")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        titles = [str(g.border_title) for g in screen.query(PagesGrid)]
        assert titles == [f"{shared.name} · stream 0", f"{per_stream.name} · stream 0"]
        await show(pilot, "tab", "n")  # stream 1, the first step with a bad read
        titles = [str(g.border_title) for g in screen.query(PagesGrid)]
        assert titles == [f"{shared.name} · stream 1", f"{per_stream.name} · stream 1"]
        step = app.step
        rows = [r.split("││") for r in lines(app) if r.startswith("│L")]
        left, right = "".join(r[0] for r in rows), "".join(r[1] for r in rows)
        assert "~P" in left or "!P" in left  # the shared layout reads stale/foreign pages here
        assert "~" not in right and "!" not in right  # the per-stream one does not
        words = " ".join(text(app).split())
        flagged = sum(1 for f in screen.snapshot.flagged()  # type: ignore[union-attr]
                      if f[0] == 1 and f[3].step == step)
        assert (f"compared with {per_stream.name} at step {step} · stream 1: {flagged} cell(s) "
                "read differently") in words
        assert "different scenarios" not in words
        await show(pilot, "o")
        titles = [str(g.border_title) for g in screen.query(PagesGrid)]
        assert titles == [f"{per_stream.name} · stream 1", f"{shared.name} · stream 1"]
        await show(pilot, "c")
        assert [g.border_title for g in screen.query(PagesGrid)] == ["stream 0", "stream 1"]

    drive([shared, per_stream], script, size=(120, 36))


def test_comparing_different_scenarios_says_so(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "c")
        words = " ".join(text(app).split())
        assert "compared with marks.kvtrace at step 0" in words
        assert ("different scenarios (aliasing vs marks): the steps need not correspond"
                in words)

    drive([samples["aliasing"], samples["marks"]], script, size=(120, 36))


def test_a_mark_beyond_the_window_leaves_nothing_stale(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the per-stream layout a mark outside the window falls on a page beyond it, which is
    read through the ring: the cell says so instead of claiming a stale resident copy."""
    monkeypatch.setattr(writer_module.time, "monotonic_ns", FakeClock())
    path = tmp_path / "ring.kvtrace"
    w = TraceWriter.create(path, header("ring", "a write beyond the window", layout="per-stream"))
    w.emit(ev.Step, 0, phase="decode", streams=(1,), tokens=1, n_kv=1024, slots=(1,))
    w.emit(ev.Mark, 0, rows=((1024 + 768, 1024 + 769),), outside=((1, 3),))
    for layer in range(2):
        w.emit(ev.Write, 0, layer=layer, stream=1, cells=(768, 769),
               rows=(1024 + 768, 1024 + 769), versions=((3, 1),))
    w.end_step()
    w.close()

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "tab", *["right_square_bracket"] * 3)
        words = " ".join(text(app).split())
        assert "step 0 · layer 0 · stream 1 · page 3: beyond the resident window" in words
        assert ("Marked at this step (mark #2) as stream 1 page 3: outside the window: it has "
                "no resident copy (read through the ring), so nothing is left stale.") in words
        _, right = grid_row(app, "L0").split("││")
        assert "^" in right

    drive([path], script, size=(120, 36))


def test_the_palette_starts_a_comparison(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "ctrl+p", *"compare with the other", "enter")
        screen = app.screen
        assert isinstance(screen, PagesScreen) and screen.compare == 1
        titles = [str(g.border_title) for g in screen.query(PagesGrid)]
        assert titles == ["aliasing.kvtrace · stream 0", "marks.kvtrace · stream 0"]

    drive([samples["aliasing"], samples["marks"]], script, size=(120, 36))
