"""Pilot tests: drive the viewer headlessly and assert on what each screen shows."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.style import Style
from textual.pilot import Pilot
from textual.widgets import Input

from kvdiag.cli import main
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.export import wait_loaded
from kvdiag.tui.loading import Symbols
from kvdiag.tui.screens.backtrace import BacktraceScreen
from kvdiag.tui.screens.fits import FitsScreen
from kvdiag.tui.screens.help import HelpScreen
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.timeline import TimelineScreen
from kvdiag.tui.widgets.virtual_table import VirtualTable
from tests.conftest import Capture
from tests.tui_samples import write_abort, write_aliasing, write_samples

LOGS = Path(__file__).parent / "fixtures" / "logs"
GDB_LOG = LOGS / "kvstream_np2_gdb.log"
Script = Callable[[KvdiagApp, Pilot[int]], Awaitable[None]]


def drive(paths: list[Path | str], script: Script, size: tuple[int, int] = (160, 48)) -> None:
    async def run() -> None:
        app = KvdiagApp([str(p) for p in paths])
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, timeout=60)
            await pilot.pause()
            await script(app, pilot)

    asyncio.run(run())


def lines(app: KvdiagApp) -> list[str]:
    """The screen as plain text, one string per terminal row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def text(app: KvdiagApp) -> str:
    return "\n".join(lines(app))


def style_of(app: KvdiagApp, needle: str, row_hint: str = "") -> Style:
    """The style of the first character of ``needle`` on the first row containing both."""
    for y, row in enumerate(lines(app)):
        if needle in row and row_hint in row:
            return app.screen._compositor.get_style_at(row.index(needle), y)
    raise AssertionError(f"{needle!r} not on screen:\n{text(app)}")


async def show(pilot: Pilot[int], *keys: str) -> None:
    await pilot.press(*keys)
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_samples(tmp_path_factory.mktemp("pilot"),
                         aliasing=write_aliasing, abort=write_abort)


# -- 1 Overview ---------------------------------------------------------------------------


def test_overview_of_a_trace_and_a_log(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        screen = text(app)
        assert "ERROR: stream 1 read 12 foreign resident page(s) holding other bytes (12 " \
               "another stream's) in 6 read(s), first at step 2" in screen
        assert "scenario  aliasing — slot 1 first, then slot 0 overwrites" in screen
        assert " read 10 " in screen and " telemetry 5 " in screen and " evict 4 " in screen
        assert "error 2" in screen and "foreign-page-read" in screen
        assert "aliasing.kvtrace (1/2, o: other file) · trace · 60 events, 5 steps" in screen
        await show(pilot, "o")
        screen = text(app)
        assert "kvstream_np2_gdb.log (2/2, o: other file) · log · 67 lines · 1 crash(es)" in screen
        assert "CRITICAL: GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) aborted the server" \
               in screen
        assert "│ n_ctx                         │ 16384" in screen
        assert "line 38: assert: ggml_cuda_kv_stream_fattn_fits(dst)  [2efab8991a57]" in screen

    drive([samples["aliasing"], GDB_LOG], script)


def test_bad_inputs_become_notifications_and_overview_messages(tmp_path: Path) -> None:
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    bad_trace = tmp_path / "bad.kvtrace"
    bad_trace.write_text('{"format":"kvtrace","version":"9.0"}\n')

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        messages = [n.message for n in app._notifications]
        assert any("no such file" in m for m in messages)
        assert any("not a text log" in m for m in messages)
        assert any("9.0" in m for m in messages)
        assert "This file cannot be shown" in text(app) and "no such file" in text(app)
        for key in "2345671":
            await show(pilot, key)  # every screen copes with an unreadable file
        await show(pilot, "o")
        assert app.current == 1 and "not a text log" in text(app)
        await show(pilot, "o")
        assert app.current == 2 and "trace format 9.0 is newer" in text(app)

    drive([tmp_path / "missing.kvtrace", binary, bad_trace], script)


# -- 2 Timeline ---------------------------------------------------------------------------


def test_timeline_filter_search_and_jump_back(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "2")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        table = screen.query_one("#timeline", VirtualTable)
        assert table.row_count == 60 and "60 of 60 events" in text(app)
        assert "relearn: layer maps cleared" in text(app)
        screen.query_one("#filter", Input).value = "read stream:1"
        await show(pilot)
        assert table.row_count == 8 and "8 of 60 events · filter kind:read stream:1" in text(app)
        screen.query_one("#filter", Input).value = "layer:x"
        await show(pilot)
        assert "'layer:x': 'x' is not a number" in text(app) and table.row_count == 8
        await show(pilot, "escape", "c")
        assert table.row_count == 60
        await show(pilot, "slash", *"foreign")
        first = screen.current_row()
        # the judgement's classes: slot 1's read of pages 0-1 got slot 0's bytes
        assert first == 35 and "pool 2 ring 0 host 0: 0-1 pool FOREIGN (s0's)" in text(app)
        await show(pilot, "escape", "n")
        second = screen.current_row()
        assert second is not None and second > first
        # enter on a read opens Pages at its step, layer and stream
        await show(pilot, "enter")
        pages = app.screen
        assert isinstance(pages, PagesScreen) and app.step == 2
        assert pages.location().layer == 1 and pages.location().stream == 1
        await show(pilot, "backspace")
        assert isinstance(app.screen, TimelineScreen) and app.screen.current_row() == second

    drive([samples["aliasing"]], script)


def test_timeline_of_a_log_shows_lines_with_kinds() -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "2")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        screen.query_one("#filter", Input).value = "slot:0"
        await show(pilot)
        assert "5 of 67 lines · filter slot:0" in text(app)
        assert "slot launch_slot_: id  0 | task 2 | processing task" in text(app)
        screen.query_one("#filter", Input).value = "crash"
        await show(pilot)
        assert "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed" in text(app)

    drive([GDB_LOG], script)


