"""What the viewer shows of a trace, without running the viewer (no textual import).

For tests that run every surface on one corpus and compare them (issue 15 §2): :func:`shown`
loads a trace exactly as ``kvdiag tui`` does (:func:`~kvdiag.tui.loading.load_trace`, the Judge
behind the indexer) and collects, from the document the screens draw, what they would display:
the findings, the events and steps, what is not recorded, each read's class counts and Timeline
mark, the scrubber's marked steps, and per step the Pages grid's marked cells (the glyph each
cell is drawn with, :func:`~kvdiag.tui.pagestext.cell_glyph`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvdiag.errors import InputError
from kvdiag.tui.document import Document, TraceDoc
from kvdiag.tui.loading import load_trace
from kvdiag.tui.pagestext import cell_glyph
from kvdiag.tui.rows import read_judged

Cell = tuple[int, int, int, str]
"""(stream, layer, page, glyph) of a Pages cell drawn with a glyph (``!`` foreign, ``~``
stale)."""


@dataclass(frozen=True)
class Shown:
    findings: tuple[str, ...]
    """Rule ids, in the judgement's order (the Findings screen and the Overview)."""
    counts: dict[str, int]
    """Events per kind (Overview)."""
    steps: int
    """Steps by the judgement's rule (status line, Overview)."""
    not_recorded: tuple[str, ...]
    """Judged kinds the trace does not record (Overview, "Recorded")."""
    reads: dict[int, tuple[int, int, int, int]]
    """Per read event (by seq): pages exact, stale, foreign, not judged (Timeline)."""
    marks: dict[int, str]
    """Per read event (by seq): the Timeline row's mark (``foreign``, ``stale`` or ``""``)."""
    scrubber: dict[str, list[int]]
    """Steps marked on the Pages scrubber, per mark; ``n``/``N`` visit ``stale`` ∪
    ``foreign``."""
    pages: dict[int, list[Cell]] = field(default_factory=dict)
    """Per step (those asked for): the Pages cells drawn with a glyph, at that step."""
    status: str = ""
    """How the run ended (status line, Overview)."""
    aborts: tuple[tuple[int, int, str], ...] = ()
    """(seq, step, message) of each abort the Backtrace screen lists."""
    lost_events: int = 0
    """Events missing between those the trace holds (Overview, "Recorded")."""


def load_document(path: str) -> TraceDoc:
    """The trace as the viewer holds it once loaded (judged in this thread)."""
    docs: list[Document] = []
    load_trace(path, docs.append, judge_in_process=False)
    doc = docs[-1] if docs else None
    if not isinstance(doc, TraceDoc) or doc.digest is None or doc.pages is None:
        raise InputError(f"{path}: the viewer could not load it")
    return doc


def shown(path: str, steps: list[int] | None = None) -> Shown:
    """What the viewer shows of the trace at ``path``; the Pages grid's marked cells at
    ``steps`` (default: every step with a stale or foreign read, and step 0)."""
    doc = load_document(path)
    digest = doc.digest
    assert digest is not None and doc.pages is not None
    j = digest.judgement
    reads = digest.ledger.reads.array
    counts: dict[int, tuple[int, int, int, int]] = {}
    marks: dict[int, str] = {}
    for r in reads:
        judged = read_judged(digest, int(r["row"]))
        assert judged is not None
        counts[int(r["seq"])] = judged.counts
        marks[int(r["seq"])] = judged.mark
    scrubber = {k: [int(s) for s in v] for k, v in digest.marks.items()}
    if steps is None:
        flagged = np.union1d(digest.marks["stale"], digest.marks["foreign"])
        steps = sorted({0, *(int(s) for s in flagged)})
    return Shown(
        findings=tuple(f.rule for f in digest.findings), counts=dict(j.counts),
        steps=j.steps.count, not_recorded=tuple(k.kind for k in j.completeness.missing),
        reads=counts, marks=marks, scrubber=scrubber,
        pages={s: pages_marked(doc, s) for s in steps}, status=j.status,
        aborts=tuple((a.seq, a.step, a.message) for a in digest.aborts),
        lost_events=j.lost["events"] if j.lost else 0)


def pages_marked(doc: TraceDoc, step: int) -> list[Cell]:
    """The cells the Pages grid draws with a glyph at ``step`` (every stream, layer, page)."""
    assert doc.pages is not None
    snap = doc.pages_at(step)
    geo = snap.geometry
    out: list[Cell] = []
    for stream in geo.streams:
        for layer in range(geo.layers):
            for cell in snap.row(stream, layer):
                glyph = cell_glyph(cell)
                if glyph != " ":
                    out.append((stream, layer, cell.page, glyph))
    return out
