"""The trace index's C pass (``kvdiag/analysis/indexscan.c``) against its Python reference.

Where a C compiler is at hand, :class:`~kvdiag.analysis.trace_index.IndexBuilder` reads a
block's row fields straight from its bytes; the Python path (msgspec into a narrow Struct,
then numpy) stays the reference, and takes every block holding a line the C pass is not sure
of. Whatever the C pass accepts must give the reference's rows exactly: on model captures, on
kvrt's native traces (kvtrace.h, C and C++ writers, a killed run), and on thousands of lines
mutated at random (types swapped, numbers malformed or too big, strings escaped, nesting,
whitespace, duplicate keys, cut lines, high and control bytes).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from kvdiag import compiled
from kvdiag.analysis import trace_index as ti
from kvdiag.analysis.linesource import LineSource
from tests.tui_samples import write_abort, write_aliasing, write_marks

C = compiled.load(ti._INDEXSCAN, "kvdiag.analysis._indexscan")
needs_c = pytest.mark.skipif(C is None, reason="no C compiler here: " + str(compiled.status()))


def _index(path: Path, use_c: bool, chunk: int = ti.CHUNK) -> tuple[ti.TraceIndex, int]:
    """The index of ``path`` by either path, and how many blocks the C pass declined."""
    source = LineSource.open(path)
    builder = ti.IndexBuilder(source, ti.header_end(source))
    declined = 0
    if not use_c:
        builder._scanned = lambda block, base: False  # type: ignore[method-assign]
    else:
        real = builder._scanned

        def counted(block: bytes, base: int) -> bool:
            nonlocal declined
            ok = real(block, base)
            declined += not ok
            return ok

        builder._scanned = counted  # type: ignore[method-assign]
    for _ in builder.run(chunk):
        pass
    return builder.snapshot(), declined


def _rows(block: bytes, use_c: bool) -> dict[str, list[int]] | None:
    """The index rows of one block (None: the C pass declined it)."""
    builder = ti.IndexBuilder(LineSource(block, "<block>"), 0)
    if use_c:
        if not builder._scanned(block, 0):
            return None
    else:
        builder._scanned = lambda b, base: False  # type: ignore[method-assign]
        builder._block(block, 0)
    snap = builder.snapshot()
    return {k: v.tolist() for k, v in snap.columns.items()}


def assert_same_index(path: Path, chunk: int = ti.CHUNK) -> int:
    a, declined = _index(path, True, chunk)
    b, _ = _index(path, False, chunk)
    assert a.n == b.n > 0
    for name in ti.COLUMNS:
        np.testing.assert_array_equal(a.columns[name], b.columns[name], err_msg=name)
    assert a.seq_sorted == b.seq_sorted and a.kind_counts() == b.kind_counts()
    return declined


@needs_c
def test_model_captures_index_the_same_and_are_never_declined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN model-shaped traces (foreign reads, an abort, scrubber marks; TraceWriter's lines)
    WHEN indexed by the C pass and by the reference, in big blocks and in blocks of a few lines
    THEN every column is equal, and the C pass took every block."""
    for write in (write_aliasing, write_abort, write_marks):
        path = write(tmp_path / f"{write.__name__}.kvtrace", monkeypatch)
        for chunk in (ti.CHUNK, 700):
            assert assert_same_index(path, chunk) == 0, (write.__name__, chunk)


@needs_c
@pytest.mark.parametrize("config", ["slot1-first", "dso", "abort", "kill"])
def test_native_traces_index_the_same(config: str, tmp_path: Path) -> None:
    """GIVEN kvrt's traces, written through kvtrace.h by C (and a C++ shared object), one
    aborted and one killed mid-line WHEN indexed by both paths THEN every column is equal; only
    a killed run's last block (a cut line) is left to the reference."""
    from tests import native_runtime

    if native_runtime.missing_tools():
        pytest.skip(native_runtime.missing_tools())
    run = native_runtime.run(config, tmp_path)
    declined = assert_same_index(run.trace)
    assert declined <= (1 if config == "kill" else 0)


