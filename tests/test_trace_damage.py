"""Damaged traces: truncation, corrupt lines, sequence breaks, End mismatches, long lines."""

from __future__ import annotations

import io
from pathlib import Path

from trace_samples import end_line, event_line, header_line, write_line, write_steps

from kvdiag.model.events import Step, Unknown, Write
from kvdiag.trace import Problem, TraceReader


def read(
    data: bytes, chunk_size: int = 1 << 15, max_line: int = 1 << 26
) -> tuple[TraceReader, list[object]]:
    reader = TraceReader(io.BytesIO(data), "t.kvtrace", chunk_size=chunk_size, max_line=max_line)
    return reader, list(reader)


def kinds(reader: TraceReader) -> list[tuple[int, str]]:
    return [(p.line, p.kind) for p in reader.problems]


def test_truncated_last_line_keeps_every_complete_event(tmp_path: Path) -> None:
    path = tmp_path / "t.kvtrace"
    write_steps(path, steps=3, per_step=3, close=False)  # 9 events, lines 2..10
    data = path.read_bytes()
    with path.open("ab") as f:
        f.write(write_line(10, 3)[:25])  # the writer was killed inside os.write
    reader, events = read(path.read_bytes())
    assert [e.seq for e in events] == list(range(1, 10))  # type: ignore[attr-defined]
    assert reader.truncated and not reader.complete
    assert kinds(reader) == [(11, "truncated"), (11, "incomplete")]
    assert "cut short (25 bytes)" in reader.problems[0].message
    assert reader.lines_read == 11
    # The same file cut exactly at a line boundary is not truncated, only incomplete.
    reader2, events2 = read(data)
    assert len(events2) == 9 and not reader2.truncated
    assert kinds(reader2) == [(10, "incomplete")]


def test_last_line_without_newline_that_decodes_is_kept() -> None:
    data = header_line() + write_line(1) + end_line(2, events=1).rstrip(b"\n")
    reader, events = read(data)
    assert len(events) == 2 and reader.complete and not reader.truncated
    assert reader.problems == []


def test_corrupt_middle_lines_are_reported_by_line_and_neighbours_kept() -> None:
    data = (
        header_line()  # line 1
        + write_line(1)  # 2
        + b"this is not json\n"  # 3
        + write_line(2)  # 4
        + event_line("write", 3, layer="five", stream=0, cells=[0, 1], rows=[0, 1])  # 5
        + b"[1, 2, 3]\n"  # 6
        + b'{"kind": 7}\n'  # 7
        + b"\n"  # 8
        + write_line(4)  # 9
        + b'{"kind":"write","seq":5,"t_ns":1,"step":0,"layer":0,"stream":0,"cel\n'  # 10
        + write_line(6)  # 11
        + end_line(7, events=10)  # 12: 10 event lines before it, damaged ones included
    )
    reader, events = read(data)
    assert [e.seq for e in events] == [1, 2, 4, 6, 7]  # type: ignore[attr-defined]
    assert kinds(reader) == [
        (3, "corrupt"),
        (5, "corrupt"),
        (6, "corrupt"),
        (7, "corrupt"),
        (8, "corrupt"),
        (10, "corrupt"),
    ]
    messages = [p.message for p in reader.problems]
    assert messages[0].startswith("not JSON")
    assert "invalid write event" in messages[1] and "layer" in messages[1]
    assert messages[2] == "not a JSON object (list)"
    assert messages[3] == "no string 'kind' field"
    assert messages[4] == "empty line"
    assert reader.complete and not reader.truncated


def test_every_chunk_size_reports_the_same_problems() -> None:
    data = header_line() + b"".join(write_line(i) for i in range(1, 40))
    data += b"garbage\n" + b"".join(write_line(i) for i in range(40, 80)) + end_line(80, 80)
    reader, events = read(data)
    assert kinds(reader) == [(41, "corrupt")]
    for chunk in (1, 3, 50, 333, 100_000):
        r, e = read(data, chunk_size=chunk)
        assert e == events and r.problems == reader.problems, chunk


def test_sequence_not_increasing_is_a_problem_not_a_crash() -> None:
    data = (
        header_line()
        + write_line(1)
        + write_line(2)
        + write_line(2)  # line 4: repeated
        + write_line(5)
        + write_line(3)  # line 6: goes back
        + write_line(4)  # follows 3: fine again
        + end_line(7, events=6)
    )
    reader, events = read(data)
    assert [e.seq for e in events] == [1, 2, 2, 5, 3, 4, 7]  # type: ignore[attr-defined]
    assert kinds(reader) == [(4, "sequence"), (6, "sequence")]
    assert reader.problems[1] == Problem(6, "sequence", "seq 3 does not follow seq 5")


def test_gaps_in_seq_are_fine() -> None:
    data = header_line() + write_line(10) + write_line(20) + write_line(21) + end_line(30, 3)
    reader, events = read(data)
    assert len(events) == 4 and reader.problems == []


