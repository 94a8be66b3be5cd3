"""Format versions (newer minor kept, other majors refused) and files that are not traces."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from trace_samples import NEWER_MINOR, end_line, event_line, header_line, write_line

from kvdiag.errors import EXIT_USAGE, InputError
from kvdiag.model.events import End, Fits, Read, Unknown, Write
from kvdiag.trace import TraceReader
from kvdiag.trace.summary import summarize

TENSOR = {"name": "q", "type": "f16", "ne": [1, 1, 1, 1], "nb": [2, 2, 2, 2], "lanes": 4}


def newer_minor_file() -> bytes:
    return (
        header_line(NEWER_MINOR, gpu_uuid="GPU-1234")
        + event_line(
            "write", 1, layer=0, stream=1, cells=[0, 1], rows=[0, 1], checksum="ab", extra_n=2
        )
        + event_line("prefetch", 2, 0, layer=3, pages=[0, 4])
        + event_line(
            "fits",
            3,
            node="fa",
            layer=0,
            q=TENSOR,
            k=TENSOR,
            v=TENSOR,
            dst=TENSOR,
            stage_bytes=0,
            result=True,
            route="streamed",
        )
        + event_line(
            "read",
            4,
            layer=0,
            stream=0,
            pool=1,
            ring=0,
            host=0,
            ranges=[[0, 1, "pool", 0, "exact", 0, "new-col"]],
        )
        + write_line(5)
        + end_line(6, events=5)
    )


def test_newer_minor_keeps_unknown_kinds_and_fields() -> None:
    reader = TraceReader(io.BytesIO(newer_minor_file()), "new.kvtrace")
    assert reader.version_text == NEWER_MINOR and reader.newer_minor
    assert reader.header_extras == {"gpu_uuid": "GPU-1234"}
    events = list(reader)
    assert reader.problems == []  # unknown kinds are expected in a newer minor version
    assert isinstance(events[0], Write) and events[0].stream == 1
    assert events[1] == Unknown("prefetch", 2, 200, 0, {"layer": 3, "pages": [0, 4]})
    assert isinstance(events[2], Fits) and isinstance(events[3], Read)
    assert reader.extras == {
        1: {"checksum": "ab", "extra_n": 2},
        3: {f"{t}.lanes": 4 for t in ("q", "k", "v", "dst")},
        4: {"ranges[0][6]": "new-col"},
    }
    assert 5 not in reader.extras  # a line with nothing unknown has no entry


def test_summary_shows_newer_minor_extras() -> None:
    summary = summarize(TraceReader(io.BytesIO(newer_minor_file()), "new.kvtrace"))
    assert summary.version == NEWER_MINOR and summary.newer_minor
    assert summary.unknown_kinds == ("prefetch",)
    assert summary.counts == {"write": 2, "end": 1, "fits": 1, "prefetch": 1, "read": 1}
    assert summary.extra_fields == {
        "fits.dst.lanes": 1,
        "fits.k.lanes": 1,
        "fits.q.lanes": 1,
        "fits.v.lanes": 1,
        "read.ranges[0][6]": 1,
        "write.checksum": 1,
        "write.extra_n": 1,
    }
    assert summary.header_extras == {"gpu_uuid": "GPU-1234"}
    assert summary.valid


def test_same_minor_ignores_unknown_fields_on_the_fast_path() -> None:
    data = header_line("1.0") + event_line(
        "write", 1, layer=0, stream=0, cells=[0, 1], rows=[0, 1], checksum="ab"
    )
    reader = TraceReader(io.BytesIO(data + end_line(2, 1)), "t")
    assert [type(e) for e in reader] == [Write, End]
    assert reader.extras == {} and reader.problems == []


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (
            "2.0",
            "t.kvtrace: trace format 2.0 is newer than this kvdiag understands (1.x); "
            "upgrade kvdiag",
        ),
        ("0.9", "t.kvtrace: trace format 0.9 is older than this kvdiag understands (1.x)"),
        ("1", "t.kvtrace: trace header has an invalid format version '1' (want MAJOR.MINOR)"),
        ("v1.0", "t.kvtrace: trace header has an invalid format version 'v1.0' (want MAJOR.MINOR)"),
    ],
)
def test_other_majors_and_bad_versions_are_refused(version: str, message: str) -> None:
    data = header_line(version) + write_line(1)
    with pytest.raises(InputError) as info:
        TraceReader(io.BytesIO(data), "t.kvtrace")
    assert str(info.value) == message
    assert info.value.exit_code == EXIT_USAGE == 2


def test_newer_major_refused_even_with_unknown_header_shape() -> None:
    data = b'{"format":"kvtrace","version":"2.0","entirely":"different"}\n'
    with pytest.raises(InputError, match=r"2\.0 is newer"):
        TraceReader(io.BytesIO(data), "t")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file, not a kvtrace trace"),
        (b"\x00\xff\x13\x37garbage\x89PNG\r\n\x1a\n", "not a kvtrace trace (line 1 is not JSON)"),
        (b'{"hello": "world"}\n', "not a kvtrace trace (line 1 is not a kvtrace header)"),
        (b'["kvtrace", "1.0"]\n', "not a kvtrace trace (line 1 is not a kvtrace header)"),
        (b'{"format":"kvtrace","version":"1.0","kvd', "truncated header, no events written"),
        (
            b'{"format":"kvtrace","version":"1.0","created":3}\n',
            "invalid trace header: Expected `str`, got `int` - at `$.created`",
        ),
    ],
)
def test_files_that_are_not_traces(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "f.kvtrace"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        TraceReader.open(path)
    assert str(info.value) == f"{path}: {message}"


def test_header_longer_than_max_line_is_not_a_trace() -> None:
    with pytest.raises(InputError, match="no header line"):
        TraceReader(io.BytesIO(b"x" * 5000), "t", chunk_size=64, max_line=1024)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        TraceReader.open(tmp_path / "nope.kvtrace")
    assert str(info.value) == f"{tmp_path / 'nope.kvtrace'}: no such file"
    with pytest.raises(InputError) as info:
        TraceReader.open(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a trace file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.kvtrace"
    path.write_bytes(header_line())
    path.chmod(0)
    with pytest.raises(InputError, match="cannot open: Permission denied"):
        TraceReader.open(path)


def test_text_stream_is_refused() -> None:
    with pytest.raises(InputError, match="not a binary stream"):
        TraceReader(io.StringIO("{}"), "t")  # type: ignore[arg-type]
