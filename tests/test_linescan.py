"""The judgement's columns read straight from lines (``linescan.h`` through
``Accumulator.scan``) against the decoder, which stays the reference.

Where a C compiler is at hand, the TUI's judging pass reads write, upload, evict, read and fits
lines into the Judge's columns without making their events, and decodes every line it
declines. Whatever it takes must give exactly the columns the decoded event gives, and the
whole judgement — findings, counts, every ledger table, the reader's problems and their line
numbers — must equal the one made by decoding every line: on model captures, on kvrt's native
traces (kvtrace.h: C, a C++ shared object, abort, SIGKILL), and on lines mutated at random.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kvdiag.analysis.judgement import columns, linescan
from kvdiag.model import events as ev
from kvdiag.tui.digest import TABLES
from kvdiag.tui.judging import JudgingPass
from tests.test_trace_indexscan import MUTANTS, _mutate
from tests.tui_samples import write_abort, write_aliasing, write_marks

C = columns.compiled_module()
needs_c = pytest.mark.skipif(
    C is None or not linescan.ready(columns.accumulator(())), reason="no C pass here")

DECODE = msgspec.json.Decoder(ev.AnyEvent).decode
SCANNED = {ev.Write, ev.Upload, ev.Evict, ev.Read, ev.Fits, ev.Step, ev.Mark, ev.Output}
FIELDS = [b"kind", b"seq", b"t_ns", b"step", b"layer", b"stream", b"slot", b"page", b"pages",
          b"cells", b"rows", b"dirty", b"versions", b"target", b"bytes", b"reason",
          b"key_stream", b"pool", b"ring", b"host", b"served", b"ranges", b"result", b"route",
          b"q", b"k", b"dst", b"ne", b"nb", b"runtime", b"failed", b"mask", b"membership",
          b"node", b"stage_bytes", b"evaluated", b"other"]


def scanned(line: bytes, expect: int) -> Any:
    """The columns of one line read by the C pass (pack()'s tuple), or None: declined."""
    acc = columns.accumulator(())
    stop, count, _, _ = acc.scan(line + b"\n", 0, 0, expect, 1 << 30)
    assert count in (0, 1) and stop == (len(line) + 1 if count else 0)
    return acc.take() if count else None


def decoded(line: bytes, expect: int) -> Any:
    """The columns of the event the decoder makes of one line, where the C pass may take it (a
    kind it reads, the seq expected, nothing Python must see); else None."""
    try:
        e = DECODE(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if type(e) not in SCANNED or e.seq != expect:
        return None
    acc = columns.accumulator(())
    try:
        if acc.add([e], 0, True):
            return None
    except (TypeError, ValueError, OverflowError):  # beyond 2^62: the Python path's
        return None
    return acc.take()


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()[1:]


def assert_lines_read_as_decoded(lines: list[bytes]) -> int:
    """Every line read by the C pass gives the decoded event's columns, and every line the
    decoder makes a plain event of a kind read here is read; how many were read."""
    read = 0
    for line in lines:
        try:
            seq = msgspec.json.decode(line).get("seq")
        except (msgspec.DecodeError, AttributeError):
            continue
        if type(seq) is not int:
            continue
        ref = decoded(line, seq)
        assert scanned(line, seq) == ref, line
        read += ref is not None
    return read


def judged(path: Path, scan: bool, block: int = 1 << 20) -> tuple[JudgingPass, Any]:
    """The judging pass over ``path`` fed ``block`` bytes (whole lines) at a time."""
    data = path.read_bytes()
    start = data.index(b"\n") + 1
    jp = JudgingPass(path, scan=scan)
    pos = start
    while pos < len(data):
        cut = data.rfind(b"\n", pos, pos + block)
        end = len(data) if cut < 0 or pos + block >= len(data) else cut + 1
        if cut < 0 and end < len(data):
            nxt = data.find(b"\n", pos)
            end = len(data) if nxt < 0 else nxt + 1
        jp.feed(data[pos:end], pos)
        pos = end
    jp.finish()
    return jp, jp.delta(done=True)


def assert_same_judgement(path: Path, block: int = 1 << 20) -> None:
    (ja, a), (jb, b) = judged(path, False, block), judged(path, True, block)
    assert a.rows == b.rows and ja.reader.lines_read == jb.reader.lines_read
    assert a.problems == b.problems and a.truncated == b.truncated
    assert a.judgement.findings == b.judgement.findings
    assert a.judgement.counts == b.judgement.counts
    assert ja.judge.gaps.as_json() == jb.judge.gaps.as_json()
    for name, ta, tb in zip(TABLES, a.tables, b.tables, strict=True):
        got = [np.concatenate([*ta.sealed, *(() if ta.open is None else (ta.open,))])
               if ta.sealed or ta.open is not None else None for ta in (ta, tb)]
        if got[0] is None or got[1] is None:
            assert got[0] is None and got[1] is None, name
        else:
            assert got[0].tolist() == got[1].tolist(), name
    for m in a.marks_sealed:
        assert a.marks_sealed[m].tolist() == b.marks_sealed[m].tolist(), m
    assert a.aborts == b.aborts and a.widest_page == b.widest_page


@needs_c
def test_model_captures_are_read_line_for_line_as_decoded(
        captured: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN model captures (stale and foreign reads, an abort, marks, the pool-pressure and
    per-stream shapes) WHEN each line is read by the C pass and decoded THEN every line of a
    kind it reads is read, with the decoded event's columns exactly."""
    paths = [captured("slot1-first", "shared", "membership")[0],
             captured("pool-pressure", "per-stream", "membership")[0],
             write_aliasing(tmp_path / "a.kvtrace", monkeypatch),
             write_abort(tmp_path / "b.kvtrace", monkeypatch),
             write_marks(tmp_path / "c.kvtrace", monkeypatch)]
    for path in paths:
        lines = _lines(path)
        kinds = [DECODE(x) for x in lines]
        read = assert_lines_read_as_decoded(lines)
        # left to Python: fits decisions with a bad outcome, outputs that diverged or have no
        # reference, and (to a pass that has seen no step yet) steps
        expect = sum(type(e) in (ev.Write, ev.Upload, ev.Evict, ev.Read, ev.Mark)
                     or (type(e) is ev.Fits and e.route != "fallback" and e.result)
                     or (type(e) is ev.Output and e.diverged is False) for e in kinds)
        assert read == expect > 0, path


@needs_c
@pytest.mark.parametrize("config", ["slot1-first", "dso", "abort", "kill"])
def test_native_traces_read_and_judge_as_decoded(config: str, tmp_path: Path) -> None:
    """GIVEN kvrt's traces written through kvtrace.h (C, a C++ shared object writing into the
    same trace, an abort, a SIGKILL mid-line) WHEN read by the C pass THEN each line gives the
    decoded columns, and the judgement, problems and ledger equal the decoded pass's, in big
    blocks and in blocks of about 700 bytes."""
    from tests import native_runtime

    if native_runtime.missing_tools():
        pytest.skip(native_runtime.missing_tools())
    run = native_runtime.run(config, tmp_path)
    assert assert_lines_read_as_decoded(_lines(run.trace)) > 20
    assert_same_judgement(run.trace)
    assert_same_judgement(run.trace, 700)


@needs_c
def test_captures_judge_as_decoded_in_any_blocks(captured: Any) -> None:
    """GIVEN captures of the three layouts and dispatches WHEN judged with lines read by the C
    pass and with every line decoded, whole and in small blocks THEN findings, counts, every
    ledger table, marks and problems are equal."""
    for key in (("slot1-first", "shared", "membership"), ("pool-pressure", "shared", "fits"),
                ("two-slot-concurrent", "per-stream", "membership"),
                ("two-slot-concurrent", "shared", "fits")):
        path = captured(*key)[0]
        assert_same_judgement(path)
        assert_same_judgement(path, 997)


@needs_c
@pytest.mark.parametrize("seed", range(4))
def test_mutated_lines_read_as_decoded(captured: Any, seed: int) -> None:
    """GIVEN a capture's lines mutated at random (types swapped, numbers malformed or too big,
    strings escaped, keys repeated or added, lines cut, bytes out of ASCII) WHEN read by the
    C pass THEN whatever it reads gives exactly the decoded event's columns (and it reads many
    and declines many)."""
    rng = random.Random(seed)
    base = [x for x in _lines(captured("slot1-first", "shared", "membership")[0])
            if type(DECODE(x)) in SCANNED]
    read = declined = 0
    for _ in range(1500):
        line = _mutate(rng, rng.choice(base), FIELDS)
        if b"\n" in line or not line:
            continue
        seq = 7
        line = line.replace(b'"seq":', b'"seq":7,"_":', 1) if rng.random() < 0.5 else line
        got, ref = scanned(line, seq), decoded(line, seq)
        if got is None:
            declined += 1
        else:
            read += 1
            assert got == ref, line
    assert read > 100 and declined > 100


@needs_c
@pytest.mark.parametrize("seed", range(3))
def test_a_damaged_trace_judges_as_decoded(captured: Any, tmp_path: Path, seed: int) -> None:
    """GIVEN a capture with lines mutated, deleted and repeated at random WHEN judged both
    ways THEN the problems (kind, message, line number), the lost events, findings and ledger
    are equal."""
    rng = random.Random(seed)
    src = captured("slot1-first", "shared", "membership")[0].read_bytes().splitlines()
    out = [src[0]]
    for line in src[1:]:
        r = rng.random()
        if r < 0.02:
            continue
        out.append(_mutate(rng, line, FIELDS).replace(b"\n", b"") if r < 0.08 else line)
        if r > 0.99:
            out.append(line)
    path = tmp_path / "damaged.kvtrace"
    path.write_bytes(b"\n".join(out) + b"\n")
    assert_same_judgement(path)
    assert_same_judgement(path, 1500)


LINE = (b'{"kind":"upload","seq":7,"t_ns":1,"step":3,"layer":2,"stream":1,"pages":[4,6],'
        b'"slot":5,"target":"ring","bytes":1024,"reason":"ring"}')


@needs_c
def test_what_the_c_pass_declines_and_what_it_skips() -> None:
    """GIVEN one valid upload line and variants of it WHEN read THEN a key the model does not
    name (any JSON value) is skipped as the decoder skips it, and the pass declines what it
    must leave to the decoder: "kind" not first or given twice, a key given twice, another
    seq than expected, 19 digits, an escape in a literal, a missing field, a float for an
    integer, a last line without its newline."""
    assert scanned(LINE, 7) == decoded(LINE, 7) is not None
    skipped = LINE[:-1] + b',"new":{"a":[1,2.5e3,{"b":null}],"c":"\\"x\\\\"}}'
    assert scanned(skipped, 7) == decoded(skipped, 7) is not None
    for bad in (
        LINE.replace(b'{"kind":"upload","seq":7,', b'{"seq":7,"kind":"upload",'),
        LINE[:-1] + b',"kind":"upload"}',
        LINE[:-1] + b',"slot":6}',
        LINE.replace(b'"bytes":1024', b'"bytes":1234567890123456789'),
        LINE.replace(b'"reason":"ring"', b'"reason":"r\\u0069ng"'),
        LINE[:-1] + b',"new":"\\u00e9"}',
        LINE[:-1] + b',"new":[123456789012345678901]}',  # beyond 64 bits: the reader refuses it
        LINE.replace(b',"slot":5', b""),
        LINE.replace(b'"slot":5', b'"slot":5.0'),
    ):
        assert scanned(bad, 7) is None, bad
    assert scanned(LINE, 8) is None  # another seq: the lost-event check's to see
    acc = columns.accumulator(())
    assert acc.scan(LINE, 0, 0, 7, 10)[:2] == (0, 0)  # no newline: the reader's to judge
    # a bad fits decision is Python's to see; an unknown route, too
    fits = (b'{"kind":"fits","seq":7,"t_ns":1,"step":0,"node":"n","layer":0,'
            + b",".join(b'"%s":{"name":"x","type":"f16","ne":[1,1,1,1],"nb":[2,2,2,2]}' % t
                        for t in (b"q", b"k", b"v", b"dst"))
            + b',"stage_bytes":0,"result":true,"route":"streamed"}')
    assert scanned(fits, 7) == decoded(fits, 7) is not None
    assert scanned(fits.replace(b'"result":true', b'"result":false'), 7) is None
    assert scanned(fits.replace(b'"streamed"', b'"fallback"'), 7) is None
    assert scanned(fits.replace(b'"ne":[1,1,1,1]', b'"ne":[1,1,1]'), 7) is None
    assert decoded(fits.replace(b'"ne":[1,1,1,1]', b'"ne":[1,1,1]'), 7) is None


@needs_c
def test_a_step_is_read_while_its_phase_goes_on() -> None:
    """GIVEN a pass that has seen a decode step WHEN more steps come THEN a decode step is read
    (it says nothing new) and a prefill step is declined (a decode loop ends: Python's to see,
    as the decoded path hands it); after it, a prefill step is read; a diverged output and one
    without a reference are declined, one within its tolerance read."""
    def step(seq: int, phase: bytes) -> bytes:
        return (b'{"kind":"step","seq":%d,"t_ns":1,"step":%d,"phase":"%s","streams":[0],'
                b'"tokens":1,"n_kv":1}' % (seq, seq, phase))

    acc = columns.accumulator(())
    assert acc.add([DECODE(step(1, b"decode"))], 0, True) == [0]
    assert acc.scan(step(2, b"decode") + b"\n", 0, 1, 2, 9)[1] == 1
    assert acc.scan(step(3, b"prefill") + b"\n", 0, 2, 3, 9)[1] == 0
    assert acc.add([DECODE(step(3, b"prefill"))], 2, True) == [0]
    assert acc.scan(step(4, b"prefill") + b"\n", 0, 3, 4, 9)[1] == 1
    out = (b'{"kind":"output","seq":7,"t_ns":1,"step":0,"stream":1,"checksum":"a",'
           b'"ref_checksum":"b","max_abs_delta":%s,"tolerance":%s}')
    for delta, tol, taken in ((b"0.25", b"0.5", True), (b"5e-1", b"5E-1", True),
                              (b"1", b"0.001", False), (b"null", b"0.001", False),
                              (b"0", b"0", True)):
        line = out % (delta, tol)
        assert (scanned(line, 7) is not None) is taken, line
        assert scanned(line, 7) == decoded(line, 7)


@needs_c
def test_resume_is_the_next_line_the_pass_reads() -> None:
    """GIVEN a block of lines the pass reads, one it does not (a step), and more it reads WHEN
    scanned THEN it stops at the step and says where the next line it reads begins."""
    step = b'{"kind":"step","seq":8,"t_ns":1,"step":3,"phase":"decode","streams":[0],' \
           b'"tokens":1,"n_kv":1}'
    second = LINE.replace(b'"seq":7', b'"seq":9')
    block = LINE + b"\n" + step + b"\n" + second + b"\n"
    acc = columns.accumulator(())
    stop, count, last_step, resume = acc.scan(block, 0, 0, 7, 10)
    assert (count, last_step) == (1, 3)
    assert stop == len(LINE) + 1 and resume == stop + len(step) + 1
    # at most ``limit`` lines: stopped by it, nothing was declined
    third = LINE.replace(b'"seq":7', b'"seq":8')
    acc = columns.accumulator(())
    assert acc.scan(LINE + b"\n" + third + b"\n", 0, 0, 7, 1) == (len(LINE) + 1, 1, 3,
                                                                  len(LINE) + 1)
    assert MUTANTS  # the mutations are the index pass's own list
