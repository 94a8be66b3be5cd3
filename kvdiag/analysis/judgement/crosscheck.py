"""The model's own annotations compared with the judgement (a cross-check, never an input).

The model writes ``read.ranges`` (its provenance of each read) and ``write.versions`` (each
page's version after a write); a native writer writes neither. The judgement never reads them;
where a trace carries them, every read's verdicts are put in the annotation's shape — runs of
equal (source, holder stream, class, lag) — and compared, and every annotated version is
compared with the judged one; disagreements become the ``annotation-mismatch`` finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvdiag.analysis.judgement.classes import CLASSES, SOURCES
from kvdiag.analysis.judgement.slots import Piece
from kvdiag.model import events as ev


def as_ranges(read: ev.Read, bad: Sequence[Piece]) -> tuple[ev.ReadRange, ...]:
    """Verdicts in the model annotation's shape, in page order; pages of the served runs
    outside ``bad`` are exact."""
    stream = read.stream
    items: list[tuple[int, int, str, int, str, int]] = [
        (p[0], p[1], SOURCES[p[2]], p[7] if p[6] >= 0 else -1, CLASSES[p[4]], p[5])
        for p in bad]
    for s in read.served:
        if s.end <= s.begin:
            continue
        at = s.begin
        for p in sorted(q for q in bad if s.begin <= q[0] < s.end):
            if p[0] > at:
                items.append((at, p[0], s.source, stream, "exact", 0))
            at = max(at, p[1])
        if at < s.end:
            items.append((at, s.end, s.source, stream, "exact", 0))
    items.sort()
    return merge(ev.ReadRange(*i) for i in items)  # type: ignore[arg-type]


def merge(ranges: Iterable[ev.ReadRange]) -> tuple[ev.ReadRange, ...]:
    out: list[ev.ReadRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if (last is not None and last.end == r.begin and last.source == r.source
                and last.holder == r.holder and last.cls == r.cls
                and last.version_lag == r.version_lag):
            out[-1] = ev.ReadRange(last.begin, r.end, r.source, r.holder, r.cls, r.version_lag)
        else:
            out.append(r)
    return tuple(out)


def ranges_text(ranges: Iterable[ev.ReadRange]) -> str:
    return ", ".join(f"{r.begin}..{r.end - 1} {r.source} {r.cls}"
                     + (f" (stream {r.holder})" if r.cls == "foreign" else "")
                     + (f" -{r.version_lag}" if r.cls == "stale" else "") for r in ranges)


def disagrees(read: ev.Read, bad: Sequence[Piece]) -> str | None:
    """How the read's annotation differs from its verdicts (None: it agrees, or a page is not
    judged so nothing can be compared)."""
    if any(p[4] == 3 for p in bad):
        return None
    derived = as_ranges(read, bad)
    annotated = merge(read.ranges)
    if derived == annotated:
        return None
    return f"annotated {ranges_text(annotated)}; judged {ranges_text(derived)}"
