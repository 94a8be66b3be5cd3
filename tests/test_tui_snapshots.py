"""Snapshot tests: one SVG per screen at a fixed terminal size, from deterministic inputs.

The traces are written by tests/tui_samples.py with a fixed creation time and a fake clock, and
every file is opened by a relative name from a temporary directory, so no path, time or random
value reaches the screen. Update with ``pytest --snapshot-update`` only under the pinned textual
and pytest-textual-snapshot (tests/conftest.py refuses otherwise).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.export import wait_loaded
from tests.seed_arm117 import seed_logs
from tests.tui_samples import write_abort, write_aliasing

SIZE = (120, 36)
LOG = Path(__file__).parent / "fixtures" / "logs" / "kvstream_np2_gdb.log"
SnapCompare = Callable[..., bool]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)
    write_abort(tmp_path / "abort.kvtrace", monkeypatch)
    shutil.copy(LOG, tmp_path / "server.log")
    base, stream = seed_logs()
    (tmp_path / "base.log").write_text(base)
    (tmp_path / "stream.log").write_text(stream)
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def loaded(pilot: Pilot[int]) -> None:
    app = pilot.app
    assert isinstance(app, KvdiagApp)
    await wait_loaded(app, timeout=60)
    await pilot.pause()


def shot(snap_compare: SnapCompare, files: list[str], *keys: str,
         size: tuple[int, int] = SIZE) -> bool:
    return snap_compare(KvdiagApp(files), press=keys, terminal_size=size, run_before=loaded)


def test_overview(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"])


def test_overview_of_a_log(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["server.log"])


def test_timeline(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"], "2", "end", "up", "up")


def test_fits(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["abort.kvtrace"], "3")


def test_pages_at_the_foreign_read(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"], "4", "right", "right", "tab")


def test_backtrace_of_a_log(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["server.log"], "5")


def test_telemetry(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"], "6", "right", "right")


def test_findings(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"], "7")


def test_help(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["aliasing.kvtrace"], "4", "question_mark")


# -- 80x24 (issue 16 #6): the narrow layouts -----------------------------------------------


def test_backtrace_of_a_log_at_80x24(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["server.log"], "5", "down", "down", "down", "down",
                size=(80, 24))


def test_fits_at_80x24(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["abort.kvtrace"], "3", size=(80, 24))


def test_timeline_at_80x24(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["server.log"], "2", "end", "up", size=(80, 24))


def test_perf(here: Path, snap_compare: SnapCompare) -> None:
    assert shot(snap_compare, ["stream.log", "base.log"], "8", *["right"] * 6)
