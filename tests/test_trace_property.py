"""Property tests: the reader raises only InputError, and never drops a valid event."""

from __future__ import annotations

import io

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from trace_samples import header_line

from kvdiag.errors import InputError
from kvdiag.model.events import Event, Warn, Write
from kvdiag.trace import TraceReader

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = header_line()
ints = st.integers(min_value=-(2**40), max_value=2**40)


def writes(seq: int) -> st.SearchStrategy[Event]:
    return st.builds(
        Write,
        seq=st.just(seq),
        t_ns=st.integers(0, 2**62),
        step=st.integers(0, 10**6),
        layer=ints,
        stream=ints,
        cells=st.tuples(ints, ints),
        rows=st.tuples(ints, ints),
        dirty=st.lists(st.tuples(ints, st.none() | ints, ints), max_size=3).map(tuple),
    )


def warns(seq: int) -> st.SearchStrategy[Event]:
    return st.builds(
        Warn,
        seq=st.just(seq),
        t_ns=st.integers(0, 2**62),
        step=st.integers(0, 10**6),
        message=st.text(max_size=40),
        layer=st.none() | ints,
    )


@st.composite
def event_lists(draw: st.DrawFn, max_size: int = 12) -> list[Event]:
    n = draw(st.integers(0, max_size))
    return [draw(st.one_of(writes(seq), warns(seq))) for seq in range(1, n + 1)]


def line(event: Event) -> bytes:
    return msgspec.json.encode(event) + b"\n"


def decodes_as_event(text: bytes) -> bool:
    try:
        raw = msgspec.json.decode(text)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and "kind" in raw


def read_all(data: bytes, chunk_size: int = 1 << 15) -> tuple[TraceReader, list[object]]:
    reader = TraceReader(io.BytesIO(data), "p.kvtrace", chunk_size=chunk_size, max_line=1 << 16)
    return reader, list(reader)


@SETTINGS
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_input_error(data: bytes) -> None:
    try:
        reader, _ = read_all(data)
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("p.kvtrace: ")
    else:
        assert reader.finished


@SETTINGS
@given(st.binary(max_size=600), st.integers(1, 64))
def test_arbitrary_bytes_after_a_header_never_raise(body: bytes, chunk: int) -> None:
    reader, _ = read_all(HEADER + body, chunk_size=chunk)
    assert reader.finished
    n_lines = 1 + body.count(b"\n") + (0 if body.endswith(b"\n") or not body else 1)
    assert reader.lines_read == n_lines
    assert all(1 < p.line <= n_lines or p.kind == "incomplete" for p in reader.problems)
    assert reader.problems[-1].kind == "incomplete" or reader.complete


@SETTINGS
@given(
    st.lists(
        st.one_of(
            event_lists(3).map(lambda evs: [("ok", e) for e in evs]),
            st.lists(st.binary(max_size=60).filter(lambda b: b"\n" not in b), max_size=2).map(
                lambda gs: [("bad", g) for g in gs]
            ),
        ),
        max_size=8,
    ),
    st.integers(1, 200),
)
def test_garbage_lines_never_lose_valid_neighbours(
    groups: list[list[tuple[str, object]]], chunk: int
) -> None:
    items = [item for group in groups for item in group]
    lines: list[bytes] = []
    expected: list[object] = []
    bad_lines: list[int] = []
    seq = 0
    for what, value in items:  # ("ok", Event) or ("bad", bytes)
        if isinstance(value, Event):
            seq += 1
            event = msgspec.structs.replace(value, seq=seq)
            lines.append(line(event))
            expected.append(event)
        else:
            assert what == "bad" and isinstance(value, bytes)
            assume(not decodes_as_event(value))
            lines.append(value + b"\n")
            bad_lines.append(len(lines) + 1)  # +1: the header is line 1
    reader, events = read_all(HEADER + b"".join(lines), chunk_size=chunk)
    assert events == expected
    assert [p.line for p in reader.problems if p.kind == "corrupt"] == bad_lines
    assert not reader.truncated


@SETTINGS
@given(event_lists(), st.data())
def test_cut_anywhere_keeps_every_whole_line(events: list[Event], data: st.DataObject) -> None:
    body = b"".join(line(e) for e in events)
    cut = data.draw(st.integers(0, len(body)))
    chunk = data.draw(st.integers(1, 300))
    reader, got = read_all(HEADER + body[:cut], chunk_size=chunk)
    ends = [0]
    for e in events:
        ends.append(ends[-1] + len(line(e)))
    # Whole lines before the cut; a line cut just before its newline still decodes.
    whole = [e for e, end in zip(events, ends[1:], strict=True) if end - 1 <= cut]
    assert got == whole
    cut_inside = cut not in ends and cut + 1 not in ends
    assert reader.truncated == cut_inside
    assert [p.kind for p in reader.problems] == (
        ["truncated", "incomplete"] if cut_inside else ["incomplete"]
    )
