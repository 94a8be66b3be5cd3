"""Writer flush semantics: what is on disk after each call, without close."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from trace_samples import header

from kvdiag.model.events import Abort, End, Step, Warn, Write
from kvdiag.trace import TraceReader, TraceWriter


def on_disk(path: Path) -> tuple[list[Any], TraceReader]:
    """Read the file as another process would, while the writer still holds it open."""
    reader = TraceReader.open(path)
    return list(reader), reader


def emit_step(w: TraceWriter, step: int, writes: int = 3) -> None:
    w.emit(Step, step, phase="decode", streams=(0,), tokens=1, n_kv=8)
    for layer in range(writes):
        w.emit(Write, step, layer=layer, stream=0, cells=(step, step + 1), rows=(step, step + 1))


def test_header_is_on_disk_right_after_create(tmp_path: Path) -> None:
    path = tmp_path / "w.kvtrace"
    w = TraceWriter.create(path, header())
    events, reader = on_disk(path)
    assert events == [] and reader.header == header()
    assert [p.kind for p in reader.problems] == ["incomplete"]
    w.close()


def test_end_step_puts_every_event_of_the_step_on_disk_without_close(tmp_path: Path) -> None:
    path = tmp_path / "w.kvtrace"
    w = TraceWriter.create(path, header())
    emit_step(w, 0)
    # Not yet handed to the OS: buffering until end_step is what keeps lines whole.
    assert on_disk(path)[0] == []
    w.end_step()
    events, reader = on_disk(path)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert not reader.truncated and not reader.complete
    emit_step(w, 1)
    w.end_step()
    w.end_step()  # a second call with nothing buffered writes nothing
    events, reader = on_disk(path)
    assert [e.seq for e in events] == list(range(1, 9))
    assert [p.kind for p in reader.problems] == ["incomplete"]
    w.close()
    events, reader = on_disk(path)
    assert isinstance(events[-1], End) and reader.problems == []


@pytest.mark.parametrize("urgent", [Warn, Abort])
def test_warn_and_abort_are_flushed_at_once(tmp_path: Path, urgent: type[Warn | Abort]) -> None:
    path = tmp_path / "w.kvtrace"
    w = TraceWriter.create(path, header())
    emit_step(w, 0, writes=2)
    w.emit(urgent, 0, message="route fell back")
    events, _ = on_disk(path)
    # The urgent event and everything buffered before it, in order.
    assert [type(e) for e in events] == [Step, Write, Write, urgent]
    assert events[-1].message == "route fell back"
    w.emit(Write, 0, layer=9, stream=0, cells=(0, 1), rows=(0, 1))
    assert len(on_disk(path)[0]) == 4
    w.close()


def test_fsync_is_off_by_default_and_called_per_flush_when_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    w = TraceWriter.create(tmp_path / "a.kvtrace", header())
    emit_step(w, 0)
    w.end_step()
    w.close()
    assert calls == []
    w = TraceWriter.create(tmp_path / "b.kvtrace", header(), fsync=True)
    emit_step(w, 0)
    w.end_step()
    w.close()
    assert len(calls) == 3  # header, end_step, close


def test_short_os_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    sizes: list[int] = []

    def short_write(fd: int, data: Any) -> int:
        sizes.append(len(data))
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short_write)
    path = tmp_path / "s.kvtrace"
    w = TraceWriter.create(path, header())
    emit_step(w, 0)
    w.end_step()
    w.close()
    monkeypatch.undo()
    events, reader = on_disk(path)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5] and reader.problems == []
    assert len(sizes) > 50  # it really was written 7 bytes at a time


def test_emit_from_several_threads_numbers_every_event_once(tmp_path: Path) -> None:
    path = tmp_path / "t.kvtrace"
    w = TraceWriter.create(path, header())

    def worker(stream: int) -> None:
        for i in range(300):
            w.emit(Write, 0, layer=i, stream=stream, cells=(0, 1), rows=(0, 1))
            if i % 50 == 0:
                w.end_step()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.count_by_kind == {"write": 1200}
    w.close()
    events, reader = on_disk(path)
    assert reader.problems == []
    assert [e.seq for e in events] == list(range(1, 1202))
    per_stream = [
        sorted(e.layer for e in events if isinstance(e, Write) and e.stream == s) for s in range(4)
    ]
    assert per_stream == [list(range(300))] * 4
