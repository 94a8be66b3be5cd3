"""The judgement of a trace: the one place that turns raw events into verdicts.

Every surface — ``check`` (all formats), ``diff``, ``trace info`` / ``pages`` / ``export``,
``import``'s summary, every TUI screen — renders what this package concludes and decides
nothing itself: no class, condition, flow or count is computed anywhere else
(design.md, "One judgement, every surface"). It imports only :mod:`kvdiag.model`.

Modules, one idea each:

- :mod:`.classes` — the classification rule (exact / stale / foreign / not judged) and codes;
- :mod:`.slots` — what every pool and ring slot holds, host page versions, the ring rule
  (and the arrays that carry them between chunks);
- :mod:`.columns` — the fields the page judgement needs, taken out of decoded events as numpy
  columns (a stream's a few hundred events at a time, while they are fresh);
- :mod:`.batch` — a chunk's columns judged with array operations (the speed of ``check``);
- :mod:`.history` — the slot rule by random access over an index (a viewer's any-step state);
- :mod:`.crosscheck` — the model's own annotations compared with the judgement;
- :mod:`.fits` — one fits decision: outcome (which decisions are bad) and every condition
  held / failed with its logged value / unknown and why (predicate: :mod:`kvdiag.model.fits`);
- :mod:`.completeness` — which kinds the trace records (declared or inferred) and what a
  missing one hides;
- :mod:`.gaps` — events lost from the trace (jumps in seq): where, how many, and from where
  on what every slot holds is unknown;
- :mod:`.judge` — the streaming :class:`Judge` and its :class:`Judgement` snapshot;
- :mod:`.ledger` — compact per-read tables for viewers;
- :mod:`.findings` — verdicts grouped into findings (rule ids as ``kvdiag check`` prints them);
- :mod:`.adapt` — the adaptive partition's rules.

Using it
--------

Headless, one pass (what ``kvdiag check`` does; every command that judges a file builds its
Judge with :func:`trace_judge`, from the file's header)::

    judge = trace_judge(reader, name=path)  # = Judge(reader.header, name=path)
    judge.feed_all(reader)                  # events in file order, any iterable (streamed:
                                            # fields taken out as they are decoded)
    j = judge.snapshot()                    # Judgement: an immutable value
    j.findings, j.summary(), j.steps.count, j.completeness.missing, j.residency

Per read, a chunk at a time (``diff``, ``trace pages``, ``trace export``)::

    judge = Judge(reader.header, flows=True)    # flows: which writes each read missed
    for chunk in batches:                       # lists of events (judge.CHUNK at a time)
        judge.feed_all(chunk)
        for e in chunk:
            if type(e) is Read:
                judge.verdict(e)  # ReadVerdict: counts (exact, stale, foreign, not judged),
                                  # pieces = its non-exact runs (slots.Piece tuples)
                judge.pages(e)    # [PageVerdict] every page: source, slot, class, lag,
                                  # host version, holder Copy (whose bytes), why not judged
                judge.missed(e)   # (write seq, class) of the writes its stale/foreign
                                  # pages missed: the flows
        judge.live_writes()       # writes still the last of some page (a surface drawing
                                  # flows may forget the rest)

A read is asked about while its chunk is the last one fed (``judge.feed(e)`` is a chunk of
one; ``judge.last`` the last read of the last chunk). Any fits event, any time:
``judge.fits_verdict(e)`` → :class:`~.fits.FitsVerdict` (``outcome``, ``failed``, ``by``,
``conditions``, ``note``); :func:`.fits.outcome` alone says whether a decision is bad.

Behind a viewer's background indexer (the TUI): ``Judge(header, ledger=True)``, feed the same
chunks as they are indexed (``judge.skip()`` for a row that is not an event, so that ledger rows
stay the index's rows), and publish ``judge.snapshot()`` every so often: a snapshot is a
read-only prefix (``Judgement.rows`` events judged; show later rows as "judging…"). Its
``ledger`` (:class:`~.ledger.LedgerSnapshot`) has numpy tables — ``reads`` (row, seq, step,
layer, stream, page counts per class), ``pieces`` (non-exact runs with whose bytes the slot
held), ``flows`` (write → read), ``fits`` (outcome per decision), ``outputs`` (diverged or
not) — and ``steps_with("foreign")`` etc. for scrubber marks; a page of a read outside its
pieces is exact.

What every verdict means is in the modules' docstrings and docs/trace-format.md,
"Derivation"; the steps rule is :class:`Steps`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvdiag.analysis.judgement.classes import CLASSES, SOURCES, WHY
    from kvdiag.analysis.judgement.completeness import Completeness, KindStatus
    from kvdiag.analysis.judgement.fits import FitsVerdict, outcome
    from kvdiag.analysis.judgement.judge import (
        CHUNK,
        Judge,
        Judgement,
        PageVerdict,
        ReadVerdict,
        Steps,
        Trace,
        batches,
        trace_judge,
    )
    from kvdiag.analysis.judgement.ledger import LedgerSnapshot
    from kvdiag.analysis.judgement.slots import Copy

_WHERE = {
    "CLASSES": "classes", "SOURCES": "classes", "WHY": "classes",
    "Completeness": "completeness", "KindStatus": "completeness",
    "FitsVerdict": "fits", "outcome": "fits",
    "CHUNK": "judge", "Judge": "judge", "Judgement": "judge", "PageVerdict": "judge",
    "ReadVerdict": "judge", "Steps": "judge", "Trace": "judge", "batches": "judge",
    "trace_judge": "judge",
    "LedgerSnapshot": "ledger", "Copy": "slots",
}
"""Where each name is defined: imported on first use (PEP 562), so that a command that needs
one light module of the package (``trace validate``: :mod:`.gaps`) does not load numpy and
the whole judgement."""


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CHUNK",
    "CLASSES",
    "SOURCES",
    "WHY",
    "Completeness",
    "Copy",
    "FitsVerdict",
    "Judge",
    "Judgement",
    "KindStatus",
    "LedgerSnapshot",
    "PageVerdict",
    "ReadVerdict",
    "Steps",
    "Trace",
    "batches",
    "outcome",
    "trace_judge",
]