# -- 3 Fits -------------------------------------------------------------------------------


def test_fits_marks_and_explains_failed_conditions(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "3")
        assert isinstance(app.screen, FitsScreen)
        screen = text(app)
        assert "1 fits() decision(s), 1 false · routes: abort 1" in screen
        assert "Q.ne[3]==1, K.ne[3]==1, V.ne[3]==1" in screen
        for op in ("Q", "K", "V"):
            assert f"✗ {op}.ne[3]==1 ({op}.ne[3]=2)  the " in screen
        assert "the dispatcher still chose the streamed kernel" in screen
        # the failing field (K ne[3] = 2) is drawn in the failure style, ne[2] (also 2) is not
        rows = lines(app)
        k_y = next(y for y, r in enumerate(rows) if r.startswith(" K     cache_k_l0"))
        ne = rows[k_y].index("[256, 512, 2, 2]")
        ne2, ne3 = ne + len("[256, 512, "), ne + len("[256, 512, 2, ")
        assert rows[k_y][ne3] == "2" and rows[k_y][ne2] == "2"
        at = app.screen._compositor.get_style_at
        assert at(ne3, k_y).bgcolor is not None and at(ne3, k_y).bold
        assert at(ne2, k_y).bgcolor != at(ne3, k_y).bgcolor
        name = style_of(app, "K.ne[3]==1 (K.ne[3]=2)  the")
        assert name.bgcolor == at(ne3, k_y).bgcolor

    drive([samples["abort"]], script)


# -- 4 Pages ------------------------------------------------------------------------------


def test_pages_scrub_play_and_highlight(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        assert "step 0 of 4" in text(app)
        assert "layout shared: bookkeeping keyed (layer, page): no stream axis" in text(app)
        await show(pilot, "right", "right")
        assert "step 2 of 4 · 4 stale/foreign page read(s) at this step" in text(app)
        # layer 0, page 0 in both panels holds slot 0's bytes; stream 0 read them exactly at
        # step 1, stream 1 reads them now: foreign, in the foreign style and bold
        y, row = next((y, r) for y, r in enumerate(lines(app)) if r.startswith("│L0   P0:0v1"))
        left = row.index(" P0:0v1") + 1
        right = row.index("!P0:0v1") + 1  # the foreign read's glyph, in front of its label
        at = app.screen._compositor.get_style_at
        assert at(right, y).bgcolor is not None and at(right, y).bold
        assert at(left, y).bgcolor != at(right, y).bgcolor  # (left has the cell cursor)
        await show(pilot, "tab")  # cursor to stream 1's panel, layer 0 page 0
        assert "FOREIGN, stream 1 read stream 0's bytes" in text(app)
        await show(pilot, "end")
        assert "step 4 of 4" in text(app)
        await show(pilot, "home")
        assert "step 0 of 4" in text(app)
        await show(pilot, "n")
        assert app.step == 2
        await show(pilot, "space")
        assert "▶ playing" in text(app)
        await pilot.pause(1.0)
        assert app.step == 4 and screen.timer is None  # played to the end and stopped
        # a click on a cell selects it
        grid = screen.query_one("#pages-grid-1")
        await pilot.click(grid, offset=(5 + 9, 2))  # label 4 + border 1, page 1; layer 0
        await pilot.pause()
        assert "layer 0 · stream 1 · page 1" in text(app)

    drive([samples["aliasing"]], script)


def test_findings_jump_to_the_first_foreign_read_of_a_capture(captured: Capture) -> None:
    path, _ = captured("slot1-first", "shared", "membership")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "7")
        table = app.screen.query_one("#findings-table", VirtualTable)
        rules = [table.source.row(i)[0][1] for i in range(table.row_count)]
        assert "foreign-page-read" in rules and "stale-page-read" in rules
        table.go_to(rules.index("foreign-page-read"))
        await show(pilot)
        assert "rule foreign-page-read" in text(app)
        await show(pilot, "enter")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        words = screen.query_one("#pages-cell").render()
        assert "FOREIGN, stream 1 read stream 0's bytes" in str(words)
        loc = screen.location()
        assert loc.stream == 1 and loc.step is not None and loc.step > 2
        await show(pilot, "backspace")
        assert "rule foreign-page-read" in text(app)

    drive([path], script)


