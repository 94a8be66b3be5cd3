"""Row sources for the virtual tables: timeline and fits rows of traces and logs.

A source is a snapshot (a document and an array of row numbers): it decodes the lines it is
asked for, on demand, and remembers a few hundred. No textual import.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from rich.text import Text

from kvdiag.analysis.judgement import FitsVerdict
from kvdiag.analysis.judgement.fits import FitsJudge
from kvdiag.analysis.log_index import LOG_KINDS
from kvdiag.analysis.trace_index import KINDS, decode_event
from kvdiag.model import events as ev
from kvdiag.model.logrecords import FitsLine
from kvdiag.postmortem.lines import clean
from kvdiag.tui.clip import MAX_FIELD, clip, clip_deep
from kvdiag.tui.digest import TraceDigest
from kvdiag.tui.document import LogDoc, TraceDoc
from kvdiag.tui.eventtext import ReadJudged, describe, fits_mark, nb, ne, ptr
from kvdiag.tui.rowsource import Cells, Column

TRACE_COLUMNS = (Column("seq", 8, "right"), Column("step", 6, "right"),
                 Column("t ms", 9, "right"), Column("kind", 9), Column("L", 3, "right"),
                 Column("s", 2, "right"), Column("event", 0))
LOG_COLUMNS = (Column("line", 7, "right"), Column("kind", 9), Column("slot", 4, "right"),
               Column("text", 0))
FITS_COLUMNS = (Column("seq", 7, "right"), Column("step", 5, "right"), Column("L", 3, "right"),
                Column("node", 12), Column("route", 9), Column("fits", 5),
                Column("failed conditions", 36),
                Column("Q ne", 17), Column("K ne", 17), Column("V ne", 17), Column("dst ne", 17),
                Column("Q nb", 26), Column("K nb", 26), Column("V nb", 26), Column("dst nb", 26),
                Column("K/V buffer", 41), Column("rt K/V", 7), Column("dst", 15),
                Column("K data", 15), Column("V data", 0))
LOG_FITS_COLUMNS = (Column("line", 7, "right"), Column("dst ne", 18), Column("type", 5),
                    Column("dst", 16), Column("K data", 16), Column("K buffer", 22),
                    Column("V buffer", 22), Column("K rt", 16), Column("V rt", 0))


def _highlight(text: str, needle: str | None) -> Text:
    t = Text(text)
    if needle:
        t.highlight_words([needle], style="reverse", case_sensitive=True)
    return t


class _Selection:
    def __init__(self, n: int, selection: np.ndarray | None) -> None:
        self.selection = selection
        self.n = n if selection is None else len(selection)

    def __len__(self) -> int:
        return self.n

    def source_row(self, i: int) -> int:
        return i if self.selection is None else int(self.selection[i])

    def position_of(self, row: int) -> int | None:
        """Position of source row ``row`` in this selection (None when filtered out)."""
        if self.selection is None:
            return row if 0 <= row < self.n else None
        i = int(np.searchsorted(self.selection, row))
        return i if i < self.n and int(self.selection[i]) == row else None

    def nearest_position(self, row: int) -> int:
        """Position of the first selected row at or after ``row`` (clamped)."""
        if self.selection is None:
            return max(0, min(row, self.n - 1))
        return max(0, min(int(np.searchsorted(self.selection, row)), self.n - 1))


class TraceRows(_Selection):
    def __init__(self, doc: TraceDoc, selection: np.ndarray | None = None,
                 needle: str | None = None) -> None:
        super().__init__(doc.index.n, selection)
        self.doc = doc
        self.needle = needle
        self.fits = FitsJudge(doc.header)
        self._row = lru_cache(maxsize=1024)(self._make)

    def event(self, row: int) -> object:
        off = int(self.doc.index.columns["offset"][row])
        return clip_deep(decode_event(self.doc.source.line(off)))

    def row(self, i: int) -> tuple[Cells, str]:
        return self._row(self.source_row(i))

    def judged(self, row: int, event: object) -> ReadJudged | FitsVerdict | None:
        """The judgement's verdict on the event at ``row``: a read's classes (None while the
        row is past the judged prefix), a fits decision's conditions."""
        if isinstance(event, ev.Fits):
            return self.fits.verdict(event)
        digest = self.doc.digest
        if not isinstance(event, ev.Read) or digest is None or row >= digest.rows:
            return None
        return read_judged(digest, row)

    def _make(self, r: int) -> tuple[Cells, str]:
        c = self.doc.index.columns
        kind = KINDS[int(c["kind"][r])]
        line = self.doc.source.line(int(c["offset"][r]))
        event = clip_deep(decode_event(line))
        if event is None:
            summary, mark = clip_line(line)[0], "corrupt"
            t_ms = ""
        else:
            summary, mark = describe(event, self.judged(r, event))
            summary = clip(summary)
            t_ms = f"{event.t_ns / 1e6:.3f}"
        layer, stream = int(c["layer"][r]), int(c["stream"][r])
        cells: list[str | Text] = [
            str(int(c["seq"][r])), str(int(c["step"][r])), t_ms, kind,
            "" if layer < 0 else str(layer), "" if stream < 0 else str(stream),
            _highlight(summary, self.needle),
        ]
        return cells, mark


