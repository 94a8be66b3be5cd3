"""kvdiag tui --follow: the viewer driven by Pilot while a trace or a log is being written."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from textual.pilot import Pilot

from kvdiag.cli import main
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.document import Document, LogDoc, PendingDoc, TraceDoc
from kvdiag.tui.loading import load_log
from kvdiag.tui.screens.pages import PagesScreen
from kvdiag.tui.screens.timeline import TimelineScreen
from kvdiag.tui.shown import load_document, pages_marked
from tests.test_follow import Writer
from tests.test_tui_pilot import text

LOG = Path(__file__).parent / "fixtures" / "logs" / "kvstream_np2_gdb.log"
Script = Callable[[KvdiagApp, Pilot[int]], Awaitable[None]]


@pytest.fixture(scope="module")
def s1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slot1-first: foreign pool reads of stream 1 from step 10; 15 steps, 183 lines."""
    out = tmp_path_factory.mktemp("tuifollow") / "s1.kvtrace"
    assert main(["capture", "--scenario", "slot1-first", "--preset", "small", "--layers", "2",
                 "--streamed-layers", "2", "--prompt-tokens", "300", "--steps", "4", "-q",
                 "--executor", "numpy", "-o", str(out)]) == 0
    return out


def follow(path: Path, script: Script) -> None:
    async def run() -> None:
        app = KvdiagApp([str(path)], follow=True)
        async with app.run_test(size=(160, 48)) as pilot:
            await script(app, pilot)

    asyncio.run(run())


async def until(pilot: Pilot[int], cond: Callable[[], bool], what: str,
                timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{text(pilot.app)}")  # type: ignore[arg-type]
        await asyncio.sleep(0.02)
    await pilot.pause()


def live_file(app: KvdiagApp, files: int, rows: int | None = None) -> bool:
    """The viewer shows the ``files``-th file followed under the name (with ``rows`` index
    rows): False, not an error, while it waits for a file that is empty for a moment."""
    doc = app.doc
    return (isinstance(doc, TraceDoc) and doc.live is not None and doc.live.files == files
            and (rows is None or doc.index.n == rows))


def trace(app: KvdiagApp) -> TraceDoc:
    doc = app.doc
    assert isinstance(doc, TraceDoc), doc
    return doc


def lines_to_step(path: Path, step: int) -> list[bytes]:
    """The lines of ``path`` up to the last one of ``step`` (header included)."""
    lines = path.read_bytes().splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if f'"step":{step},'.encode() in ln)
    return lines[:last + 1]


def append(path: Path, lines: list[bytes]) -> None:
    with open(path, "ab") as fh:
        fh.write(b"".join(lines))