# -- 5 Backtrace --------------------------------------------------------------------------


def test_backtrace_groups_crashes_and_shows_local_source(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "llama.cpp"
    src = checkout / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu"
    src.parent.mkdir(parents=True)
    body = [f"// line {i}" for i in range(1, 4000)]
    body[1897] = "    GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst));"
    src.write_text("\n".join(body) + "\n")
    twice = tmp_path / "twice.log"
    twice.write_bytes(GDB_LOG.read_bytes() * 2)
    monkeypatch.chdir(checkout)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "5")
        assert isinstance(app.screen, BacktraceScreen)
        screen = text(app)
        assert "crash group 1 of 1: assert" in screen
        # one group: no list beside the frames, the head says how often it happened
        assert not app.screen.query_one("#crash-groups").display
        assert "occurrence 1 of 2" in screen and f"{twice}:38" in screen
        assert "14 frame(s), 11 in-app (highlighted)" in screen
        frames = app.screen.query_one("#frames", VirtualTable)
        assert frames.cursor == 3  # the first in-app frame: the kernel that asserted
        assert "1898     GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst));" in screen
        assert str(src) + ":1898" in screen
        in_app = style_of(app, "ggml_cuda_graph_evaluate_and_capture")
        system = style_of(app, "ggml_abort ")
        assert in_app.bold and not system.bold
        await show(pilot, "t")
        assert "occurrence 2 of 2" in text(app) and f"{twice}:105" in text(app)
        await show(pilot, "up", "up", "up")
        assert "not found on this machine" in text(app)  # ../sysdeps/... is not here

    drive([twice], script)


def test_backtrace_of_a_trace_abort(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "5")
        screen = text(app)
        assert "crash group 1 of 1: assert  fingerprint ggml-cuda.cu:1898" in screen
        assert "(inlined) ggml_cuda_kv_stream_fattn" in screen
        assert "6 frame(s), 4 in-app (highlighted)" in screen

    drive([samples["abort"]], script)


# -- 6 Telemetry --------------------------------------------------------------------------


def test_telemetry_plots_follow_the_step(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "6")
        screen = text(app)
        for label in ("VRAM used", "PCIe rx", "PCIe tx", "GPU util", "mem util", "SM clock"):
            assert label in screen
        vram = next(r for r in lines(app) if r.startswith(" VRAM used"))
        assert "4.00 GiB" in vram and "4.00 – 4.25" in vram
        assert "cursor at step 0 of 4 → sample 1 of 5" in screen
        await show(pilot, "right", "right")
        vram = next(r for r in lines(app) if r.startswith(" VRAM used"))
        assert "4.12 GiB" in vram and "sample 3 of 5" in text(app)
        await show(pilot, "o", "6")
        assert "no telemetry in this trace" in text(app)

    drive([samples["aliasing"], samples["abort"]], script)


# -- 7 Findings, help, palette, export ----------------------------------------------------


