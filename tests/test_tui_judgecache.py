"""The judgement cache of big traces (kvdiag.tui.judgecache, issue 15 §5): written by the judging
process's pass, used when a trace is opened again and only then, ignored with a note when
damaged, never left half-written (no textual)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
import pytest

from kvdiag.tui import judgecache, loading
from kvdiag.tui.digest import MARKS
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.judgecache import TRAILER, Footer, cache_file, cache_folder, key_of, prune
from kvdiag.tui.loading import load_trace
from tests.tui_samples import write_aliasing

TABLES = ("reads", "pieces", "flows", "fits", "outputs")


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Foreign reads, a diverged output and telemetry samples (tests/tui_samples.py)."""
    return write_aliasing(tmp_path / "aliasing.kvtrace", monkeypatch)


class Spawned:
    """Counts the judging processes started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = loading.JudgeProcess

        def spawn(*args: object, **kwargs: object) -> object:
            self.n += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(loading, "JudgeProcess", spawn)


def opened(path: Path, **kwargs: object) -> TraceDoc:
    """The trace as a big one is loaded: judged in a child process, cached."""
    docs: list[Document] = []
    load_trace(str(path), docs.append, judge_in_process=True, **kwargs)  # type: ignore[arg-type]
    doc = docs[-1]
    assert isinstance(doc, TraceDoc) and doc.stage == "ready" and doc.judge_error is None
    return doc


def assert_same_judgement(a: TraceDoc, b: TraceDoc) -> None:
    da, db = a.digest, b.digest
    assert da is not None and db is not None and da.done and db.done
    assert da.findings == db.findings and [f.rule for f in da.findings]
    assert replace(da.judgement, ledger=None) == replace(db.judgement, ledger=None)
    assert da.summary == db.summary
    assert da.rows == db.rows == a.index.n
    for name in TABLES:
        ta, tb = getattr(da.ledger, name), getattr(db.ledger, name)
        assert len(ta) == len(tb) and ta.array.tolist() == tb.array.tolist(), name
    for m in (*MARKS, "abort"):
        assert da.marks[m].tolist() == db.marks[m].tolist(), m
    assert da.marks["foreign"].size and da.marks["diverged"].size
    assert da.problems == db.problems and da.aborts == db.aborts
    assert da.telemetry.n == db.telemetry.n > 0
    for f in da.telemetry.fields:
        np.testing.assert_array_equal(da.telemetry.values[f], db.telemetry.values[f])


def test_a_reopened_trace_has_the_judgement_at_once(trace: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a trace judged once in a child process WHEN it is opened again THEN no judging
    process starts, the first document after the header already holds the whole judgement,
    and it equals the first one: findings, summary, every ledger table, marks, telemetry."""
    spawned = Spawned(monkeypatch)
    first = opened(trace)
    key = key_of(trace)
    assert key is not None and cache_file(key).is_file() and spawned.n == 1
    assert [p.name for p in cache_folder().iterdir()] == [cache_file(key).name]  # no .part
    docs: list[Document] = []
    load_trace(str(trace), docs.append, judge_in_process=True)
    assert spawned.n == 1
    early = docs[1]
    assert isinstance(early, TraceDoc) and early.stage == "indexing"
    assert early.digest is not None and early.digest.done
    again = docs[-1]
    assert isinstance(again, TraceDoc) and again.timings.get("cached") == 1.0
    assert again.notes == ()
    assert_same_judgement(first, again)
    # the ledger is mapped from the cache file, not copied
    reads = again.digest.ledger.reads.blocks[0]  # type: ignore[union-attr]
    assert not reads.flags.owndata and not reads.flags.writeable


