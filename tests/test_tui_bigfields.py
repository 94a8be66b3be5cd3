"""A 10 MB string in one field (issue 11 item 23): every view shows at most MAX_FIELD
characters of it and says how long it was, so no screen is slow or thousands of lines tall."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.containers import VerticalScroll
from textual.pilot import Pilot

from kvdiag.model.events import Abort, Fits, Step, Warn
from kvdiag.trace import writer as writer_module
from kvdiag.trace.writer import TraceWriter
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.clip import MAX_FIELD, clip, clip_deep
from kvdiag.tui.rows import clip_line
from tests.test_tui_pilot import drive, show, text
from tests.tui_samples import FakeClock, fits_fields, header

BIG = 10 << 20


def marker(n: int) -> str:
    return f"… [{n:,} characters, first {MAX_FIELD:,} shown]"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("big")
    mp = pytest.MonkeyPatch()
    mp.setattr(writer_module.time, "monotonic_ns", FakeClock())
    try:
        w = TraceWriter.create(root / "big.kvtrace", header("big", "d" * BIG))
        w.emit(Step, 0, phase="decode", streams=(0,), tokens=1, n_kv=512, slots=(0,))
        w.emit(Warn, 0, message="w" * BIG, code="x")
        fits = fits_fields(0, 512, 1, 1)
        fits["node"] = "n" * BIG
        w.emit(Fits, 0, **fits)
        w.emit(Abort, 0, message="a" * BIG, condition="c" * BIG, backtrace=("f" * BIG, "main"))
        w.end_step()
        w.close("aborted")
    finally:
        mp.undo()
    log = root / "big.log"
    log.write_text("srv  log_server_r: " + "L" * BIG + "\nmain: server is listening\n")
    return {"trace": root / "big.kvtrace", "log": log}


def test_clip_keeps_short_text_and_says_how_long_long_text_was() -> None:
    assert clip("short") == "short"
    assert clip("y" * 5000) == "y" * MAX_FIELD + marker(5000)
    event = Warn(seq=1, t_ns=0, step=0, message="m" * 5000, code="c")
    clipped = clip_deep(event)
    assert clipped.message == "m" * MAX_FIELD + marker(5000) and clipped.code == "c"
    small = Warn(seq=1, t_ns=0, step=0, message="m")
    assert clip_deep(small) is small  # nothing long: the same object
    assert clip_deep({"k": ("z" * 2000, 3)}) == {"k": ("z" * MAX_FIELD + marker(2000), 3)}
    text_, _ = clip_line(b"q" * BIG + b"\n")
    assert text_ == "q" * MAX_FIELD + f"… [{BIG + 1:,} bytes, first {MAX_FIELD:,} shown]"


@pytest.mark.slow
def test_a_10mb_field_is_capped_on_every_screen(big: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        scroll = app.screen.query_one("#overview-scroll", VerticalScroll)
        assert scroll.virtual_size.height < 200  # the description did not become 100k lines
        await show(pilot, "2")
        screen = text(app)
        assert "w" * 50 in screen and "warn" in screen
        await show(pilot, "3")
        assert "n" * 50 in text(app)
        await show(pilot, "5")
        screen = text(app)
        assert "a" * 50 in screen or "c" * 50 in screen
        await show(pilot, "7")
        await show(pilot, "4", "6", "1")
        for doc in app.docs:
            assert doc.stage == "ready"
        digest = app.docs[0].digest  # type: ignore[union-attr]
        assert digest is not None
        abort = digest.aborts[0]
        assert abort.message == "a" * MAX_FIELD + marker(BIG)
        assert abort.backtrace[0] == "f" * MAX_FIELD + marker(BIG)
        assert app.docs[0].header.scenario["description"] == (  # type: ignore[union-attr]
            "d" * MAX_FIELD + marker(BIG))

    drive([big["trace"]], script, size=(120, 36))

    async def log_script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "2")
        screen = text(app)
        assert "L" * 50 in screen and "server is listening" in screen

    drive([big["log"]], log_script, size=(120, 36))
