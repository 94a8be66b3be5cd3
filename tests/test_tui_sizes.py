"""The viewer at 120x40 and 80x24 (issue 16 #6): nothing a user needs is cut without a way to
see it whole, the keys do what the footer and the help say, and a screen never shows another
file's state. The inputs are new: a glibc crash log with long C++ names written here, a trace
whose strides run to ten digits, a log's ``fits=false`` line longer than the screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from kvdiag.model.events import Abort, Fits, Step, Write
from kvdiag.model.geometry import Tensor
from kvdiag.trace import writer as writer_module
from kvdiag.trace.writer import TraceWriter
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.screens.backtrace import BacktraceScreen
from kvdiag.tui.screens.help import HelpScreen
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.timeline import TimelineScreen
from kvdiag.tui.widgets.scrubber import Scrubber
from kvdiag.tui.widgets.virtual_table import VirtualTable
from tests.test_tui_pilot import drive, lines, text
from tests.tui_samples import FakeClock, header, write_aliasing

SIZES = [(120, 40), (80, 24)]
LONG_FUNCTION = ("kvstream::ResidentPool<kvstream::PerStreamKey>::upload_batch(unsigned long, "
                 "std::vector<int, std::allocator<int> > const&)")
LIB = "/opt/inference/build-release-cuda12/lib/libkvstream-runtime.so.3"


def region_text(app: KvdiagApp, selector: str) -> str:
    """What the widget ``selector`` shows on screen, without any whitespace (so that a line
    wrapped or folded anywhere reads as one; compare with :func:`squeezed`)."""
    r = app.screen.query_one(selector).region
    rows = lines(app)[r.y:r.y + r.height]
    return squeezed("".join(row[r.x:r.x + r.width] for row in rows))


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _crash_log(path: Path) -> Path:
    """A glibc backtrace (``module(sym+0xOFF)[0xADDR]``) under a GGML_ABORT, as a server that
    links a kv-stream runtime library prints it, then (after a restart) a CUDA error."""
    frames = [
        (LIB, "_ZN8kvstream12ResidentPoolINS_12PerStreamKeyEE12upload_batchEmRKSt6vectorIiSaIiEE",
         0x2f4, 0x7F11C2A4B2F4),
        (LIB, "kv_stream_evaluate_and_capture_with_deadline_feedback", 0x1a0, 0x7F11C2A4C1A0),
        ("/usr/local/bin/llama-server", "main", 0x5c, 0x55D0AA01205C),
    ]
    body = ["srv  update_slots: all slots are idle",
            "/src/kvstream/pool.cpp:412: GGML_ASSERT(slot < n_slots) failed"]
    body += [f"{mod}({sym}+0x{off:x})[0x{addr:x}]" for mod, sym, off, addr in frames]
    body += ["Aborted (core dumped)", "srv  load_model: loading model",
             "CUDA error: an illegal memory access was encountered",
             "  current device: 1, in function kv_stream_upload_ring at /src/kvstream/ring.cu:77",
             "  cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream)",
             "/src/kvstream/ring.cu:80: CUDA error", "Aborted (core dumped)"]
    path.write_text("\n".join(body) + "\n")
    return path


@pytest.mark.parametrize("size", SIZES)
def test_backtrace_frames_are_whole_or_in_the_detail_line(tmp_path: Path,
                                                          size: tuple[int, int]) -> None:
    log = _crash_log(tmp_path / "server.log")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("5")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, BacktraceScreen)
        groups = screen.query_one("#crash-groups")
        assert groups.display  # two crash groups: the abort and the segfault
        frames = screen.query_one("#frames", VirtualTable)
        if size[0] >= 100:  # beside the frames, no wider than its labels need
            assert groups.region.width <= 32
            assert groups.region.x + groups.region.width <= frames.region.x
        else:  # above the frames, which keep the whole width
            assert groups.region.y + groups.region.height <= frames.region.y
            assert frames.region.width >= size[0] - 2
        # every cell of every frame: whole on screen, or whole in the detail line under the
        # table while its row is selected
        cut = 0
        for i in range(frames.row_count):
            frames.go_to(i)
            await pilot.pause()
            table = region_text(app, "#frames")
            detail = region_text(app, "#frame-detail") if screen.query_one(
                "#frame-detail").display else ""
            for column, cell in zip(frames.columns, frames.source.row(i)[0], strict=True):
                whole = squeezed(str(cell))
                if whole and whole not in table:
                    assert squeezed(f"{column.label}:") + whole in detail, (i, column.label)
                    cut += 1
        assert cut > 0  # LONG_FUNCTION is wider than either screen
        frames.go_to(0)
        await pilot.pause()
        assert squeezed(f"function: {LONG_FUNCTION}") in region_text(app, "#frame-detail")
        if size[0] >= 100:  # room enough: the module and address on the frame's own row
            assert any("libkvstream-runtime.so.3 0x7f11c2a4c1a0" in r for r in lines(app)), \
                text(app)

    drive([log], script, size=size)


def _wide_strides(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fits() decision of a 65536-token, two-stream cache: K/V strides of 9-10 digits."""
    monkeypatch.setattr(writer_module.time, "monotonic_ns", FakeClock())
    w = TraceWriter.create(path, header("wide", "arm117-sized views, two streams"))
    w.emit(Step, 0, phase="decode", streams=(0, 1), tokens=1, n_kv=32768, slots=(0, 1))
    w.emit(Write, 0, layer=0, stream=0, cells=(5, 6), rows=(5, 6), versions=((0, 2),))

    def t(name: str, type_: str, ne: tuple[int, int, int, int], nb: tuple[int, int, int, int],
          data: int, buffer: str, runtime: int | None = None) -> Tensor:
        return Tensor(name, type_, ne, nb, data=data, buffer=buffer, runtime=runtime,
                      contiguous=False)

    k = t("cache_k_l0 (view) (permuted)", "q8_0", (256, 32768, 4, 2),
          (34, 1088, 272, 1140850688), 0x7F3A00000000, "CUDA_KV_Stream_Host", 1)
    v = t("cache_v_l0 (view) (permuted)", "q8_0", (256, 32768, 4, 2),
          (34, 1088, 272, 1140850688), 0x7F3A40000000, "CUDA_KV_Stream_Host", 1)
    q = t("Qcur-0 (permuted)", "f32", (256, 1, 24, 2), (4, 24576, 1024, 125829120),
          0x7F31C4000000, "CUDA0")
    dst = t("__fattn__-0", "f32", (256, 24, 1, 2), (4, 1024, 24576, 2147483648),
            0x7F31C4100000, "CUDA0")
    w.emit(Fits, 0, node="__fattn__-0", layer=0, q=q, k=k, v=v, dst=dst, mask=None,
           stage_bytes=2147483648, result=False, route="abort",
           failed=("Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"), membership=True)
    w.emit(Abort, 0, message="GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed",
           file="ggml-cuda.cu", line=1898, condition="ggml_cuda_kv_stream_fattn_fits(dst)")
    w.close("aborted")
    return path


