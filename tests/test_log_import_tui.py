"""An imported log in the viewer: its fits decisions on Fits, its partition on Telemetry."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvdiag.cli import main
from kvdiag.tui.app import KvdiagApp
from tests.test_log_import import ASSERT, BOOT, fits_line, stamped
from tests.test_tui_pilot import Script, drive, lines, show, text


def adapt(active: int, resident: int, ring: int, misses: int, busy: float) -> str:
    return (f"W kv_stream_adapt: active {active}, resident {resident}, ring {ring}, samples 200, "
            f"misses {misses}, copy busy {busy}%, peak {ring // 2}")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imported")
    log = [
        *BOOT,
        adapt(9000, 40, 8, 0, 20.0),
        adapt(9300, 40, 8, 6, 35.0),
        "W kv_stream_adapt: adaptive KV partition: resident pages/layer 40 -> 37, ring slots "
        "8 -> 35, miss 3.0%, copy busy 35.0%",
        adapt(9600, 37, 35, 2, 61.5),
        adapt(9900, 37, 35, 0, 64.0),
        fits_line("0x7f00aa000100", "256,24,1,2", "0x7f2000000000", "0x55aa00001230",
                  "0x55aa00001230"),
        ASSERT,
    ]
    path = root / "server.log"
    path.write_text("\n".join(stamped(log)) + "\n")
    out = root / "server.kvtrace"
    assert main(["import", str(path), "-o", str(out)]) == 0
    return out


def test_fits_screen_shows_the_imported_decision(imported: Path) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "3")
        screen = text(app)
        assert "1 fits() decision(s), 1 false · routes: abort 1" in screen
        # the judgement evaluates what the log printed (dst ne[3] is Q ne[3]), as check does
        assert "1 failed condition(s), evaluated by kvdiag from the logged geometry" in screen
        assert "✗ Q.ne[3]==1 (Q.ne[3]=2 from dst.ne[3])" in screen
        assert "? K.ne[3]==1: K.ne[3] not recorded" in screen
        row = next(r for r in lines(app) if "abort" in r and "FALSE" in r)
        assert "Q.ne[3]==1 (by kvdiag)" in row and "[256,24,1,2]" in row
        assert "[0,0,0,0]" not in row
        assert "GGML_ASSERT(fits) aborts" in screen
        dst = next(r for r in lines(app) if r.lstrip().startswith("dst"))
        assert "256" in dst and "24" in dst and "?" in dst  # ne logged, nb not

    drive([imported], script)


def test_telemetry_screen_plots_the_partition(imported: Path) -> None:
    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await show(pilot, "6", "home")
        screen = text(app)
        assert "KV partition (kv_stream_adapt)" in screen
        assert "kv_stream_adapt (5 samples)" in screen
        assert "no telemetry in this trace" in screen  # no NVML samples in a log

        def row(label: str) -> str:
            return next(r for r in lines(app) if r.lstrip().startswith(label))

        assert "40 pages" in row("resident/layer") and "37 – 40" in row("resident/layer")
        assert "8 slots" in row("ring slots") and "8 – 35" in row("ring slots")
        assert "20.00 %" in row("copy busy")
        assert "0.00 %" in row("miss")
        # the second adapt line (step 1): misses 6 of 200 samples
        await show(pilot, "right")
        assert "3.00 %" in row("miss") and "35.00 %" in row("copy busy")
        # the repartition belongs to step 2, the adapt line after it too
        await show(pilot, "right")
        assert "37 pages" in row("resident/layer") and "35 slots" in row("ring slots")
        assert "61.50 %" in row("copy busy")

    drive([imported], script)


def test_fits_pane_says_an_unknown_stage_and_the_headers(tmp_path: Path) -> None:
    """GIVEN a log whose boot does not give the head sizes (no stage can be computed), WHEN its
    import's fits line is shown, THEN the pane says the stage is unknown, not "stage_bytes 0";
    GIVEN the same trace with a header plan that knows the stage, THEN the pane says the
    header's figure, marked as the header's."""
    import json

    boot = [line for line in BOOT if "n_embd_head" not in line]
    log = tmp_path / "headless.log"
    log.write_text("\n".join(stamped([*boot, fits_line(
        "0x7f00aa000100", "128,8,1,2", "0x7f2000000000", "0x55aa00001230",
        "0x55aa00001230"), ASSERT])) + "\n")
    out = tmp_path / "headless.kvtrace"
    assert main(["import", str(log), "-o", str(out)]) == 0
    lines_ = out.read_text().splitlines()
    header = json.loads(lines_[0])
    assert "stage_bytes" not in header["plan"]
    known = tmp_path / "known.kvtrace"
    header["plan"]["stage_bytes"] = 1 << 20
    known.write_text("\n".join([json.dumps(header), *lines_[1:]]) + "\n")

    def script_for(expected: str) -> Script:
        async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
            await show(pilot, "3")
            screen = " ".join(text(app).split())
            assert expected in screen
            assert "stage_bytes 0" not in screen
        return script

    drive([out], script_for("stage_bytes unknown (not recorded)"))
    drive([known], script_for(
        "stage_bytes not recorded in this event; the header's plan says 1048576 (from the "
        "header)"))
