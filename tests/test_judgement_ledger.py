"""The ledger's lookups by row and by read, block by block, against the flattened tables."""

from __future__ import annotations

import numpy as np

from kvdiag.analysis.judgement import ledger
from kvdiag.analysis.judgement.ledger import PIECES, READS, Ledger


def _filled(monkeypatch, reads: list[int], pieces_per_read: list[int]) -> Ledger:
    monkeypatch.setattr(ledger, "BLOCK", 4)  # many small blocks: every boundary case
    led = Ledger()
    for i, row in enumerate(reads):
        led.reads.append((row, row + 100, row // 3, i % 5, i % 2, 8, 0, 0, 0))
        for k in range(pieces_per_read[i]):
            led.pieces.append((i, k, k + 1, 0, k, 2, 0, 1, 0, k, 0, 0, 0, 0))
    return led


def test_read_at_and_pieces_of_agree_with_the_flat_tables(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    rows = sorted(rng.choice(200, size=57, replace=False).tolist())
    per = rng.integers(0, 4, size=57).tolist()
    per[10:19] = [3] * 9  # a read's pieces spanning block edges
    snap = _filled(monkeypatch, rows, per).snapshot()
    flat_reads, flat_pieces = snap.reads.array, snap.pieces.array
    assert len(snap.reads.blocks) > 10 and snap.reads.sealed == len(rows) // 4
    for row in range(-1, 202):
        i = snap.read_at(row)
        hits = np.flatnonzero(flat_reads["row"] == row)
        assert i == (int(hits[0]) if hits.size else None)
    for i in range(len(rows)):
        want = flat_pieces[flat_pieces["read"] == i]
        got = snap.pieces_of(i)
        assert len(got) == per[i]
        assert got.tolist() == want.tolist()
    assert len(snap.pieces_of(len(rows) + 5)) == 0


def test_rows_joins_the_blocks_a_range_spans(monkeypatch) -> None:
    snap = _filled(monkeypatch, list(range(0, 60, 2)), [0] * 30).snapshot()
    flat = snap.reads.array
    for lo, hi in ((0, 30), (3, 9), (4, 8), (7, 7), (28, 40), (-2, 3)):
        assert snap.reads.rows(lo, hi).tolist() == flat[max(lo, 0):hi].tolist()
    assert np.dtype(READS) == snap.reads.dtype and np.dtype(PIECES) == snap.pieces.dtype


def test_values_beyond_a_column_are_clipped_not_wrapped(monkeypatch) -> None:
    """A hostile trace's numbers (a seq past 64 bits, a step past 32) land clipped to their
    column, sealed or still open."""
    monkeypatch.setattr(ledger, "BLOCK", 2)
    led = Ledger()
    led.reads.append((0, 1 << 70, 1 << 40, 1, 0, 8, 0, 0, 0))
    led.reads.append((1, 5, -(1 << 40), 1, 0, 8, 0, 0, 0))
    led.reads.append((2, 6, 3, 1, 0, 8, 0, 0, 0))
    snap = led.snapshot()
    assert len(snap.reads.blocks) == 2 and snap.reads.sealed == 1
    rows = snap.reads.array
    assert rows["seq"].tolist() == [(1 << 63) - 1, 5, 6]
    assert rows["step"].tolist() == [(1 << 31) - 1, -(1 << 31), 3]
    assert snap.read_at(2) == 2 and snap.read_at(3) is None


def test_take_hands_each_sealed_block_over_once(monkeypatch) -> None:
    monkeypatch.setattr(ledger, "BLOCK", 3)
    led = Ledger()
    for row in range(7):
        led.reads.append((row, row, 0, 0, 0, 1, 0, 0, 0))
    sealed, open_rows, n = led.reads.take()
    assert [b["row"].tolist() for b in sealed] == [[0, 1, 2], [3, 4, 5]] and n == 7
    assert open_rows is not None and open_rows["row"].tolist() == [6]
    for row in range(7, 10):
        led.reads.append((row, row, 0, 0, 0, 1, 0, 0, 0))
    sealed, open_rows, n = led.reads.take()
    assert [b["row"].tolist() for b in sealed] == [[6, 7, 8]] and n == 10
    assert open_rows is not None and open_rows["row"].tolist() == [9]
    assert led.reads.blocks == []  # held once: by whoever took them