@pytest.mark.parametrize("size", SIZES)
def test_fits_shows_every_stride_and_the_raw_line_whole(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         size: tuple[int, int]) -> None:
    trace = _wide_strides(tmp_path / "wide.kvtrace", monkeypatch)
    raw = ("0.00.144.129 E arm117 fits=false: dst=0x7f31c4100000 ne=[256,24,1,2] type=f32 "
           "k=0x7f3a00000000 kbuf=\"CUDA_KV_Stream_Host\" | v=\"CUDA_KV_Stream_Host\" | "
           "kr=0x55d1e7a30001 vr=0x55d1e7a30001 stage=2147483648 node=__fattn__-0")
    log = tmp_path / "fits.log"
    log.write_text(f"llama_context: n_ctx = 65536\n{raw}\n")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("3")
        await pilot.pause()
        flat = re.sub(r"[\s│]+", " ", text(app))
        for stride in ("1140850688", "125829120", "2147483648"):
            assert stride in flat, stride
        assert "…" not in "".join(r for r in lines(app) if "[" in r and "]" in r)
        # the pane wraps at the screen's width: nothing drawn beyond it
        assert all(len(r.rstrip()) <= size[0] for r in lines(app))
        await pilot.press("o")
        await pilot.pause()
        app.screen.query_one("#fits-detail-scroll").scroll_end(animate=False)
        await pilot.pause()
        # the whole line after the runtime's time/level prefix (which the log reader strips)
        assert squeezed(raw[raw.index("arm117"):]) in region_text(app, "#fits-detail-scroll")

    drive([trace, log], script, size=size)


