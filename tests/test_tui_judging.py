"""The judging pass behind the viewer's indexer (no textual): one pass over the same blocks,
read-only prefixes, rows past the prefix "judging…", the same judgement in a child process as
in the loader's thread, ledger rows that stay index rows on a damaged file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvdiag.analysis.judgement import Judge, trace_judge
from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.pages_query import PagesQuery
from kvdiag.analysis.replay import JUDGING, geometry_from_header
from kvdiag.analysis.trace_index import READ, IndexBuilder, header_end, line_blocks
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader, slices
from kvdiag.tui.digest import MARKS, DigestBuilder, TraceDigest
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.judging import JudgingPass
from kvdiag.tui.loading import load_trace
from kvdiag.tui.rows import TraceRows
from tests.conftest import Capture
from tests.tui_samples import write_aliasing


@pytest.fixture(scope="module")
def aliasing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        return write_aliasing(tmp_path_factory.mktemp("judging") / "aliasing.kvtrace", mp)
    finally:
        mp.undo()


def loaded(path: Path, in_process: bool) -> TraceDoc:
    docs: list[Document] = []
    load_trace(str(path), docs.append, judge_in_process=in_process)
    doc = docs[-1]
    assert isinstance(doc, TraceDoc) and doc.stage == "ready" and doc.judge_error is None
    return doc


def test_slices_cut_after_newlines() -> None:
    block = b"".join(f"{i:05d}{'x' * (i % 7)}\n".encode() for i in range(500))
    parts = list(slices(block, 64))
    assert b"".join(parts) == block and all(p.endswith(b"\n") for p in parts)
    assert max(len(p) for p in parts) <= 64 and len(parts) > 50
    long = b"a" * 200 + b"\nb\n"
    assert list(slices(long, 64)) == [b"a" * 200 + b"\n", b"b\n"]


def test_a_child_process_gives_the_judgement_the_thread_gives(captured: Capture) -> None:
    """GIVEN a capture with stale and foreign reads and divergence THEN the judgement made in
    a child process and sent over a pipe equals the one made in the loader's thread: findings,
    counts, every ledger table, marks, telemetry, problems."""
    path, _ = captured("slot1-first", "shared", "membership")
    here, there = loaded(path, False), loaded(path, True)
    a, b = here.digest, there.digest
    assert a is not None and b is not None and a.done and b.done
    assert a.findings == b.findings and [f.rule for f in a.findings]
    assert a.judgement.counts == b.judgement.counts and a.rows == b.rows == here.index.n
    for name in ("reads", "pieces", "flows", "fits", "outputs"):
        ta, tb = getattr(a.ledger, name), getattr(b.ledger, name)
        assert ta.array.tolist() == tb.array.tolist(), name
    assert len(a.ledger.reads) == int(np.count_nonzero(here.index.columns["kind"] == READ))
    for m in (*MARKS, "abort"):
        assert a.marks[m].tolist() == b.marks[m].tolist(), m
    assert a.marks["foreign"].size or a.marks["stale"].size
    assert a.problems == b.problems and a.aborts == b.aborts
    assert a.telemetry.n == b.telemetry.n
    # the marks folded delta by delta are the ledger's own rule over the whole table
    for m in MARKS:
        assert a.marks[m].tolist() == a.ledger.steps_with(m).tolist(), m


def test_small_blocks_held_give_checks_judgement(captured: Capture) -> None:
    """GIVEN a capture fed a few hundred bytes at a time (a block's last events wait to be
    judged with the next block's) THEN after each block the rows and the run's end are
    current, a delta judges everything fed, and the last judgement is check's (its reader's
    stream judged at once): findings, counts, every page class."""
    path, _ = captured("slot1-first", "shared", "membership")
    with TraceReader.open(path) as reader:
        whole = trace_judge(reader, ledger=True, name=str(path)).feed_all(reader).snapshot()
    source = LineSource.open(path)
    judging = JudgingPass(str(path))
    fed = 0
    for offset, block in line_blocks(source, header_end(source), 700):
        judging.feed(block, offset)
        fed += block.count(b"\n")
        assert judging.judge.rows == fed
    assert judging.judge.end is not None  # the End event was handled, though held
    judging.finish()
    last = judging.delta(done=True).judgement
    assert last.rows == whole.rows == fed
    assert last.findings == whole.findings and [f.rule for f in last.findings]
    assert last.counts == whole.counts
    assert whole.ledger is not None and judging.judge.ledger is not None
    led = judging.judge.snapshot().ledger
    assert led is not None
    assert led.reads.array.tolist() == whole.ledger.reads.array.tolist()
    assert led.pieces.array.tolist() == whole.ledger.pieces.array.tolist()


def test_rows_past_the_judged_prefix_are_judging(aliasing: Path) -> None:
    """A prefix judged up to the middle of the file: reads before it show their class, reads
    after it "judging…", in the Timeline and on the Pages grid."""
    source = LineSource.open(aliasing)
    with TraceReader.open(aliasing) as reader:
        header = reader.header
    index = IndexBuilder(source, header_end(source))
    judging = JudgingPass(str(aliasing))
    builder = DigestBuilder()
    prefix: TraceDigest | None = None
    for offset, block in line_blocks(source, header_end(source), 400):
        index.add(block, offset)
        if prefix is None:
            judging.feed(block, offset)
            if judging.judge.rows >= 40:
                prefix = builder.add(judging.delta())
    index.done = True
    assert prefix is not None and not prefix.done
    idx = index.snapshot()
    geometry = geometry_from_header(header)
    doc = TraceDoc(str(aliasing), source, header, idx, stage="judging", digest=prefix,
                   geometry=geometry, pages=PagesQuery(idx, source, geometry))
    rows = TraceRows(doc)
    reads = np.flatnonzero(idx.columns["kind"] == READ)
    before, after = reads[reads < prefix.rows], reads[reads >= prefix.rows]
    assert before.size and after.size
    assert all("judging" not in str(rows.row(int(r))[0][6]) for r in before)
    assert all(str(rows.row(int(r))[0][6]).endswith("judging…") for r in after)
    assert all(rows.row(int(r))[1] == "" for r in after)
    # the last step's reads are past the prefix: the grid shows them as being judged
    last = idx.last_step
    snap = doc.pages_at(last)
    judged_cells = [c for c in snap.row(1, 0) if c.read is not None]
    assert judged_cells and {c.read.cls for c in judged_cells} == {JUDGING}  # type: ignore[union-attr]
    assert snap.flagged() == []


def test_ledger_rows_stay_index_rows_on_a_damaged_file(aliasing: Path, tmp_path: Path) -> None:
    """Corrupt lines between events: the judge skips their rows, so each read the ledger
    holds sits at the index row of its line, and the problems are the reader's."""
    lines = aliasing.read_bytes().split(b"\n")
    damaged = tmp_path / "damaged.kvtrace"
    out = [lines[0]]
    for i, line in enumerate(lines[1:], 1):
        out.append(line)
        if i % 9 == 0:
            out.append(b"{not json")
    damaged.write_bytes(b"\n".join(out))
    doc = loaded(damaged, False)
    digest = doc.digest
    assert digest is not None
    c = doc.index.columns
    reads = np.flatnonzero(c["kind"] == READ)
    ledger = digest.ledger.reads.array
    assert ledger["row"].tolist() == reads.tolist()
    assert ledger["seq"].tolist() == c["seq"][reads].tolist()
    with TraceReader.open(damaged) as reader:
        events = list(reader)
        problems = reader.problems
    assert digest.problems == tuple(problems) and len(problems) >= 6
    plain = Judge(reader.header).feed_all(events).snapshot()
    assert plain.findings == digest.findings and plain.counts == digest.judgement.counts
    assert "Problems in the file" in str(_overview_text(doc))