def test_findings_enter_opens_fits_backtrace_and_log_lines(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "7")
        table = app.screen.query_one("#findings-table", VirtualTable)
        rules = [table.source.row(i)[0][1] for i in range(table.row_count)]
        assert rules == ["fits-dispatch-mismatch", "abort"]
        await show(pilot, "enter")
        assert isinstance(app.screen, FitsScreen) and "✗ K.ne[3]==1" in text(app)
        await show(pilot, "backspace", "down", "enter")
        assert isinstance(app.screen, BacktraceScreen)
        await show(pilot, "o", "7")  # the log
        table = app.screen.query_one("#findings-table", VirtualTable)
        rules = [table.source.row(i)[0][1] for i in range(table.row_count)]
        assert rules[0] == "kvstream-fits-dispatch-abort"
        evidence = app.screen.query_one("#evidence-table", VirtualTable)
        opens = [evidence.source.row(i)[0][1] for i in range(evidence.row_count)]
        assert {"backtrace", "timeline", "fits"} <= set(opens)
        evidence.focus()
        evidence.go_to(opens.index("fits"))
        await show(pilot, "enter")
        assert isinstance(app.screen, FitsScreen)
        assert "kvstream_np2_gdb.log:37: fits=false" in text(app)
        await show(pilot, "backspace")
        evidence = app.screen.query_one("#evidence-table", VirtualTable)
        evidence.focus()
        evidence.go_to(opens.index("timeline"))
        await show(pilot, "enter")
        assert isinstance(app.screen, TimelineScreen)
        row = app.screen.current_row()
        line = next(e.line for e in app.docs[1].findings[0].evidence
                    if e.line is not None and e.line - 1 == row)
        assert line == row + 1

    drive([samples["abort"], GDB_LOG], script)


def test_help_and_command_palette(samples: dict[str, Path]) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "4", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "next / previous step with a stale or foreign read" in text(app)
        await show(pilot, "escape")
        assert isinstance(app.screen, PagesScreen)
        await show(pilot, "ctrl+p", *"Screen: Fits", "enter")
        assert isinstance(app.screen, FitsScreen)

    drive([samples["aliasing"]], script)


def test_export_svg_and_usage_errors(samples: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pages.svg"
    assert main(["tui", str(samples["aliasing"]), "--export-svg", str(out), "--screen", "4",
                 "--step", "2", "--size", "120x30"]) == 0
    svg = out.read_text()
    assert svg.startswith("<svg") and "stream&#160;1" in svg and "step&#160;2&#160;of&#160;4" in svg
    assert main(["tui", str(samples["aliasing"]), "--export-svg", str(out), "--screen", "9",
                 "--force"]) == 2
    assert "--screen: '9' is not 1-8" in capsys.readouterr().err
    assert main(["tui", str(samples["aliasing"])]) == 2  # stdout is not a terminal here
    assert "standard output is not a terminal" in capsys.readouterr().err
    assert main(["tui", str(tmp_path / "nope.kvtrace"), "--export-svg", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["tui", str(samples["aliasing"]), "--export-svg", str(out)]) == 2
    assert f"{out} exists (use --force to replace it)" in capsys.readouterr().err
    assert out.read_text() == svg


# -- symbolized log backtraces (--binary) --------------------------------------------------

NATIVE = Path(__file__).parent / "fixtures" / "native" / "crashprog.cpp"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the crash program")
def test_binary_symbolizes_frames_and_shows_their_source(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a program that asserts, its stderr as the log, and the binary WHEN viewed with
    --binary THEN the inlined frame has its file:line and the Backtrace shows that source."""
    binary = tmp_path / "crashprog"
    subprocess.run(["gcc", "-g", "-O2", "-Wl,--build-id", "-o", str(binary), str(NATIVE)],
                   check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(binary)], capture_output=True, timeout=30, check=False)
    log = tmp_path / "crash.log"
    log.write_bytes(proc.stderr)
    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert_line = "    KV_ASSERT(row >= 0 && row < 4096);"

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "5")
        frames = app.screen.query_one("#frames", VirtualTable)
        rows = [frames.source.row(i)[0] for i in range(frames.row_count)]
        page_of = next(i for i, r in enumerate(rows) if str(r[1]).endswith("page_of"))
        assert str(rows[page_of][1]).startswith("(inlined)")
        assert str(rows[page_of][2]).endswith("crashprog.cpp:31")
        frames.go_to(page_of)
        await show(pilot)
        assert f"    31 {assert_line}" in text(app).replace("\u00a0", " ")

    async def unsymbolized(app: KvdiagApp, pilot: Pilot[int]) -> None:
        assert "backtraces not symbolized" in text(app)
        assert any("backtraces not symbolized" in n.message for n in app._notifications)

    async def run(symbols: Symbols, check: Script) -> None:
        app = KvdiagApp([str(log)], symbols=symbols)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_loaded(app, timeout=60)
            await pilot.pause()
            await check(app, pilot)

    asyncio.run(run(Symbols((str(binary),)), script))
    asyncio.run(run(Symbols((str(tmp_path / "missing.so"),)), unsymbolized))
    assert main(["tui", str(log), "--debug-dir", str(tmp_path), "--export-svg", "x.svg"]) == 2