LINES = [
    b'{"kind":"upload","seq":7,"t_ns":1,"step":3,"layer":2,"stream":1,"target":"ring",'
    b'"slot":5,"pages":[4,6],"key_stream":1,"bytes":[1,2.5e3,-0.25]}',
    b'{"kind":"upload","seq":8,"step":3,"layer":2,"target":"pool","slot":1,"pages":[0,1],'
    b'"key_stream":null}',
    b'{"kind":"write","seq":9,"step":3,"layer":0,"stream":0,"cells":[10,12],"x":{"a":[{}],"b":""}}',
    b'{"kind":"evict","seq":10,"step":4,"layer":3,"stream":-1,"slot":2,"page":17}',
    b'{"kind":"fits","seq":11,"step":4,"layer":1,"result":false,"route":"fallback",'
    b'"q":{"name":"Q\\"cur","ne":[256,1,32,1],"buffer":"CUDA0"},"failed":["a","b\\\\n"]}',
    b'{"kind":"fits","seq":12,"step":4,"layer":1,"result":true,"route":"someday"}',
    b'{"kind":"learn","seq":13,"step":4,"layer":1,"relearn":true}',
    b'{"kind":"read","seq":14,"step":5,"layer":1,"stream":0,"served":[[0,4,"pool",[1,2]]],'
    b'"ranges":[{"first":0,"count":4,"source":"pool"}]}',
    b'{"kind":"telemetry","seq":15,"step":5,"values":{"power_w":301.5,"t":1e-3}}',
    b'{"kind":"newer_kind","seq":16,"step":6,"layer":40}',
    b' { "seq" : 17 , "step" : 6 , "kind" : "step" , "phase" : "decode" } \r',
    b'{"kind":"step","seq":18,"step":7,"seq":19,"extra":true,"n":null}',
]

MUTANTS = [b"", b" ", b"\t", b"\r", b"\x00", b"\x01", b"\x7f", b"\xc3\xa9", b"\xff", b"\\",
           b"\\u0041", b"\\n", b'"', b",", b":", b"[", b"]", b"{", b"}", b"-", b"0", b"01", b"1.",
           b".5", b"1e", b"1e+", b"1E-7", b"1e400", b"-0", b"99999999999999999999",
           b"123456789012345678", b"2147483648", b"32768", b"-32769", b"true", b"false",
           b"null", b"tru", b"nul", b'"ring"', b'"x"', b"[1,2]", b"[1,2,3]", b"[1]",
           b"[1,2,]", b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
           b"\n"]
FIELDS = [b"kind", b"seq", b"step", b"layer", b"stream", b"slot", b"page", b"pages", b"cells",
          b"target", b"key_stream", b"result", b"route", b"relearn", b"other"]


def _mutate(rng: random.Random, line: bytes, fields: list[bytes] = FIELDS) -> bytes:
    """``line`` changed in 1 to 3 places: bytes of :data:`MUTANTS` put in, one of ``fields``
    added or given another value, the line cut, whitespace added."""
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(5)
        if how == 0:  # a byte sequence inserted, replacing or not
            at = rng.randrange(len(line) + 1)
            cut = rng.choice([0, 0, 1, 2])
            line = line[:at] + rng.choice(MUTANTS) + line[at + cut:]
        elif how == 1:  # a field of the index given another value
            name = rng.choice(fields)
            line = line.replace(b"}", b',"%s":%s}' % (name, rng.choice(MUTANTS)), 1) \
                if rng.random() < 0.5 else line[:-1] + b',"%s":%s}' % (name, rng.choice(MUTANTS))
        elif how == 2:  # cut
            line = line[:rng.randrange(len(line) + 1)]
        elif how == 3:  # a known field's value replaced
            name = rng.choice(fields)
            key = b'"%s":' % name
            at = line.find(key)
            if at >= 0:
                end = at + len(key)
                stop = min((i for i in (line.find(b",", end), line.find(b"}", end)) if i >= 0),
                           default=len(line))
                line = line[:end] + rng.choice(MUTANTS) + line[stop:]
        else:  # whitespace where JSON allows it
            line = line.replace(b":", rng.choice([b": ", b" :", b"\t:\t"]), 1)
    return line


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_mutated_lines_the_c_pass_accepts_index_as_the_reference_does(seed: int) -> None:
    """GIVEN event lines of every indexed shape, mutated at random, alone and in blocks of
    several WHEN the C pass reads them THEN whatever it accepts gives exactly the reference's
    rows (and it accepts many and declines many: both outcomes were tested)."""
    rng = random.Random(seed)
    accepted = declined = 0
    for _ in range(700):
        lines = [_mutate(rng, rng.choice(LINES)) if rng.random() < 0.8 else rng.choice(LINES)
                 for _ in range(rng.choice([1, 1, 2, 5]))]
        block = b"\n".join(lines) + (b"\n" if rng.random() < 0.9 else b"")
        got = _rows(block, True)
        if got is None:
            declined += 1
            continue
        accepted += 1
        assert got == _rows(block, False), block
    assert accepted > 100 and declined > 100


