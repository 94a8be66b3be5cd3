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