def test_a_trace_written_by_a_thread_is_shown_live_and_ends_as_a_whole_load(
        s1: Path, tmp_path: Path) -> None:
    live = tmp_path / "live.kvtrace"
    # the writer stops every 30 lines until the viewer has caught up with what it wrote: a
    # loaded machine may otherwise read the whole file between two looks at the screen
    w = Writer(s1, live, pause=0.006, delay=0.3, hold_every=30)
    seen_steps: list[tuple[int, int]] = []

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: isinstance(app.doc, PendingDoc), "the wait for the file")
        assert "waiting for" in app.doc.message and "● LIVE" in text(app)  # type: ignore[union-attr]
        w.start()
        await pilot.press("4")
        while w.is_alive():
            doc = app.doc
            if isinstance(doc, TraceDoc) and doc.pages is not None:
                seen_steps.append((doc.index.last_step, app.step))
                if w.held.is_set() and doc.index.n + 1 >= w.written:  # + the header line
                    await pilot.pause()
                    seen_steps.append((doc.index.last_step, app.step))
                    w.resume.set()
            await asyncio.sleep(0.05)
        await until(pilot, lambda: isinstance(app.doc, TraceDoc) and app.doc.live is not None
                    and bool(app.doc.live.ended), "the End event")
        doc = trace(app)
        assert doc.index.n == 182 and doc.index.last_step == 14
        steps = doc.index.columns["step"]
        assert doc.index.step_high.tolist() == np.maximum.accumulate(steps).tolist()
        assert "■ ENDED: End event (status completed)" in text(app)
        assert "step 14 of 14 · following the newest step" in text(app)
        # the whole file, loaded as a finished trace, shows the same
        whole = load_document(str(s1))
        assert [f.rule for f in doc.findings] == [f.rule for f in whole.findings]
        assert doc.digest is not None and whole.digest is not None
        assert doc.digest.judgement.counts == whole.digest.judgement.counts
        for step in (0, 9, 10, 14):
            assert pages_marked(doc, step) == pages_marked(whole, step)
        await pilot.press("2")
        await pilot.pause()
        table = app.screen.table  # type: ignore[attr-defined]
        assert table.cursor == 181  # the Timeline tails the file: its last event
        assert "182 of 182 events" in text(app)

    follow(live, script)
    assert w.timeouts == 0  # every hold ended when the viewer had caught up
    # new steps appeared one after another while it was written, and Pages was on the newest
    steps = sorted({s for s, _ in seen_steps})
    assert len(steps) >= 5 and steps[0] < 10
    assert all(shown == last for last, shown in seen_steps[-5:])


def test_scrubbing_away_stops_following_and_end_resumes(s1: Path, tmp_path: Path) -> None:
    live = tmp_path / "live.kvtrace"
    lines = s1.read_bytes().splitlines(keepends=True)
    first = lines_to_step(s1, 6)
    append(live, first)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("4")
        await until(pilot, lambda: isinstance(app.doc, TraceDoc)
                    and app.doc.index.last_step == 6 and app.step == 6, "step 6")
        await pilot.press("left", "left")
        await pilot.pause()
        assert app.step == 4 and not app.follow_step
        assert "not following (end: the newest step)" in text(app)
        append(live, lines_to_step(s1, 11)[len(first):])
        await until(pilot, lambda: trace(app).index.last_step == 11, "step 11")
        screen = app.screen
        assert isinstance(screen, PagesScreen)
        assert app.step == 4 and screen.shown_step == 4  # stays where the user put it
        assert "step 4 of 11" in text(app)
        await pilot.press("end")
        await pilot.pause()
        assert app.step == 11 and app.follow_step
        append(live, lines[len(lines_to_step(s1, 11)):])
        await until(pilot, lambda: trace(app).index.last_step == 14 and app.step == 14,
                    "following again to step 14")
        # scrubbing to the newest step resumes too: away, then → up to it
        await pilot.press("left")
        assert not app.follow_step
        await pilot.press("right")
        assert app.follow_step

    follow(live, script)


def test_pause_keeps_the_screens_still_and_resume_catches_up(s1: Path, tmp_path: Path) -> None:
    live = tmp_path / "live.kvtrace"
    lines = s1.read_bytes().splitlines(keepends=True)
    first = lines_to_step(s1, 3)
    append(live, first)

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.doc, TraceDoc)
                    and app.doc.index.n == len(first) - 1, "the first steps")
        n = trace(app).index.n
        await pilot.press("s")
        await pilot.pause()
        assert app.paused and "⏸ PAUSED" in text(app)
        append(live, lines[len(first):])
        await asyncio.sleep(0.6)  # the loader reads on
        await pilot.pause()
        assert trace(app).index.n == n
        assert f"{n} of {n} events" in text(app)
        await pilot.press("s")
        await until(pilot, lambda: trace(app).index.n == 182, "the held snapshot")
        assert not app.paused and "⏸ PAUSED" not in text(app)
        assert "182 of 182 events" in text(app)

    follow(live, script)