def _overview_text(doc: TraceDoc) -> str:
    from io import StringIO

    from rich.console import Console

    from kvdiag.tui.summaries import overview

    out = StringIO()
    Console(file=out, width=120, color_system=None).print(overview(doc))
    return out.getvalue()


def test_overview_states_counts_steps_and_recorded_kinds(aliasing: Path) -> None:
    text = _overview_text(loaded(aliasing, False))
    assert "5 step(s) · capture status: completed" in text
    assert ("every judged kind is recorded (inferred from what the trace contains; its writer "
            "does not declare it)") in text
    assert "write 10  fits 10  read 10" in text
    assert "exact 8, stale 0, foreign 12" in text


def test_unknown_kinds_and_sequence_are_fed_like_check(tmp_path: Path,
                                                       aliasing: Path) -> None:
    """An event of a kind this version does not know is judged as check judges it (the
    declaration of more recorded kinds included) and the Timeline row is kept."""
    lines = aliasing.read_bytes().split(b"\n")
    path = tmp_path / "records.kvtrace"
    extra = b'{"kind":"gpu_clock","seq":1000,"t_ns":1,"step":0,"mhz":7}'
    path.write_bytes(b"\n".join([lines[0], extra, *lines[1:]]))
    doc = loaded(path, False)
    assert doc.digest is not None and doc.digest.judgement.counts.get("gpu_clock") == 1
    assert isinstance(TraceRows(doc).event(0), ev.Unknown)
