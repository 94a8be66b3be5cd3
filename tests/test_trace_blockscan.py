"""The reader's block check in C (``kvdiag/trace/blockscan.c``) against its Python reference.

Before decoding a block of lines whole, :mod:`kvdiag.trace.reader` counts the lines that end in
it and looks for a run of 19 digits (an integer that may lie outside 64 bits, issue 11 #19).
Where a C compiler is at hand one pass does both; ``bytes.count`` and ``translate`` + ``find``
stay the reference. Both must agree on any bytes: digit runs of every length at every place,
runs cut by a block's end, NULs and high bytes.
"""

from __future__ import annotations

import random

import pytest

from kvdiag import compiled
from kvdiag.trace import reader

C = compiled.load(reader._BLOCKSCAN, "kvdiag.trace._blockscan")
needs_c = pytest.mark.skipif(C is None, reason="no C compiler here: " + str(compiled.status()))


HEADER = (b'{"format":"kvtrace","version":"1.2","kvdiag_version":"0","created":"x",'
          b'"backend":"synthetic","device":{"name":"d"},"scenario":{"name":"s"}}\n')
"""A minimal trace header (tests that need a small trace of their own)."""


def step_lines(n: int) -> list[bytes]:
    """``n`` step events, seq 1..n."""
    return [b'{"kind":"step","seq":%d,"t_ns":1,"step":%d,"phase":"decode","streams":[0],'
            b'"tokens":1,"n_kv":1}' % (i + 1, i) for i in range(n)]


def _reference(block: bytes) -> tuple[int, bool]:
    return block.count(b"\n"), reader._long_digits(block)


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_one_pass_counts_lines_and_finds_long_digit_runs_as_python_does(seed: int) -> None:
    """GIVEN random blocks of JSON-like text with digit runs of 0-40 digits anywhere
    WHEN they are scanned in C and by the Python reference
    THEN the line counts and the long-run answers are equal, both answers occurring."""
    rng = random.Random(seed)
    seen = set()
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(0, 30)):
            parts.append(rng.choice([b'{"seq":', b"\n", b",", b"\x00", b"\xff", b" ", b'"a"']))
            parts.append(b"7" * rng.choice([0, 1, 5, 17, 18, 19, 20, 25, 40]))
        block = b"".join(parts)
        got = C.scan(block)
        assert got == _reference(block)
        seen.add(got[1])
    assert seen == {True, False}


@needs_c
def test_a_run_of_19_is_found_at_every_place_and_18_never() -> None:
    """GIVEN a run of exactly 19 (or 18) digits at every offset of a short block, also at its
    very start and end
    THEN 19 is always found and 18 never."""
    for length, want in ((19, True), (18, False)):
        for at in range(0, 60):
            block = b"x" * at + b"1" * length + b"y" * (59 - at)
            assert C.scan(block) == (0, want)
            assert C.scan(block[: at + length]) == (0, want)
    assert C.scan(b"") == (0, False)
    assert C.scan(b"\n" * 5) == (5, False)


def test_the_reader_reads_alike_without_the_c_pass(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: pytest.TempPathFactory) -> None:
    """GIVEN a trace with an integer beyond 64 bits in one line
    WHEN it is read with and without the C pass
    THEN the same events and the same problem (that line) come out."""
    from pathlib import Path

    path = Path(str(tmp_path)) / "t.jsonl"
    lines = step_lines(50)
    lines[20] = lines[20].replace(b'"n_kv":1', b'"n_kv":123456789012345678901234')
    path.write_bytes(HEADER + b"\n".join(lines) + b"\n")

    def read() -> tuple[list[int], list[tuple[int, str]]]:
        with reader.TraceReader.open(path) as r:
            seqs = [e.seq for e in r]
            return seqs, [(p.line, p.kind) for p in r.problems]

    with_c = read()
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert read() == with_c
    assert 21 not in with_c[0] and len(with_c[0]) == 49
    assert (22, "corrupt") in with_c[1]  # the header is line 1


@needs_c
@pytest.mark.parametrize("seed", range(4))
def test_what_a_decoded_block_holds_is_found_as_python_finds_it(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN lists of events of several types, None entries (lines that are not events) and
    other objects, at every place WHEN asked whether they hold a None and an event of some
    types THEN the C pass answers as ``None in`` and a set of their types do (the Python path,
    KVDIAG_COMPILED=0), all four answers occurring."""
    import msgspec

    from kvdiag.model import events as ev

    step = msgspec.json.decode(step_lines(1)[0], type=ev.AnyEvent)

    class Other:
        pass

    pool: list[object] = [step, None, 0, "x", Other(), step]
    rng = random.Random(seed)
    seen = set()
    for _ in range(300):
        items = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        types = tuple(rng.sample([ev.Step, Other, ev.End, ev.Abort, int], rng.randint(0, 3)))
        got = reader.holds(items, types)
        with monkeypatch.context() as m:
            m.setattr(reader.compiled, "load", lambda *a, **k: None)
            want = reader.holds(items, types)
        assert got == want == (None in items, any(type(i) in types for i in items))
        seen.add(got)
    assert len(seen) == 4


class _Seq:
    def __init__(self, seq: object) -> None:
        self.seq = seq


@needs_c
@pytest.mark.parametrize("seed", range(4))
def test_rising_seqs_are_accepted_as_python_accepts_them(seed: int) -> None:
    """GIVEN runs of events whose seqs rise, repeat, fall, jump, start at or below the last
    seq accepted, hold an End, or are beyond 64 bits WHEN the reader's
    fast path accepts them in C THEN it answers as its Python reference does, and the reader's
    last seq follows; where a seq is not a 64-bit integer the C pass leaves it to Python."""
    import msgspec

    from kvdiag.model import events as ev

    end = msgspec.json.decode(b'{"kind":"end","seq":5,"t_ns":1,"step":0,"steps":1,"events":5,"status":"completed"}',
                              type=ev.AnyEvent)
    rng = random.Random(seed)
    seen = set()
    for _ in range(400):
        last = rng.choice([0, 3, 10, -5, 1 << 62])
        start = last + rng.choice([-1, 0, 1, 2])
        seqs: list[object] = [start + i * rng.choice([1, 1, 1, 2])
                              for i in range(rng.randint(1, 9))]
        if rng.random() < 0.2:
            seqs[rng.randrange(len(seqs))] = rng.choice([start, 1 << 70, -3, start + 100])
        items: list[object] = [_Seq(s) for s in seqs]
        if rng.random() < 0.15:
            items.insert(rng.randrange(len(items) + 1), end)
        got = C.rising(items, last, type(end))
        if got is None:
            assert any(not isinstance(q, int) or q >= 1 << 63 for q in seqs)
            seen.add(None)
            continue
        r = reader.TraceReader.__new__(reader.TraceReader)
        r._last_seq = last
        with pytest.MonkeyPatch.context() as m:
            m.setattr(reader.compiled, "load", lambda *a, **k: None)
            want = r._fast_accept(items)  # type: ignore[arg-type]
        assert (got is not False) == want, (last, seqs)
        if want:
            assert got == r._last_seq
        seen.add(want)
    assert seen == {True, False, None}