def read_judged(digest: TraceDigest, row: int) -> ReadJudged | None:
    """The ledger's verdict on the read at index ``row`` (None: no read judged there)."""
    ledger = digest.ledger
    i = ledger.read_at(row)
    if i is None:
        return None
    r = ledger.reads.rows(i, i + 1)[0]
    return ReadJudged((int(r["exact"]), int(r["stale"]), int(r["foreign"]),
                       int(r["not_judged"])), ledger.pieces_of(i))


class LogRows(_Selection):
    def __init__(self, doc: LogDoc, selection: np.ndarray | None = None,
                 needle: str | None = None) -> None:
        super().__init__(doc.index.n, selection)
        self.doc = doc
        self.needle = needle
        self._row = lru_cache(maxsize=1024)(self._make)

    def row(self, i: int) -> tuple[Cells, str]:
        return self._row(self.source_row(i))

    def _make(self, r: int) -> tuple[Cells, str]:
        c = self.doc.index.columns
        text, _level = clip_line(self.doc.source.line(int(c["offset"][r])))
        kind = LOG_KINDS[int(c["kind"][r])]
        slot = int(c["slot"][r])
        cells: list[str | Text] = [str(r + 1), kind if kind != "line" else "",
                                   "" if slot < 0 else str(slot), _highlight(text, self.needle)]
        return cells, "" if kind == "line" else kind


def clip_line(line: bytes) -> tuple[str, str | None]:
    """A log line cleaned for display (:func:`kvdiag.postmortem.lines.clean`), cut to
    :data:`MAX_FIELD` characters before the cleaning so that a megabyte line costs no more than
    a short one."""
    cap = MAX_FIELD * 4
    if len(line) <= cap:
        text, level = clean(line)
        return clip(text), level
    text, level = clean(line[:cap])
    return f"{text[:MAX_FIELD]}… [{len(line):,} bytes, first {MAX_FIELD:,} shown]", level


class FitsRows(_Selection):
    """One row per fits event (``doc.fits_rows``), with the judgement's verdict on it."""

    def __init__(self, doc: TraceDoc, selection: np.ndarray) -> None:
        super().__init__(len(selection), selection)
        self.doc = doc
        self.judge = FitsJudge(doc.header)
        self._row = lru_cache(maxsize=1024)(self._make)

    def event(self, i: int) -> ev.Fits | None:
        r = self.source_row(i)
        e = decode_event(self.doc.source.line(int(self.doc.index.columns["offset"][r])))
        return clip_deep(e) if isinstance(e, ev.Fits) else None

    def verdict(self, event: ev.Fits) -> FitsVerdict:
        """The judgement's verdict on one decision (:meth:`Judge.fits_verdict`: a pure function
        of the event and the header)."""
        return self.judge.verdict(event)

    def row(self, i: int) -> tuple[Cells, str]:
        return self._row(i)

    def _make(self, i: int) -> tuple[Cells, str]:
        e = self.event(i)
        if e is None:
            return ["", "", "", "", "", "", "(not a fits event)"], "corrupt"
        v = self.verdict(e)
        rt = f"{'-' if e.k.runtime is None else e.k.runtime}/" \
             f"{'-' if e.v.runtime is None else e.v.runtime}"
        failed = Text(", ".join(v.failed) + (" (by kvdiag)" if v.by == "kvdiag" else "")
                      if v.failed else ("not evaluable" if v.by == "not recorded" else "-"))
        cells: list[str | Text] = [
            str(e.seq), str(e.step), str(e.layer), e.node, e.route,
            "true" if e.result else "FALSE", failed, ne(e.q), ne(e.k), ne(e.v), ne(e.dst),
            nb(e.q), nb(e.k), nb(e.v), nb(e.dst), f"{e.k.buffer or '-'}/{e.v.buffer or '-'}",
            rt, ptr(e.dst.data or None),
            ptr(e.k.data or None), ptr(e.v.data or None),
        ]
        return cells, fits_mark(e, v.outcome)


class LogFitsRows:
    """The instrumented ``fits=false`` lines a log scan kept."""

    def __init__(self, records: Sequence[FitsLine]) -> None:
        self.records = tuple(records)

    def __len__(self) -> int:
        return len(self.records)

    def row(self, i: int) -> tuple[Cells, str]:
        r = self.records[i]
        shape = "[" + ",".join(map(str, r.ne)) + "]" if r.ne else "-"
        return ([str(r.where.line), shape, r.type or "-", r.dst or "-", r.k or "-",
                 r.kbuf or "-", r.vbuf or "-", r.kr or "-", r.vr or "-"], "fits-false")


def log_fits_records(doc: LogDoc) -> list[FitsLine]:
    """Fits lines of the log, crash-attached ones included, once each, in line order."""
    seen: dict[tuple[str, int], FitsLine] = {}
    for rec in (*doc.scan.fits, *(f for c in doc.scan.crashes for f in c.fits)):
        seen.setdefault((rec.where.source, rec.where.line), rec)
    return sorted(seen.values(), key=lambda r: (r.where.source, r.where.line))