@needs_c
def test_every_shape_of_the_lines_is_accepted_unmutated() -> None:
    """GIVEN each line of :data:`LINES` (every kind the index reads fields of, floats, nested
    values, escapes in skipped strings, whitespace, a kind it does not know, a repeated key)
    WHEN scanned alone and all together THEN the C pass accepts them and agrees."""
    for line in LINES:
        assert _rows(line + b"\n", True) == _rows(line + b"\n", False), line
    block = b"\n".join(LINES) + b"\n"
    got = _rows(block, True)
    assert got is not None and got == _rows(block, False)
    assert got["kind"][4] == ti.FITS and got["a"][4] == ti.ROUTE_CODE["fallback"]
    assert got["flags"][4] == ti.F_FITS_FALSE and got["a"][5] == -1  # a route it does not know
    assert got["flags"][0] == ti.F_RING and got["key"][0] == 1 and got["key"][1] == -1
    assert got["seq"][-1] == 19  # the last of a repeated key, as the decoder takes it


@needs_c
def test_values_outside_a_column_are_left_to_the_reference() -> None:
    """GIVEN a layer beyond int16, a step beyond int32, a seq of 19 digits, an int as a float
    WHEN scanned THEN the C pass declines each (the reference decides what they become)."""
    for line in (b'{"kind":"read","seq":1,"step":2,"layer":32768}',
                 b'{"kind":"read","seq":1,"step":2147483648}',
                 b'{"kind":"read","seq":1234567890123456789,"step":2}',
                 b'{"kind":"read","seq":1,"step":2.0}',
                 b'{"kind":"read","seq":1,"step":2,"x":"\\u00e9"}',
                 b'{"kind":"read","seq":1,"step":2}\n\n'):
        assert _rows(line, True) is None, line
        assert _rows(line, False) is not None


def _old_line_blocks(data: bytes, start: int, chunk: int) -> list[tuple[int, bytes]]:
    """The runs as a plain split of whole lines would give them, for comparison: every block
    whole lines (the last may lack its newline), in order, covering the file from ``start``."""
    out, pos = [], start
    while pos < len(data):
        end = min(pos + chunk, len(data))
        if end < len(data):
            cut = data.rfind(b"\n", pos, end)
            end = cut + 1 if cut >= 0 else (data.find(b"\n", end) + 1 or len(data))
        out.append((pos, data[pos:end]))
        pos = end
    return out


@pytest.mark.parametrize("seed", range(5))
def test_line_blocks_are_whole_lines_read_at_their_length(tmp_path: Path, seed: int) -> None:
    """GIVEN files of short lines, lines longer than a chunk (also longer than the look-back
    window), no final newline, CRLF, empty lines WHEN cut into blocks THEN every block is whole
    lines, about a chunk long, in order, covering the file from ``start`` exactly as the split
    of :func:`_old_line_blocks` does."""
    rng = random.Random(seed)
    lines = [b"x" * rng.choice([0, 1, 50, 300, 5000, ti.TAIL + 7]) + rng.choice([b"", b"\r"])
             for _ in range(rng.randint(1, 60))]
    data = b"\n".join(lines) + rng.choice([b"", b"\n"])
    path = tmp_path / "f"
    path.write_bytes(data)
    source = LineSource.open(path) if data else LineSource(data, "f")
    for chunk in (1, 7, 300, 4096, 1 << 20):
        for start in (0, min(len(data), rng.randrange(len(data) + 1))):
            got = list(ti.line_blocks(source, start, chunk))
            assert got == _old_line_blocks(data, start, chunk), (chunk, start)
            assert b"".join(b for _, b in got) == data[start:]