def test_status_line_keeps_its_counts_at_80_columns(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = "capture-of-the-late-join-scenario-on-the-production-shape-2026-03-01.kvtrace"
    trace = write_aliasing(tmp_path / name, monkeypatch)
    log = _crash_log(tmp_path / "server.log")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        for key in ("1", "2", "4", "5", "7"):
            await pilot.press(key)
            await pilot.pause()
            status = lines(app)[0]
            assert len(status.rstrip()) <= 80
            assert re.search(r"· \d+ events, \d+ steps · \d+ finding\(s\)", status), status
            assert "1/2" in status and "…" in status  # the name shortened, not the counts
        await pilot.press("o")
        await pilot.pause()
        assert re.search(r"server\.log 2/2 · log · \d+ lines · 2 crash\(es\) · \d+ finding",
                         lines(app)[0]), lines(app)[0]

    drive([trace, log], script, size=(80, 24))


@pytest.mark.parametrize("size", SIZES)
def test_a_logs_pages_screen_has_no_step_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             size: tuple[int, int]) -> None:
    trace = write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)
    log = _crash_log(tmp_path / "server.log")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("4", "right")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        bar = screen.query_one("#pages-scrubber", Scrubber)
        assert bar.display and bar.steps > 0 and "▮" in text(app)
        await pilot.press("o")
        await pilot.pause()
        assert "no page bookkeeping in this file" in text(app)
        assert bar.steps == 0 and not bar.display
        assert not screen.query_one("#pages-legend").display
        assert "▮" not in text(app) and "foreign read" not in text(app)
        await pilot.press("o")  # back to the trace: bar and legend again
        await pilot.pause()
        assert bar.display and bar.steps > 0

    drive([trace, log], script, size=size)


@pytest.mark.parametrize("size", SIZES)
def test_n_after_enter_in_search_jumps_to_the_next_match(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         size: tuple[int, int]) -> None:
    trace = write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("2", "slash", *"evict", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        table = screen.query_one("#timeline", VirtualTable)
        box = screen.query_one("#search", Input)
        assert app.focused is table
        kinds = []
        for _ in range(3):
            kinds.append((table.cursor, table.source.row(table.cursor)[0][3]))
            await pilot.press("n")
            await pilot.pause()
        assert box.value == "evict"
        assert [k for _c, k in kinds] == ["evict"] * 3
        cursors = [c for c, _k in kinds]
        assert cursors == sorted(set(cursors))  # each n a later match
        await pilot.press("N")
        await pilot.pause()
        assert table.cursor == cursors[-1] and box.value == "evict"

    drive([trace], script, size=size)


@pytest.mark.parametrize("size", SIZES)
def test_timeline_detail_line_shows_a_cut_event_whole(tmp_path: Path,
                                                      size: tuple[int, int]) -> None:
    log = _crash_log(tmp_path / "server.log")

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("2")
        await pilot.pause()
        table = app.screen.query_one("#timeline", VirtualTable)
        row = next(i for i in range(table.row_count)
                   if "upload_batch" in str(table.source.row(i)[0][3]))
        table.go_to(row)
        await pilot.pause()
        line = str(table.source.row(row)[0][3])
        rows = lines(app)
        assert not any(line in r for r in rows)  # the table cuts it at both sizes
        assert app.screen.query_one("#timeline-detail").display
        assert squeezed("text: " + line) in region_text(app, "#timeline-detail")

    drive([log], script, size=size)


def test_help_lists_one_key_per_row_at_80_columns(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trace = write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("4", "question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        want = [("[ ]", "page left / right"), ("↑ ↓", "layer up / down"),
                ("tab /", "next / previous stream panel")]
        for _ in range(6):
            rows = lines(app)
            for key, words in list(want):
                if any(key in r and words in r for r in rows):
                    want.remove((key, words))
            if not want:
                break
            await pilot.press("down", "down", "down")
            await pilot.pause()
        assert want == []

    drive([trace], script, size=(80, 24))


@pytest.mark.parametrize("size", SIZES)
def test_findings_and_their_evidence_fit_the_width(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   size: tuple[int, int]) -> None:
    trace = write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("7")
        await pilot.pause()
        table = app.screen.query_one("#findings-table", VirtualTable)
        rows = lines(app)
        head = next(r for r in rows if r.startswith("severity"))
        assert head.rstrip().endswith("evidence")  # the count column in view, label whole
        for i in range(table.row_count):
            rule = str(table.source.row(i)[0][1])
            assert any(rule in r for r in rows), rule
        evidence = app.screen.query_one("#evidence-table", VirtualTable)
        evidence.focus()
        evidence.go_to(0)
        await pilot.pause()
        whole = str(evidence.source.row(0)[0][2])
        shown = region_text(app, "#evidence-table")
        if squeezed(whole) not in shown:  # cut by the table: whole in the line below it
            assert squeezed("evidence: " + whole) in region_text(app, "#evidence-detail")

    drive([trace], script, size=size)