def test_a_finding_shows_when_it_arises_before_the_run_ends(s1: Path, tmp_path: Path) -> None:
    live = tmp_path / "live.kvtrace"
    append(live, lines_to_step(s1, 9))

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await pilot.press("7")
        await until(pilot, lambda: isinstance(app.doc, TraceDoc)
                    and app.doc.index.last_step == 9, "step 9")
        await asyncio.sleep(0.3)
        # no End yet: what only the end settles (the run not completing) is not claimed
        assert [f.rule for f in trace(app).findings] == []
        assert "trace-incomplete" not in text(app)
        append(live, lines_to_step(s1, 10)[len(lines_to_step(s1, 9)):])
        await until(pilot, lambda: "foreign-page-read" in [f.rule for f in trace(app).findings],
                    "the foreign read of step 10")
        assert "foreign-page-read" in text(app) and "● LIVE" in text(app)

    follow(live, script)


def test_a_rotated_then_truncated_trace_is_followed_into_the_new_file(s1: Path, tmp_path: Path
                                                                      ) -> None:
    live = tmp_path / "live.kvtrace"
    append(live, lines_to_step(s1, 5))

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: isinstance(app.doc, TraceDoc)
                    and app.doc.index.last_step == 5, "step 5")
        os.rename(live, tmp_path / "live.kvtrace.1")  # rotated: a new file under the name
        append(live, lines_to_step(s1, 2))
        await until(pilot, lambda: isinstance(app.doc, TraceDoc) and app.doc.live is not None
                    and app.doc.live.files == 2 and app.doc.index.last_step == 2,
                    "the new file")
        live_state = trace(app).live
        assert live_state is not None and "replaced" in live_state.note
        assert "file 2 under this name" in text(app)
        with open(live, "r+b") as fh:  # copytruncate: the same file cut, then written again
            fh.truncate(0)
            fh.write(b"".join(lines_to_step(s1, 1)))  # shorter than what was read
        # the viewer may look between the cut and the write (a file of 0 bytes: it waits,
        # PendingDoc, as it should): the conditions ask for a trace rather than assert one
        await until(pilot, lambda: live_file(app, 3), "the cut")
        append(live, s1.read_bytes().splitlines(keepends=True)[len(lines_to_step(s1, 1)):])
        await until(pilot, lambda: live_file(app, 3, 182), "the truncated file read again")
        note = trace(app).live.note  # type: ignore[union-attr]
        assert "truncated" in note or "rewritten" in note
        assert "■ ENDED" in text(app)

    follow(live, script)


def test_a_growing_server_log_shows_its_lines_and_its_crash(tmp_path: Path) -> None:
    live = tmp_path / "server.log"
    w = Writer(LOG, live, pause=0.02, delay=0.1)
    total = len(LOG.read_bytes().splitlines())

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        w.start()
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.doc, LogDoc) and 0 < app.doc.index.n < total,
                    "the first lines")
        await until(pilot, lambda: isinstance(app.doc, LogDoc) and app.doc.index.n == total
                    and app.doc.live is not None and bool(app.doc.live.ended),
                    "the crash, once the log is quiet")
        doc = app.doc
        assert isinstance(doc, LogDoc)
        assert len(doc.scan.crashes) == 1
        whole: list[Document] = []
        load_log(str(LOG), whole.append)  # the finished log, as the viewer loads it
        done = whole[-1]
        assert isinstance(done, LogDoc)
        assert [f.rule for f in doc.findings] == [f.rule for f in done.findings]
        assert "kvstream-fits-dispatch-abort" in [f.rule for f in doc.findings]
        assert f"{total:,} of {total:,} lines" in text(app)
        assert "■ ENDED: the server crashed" in text(app)
        assert isinstance(app.screen, TimelineScreen)
        assert app.screen.table.cursor == total - 1

    follow(live, script)


