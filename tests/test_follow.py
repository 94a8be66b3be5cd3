"""kvdiag check --follow: a trace or a log judged while a writer thread appends to it."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.follow.tail import Reset, Tail
from kvdiag.follow.watch import Follower
from kvdiag.model.findings import Finding

LOG = Path(__file__).parent / "fixtures" / "logs" / "kvstream_np2_gdb.log"


@pytest.fixture(scope="module")
def s1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slot1-first, small: foreign pool reads of stream 1 from step 10, its output diverging;
    183 lines."""
    out = tmp_path_factory.mktemp("follow") / "s1.kvtrace"
    assert main(["capture", "--scenario", "slot1-first", "--preset", "small", "--layers", "2",
                 "--streamed-layers", "2", "--prompt-tokens", "300", "--steps", "4", "-q",
                 "--executor", "numpy", "-o", str(out)]) == 0
    return out


class Writer(threading.Thread):
    """Appends ``src``'s lines to ``dst``, each in two writes (a partial line first), with a
    pause between lines; ``written`` counts whole lines on disk. ``hold_at``: after that many
    lines, wait for ``resume`` (a test that must see the file half written, however slowly
    the reader runs); ``hold_every``: so after every that many lines, ``held`` set while it
    waits (a test that must see it grow step by step)."""

    def __init__(self, src: Path, dst: Path, pause: float = 0.002, delay: float = 0.05,
                 lines: int | None = None, hold_at: int | None = None,
                 hold_every: int | None = None) -> None:
        super().__init__(daemon=True)
        self.lines = src.read_bytes().splitlines(keepends=True)[:lines]
        self.dst, self.pause, self.delay = dst, pause, delay
        self.written = 0
        self.stop = threading.Event()
        self.hold_at, self.hold_every = hold_at, hold_every
        self.resume = threading.Event()
        self.held = threading.Event()
        self.timeouts = 0

    def _hold(self) -> None:
        self.held.set()
        self.timeouts += not self.resume.wait(60)  # a test asserts there were none
        self.resume.clear()
        self.held.clear()

    def run(self) -> None:
        time.sleep(self.delay)  # the follower starts before the file exists
        with open(self.dst, "ab") as fh:
            for line in self.lines:
                if self.written == self.hold_at or (
                        self.hold_every and self.written and self.written % self.hold_every == 0):
                    self._hold()
                if self.stop.is_set():
                    return
                fh.write(line[: len(line) // 2])
                fh.flush()
                time.sleep(self.pause / 2)
                fh.write(line[len(line) // 2:])
                fh.flush()
                self.written += 1
                time.sleep(self.pause / 2)


def follow(path: Path, stop: Callable[[], bool], found: list[tuple[Finding, float]] | None = None,
           **kw: float) -> tuple[list[tuple[Finding, float]], list[str], Follower]:
    found = [] if found is None else found
    notes: list[str] = []
    f = Follower(str(path), lambda x: found.append((x, time.monotonic())), notes.append,
                 interval=0.01, stop=stop, **kw)
    f.run()
    return found, notes, f


def test_tail_waits_for_the_file_then_reads_what_is_appended(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    t = Tail(str(p))
    assert t.poll() is None and not t.opened
    p.write_bytes(b"one\ntw")
    assert t.poll() == b"one\ntw"
    assert t.poll() is None
    with open(p, "ab") as fh:
        fh.write(b"o\n")
    assert t.poll() == b"o\n"
    t.close()


def test_tail_reads_the_rest_then_a_replaced_file_from_its_start(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_bytes(b"old 1\n")
    t = Tail(str(p))
    assert t.poll() == b"old 1\n"
    os.rename(p, tmp_path / "f.log.1")  # logrotate: rename, then the writer creates anew
    p.write_bytes(b"new 1\n")
    got = t.poll()
    assert isinstance(got, Reset) and "replaced" in got.why
    assert t.poll() == b"new 1\n"
    assert t.generation == 2
    t.close()


def test_tail_notices_truncation_and_a_rewrite_past_the_old_length(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_bytes(b"a much longer first line\n")
    t = Tail(str(p))
    t.poll()
    with open(p, "r+b") as fh:  # copytruncate: same inode, shorter
        fh.truncate(0)
        fh.write(b"short\n")
    got = t.poll()
    assert isinstance(got, Reset) and "truncated" in got.why
    assert t.poll() == b"short\n"
    with open(p, "r+b") as fh:  # cut and rewritten longer before the next poll
        fh.truncate(0)
        fh.write(b"other text, longer than before\n")
    t.poll()  # the bytes past the old end
    got = t.poll()
    assert isinstance(got, Reset) and "rewritten" in got.why
    assert t.poll() == b"other text, longer than before\n"
    t.close()


def test_a_trace_is_judged_while_written_and_ends_at_its_end_event(s1: Path, tmp_path: Path
                                                                   ) -> None:
    live = tmp_path / "live.kvtrace"
    w = Writer(s1, live)
    w.start()
    found, notes, f = follow(live, lambda: False)
    w.join()
    rules = [x.rule for x, _ in found]
    assert sorted(rules) == sorted(set(rules))  # each once
    assert notes and "waiting for" in notes[0]
    state = f.state
    assert state.ended and state.events == 182
    # the same findings as check on the finished file, those only the end settles apart
    from kvdiag.judged.trace import analyse_file

    final = analyse_file(s1)
    assert sorted(rules + [x.rule for x in state.final]) == sorted(
        x.rule for x in final.findings)
    assert {"foreign-page-read", "stream-divergence"} <= set(rules)


def test_findings_arise_before_the_writer_is_done(s1: Path, tmp_path: Path) -> None:
    live = tmp_path / "live.kvtrace"
    w = Writer(s1, live, pause=0.01)
    w.start()
    seen: dict[str, int] = {}

    def report(x: Finding) -> None:
        seen[x.rule] = w.written

    Follower(str(live), report, lambda _: None, interval=0.01).run()
    w.join()
    total = len(w.lines)
    first = next(i for i, line in enumerate(w.lines) if b'"foreign"' in line) + 1
    # reported within a few lines of the read that made it, long before the end
    assert first <= seen["foreign-page-read"] <= first + 20 < total


def test_exit_on_stops_at_the_first_finding_at_or_above_it(s1: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    live = tmp_path / "live.kvtrace"
    w = Writer(s1, live, pause=0.01)
    w.start()
    code = main(["check", "--follow", str(live), "--exit-on", "error"])
    w.stop.set()
    w.join()
    out = capsys.readouterr().out
    assert code == 1
    first = out.splitlines()[0]
    assert first.split("] ", 1)[1].startswith("ERROR foreign-page-read: stream 1 read 1 ")
    assert "\n    #" in out and "step" in out  # its evidence
    assert "stopped at" in out and "--exit-on error" in out
    assert w.written < len(w.lines)  # a watchdog: it did not wait for the end


def test_json_lines_one_object_per_finding_and_an_end(s1: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    live = tmp_path / "done.kvtrace"
    shutil.copy(s1, live)
    assert main(["check", "--follow", str(live), "--json", "--fail-on", "critical"]) == 0
    import json

    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert docs[-1]["type"] == "end" and docs[-1]["how"] == "end of trace"
    assert docs[-1]["events"] == 182 and docs[-1]["exit"] == 0
    rules = [d["rule"] for d in docs[:-1]]
    assert {"foreign-page-read", "stream-divergence"} <= set(rules)
    assert all(d["type"] == "finding" and d["evidence"] for d in docs[:-1])


def test_a_trace_replaced_mid_run_is_judged_again_from_its_start(s1: Path, tmp_path: Path
                                                                 ) -> None:
    live = tmp_path / "live.kvtrace"
    lines = s1.read_bytes().splitlines(keepends=True)
    live.write_bytes(b"".join(lines[:20]))  # a run that stops early (no End)

    def rotate() -> None:
        time.sleep(0.3)
        os.rename(live, tmp_path / "live.kvtrace.1")
        shutil.copy(s1, tmp_path / "next.tmp")
        os.rename(tmp_path / "next.tmp", live)

    t = threading.Thread(target=rotate, daemon=True)
    t.start()
    _found, notes, f = follow(live, lambda: False)
    t.join()
    assert any("replaced" in n for n in notes)
    assert f.state.ended and f.state.events == 182


def test_a_growing_log_reports_the_mismatch_and_the_abort_once_quiet(tmp_path: Path) -> None:
    live = tmp_path / "server.log"
    w = Writer(LOG, live, pause=0.005)
    w.start()
    t0 = time.monotonic()
    found: list[tuple[Finding, float]] = []

    def done() -> bool:
        return time.monotonic() - t0 > 3 or (w.written == len(w.lines) and len(found) >= 2)

    found, _notes, f = follow(live, done, found, quiet=0.2)
    w.join()
    rules = [x.rule for x, _ in found]
    assert rules == ["fits-dispatch-mismatch", "abort"]
    abort = found[1][0]
    assert "ggml_cuda_kv_stream_fattn_fits(dst)" in abort.title
    assert abort.details["backtrace"]  # the frames the log printed after the assert
    assert f.state.kind == "log"


def test_a_truncated_log_is_read_again(tmp_path: Path) -> None:
    live = tmp_path / "server.log"
    text = LOG.read_bytes()
    live.write_bytes(text)
    t0 = time.monotonic()
    notes: list[str] = []
    fired = threading.Event()

    def cut() -> None:
        time.sleep(0.4)
        with open(live, "r+b") as fh:
            fh.truncate(0)
        fired.set()

    threading.Thread(target=cut, daemon=True).start()
    found: list[str] = []
    Follower(str(live), lambda x: found.append(x.rule), notes.append, interval=0.01,
             quiet=0.1, stop=lambda: time.monotonic() - t0 > 1.5).run()
    assert fired.is_set()
    assert any("truncated" in n for n in notes)
    assert found.count("abort") == 1  # before the cut; the empty file has none


def test_follow_refuses_what_it_cannot_follow(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(LOG), "--exit-on", "error"]) == 2
    assert "--exit-on needs --follow" in capsys.readouterr().err
    assert main(["check", "--follow", "-"]) == 2
    assert "not standard input" in capsys.readouterr().err
    assert main(["check", "--follow", str(tmp_path), "--exit-on", "error"]) == 2
    assert "directory" in capsys.readouterr().err


def test_check_follow_ends_at_an_end_event_written_with_the_last_few_events(
        s1: Path, tmp_path: Path) -> None:
    """Regression: the judgement fed in lists of 2,048 events waited for more events after
    the last ones of a short trace (the End among them) while the reader waited for the file
    to grow; check --follow never ended."""
    lines = s1.read_bytes().splitlines(keepends=True)
    live = tmp_path / "short.kvtrace"
    live.write_bytes(b"".join([*lines[:40], lines[-1]]))  # 39 events, then the End
    found: list[str] = []
    start = time.monotonic()
    state = Follower(str(live), lambda f: found.append(f.rule), lambda _: None, interval=0.01,
                     stop=lambda: time.monotonic() - start > 10).run()
    assert state.ended and state.events == 40
    assert time.monotonic() - start < 5


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_or_device_is_refused_not_waited_on(tmp_path: Path) -> None:
    """GIVEN a FIFO no writer has opened (and a character device), WHEN followed, THEN one
    line and exit 2 at once — open(2) of a FIFO waits for a writer, and the follower hung
    there, silent, where every other reader refuses a FIFO."""
    import subprocess
    import sys

    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    for path in (fifo, Path(os.devnull)):
        proc = subprocess.run(
            [sys.executable, "-m", "kvdiag", "check", "--follow", str(path)],
            capture_output=True, text=True, timeout=20)
        err = [ln for ln in proc.stderr.splitlines() if not ln.startswith("kvdiag check")]
        assert proc.returncode == 2, proc.stderr
        assert err == [f"kvdiag: error: {path}: not a regular file (a pipe or device has no "
                       "end to follow; read it with kvdiag check -)"]
