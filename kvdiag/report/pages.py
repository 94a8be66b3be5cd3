"""``kvdiag trace pages``: every judged read page, one line each, for audits and scripts.

With ``--json`` each line is a JSON object (JSON Lines)::

    {"seq": 412, "step": 9, "layer": 0, "stream": 1, "page": 2, "source": "pool",
     "slot": 14, "class": "stale", "lag": 1, "version": 9,
     "holder": {"layer": 0, "stream": 1, "page": 2, "version": 8, "upload_step": 3,
                "upload_seq": 130}, "why": ""}

``holder`` is the copy the slot held (null: nothing, a host page, or not judged); ``version``
the host page's version at the read; ``why`` why a page is not judged. A read without served
pages has no page numbers: it is one line with ``"page": null``, ``"pages"`` (how many) and
its ``why``. Without ``--json`` the same facts are one line of text each. The verdicts are the
judgement's (:mod:`kvdiag.analysis.judgement`), the same ``kvdiag check`` counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

import msgspec

from kvdiag.analysis.judgement import Judge, PageVerdict
from kvdiag.analysis.judgement.classes import NO_SERVED, WHY
from kvdiag.analysis.judgement.judge import batches
from kvdiag.model import events as ev

_encode = msgspec.json.Encoder().encode


def page_json(v: PageVerdict) -> dict[str, Any]:
    h = v.holder
    return {"seq": v.seq, "step": v.step, "layer": v.layer, "stream": v.stream, "page": v.page,
            "source": v.source, "slot": v.slot, "class": v.cls, "lag": v.lag,
            "version": v.version,
            "holder": None if h is None else {
                "layer": h.layer, "stream": h.stream, "page": h.page, "version": h.version,
                "upload_step": h.step, "upload_seq": h.seq},
            "why": v.why}


def page_text(v: PageVerdict) -> str:
    where = f"#{v.seq} step {v.step} layer {v.layer} stream {v.stream} page {v.page}: "
    where += "host" if v.source == "host" else f"{v.source} slot {v.slot}"
    if v.cls == "not judged":
        return f"{where}: not judged ({v.why})"
    h = v.holder
    held = ("" if v.source == "host" else " (slot held nothing)" if h is None else
            f" (slot held layer {h.layer} stream {h.stream} page {h.page} v{h.version}, "
            f"copied at step {h.step} #{h.seq})")
    lag = f", {v.lag} write(s) old" if v.cls == "stale" else ""
    return f"{where}: {v.cls}{lag}, host v{v.version}{held}"


def write_pages(events: Iterable[ev.AnyEvent | ev.Unknown], judge: Judge, out: IO[bytes],
                as_json: bool) -> dict[str, int]:
    """Judge ``events`` (``judge`` made with ``detail=True``) and write every read page to
    ``out``; returns pages per class."""
    counts = {"exact": 0, "stale": 0, "foreign": 0, "not judged": 0}
    for chunk in batches(events):  # a records event alone: every read stays answerable
        judge.feed_all(chunk)
        for e in chunk:
            if type(e) is ev.Read:
                _write_read(judge, e, out, as_json, counts)
    return counts


def _write_read(judge: Judge, e: ev.Read, out: IO[bytes], as_json: bool,
                counts: dict[str, int]) -> None:
    if not e.served:
        n = e.pool + e.ring + e.host
        counts["not judged"] += n
        record = {"seq": e.seq, "step": e.step, "layer": e.layer, "stream": e.stream,
                  "page": None, "pages": n, "class": "not judged",
                  "why": WHY[NO_SERVED]}
        out.write(_encode(record) + b"\n" if as_json else (
            f"#{e.seq} step {e.step} layer {e.layer} stream {e.stream}: {n} page(s) not "
            f"judged ({WHY[NO_SERVED]})\n").encode())
        return
    lines = []
    for v in judge.pages(e):
        counts[v.cls] += 1
        lines.append(_encode(page_json(v)) if as_json else page_text(v).encode())
    if lines:
        out.write(b"\n".join(lines) + b"\n")