def test_a_growing_server_log_fills_the_perf_screen_as_requests_complete(
        tmp_path: Path) -> None:
    """The Perf screen of a followed log: the requests completed so far, growing while the
    server writes, and at the end the requests ``kvdiag perf`` reads in the finished log (it
    stayed empty while a log was followed)."""
    from kvdiag.postmortem.perfread import scan_paths
    from kvdiag.tui.screens.perf import PerfScreen
    from tests.seed_arm117 import seed_logs

    source = tmp_path / "streaming.log"
    source.write_text(seed_logs()[1])
    whole = scan_paths([str(source)])[0]
    assert len(whole.requests) >= 10
    live = tmp_path / "server.log"
    # the writer stops half way until the screen has shown the requests completed so far: a
    # loaded machine may otherwise read the whole log before the viewer draws a partial count
    lines = len(source.read_bytes().splitlines())
    w = Writer(source, live, pause=0.004, delay=0.1, hold_at=lines // 2)
    seen: list[int] = []

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        w.start()
        await pilot.press("8")
        assert isinstance(app.screen, PerfScreen)

        def requests() -> int:
            doc = app.doc
            n = len(doc.perf.requests) if isinstance(doc, LogDoc) and doc.perf else 0
            if not seen or seen[-1] != n:
                seen.append(n)
            return n

        await until(pilot, lambda: 0 < requests() < len(whole.requests), "the first requests",
                    30.0)
        w.resume.set()
        await until(pilot, lambda: requests() == len(whole.requests), "every request", 30.0)
        doc = app.doc
        assert isinstance(doc, LogDoc) and doc.perf is not None
        assert [(r.slot, r.depth_end, r.decode_tps) for r in doc.perf.requests] == \
            [(r.slot, r.depth_end, r.decode_tps) for r in whole.requests]
        assert f"{len(whole.requests)} request" in text(app)

    follow(live, script)
    assert w.timeouts == 0
    assert seen[0] == 0 or len(seen) > 2  # shown while growing, not only once complete


@pytest.mark.parametrize(("extra", "says"), [
    (["--export-svg", "out.svg"], "--export-svg draws a finished one"),
    (["second.kvtrace"], "--follow follows one file (2 given)"),
    (["--binary", "/bin/true"], "--binary symbolizes a finished log"),
])
def test_follow_refuses_bad_combinations_in_one_line(tmp_path: Path, extra: list[str],
                                                     says: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    os.chdir(tmp_path)
    assert main(["tui", "--follow", "first.kvtrace", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.svg").exists()


def test_follow_refuses_what_cannot_be_followed(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tui", "--follow", "-"]) == 2
    assert "not standard input" in capsys.readouterr().err
    (tmp_path / "a.000001.kvtrace").write_bytes(b"")
    (tmp_path / "b.000001.kvtrace").write_bytes(b"")
    assert main(["tui", "--follow", str(tmp_path)]) == 2
    assert "2 segment sets; name one" in capsys.readouterr().err
    (tmp_path / "a.000001.kvtrace").unlink()
    (tmp_path / "b.000001.kvtrace").unlink()
    assert main(["tui", "--follow", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err
    gz = tmp_path / "run.log.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00rest")
    assert main(["tui", "--follow", str(gz)]) == 2
    assert "compressed; only a file being written as plain text" in capsys.readouterr().err


def test_a_pages_query_grown_row_by_row_equals_one_built_whole(s1: Path) -> None:
    from kvdiag.analysis.linesource import LineSource
    from kvdiag.analysis.pages_query import PagesQuery
    from kvdiag.analysis.trace_index import IndexBuilder, header_end, line_blocks

    whole = load_document(str(s1))
    assert whole.pages is not None and whole.geometry is not None
    source = LineSource.open(s1)
    builder = IndexBuilder(source, header_end(source))
    grown: PagesQuery | None = None
    early: tuple[PagesQuery, list[object]] | None = None
    geo = whole.geometry

    def rows(q: PagesQuery, step: int) -> list[object]:
        snap = q.snapshot(step)
        return [snap.row(s, layer) for s in geo.streams for layer in range(geo.layers)]

    for offset, block in line_blocks(source, builder.pos, 2000):  # a few events at a time
        builder.add(block, offset)
        index = builder.snapshot()
        grown = (PagesQuery(index, source, geo) if grown is None
                 else grown.grown(index, source, geo))
        if early is None and index.last_step >= 6:
            early = (grown, rows(grown, 6))
    assert grown is not None and grown.index.n == whole.index.n == 182
    assert early is not None and rows(early[0], 6) == early[1]  # growing left it as it was
    for step in range(15):
        a = grown.snapshot(step, whole.digest.ledger if whole.digest else None)
        b = whole.pages.snapshot(step, whole.digest.ledger if whole.digest else None)
        for stream in whole.geometry.streams:
            for layer in range(whole.geometry.layers):
                assert a.row(stream, layer) == b.row(stream, layer), (step, stream, layer)


def test_a_growing_source_reads_lines_and_finds_text_only_in_its_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvdiag.analysis.linesource import GrowingSource, LineSource, OwnedFd

    p = tmp_path / "f"
    body = b"".join(b"line %d %s\n" % (i, b"x" * (i * 37 % 5000)) for i in range(400))
    p.write_bytes(body + b"past the prefix needle\n")
    whole = LineSource.open(p)
    src = GrowingSource(OwnedFd(os.open(p, os.O_RDONLY)), str(p), len(body))
    monkeypatch.setattr(GrowingSource, "_FIND", 4096)  # several chunks, needles across edges
    try:
        assert src.size == len(body) and src.data == body
        starts = [0, *(i + 1 for i in range(len(body)) if body[i:i + 1] == b"\n")][:-1]
        for off in starts[::17]:
            assert src.line(off) == whole.line(off)
        for needle in (b"line 399", b"line 250 ", b"x\nline 3", b"needle"):
            assert src.find(needle, 0) == body.find(needle)
            assert src.rfind(needle, 0, src.size) == body.rfind(needle)
            assert src.find(needle, 5000, 90000) == body.find(needle, 5000, 90000)
        longer = src.grown(whole.size)
        assert longer.find(b"needle", 0) == whole.find(b"needle", 0) > 0
        assert src.read(len(body) - 3, 100) == body[-3:]  # never past its prefix
    finally:
        whole.close()


def segment_header(s1: Path, index: int, first_seq: int) -> bytes:
    import json

    head = json.loads(s1.read_bytes().split(b"\n", 1)[0])
    head.setdefault("extra", {})["segment"] = {"index": index, "first_seq": first_seq,
                                               "run": "r1"}
    return json.dumps(head).encode() + b"\n"


def test_a_segment_set_is_followed_into_its_next_segment(s1: Path, tmp_path: Path) -> None:
    lines = s1.read_bytes().splitlines(keepends=True)
    cut = len(lines_to_step(s1, 6))
    first = tmp_path / "rig.000001.kvtrace"
    first.write_bytes(segment_header(s1, 1, 1) + b"".join(lines[1:cut]))

    async def script(app: KvdiagApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: isinstance(app.doc, TraceDoc)
                    and app.doc.index.last_step == 6, "segment 1")
        assert trace(app).index.n == cut - 1
        second = tmp_path / "rig.000002.kvtrace"  # the writer rotates: segment 1 is complete
        second.write_bytes(segment_header(s1, 2, cut) + b"".join(lines[cut:]))
        await until(pilot, lambda: live_file(app, 2, len(lines) - cut), "segment 2")
        doc = trace(app)
        assert doc.live is not None
        assert "segment rig.000001.kvtrace is complete" in doc.live.note
        assert "rig.000002.kvtrace" in doc.live.note
        assert int(doc.index.columns["step"][0]) == 7  # segment 2 from its start
        assert "■ ENDED: End event" in text(app)

    follow(tmp_path / "rig.kvtrace", script)

