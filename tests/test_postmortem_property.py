"""Property tests: no input, however damaged or interleaved, makes the parser raise."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from postmortem_helpers import FIXTURES, findings_of, scan_bytes

from kvdiag.report.postmortem import postmortem_to_json

_LINES = [
    line
    for path in sorted(FIXTURES.glob("*.log"))
    for line in path.read_bytes().splitlines()
    if line.strip()
]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    scan = scan_bytes(data)
    postmortem_to_json(scan, findings_of(scan))
    assert scan.bytes == len(data)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_LINES), max_size=120),
    st.lists(st.tuples(st.integers(0, 119), st.integers(0, 200)), max_size=6),
    st.sampled_from([b"\n", b"\r\n", b""]),
)
def test_interleavings_of_valid_lines_never_raise(
    lines: list[bytes], cuts: list[tuple[int, int]], sep: bytes
) -> None:
    # glue some lines together mid-way, as concurrent writers do
    lines = list(lines)
    for i, at in cuts:
        if i < len(lines):
            lines[i] = lines[i][:at]
    data = (sep or b"\n").join(lines)
    scan = scan_bytes(data)
    out = postmortem_to_json(scan, findings_of(scan))
    assert len(out["crashes"]) == len(scan.crashes)
    assert all(c.fingerprint for c in scan.crashes)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(_LINES), max_size=60), st.integers(1, 400))
def test_results_do_not_depend_on_block_size(lines: list[bytes], block: int) -> None:
    import msgspec

    from kvdiag.postmortem import parse

    data = b"\n".join(lines)
    want = msgspec.to_builtins(scan_bytes(data))
    saved = parse.BLOCK
    parse.BLOCK = block
    try:
        got = msgspec.to_builtins(scan_bytes(data))
    finally:
        parse.BLOCK = saved
    assert got == want
