"""A scrubbed step repaints only what changed: the grid's lines whose cells differ
(kvdiag/tui/widgets/pages_grid.py) and the scrubber when its cursor moves to another column
(kvdiag/tui/widgets/scrubber.py). What the screen shows must be what a full repaint shows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.pilot import Pilot

from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.widgets.pages_grid import PagesGrid
from kvdiag.tui.widgets.scrubber import Scrubber
from tests.test_tui_pilot import drive, lines, show
from tests.tui_samples import write_aliasing, write_samples

Refresh = Callable[..., PagesGrid]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_samples(tmp_path_factory.mktemp("repaint"), aliasing=write_aliasing)


async def repainted(pilot: Pilot[int]) -> list[str]:
    """The screen after every widget on it was repainted whole."""
    for widget in pilot.app.screen.query("*"):
        widget.refresh()
    await pilot.pause()
    return lines(pilot.app)  # type: ignore[arg-type]


def test_every_scrubbed_step_shows_what_a_full_repaint_shows(samples: dict[str, Path]) -> None:
    """Steps 0-4 of the aliasing trace: stream 1's pool pages turn foreign at step 2, the
    cursor moves between layers, pages and streams; after each key the screen equals a full
    repaint of it, and the grids did change along the way."""
    keys = ["home", "right", "right", "right", "right", "left", "down", "right_square_bracket",
            "left", "tab", "left", "up", "end", "home"]
    grids: dict[str, list[str]] = {}

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
            shown = lines(app)
            assert shown == await repainted(pilot), (key, screen.shown_step, screen.cursor)
            grids[f"{key}@{screen.shown_step}/{screen.cursor}"] = [
                row for row in shown if row.startswith("│L")]

    drive([samples["aliasing"]], script)
    # the test saw the grids change: stream 1's layer 0 row at step 1 and at step 2
    by_step = {k.split("@")[1].split("/")[0]: v for k, v in grids.items()}
    assert by_step["1"] != by_step["2"]
    row1 = next(r for r in by_step["1"] if r.startswith("│L0 "))
    row2 = next(r for r in by_step["2"] if r.startswith("│L0 "))
    # both grids side by side: stream 0's, then stream 1's
    assert "!" not in row1 and row2.split("││")[1].startswith("L0  !P0:0v1  !P0:1v1 "), row2


class _Bar(App[None]):
    CSS = "Scrubber { height: 1; }"

    def compose(self) -> ComposeResult:
        yield Scrubber(id="bar")


def test_the_scrubber_cursor_follows_the_step_across_columns() -> None:
    """1000 steps on 40 columns (25 steps a column): the cursor ``▮`` is in column
    step * 40 // 1000 after each step, whether or not the step left the column, and a new set
    of marks is drawn at once."""
    async def run() -> None:
        app = _Bar()
        async with app.run_test(size=(40, 3)) as pilot:
            bar = app.query_one(Scrubber)
            marks = {"foreign": np.array([500], dtype=np.int64)}
            for step in [0, 1, 24, 25, 26, 499, 500, 999, 975, 974, 0]:
                bar.show(1000, step, marks)
                await pilot.pause()
                row = lines(app)[0]  # type: ignore[arg-type]
                assert row.index("▮") == step * 40 // 1000, (step, row)
                assert row.count("▪") == (0 if step * 40 // 1000 == 20 else 1), (step, row)
            bar.show(1000, 0, {"stale": np.array([100, 900], dtype=np.int64)})
            await pilot.pause()
            assert [i for i, c in enumerate(lines(app)[0]) if c == "▪"] == [4, 36]  # type: ignore[arg-type]

    asyncio.run(run())


def test_the_grid_repaints_the_lines_whose_cells_changed(samples: dict[str, Path]) -> None:
    """Step 1 → 2 of the aliasing trace turns stream 1's pool pages foreign, and stream 0's
    reads (at step 1) are no longer this step's (bold): each grid asks to repaint its 2 layer
    rows (lines 1-2), not the page numbers (line 0). Step 2 → 3 reads the same foreign pages
    again, so no line of either grid changes and none is asked for."""
    asked: list[tuple[int, int, list[int]]] = []

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        screen.set_step(1)
        await pilot.pause()
        for grid in screen.query(PagesGrid):
            real = grid.refresh

            def spy(*regions: Region, _g: PagesGrid = grid, _real: Refresh = real,
                    **kw: bool) -> PagesGrid:
                asked.append((screen.kv.step, _g.stream,
                              [y for r in regions for y in r.line_range]))
                return _real(*regions, **kw)

            grid.refresh = spy  # type: ignore[method-assign]
        screen.set_step(2)
        await pilot.pause()
        screen.set_step(3)
        await pilot.pause()

    drive([samples["aliasing"]], script)
    assert sorted(asked) == [(2, 0, [1, 2]), (2, 1, [1, 2])]