def test_events_after_end_and_count_mismatch() -> None:
    data = header_line() + write_line(1) + end_line(2, events=5) + write_line(3)
    reader, events = read(data)
    assert len(events) == 3
    assert kinds(reader) == [(3, "count"), (4, "after-end")]
    assert reader.problems[0].message == "End reports 5 events but 1 event lines precede it"
    assert reader.complete  # End was seen


def test_unknown_kind_in_a_same_version_file_is_kept_and_reported() -> None:
    data = (
        header_line()
        + write_line(1)
        + event_line("prefetch", 2, 0, layer=3, pages=[0, 4])
        + end_line(3, events=2)
    )
    reader, events = read(data)
    assert events[1] == Unknown("prefetch", 2, 200, 0, {"layer": 3, "pages": [0, 4]})
    assert kinds(reader) == [(3, "unknown-kind")]
    assert "'prefetch' is not part of format 1.0" in reader.problems[0].message


def test_unknown_kind_without_integer_common_fields_is_corrupt() -> None:
    data = header_line() + b'{"kind":"x","seq":"1","t_ns":0,"step":0}\n' + end_line(2, 1)
    reader, events = read(data)
    assert len(events) == 1
    assert kinds(reader) == [(2, "corrupt")]
    assert "without integer seq/t_ns/step" in reader.problems[0].message


def test_overlong_line_is_skipped_with_bounded_memory() -> None:
    big = b'{"kind":"warn","message":"' + b"x" * 5000 + b'"}\n'
    data = header_line() + write_line(1) + big + write_line(2) + end_line(3, events=3)
    reader, events = read(data, chunk_size=256, max_line=1024)
    assert [type(e) for e in events[:2]] == [Write, Write]
    assert kinds(reader) == [(3, "corrupt")]
    assert reader.problems[0].message == "line longer than 1024 bytes, skipped"
    assert reader.complete and reader.lines_read == 5


def test_overlong_last_line_without_newline_counts_as_truncated() -> None:
    data = header_line() + write_line(1) + b"{" + b"1" * 5000
    reader, events = read(data, chunk_size=256, max_line=1024)
    assert len(events) == 1 and reader.truncated
    assert kinds(reader) == [(3, "corrupt"), (3, "incomplete")]


def test_problems_are_visible_during_iteration() -> None:
    data = header_line() + write_line(1) + b"bad\n" + write_line(2) + end_line(3, 3)
    reader = TraceReader(io.BytesIO(data), "t", chunk_size=1)
    it = iter(reader)
    assert next(it).seq == 1
    assert reader.problems == []
    assert next(it).seq == 2
    assert kinds(reader) == [(3, "corrupt")]
    assert not reader.finished
    rest = list(it)
    assert len(rest) == 1 and reader.finished and reader.complete


def test_steps_of_a_complete_trace_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "ok.kvtrace"
    write_steps(path, steps=200, per_step=4)
    with TraceReader.open(path) as reader:
        steps = [e.step for e in reader if isinstance(e, Step)]
    assert steps == list(range(200)) and reader.problems == []


def test_deep_nesting_and_invalid_utf8_are_corrupt_lines() -> None:
    data = (
        header_line()
        + write_line(1)
        + b"[" * 100_000
        + b"\n"
        + b'{"kind":"warn","seq":2,"t_ns":0,"step":0,"message":"\xff\xfe"}\n'
        + write_line(3)
        + end_line(4, events=4)
    )
    reader, events = read(data, chunk_size=1 << 20, max_line=1 << 20)
    assert [e.seq for e in events] == [1, 3, 4]  # type: ignore[attr-defined]
    assert kinds(reader) == [(3, "corrupt"), (4, "corrupt")]


def test_decode_block_gives_one_entry_per_line_as_iteration_decodes() -> None:
    """A viewer that reads the bytes itself (kvdiag.analysis.trace_index.line_blocks) gets the
    reader's events and problems, with None where a line is not an event, for any cut."""
    from kvdiag.analysis.linesource import LineSource
    from kvdiag.analysis.trace_index import header_end, line_blocks

    data = (header_line() + write_line(1) + b"not json\n" + write_line(2) + b"\n"
            + write_line(3) + write_line(3) + b'{"kind":"write","seq":9,"t_ns":1,"st')
    whole, events = read(data)
    lines = data.split(b"\n")[1:]
    for chunk in (7, 40, 1 << 20):
        reader = TraceReader(io.BytesIO(data), "t.kvtrace")
        source = LineSource(data, "t.kvtrace")
        got = [e for _, block in line_blocks(source, header_end(source), chunk)
               for e in reader.decode_block(block)]
        reader.finish()
        assert len(got) == len(lines), chunk
        assert [e is None for e in got] == [False, True, False, True, False, False, True]
        assert [e for e in got if e is not None] == events
        assert reader.problems == whole.problems and reader.truncated
        assert [p.kind for p in reader.problems] == ["corrupt", "corrupt", "sequence",
                                                     "truncated", "incomplete"]