def test_a_changed_trace_is_judged_again(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key follows the file: a trace rewritten with other content (same size), or only
    touched, is judged again; and judgements made by other judging code are never used."""
    spawned = Spawned(monkeypatch)
    opened(trace)
    data = bytearray(trace.read_bytes())
    # same length, one step number changed near the end: the edges hash sees it
    at = data.rindex(b'"step":')
    data[at + 7:at + 8] = b"9" if data[at + 7:at + 8] != b"9" else b"8"
    st = trace.stat()
    trace.write_bytes(bytes(data))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old time
    opened(trace)
    assert spawned.n == 2
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    opened(trace)
    assert spawned.n == 3
    opened(trace)
    assert spawned.n == 3  # unchanged since: the cache
    monkeypatch.setattr(judgecache, "_CODE", ["another version of the judgement"])
    opened(trace)
    assert spawned.n == 4


def _damage(target: Path, how: str) -> None:
    """Replace the cache file by a damaged copy (renamed over it, as every writer of the cache
    does: a viewer that mapped the old file keeps its bytes)."""
    data = bytearray(target.read_bytes())
    path = target.with_name("damaged")
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "garbage":
        path.write_bytes(b"\x00\xff" * 300)
    elif how == "footer":
        at, length, magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)
        data[at:at + length] = b"\xc1" * length  # msgpack's one never-used byte
        path.write_bytes(bytes(data))
    elif how == "trailer":
        data[-TRAILER.size:-8] = (len(data) * 4).to_bytes(8, "little") * 2
        path.write_bytes(bytes(data))
    elif how == "block-outside":
        at, length, magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)
        footer = msgspec.msgpack.decode(bytes(data[at:at + length]), type=Footer)
        tables = [list(t) for t in footer.tables]
        tables[0][0] = (tables[0][0][0], 10**9)  # a block of a billion reads
        encoded = msgspec.msgpack.encode(msgspec.structs.replace(footer, tables=tables))
        path.write_bytes(bytes(data[:at]) + encoded + TRAILER.pack(at, len(encoded), magic))
    else:
        raise AssertionError(how)
    os.replace(path, target)


@pytest.mark.parametrize("how", ["truncated", "garbage", "footer", "trailer", "block-outside"])
def test_a_damaged_cache_is_ignored_with_a_note(trace: Path, how: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a cache file damaged in one way WHEN the trace is opened THEN it is judged again
    (the same judgement), the Overview says the cache was ignored and why, and the judgement
    written then replaces the damaged file."""
    spawned = Spawned(monkeypatch)
    first = opened(trace)
    key = key_of(trace)
    assert key is not None
    _damage(cache_file(key), how)
    again = opened(trace)
    assert spawned.n == 2
    assert len(again.notes) == 1 and "ignored (judged again)" in again.notes[0]
    assert str(cache_file(key)) in again.notes[0]
    assert_same_judgement(first, again)
    from tests.test_tui_judging import _overview_text

    assert "ignored (judged again)" in _overview_text(again)
    third = opened(trace)
    assert spawned.n == 2 and third.notes == ()


def test_a_judgement_cut_short_leaves_nothing(trace: Path) -> None:
    """The viewer closed while the judging process runs: no cache file, no .part file."""
    docs: list[Document] = []
    calls = [0]

    def cancelled() -> bool:
        calls[0] += 1
        return calls[0] > 1

    load_trace(str(trace), docs.append, cancelled, judge_in_process=True)
    key = key_of(trace)
    assert key is not None and not cache_file(key).exists()
    assert not cache_folder().exists() or list(cache_folder().iterdir()) == []


def test_an_unwritable_cache_folder_still_judges(trace: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """KVDIAG_CACHE_DIR names a file: the judgement is made and shown, nothing is cached, and
    the Overview says why the cache was not read."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(blocker))
    doc = opened(trace)
    assert doc.digest is not None and [f.rule for f in doc.digest.findings]
    assert blocker.read_text() == "x"
    assert len(doc.notes) == 1 and doc.notes[0].endswith("not read: Not a directory")


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(6):
        p = tmp_path / f"{i}.kvjudge"
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    old_part = tmp_path / "a.kvjudge.x.part"
    old_part.write_bytes(b"x")
    os.utime(old_part, (1, 1))
    new_part = tmp_path / "b.kvjudge.y.part"
    new_part.write_bytes(b"x")
    prune(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "3.kvjudge", "4.kvjudge", "5.kvjudge", "b.kvjudge.y.part"]


@pytest.mark.parametrize("block_rows", [3, 1 << 30])
def test_blocks_written_as_they_gather_give_the_thread_s_ledger(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_rows: int) -> None:
    """GIVEN the judging pass fed a few lines at a time, its deltas written through a
    LedgerWriter that writes a block every 3 rows, or none before the end (sealed rows not
    written yet travel as pending rows, each once) and mapped back WHEN folded into digests
    THEN every prefix's tables hold the rows the pass judged, no row travels twice, and the
    last equals the judgement of a pass fed the same blocks in this process (no file
    between)."""
    from kvdiag.analysis.linesource import LineSource
    from kvdiag.analysis.trace_index import header_end, line_blocks
    from kvdiag.tui.digest import BlockRef, DigestBuilder
    from kvdiag.tui.judgecache import LedgerMap, LedgerWriter
    from kvdiag.tui.judging import JudgingPass

    monkeypatch.setattr(judgecache, "BLOCK_ROWS", block_rows)
    source = LineSource.open(trace)
    judging = JudgingPass(trace, hand_over=True)
    reference = JudgingPass(trace)
    builder = DigestBuilder()
    written = 0
    pending: list[list[object]] = [[] for _ in TABLES]
    with open(tmp_path / "ledger", "w+b") as fh:
        writer, ledger = LedgerWriter(fh.fileno(), key_of(trace)), LedgerMap(fh.fileno())
        for offset, block in line_blocks(source, header_end(source), 300):
            judging.feed(block, offset)
            reference.feed(block, offset)
            sent = writer.put(judging.delta())
            written += sum(isinstance(b, BlockRef) for t in sent.tables for b in t.sealed)
            for i, t in enumerate(sent.tables):
                pending[i] += [r for p in t.pending for r in p.tolist()]
            digest = builder.add(ledger.resolve(sent))
            assert len(digest.ledger.reads) == digest.ledger.reads.n
            assert len(digest.ledger.reads.array) == sum(
                1 for r in digest.ledger.reads.array if r["row"] < digest.rows)
        judging.finish()
        sent = writer.finish(judging.delta(done=True))
        last = builder.add(ledger.resolve(sent))
        ledger.close()
    for i, t in enumerate(sent.tables):
        pending[i] += [r for p in t.pending for r in p.tolist()]
        # the pending rows, over all deltas, are rows of the table in its order, each once
        rows = iter(getattr(last.ledger, TABLES[i]).array.tolist())
        assert all(any(r == x for x in rows) for r in pending[i]), TABLES[i]
    if block_rows == 3:
        assert written >= 3  # blocks did reach the file before the end
    else:  # nothing written before the end: every sealed row travelled as pending, once
        assert written == 0
        for i, t in enumerate(sent.tables):
            assert len(pending[i]) == t.n - (0 if t.open is None else len(t.open)), TABLES[i]
        assert sum(map(len, pending)) > 20
    reference.finish()
    here = DigestBuilder().add(reference.delta(done=True))
    for name in TABLES:
        assert getattr(last.ledger, name).array.tolist() == \
            getattr(here.ledger, name).array.tolist(), name
    for m in (*MARKS, "abort"):
        assert last.marks[m].tolist() == here.marks[m].tolist(), m
    assert last.marks["foreign"].size and last.findings == here.findings


@pytest.mark.parametrize("source", ["analysis/judgement/columns.c", "analysis/judgement/seqjudge.c",
                                    "trace/reader.py", "trace/blockscan.c", "tui/judging.py",
                                    "analysis/judgement/judge.py", "analysis/judgement/linescan.h",
                                    "compiled/jsonscan.h"])
def test_a_change_to_any_source_that_judges_makes_cached_judgements_stale(
        source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the code hash a cached judgement records WHEN one source that reads or judges a
    trace changes — a C walk or accumulator, the reader, the judging pass — THEN the hash
    changes (a judgement made by other code is not used)."""
    import kvdiag

    root = Path(kvdiag.__file__).parent
    monkeypatch.setattr(judgecache, "_CODE", [])
    before = judgecache.code_hash()
    real = Path.read_bytes
    target = (root / source).resolve()

    def edited(self: Path) -> bytes:
        data = real(self)
        return data + b"\n/* edited */" if self.resolve() == target else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    monkeypatch.setattr(judgecache, "_CODE", [])
    assert judgecache.code_hash() != before
