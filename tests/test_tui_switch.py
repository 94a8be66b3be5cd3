"""Switching files from every screen (issue 11 item 14), and what an unhandled exception in the
viewer ends with (one line and a non-zero exit, not a Textual traceback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvdiag.cli import main
from kvdiag.errors import KvdiagError
from kvdiag.tui.app import KvdiagApp, crash_error
from kvdiag.tui.navigation import SCREENS, TITLES
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.widgets.pages_grid import PagesGrid
from tests.test_tui_pilot import GDB_LOG, drive, lines, show, text
from tests.tui_samples import write_abort, write_aliasing, write_samples


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_samples(tmp_path_factory.mktemp("switch"),
                         aliasing=write_aliasing, abort=write_abort)


def status(app: KvdiagApp) -> str:
    return lines(app)[0]


async def expect(app: KvdiagApp, screen: str, doc: int) -> None:
    """The screen ``screen`` shows document ``doc`` (its status line names both)."""
    assert app.current == doc and app.current_mode == screen
    name = app.docs[doc].name
    row = status(app)
    assert row.startswith(f" {TITLES[screen]}  ·  {name} ({doc + 1}/{len(app.docs)}"), row
    if screen == "pages" and app.docs[doc].kind == "trace":
        pages = app.screen
        assert isinstance(pages, PagesScreen)
        grids = [g.stream for g in pages.query(PagesGrid)]
        assert grids == [0, 1], grids  # one panel per stream, no leftovers of the other file
        assert "step 0 of" in text(app)


@pytest.mark.slow
def test_switching_files_from_every_screen_both_ways(samples: dict[str, Path]) -> None:
    """GIVEN two traces and a log WHEN every screen switches to the next file with o, back with
    O, and to each file through the palette's File entries THEN each screen redraws for that
    file (the Pages screen rebuilt its per-stream panels instead of crashing on their ids)."""
    paths = [samples["aliasing"], GDB_LOG, samples["abort"]]

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        n = len(app.docs)
        for key, screen in zip("12345678", SCREENS, strict=True):
            await show(pilot, key)
            await expect(app, screen, 0)
            for i in range(1, n + 1):  # forward through all, back to the first
                await show(pilot, "o")
                await expect(app, screen, i % n)
            for i in range(n - 1, -1, -1):  # and backward
                await show(pilot, "O")
                await expect(app, screen, i % n)
            for target in (2, 0):  # the palette, in both directions
                await show(pilot, "ctrl+p", *f"File: {app.docs[target].name}", "enter")
                await expect(app, screen, target)

    drive(paths, script, size=(120, 36))


def test_switching_quickly_on_the_pages_screen(samples: dict[str, Path]) -> None:
    """Keys faster than the panels can be rebuilt leave exactly one panel per stream."""
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        await pilot.press("o", "o", "o", "O", "O", "O")
        await show(pilot)
        await expect(app, "pages", 0)

    drive([samples["aliasing"], GDB_LOG, samples["abort"]], script, size=(120, 36))


def test_an_unhandled_exception_ends_with_one_line(samples: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a bug in a key handler WHEN the key is pressed THEN the app exits, keeps the
    exception, and run_tui's error for it is one line with exit code 70 (internal error)."""
    def broken(self: PagesScreen, delta: int) -> None:
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr(PagesScreen, "action_step", broken)
    seen: list[KvdiagApp] = []

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        seen.append(app)
        await show(pilot, "4", "right")

    with pytest.raises(RuntimeError, match="a bug"):  # run_test re-raises it for tests
        drive([samples["aliasing"]], script)
    app = seen[0]
    assert isinstance(app.crash, RuntimeError)
    assert app._exit_renderables == []  # nothing left for Textual to print as a traceback
    error = crash_error(app.crash)
    assert isinstance(error, KvdiagError) and error.exit_code == 70
    assert str(error) == ("the viewer stopped on an internal error: RuntimeError: a bug "
                          "(rerun with --debug for the traceback)")


# -- files the viewer cannot show are refused before it starts (issue 11 item 15) -------------


@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty", "fifo"])
def test_tui_refuses_what_it_cannot_show(kind: str, tmp_path: Path, samples: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a good trace and a bad FILE WHEN ``kvdiag tui`` runs (even on a terminal) THEN it
    refuses with one line naming the bad file and exit code 2, and the app never starts."""
    bad = tmp_path / f"bad-{kind}"
    if kind == "directory":
        bad.mkdir()
    elif kind == "binary":
        bad.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    elif kind == "empty":
        bad.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(bad)  # opening it would block until a writer came
    started: list[object] = []
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(KvdiagApp, "run", lambda self, *a, **k: started.append(self))
    assert main(["tui", str(samples["aliasing"]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvdiag: error: {bad}: ")
    assert {"missing": "no such file", "directory": "is a directory",
            "binary": "not a text log", "empty": "empty file",
            "fifo": "a FIFO (named pipe), not a regular file"}[kind] in err
    assert started == []
    assert main(["tui", str(bad), "--export-svg", str(tmp_path / "x.svg")]) == 2
    assert not (tmp_path / "x.svg").exists()
    assert main(["tui", str(samples["aliasing"])]) == 0 and len(started) == 1  # a good file runs
