"""The Pages screen on an adaptive capture (issue 12): the resident window moves with the step
(the adapt line before each invalidate gives its shape), the grid draws where each layer's
window ends, and a line says why."""

from __future__ import annotations

from textual.pilot import Pilot

from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.pagestext import EDGE_GLYPH
from tests.conftest import Capture
from tests.test_tui_pilot import drive, lines, show, text

ADAPTIVE = ("--adaptive", "--steps", "6", "--prompt-tokens", "1200")


def edges(app: KvdiagApp) -> dict[str, int]:
    """Per grid row label, the page (column) whose glyph column draws the window's end."""
    out: dict[str, int] = {}
    for row in lines(app):
        if not row.startswith("│L"):
            continue
        label, cells = row[1:5].strip(), row[5:]
        at = cells.find(EDGE_GLYPH)
        if at >= 0:
            out[label] = at // 9
    return out


def test_the_window_moves_at_a_repartition(captured: Capture) -> None:
    """GIVEN a 4 MiB adaptive capture that repartitions resident 1 → 0 at step 4 THEN at step
    3 every layer's window ends after page 0 and at step 4 before page 0, with the line naming
    the repartition."""
    path, code = captured("pool-pressure", "shared", "membership", *ADAPTIVE, "--stage-mib", "4")
    assert code == 0

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "right", "right", "right")
        assert app.step == 3
        assert edges(app) == {"L0": 1, "L1": 1, "L2": 1, "L3": 1}
        words = " ".join(text(app).split())
        assert "1 resident page(s) per view of 64 · ring 4 slots" in words
        assert "repartition" not in words
        await show(pilot, "right")
        assert app.step == 4
        assert edges(app) == {"L0": 0, "L1": 0, "L2": 0, "L3": 0}
        words = " ".join(text(app).split())
        assert ("decode layout: layers 0,1,2,3 stream 5 pages (step 4: repartition 1→0)"
                in words)
        assert "0 resident page(s) per view of 64 (reshaped, per layer)" in words

    drive([path], script, size=(120, 30))


def test_a_decode_layout_gives_each_layer_its_own_window(captured: Capture) -> None:
    """GIVEN an 8 MiB adaptive capture whose decode layout (step 4) keeps layer 3's five pages
    and one page of layers 0-2 THEN the edges sit there from step 4 on, not before."""
    path, code = captured("pool-pressure", "shared", "membership", *ADAPTIVE, "--stage-mib", "8")
    assert code == 0

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "right", "right", "right")
        assert edges(app) == {"L0": 2, "L1": 2, "L2": 2, "L3": 2}
        await show(pilot, "right", "right")
        assert app.step == 5
        assert edges(app) == {"L0": 1, "L1": 1, "L2": 1, "L3": 5}
        words = " ".join(text(app).split())
        assert ("decode layout: layers 0,1,2 stream 4 pages, the others keep all 5 resident"
                in words)
        assert "1–5 resident page(s) per view of 64 (reshaped, per layer)" in words

    drive([path], script, size=(120, 30))
