"""Writer → reader round trips: every kind, every field, header, End and counters."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from trace_samples import ALL_KINDS, header, write_steps

from kvdiag.model.events import KNOWN_KINDS, End, Step, Write
from kvdiag.trace import FORMAT_NAME, FORMAT_VERSION, TraceReader, TraceWriter, make_header


def test_every_kind_round_trips_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "all.kvtrace"
    with TraceWriter.create(path, header()) as w:
        written = [w.emit(cls, 3, **fields) for cls, fields in ALL_KINDS]
        w.end_step()
    with TraceReader.open(path) as r:
        events = list(r)
        assert r.problems == []
        assert r.complete and not r.truncated
        assert r.lines_read == len(ALL_KINDS) + 2
    assert events[:-1] == written
    # Every kind of the union appears, End included, so a new kind added to the model without
    # a sample here fails this test.
    tags = {type(e).__struct_config__.tag for e in events}
    assert tags == set(KNOWN_KINDS)
    for (cls, fields), event in zip(ALL_KINDS, events, strict=False):
        assert type(event) is cls
        for name, value in fields.items():
            assert getattr(event, name) == value, (cls.__name__, name)


def test_header_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "h.kvtrace"
    h = header(model="m", streams=4)
    TraceWriter.create(path, h).close()
    with TraceReader.open(path) as r:
        assert r.header == h
        assert r.header.format == FORMAT_NAME == "kvtrace"
        assert r.version == (1, 3) and r.version_text == FORMAT_VERSION == "1.3"
        assert not r.newer_minor
        assert r.header.device.pcie == "Gen4 x16"
        assert r.header.scenario == {"model": "m", "streams": 4}
        assert r.header.created == "2026-03-01T12:00:00+00:00"
        assert [type(e) for e in r] == [End]


def test_seq_t_ns_and_end_event(tmp_path: Path) -> None:
    path = tmp_path / "s.kvtrace"
    w = write_steps(path, steps=4, per_step=3, close=False)
    assert w.seq == 12
    assert w.count_by_kind == {"step": 4, "write": 8}
    end = w.close("aborted")
    assert end is not None and end.seq == 13
    assert (end.status, end.steps, end.events) == ("aborted", 4, 12)
    assert w.close() is None  # second close: nothing more written
    events = list(TraceReader.open(path))
    assert [e.seq for e in events] == list(range(1, 14))
    times = [e.t_ns for e in events]
    assert times == sorted(times) and times[0] >= 0
    assert [e.step for e in events if isinstance(e, Step)] == [0, 1, 2, 3]
    assert events[-1] == end


def test_close_steps_override_and_exception_status(tmp_path: Path) -> None:
    path = tmp_path / "x.kvtrace"
    with pytest.raises(RuntimeError), TraceWriter.create(path, header()) as w:
        w.emit(Write, 0, layer=0, stream=0, cells=(0, 1), rows=(0, 1))
        raise RuntimeError("boom")
    end = list(TraceReader.open(path))[-1]
    assert isinstance(end, End) and end.status == "error" and end.events == 1
    w2 = TraceWriter.create(tmp_path / "y.kvtrace", header())
    end2 = w2.close(steps=7)
    assert end2 is not None and end2.steps == 7 and end2.events == 0


def test_emit_after_close_and_wrong_header_are_errors(tmp_path: Path) -> None:
    w = TraceWriter.create(tmp_path / "a.kvtrace", header())
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.emit(Write, 0, layer=0, stream=0, cells=(0, 1), rows=(0, 1))
    bad = msgspec.structs.replace(header(), version="1.2")
    with pytest.raises(ValueError, match=r"1\.2"):
        TraceWriter.create(tmp_path / "b.kvtrace", bad)


def test_make_header_fills_format_version_and_created() -> None:
    from kvdiag import __version__
    from kvdiag.model.events import Device

    h = make_header("cupy", Device("H200"))
    assert (h.format, h.version, h.kvdiag_version, h.backend) == (
        "kvtrace",
        "1.3",
        __version__,
        "cupy",
    )
    assert h.created.endswith("+00:00") and len(h.created) == 25


def test_reader_on_a_stream_and_chunk_size_do_not_change_results(tmp_path: Path) -> None:
    path = tmp_path / "c.kvtrace"
    write_steps(path, steps=50, per_step=5)
    data = path.read_bytes()
    expected = list(TraceReader(io.BytesIO(data), "mem"))
    assert len(expected) == 251
    for chunk in (1, 7, 64, 4096):
        r = TraceReader(io.BytesIO(data), "mem", chunk_size=chunk)
        assert list(r) == expected
        assert r.problems == [] and r.lines_read == 252


def test_writer_lines_are_one_json_object_each(tmp_path: Path) -> None:
    path = tmp_path / "l.kvtrace"
    write_steps(path, steps=2, per_step=2)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every line, the last included, ends with a newline
    decoded = [msgspec.json.decode(line) for line in lines[:-1]]
    assert decoded[0]["format"] == "kvtrace"
    assert [d["kind"] for d in decoded[1:]] == ["step", "write", "step", "write", "end"]
    assert all(line.startswith(b'{"kind":') for line in lines[1:-1])
