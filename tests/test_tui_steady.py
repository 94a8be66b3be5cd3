"""update_steady: a text widget updated without a layout pass when its height stays, and laid
out again when it changes (kvdiag/tui/widgets/steady.py)."""

from __future__ import annotations

import asyncio

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from kvdiag.tui.widgets.steady import update_steady


class _Demo(App[None]):
    CSS = "#t { height: auto; min-height: 2; } #u { height: 1; }"

    def compose(self) -> ComposeResult:
        yield Static("first", id="t")
        yield Static("below", id="u")


def test_a_layout_pass_only_when_the_height_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    layouts: list[bool] = []

    async def run() -> None:
        app = _Demo()
        async with app.run_test(size=(40, 10)) as pilot:
            t = app.query_one("#t", Static)
            real = t.update

            def spy(content: str = "", *, layout: bool = True) -> None:
                layouts.append(layout)
                real(content, layout=layout)

            monkeypatch.setattr(t, "update", spy)
            update_steady(t, "step 1")  # nothing measured yet: laid out
            await pilot.pause()
            update_steady(t, "step 2")  # one line again: no layout pass
            await pilot.pause()
            assert str(t.render()) == "step 2"
            update_steady(t, "step 3\nwith a second line\nand a third")  # taller
            await pilot.pause()
            assert t.size.height == 3 and app.query_one("#u").region.y == 3
            update_steady(t, "x " * 30)  # one long line wraps to two at width 40
            await pilot.pause()
            assert t.size.height == 2

    asyncio.run(run())
    assert layouts == [True, False, True, True]
