"""Findings: groupings of the judgement's verdicts, with stable rule ids (CI scripts match on
them).

``fits-dispatch-mismatch`` and ``fallback`` group fits verdicts by their failed conditions;
``abort`` is one per abort event; ``stale-page-read`` and ``foreign-page-read`` group page
verdicts by the reading stream (titles count pages and say whether they came from resident
pool slots or ring slots); ``stream-divergence`` groups outputs by stream; ``not-recorded``
(``info``) says what the trace does not record and what that hides; ``annotation-mismatch``
(``info``) says where the model's own annotation disagrees with the judgement (a cross-check);
``trace-incomplete`` says the run did not complete; ``events-lost`` (``warning``) that events
are missing between those the trace holds (gaps in ``seq``); the adaptive partition's rules are in
:mod:`~kvdiag.analysis.judgement.adapt`.

Evidence is capped at :data:`MAX_EVIDENCE` items per finding; ``details`` say how many were
shown, how many there were, how many were left out, and for page findings which command lists
every judged page (``kvdiag trace pages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvdiag.analysis.judgement.classes import FOREIGN, RING, STALE
from kvdiag.analysis.judgement.gaps import Gap, SeqGaps, between, counted
from kvdiag.model import events as ev
from kvdiag.model.findings import Evidence, Finding, Severity
from kvdiag.model.frames import python_frame_text, python_stack_title

MAX_EVIDENCE = 20

FIX_DISPATCH = (
    "dispatch FLASH_ATTN_EXT on the full ggml_cuda_kv_stream_fattn_fits(dst) predicate, not on "
    "buffer membership; fall back to ordinary flash attention over the host-mapped buffer "
    "(zero-copy) when it fails — or run with --kv-unified / -np 1"
)
FIX_ALIAS = (
    "key resident-page bookkeeping (slots, loaded, dirty) by (layer, stream, page) and derive the "
    "dirty page from the stream-local cell, not global_row / 256 — or use a unified KV cache"
)
FIX_RING = (
    "gate the reuse of a ring slot on the kernel having consumed it (the ring's consumed event), "
    "and copy each page into the slot the read names"
)
FIX_IDENTITY = (
    "identify resident layers by the K tensor and stream (tensor base and view offset), not by "
    "the view pointer learned in graph order; a decode whose slot's pointer was not seen in "
    "the last prefill graph otherwise runs out of layer numbers — the per-stream layout does this"
)


def layer_of(layer: int | None) -> int | None:
    """An event's layer for evidence: a negative layer (an imported log's unknown one) is
    None, which reports print as unknown, never as "layer -1"."""
    return layer if layer is not None and layer >= 0 else None


@dataclass
class Group:
    """Accumulates one finding: first evidence, counts."""

    count: int = 0
    pages: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    first_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, evidence: Evidence, pages: int = 0) -> None:
        self.count += 1
        self.pages += pages
        if self.first_step is None:
            self.first_step = evidence.step
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(evidence)

    @property
    def full(self) -> bool:
        """No more evidence is kept: later occurrences are only counted (:meth:`count_one`)."""
        return len(self.evidence) >= MAX_EVIDENCE

    def count_one(self, pages: int = 0) -> None:
        """One more occurrence, once the evidence is full (the first step is already set)."""
        self.count += 1
        self.pages += pages

    def caps(self, command: str | None = None) -> dict[str, Any]:
        """How much evidence the finding lists of how much it counted."""
        out: dict[str, Any] = {"evidence_shown": len(self.evidence),
                               "evidence_total": self.count,
                               "evidence_left_out": self.count - len(self.evidence)}
        if command and self.count > len(self.evidence):
            out["evidence_command"] = command
        return out


@dataclass
class PageGroup(Group):
    """A page finding of one reading stream: pages per source and what the slots held."""

    by_source: list[int] = field(default_factory=lambda: [0, 0])
    """[pool pages, ring pages]."""
    held: dict[str, int] = field(default_factory=dict)
    """Foreign pages by what the slot held: another layer's, stream's, page's bytes, nothing."""


def _pages(b: int, e: int) -> str:
    return f"page {b}" if e - b == 1 else f"pages {b}..{e - 1}"


def _slots(src: int, q: int, n: int) -> str:
    name = "ring" if src == RING else "pool"
    return f"{name} slot {q}" if n == 1 else f"{name} slots {q}..{q + n - 1}"


HELD: tuple[str, ...] = ("nothing", "another layer's", "another stream's", "another page's")
"""What a foreign page's slot held, relative to the reading view."""


def held_kind(layer: int, stream: int, p: tuple[int, ...]) -> str:
    """What a foreign piece's slot held, relative to the read's (layer, stream)."""
    if p[6] < 0:
        return "nothing"
    if p[6] != layer:
        return "another layer's"
    if p[7] != stream:
        return "another stream's"
    return "another page's"


def piece_text(layer: int, stream: int, p: tuple[int, ...]) -> str:
    """One non-exact piece of a read, for evidence."""
    b, e, src, q, cls = p[0], p[1], p[2], p[3], p[4]
    where = f"{_pages(b, e)} ({_slots(src, q, e - b)})"
    if cls == STALE:
        return (f"{where} {'is' if e - b == 1 else 'are'} {p[5]} write(s) old "
                f"(copied at step {p[10]}, #{p[11]})")
    if p[6] < 0:
        return f"{where} held nothing (never uploaded, or emptied)"
    whose = []
    if p[6] != layer:
        whose.append(f"layer {p[6]}")
    if p[7] != stream or p[6] != layer:
        whose.append(f"stream {p[7]}")
    whose.append(_pages(p[8], p[8] + e - b))
    return f"{where} held {' '.join(whose)} (copied at step {p[10]}, #{p[11]})"


class Groups:
    """Every finding being accumulated while the Judge runs."""

    def __init__(self) -> None:
        self.mismatch: dict[tuple[tuple[str, ...], str], Group] = {}
        self.fallback: dict[tuple[tuple[str, ...], str], Group] = {}
        self.aborts: list[ev.Abort] = []
        self.stale: dict[int, PageGroup] = {}
        self.foreign: dict[int, PageGroup] = {}
        self.divergence: dict[int, Group] = {}
        self.no_reference = Group()
        self.no_served = Group()
        """Reads without ``served`` (their pages are not judged)."""
        self.annotated_classes: dict[str, int] = {}
        """What the model's annotation says of reads without ``served`` (a cross-check)."""
        self.not_judged: dict[int, Group] = {}
        """Reads with pages not judged, by reason (except reads without served)."""
        self.annotation = Group()
        """Reads whose annotated ranges disagree with the judgement."""
        self.versions = Group()
        """Writes whose annotated versions disagree with the judgement."""

    def read_chunk(self, seq: np.ndarray, pieces: np.ndarray, layer: np.ndarray,
                   stream: np.ndarray, step: np.ndarray) -> None:
        """Group the non-exact pieces of a chunk's reads (``pieces``: rows of
        :data:`~kvdiag.analysis.judgement.batch.PIECE_COLUMNS`; ``seq``, ``layer``,
        ``stream``, ``step``: per read of the chunk). Counting is done on the arrays; evidence is built
        only for the reads a group still shows."""
        if not pieces.size:
            return
        read = pieces[:, 0]
        pages = pieces[:, 2] - pieces[:, 1]
        for cls, groups in ((STALE, self.stale), (FOREIGN, self.foreign)):
            sel = pieces[:, 5] == cls
            if not sel.any():
                continue
            r_streams = stream[read[sel]]
            for s in np.unique(r_streams).tolist():
                mine = np.flatnonzero(sel)[r_streams == s]
                g = groups.get(s)
                if g is None:
                    g = groups[s] = PageGroup()
                ring = pieces[mine, 3] == RING
                g.by_source[0] += int(pages[mine][~ring].sum())
                g.by_source[1] += int(pages[mine][ring].sum())
                if cls == FOREIGN:
                    hl, hs = pieces[mine, 7], pieces[mine, 8]
                    rl = layer[read[mine]]
                    kinds = np.where(hl < 0, 0, np.where(hl != rl, 1, np.where(hs != s, 2, 3)))
                    for k, n in enumerate(np.bincount(kinds, weights=pages[mine],
                                                      minlength=4).tolist()):
                        if n:
                            what = HELD[k]
                            g.held[what] = g.held.get(what, 0) + int(n)
                ids, first = np.unique(read[mine], return_index=True)
                ids = ids[np.argsort(first)]
                if g.first_step is None:
                    g.first_step = int(step[ids[0]])
                g.count += ids.size
                g.pages += int(pages[mine].sum())
                for r in ids[:max(0, MAX_EVIDENCE - len(g.evidence))].tolist():
                    ly, sm = int(layer[r]), int(stream[r])
                    found = [tuple(row) for row in pieces[mine][read[mine] == r].tolist()]
                    g.evidence.append(Evidence(
                        seq=int(seq[r]), step=int(step[r]), layer=layer_of(ly), stream=sm,
                        page=found[0][1],
                        text="; ".join(piece_text(ly, sm, p[1:]) for p in found)))


def _where(by_source: list[int], word: str) -> str:
    pool, ring = by_source
    if ring and not pool:
        return f"{word} ring page(s)"
    if pool and not ring:
        return f"{word} resident page(s)"
    return f"{word} page(s) ({pool} resident, {ring} ring)"


def _conditions(shown: str, by: str, unknown: int) -> str:
    if by == "not recorded":
        return "failed conditions not recorded"
    names = f"failed: {shown}" if shown else "no condition failed"
    if by == "kvdiag":
        names += "; evaluated by kvdiag from the logged geometry"
        if unknown:
            names += f" ({unknown} condition(s) not evaluable: fields not recorded)"
    return names


#: Frames of the signalled thread's Python stack an abort finding's evidence names (all of
#: them are in ``details.python_stacks``).
EVIDENCE_PYTHON_FRAMES = 8


def python_stack_text(st: ev.PyStack) -> str:
    """One evidence line for a Python stack of an abort (format 1.3): the thread the signal hit
    with its frames innermost first, any other thread with its innermost frame, as
    ``kvdiag postmortem`` shows them on the log."""
    frames = st.as_frames()
    title = python_stack_title(st.thread, st.name, st.current)
    shown = frames[:EVIDENCE_PYTHON_FRAMES] if st.current else frames[:1]
    text = ", ".join(python_frame_text(f) for f in shown)
    if len(frames) > len(shown):
        text += f" (+{len(frames) - len(shown)} more; {len(frames)} frame(s))"
    text = f"{title}: {text}" if text else title
    return "; ".join((text, *st.notes))


def python_stack_json(st: ev.PyStack) -> dict[str, Any]:
    """A Python stack as ``check --json`` gives it: the keys of ``kvdiag postmortem --json``'s
    ``python_stacks`` (docs/postmortem-json.md), without the log line a trace does not keep."""
    return {"thread": st.thread, "name": st.name, "current": st.current,
            "notes": list(st.notes),
            "frames": [{"index": f.index, "function": f.function, "file": f.file,
                        "line": f.line, "in_app": f.in_app} for f in st.as_frames()]}


def _abort_fix(condition: str) -> str:
    if "fattn_fits" in condition:
        return FIX_DISPATCH
    if "next_layer" in condition:
        return FIX_IDENTITY
    return ""


def identity(f: Finding) -> tuple[Any, ...]:
    """What makes a finding the same finding while its trace grows (its title's counts change,
    its grouping key does not): the rule and what it groups by — the failed conditions and who
    evaluated them, the reading stream, the abort's event, the decode loop, what is not
    recorded and why, and where lost events were lost (a trace's End can add events lost
    where no seq shows it to its gaps in seq: a follower says the finding again then)."""
    if f.rule == "abort":
        return (f.rule, f.evidence[0].seq if f.evidence else f.title)
    d = f.details
    failed = d.get("failed")
    return (f.rule, d.get("stream"), tuple(failed) if isinstance(failed, list) else None,
            d.get("conditions_from"), d.get("loop"), d.get("what"), d.get("why"),
            d.get("place"))


def _fits_details(failed: tuple[str, ...], by: str, g: Group) -> dict[str, Any]:
    return {"failed": list(failed), "conditions_from": by, "count": g.count,
            "first_step": g.first_step, "not_evaluable": g.extra["not_evaluable"], **g.caps()}


def build(groups: Groups, *, pages_command: str | None) -> list[Finding]:
    """The findings of everything grouped so far (not-recorded and incomplete are added by
    the Judge, which knows the completeness and the end)."""
    out: list[Finding] = []
    for (failed, by), g in groups.mismatch.items():
        out.append(Finding(
            rule="fits-dispatch-mismatch", severity=Severity.CRITICAL,
            title=(f"FA node routed to the streamed kernel while fits() was false "
                   f"({_conditions(g.extra['shown'], by, g.extra['unknown'])}) — "
                   f"{g.count} node(s)"),
            evidence=tuple(g.evidence), fix=FIX_DISPATCH, details=_fits_details(failed, by, g)))
    for a in groups.aborts:
        out.append(Finding(
            rule="abort", severity=Severity.CRITICAL, title=a.message,
            evidence=(Evidence(seq=a.seq, step=a.step, text=a.condition or a.message),
                      *(Evidence(seq=a.seq, step=a.step, text=python_stack_text(st))
                        for st in a.python_stacks)),
            fix=_abort_fix(a.condition),
            details={"file": a.file, "line": a.line, "condition": a.condition,
                     "backtrace": list(a.backtrace), "cuda_error": a.cuda_error,
                     "python_stacks": [python_stack_json(st) for st in a.python_stacks]}))
    for (failed, by), g in groups.fallback.items():
        out.append(Finding(
            rule="fallback", severity=Severity.WARNING,
            title=(f"{g.count} FA node(s) fell back to ordinary flash attention over the "
                   f"host buffer (zero-copy): "
                   f"{_conditions(g.extra['shown'], by, g.extra['unknown'])}"),
            evidence=tuple(g.evidence),
            fix="expected with several KV streams per ubatch; use --kv-unified to keep "
                "the streamed path",
            details=_fits_details(failed, by, g)))
    for stream, pg in sorted(groups.stale.items()):
        out.append(Finding(
            rule="stale-page-read", severity=Severity.ERROR,
            title=(f"stream {stream} read {pg.pages} {_where(pg.by_source, 'stale')} in "
                   f"{pg.count} read(s), first at step {pg.first_step}"),
            evidence=tuple(pg.evidence), fix=FIX_ALIAS if not pg.by_source[1] else
            f"{FIX_ALIAS}; for ring pages: {FIX_RING}",
            details={"stream": stream, "pages": pg.pages, "resident_pages": pg.by_source[0],
                     "ring_pages": pg.by_source[1], "reads": pg.count, "count": pg.count,
                     "first_step": pg.first_step, **pg.caps(pages_command)}))
    for stream, pg in sorted(groups.foreign.items()):
        # in HELD's order, not the order the chunks first met them: one trace, one finding
        kinds = sorted(pg.held.items(), key=lambda kv: HELD.index(kv[0]))
        held = ", ".join(f"{n} {what}" if what != "nothing" else f"{n} nothing"
                         for what, n in sorted(kinds, key=lambda kv: -kv[1]))
        out.append(Finding(
            rule="foreign-page-read", severity=Severity.ERROR,
            title=(f"stream {stream} read {pg.pages} {_where(pg.by_source, 'foreign')} "
                   f"holding other bytes ({held}) in {pg.count} read(s), first at step "
                   f"{pg.first_step}"),
            evidence=tuple(pg.evidence), fix=FIX_ALIAS if not pg.by_source[1] else
            f"{FIX_ALIAS}; for ring pages: {FIX_RING}",
            details={"stream": stream, "pages": pg.pages, "resident_pages": pg.by_source[0],
                     "ring_pages": pg.by_source[1], "held": dict(kinds), "reads": pg.count,
                     "count": pg.count, "first_step": pg.first_step,
                     **pg.caps(pages_command)}))
    for stream, g in sorted(groups.divergence.items()):
        out.append(Finding(
            rule="stream-divergence", severity=Severity.ERROR,
            title=(f"stream {stream} output diverges from the fully resident reference from "
                   f"step {g.first_step} (max |Δ| {g.extra['max_abs_delta']:.3g} > "
                   f"{g.extra['tolerance']:g}) in {g.count} step(s)"),
            evidence=tuple(g.evidence), fix=FIX_ALIAS,
            details={"stream": stream, "first_step": g.first_step, "count": g.count,
                     **g.extra, **g.caps()}))
    return out


def not_recorded(groups: Groups, missing: list[tuple[str, str, int]], source: str,
                 no_events: bool, pages_command: str | None,
                 why_text: dict[int, str]) -> list[Finding]:
    """``info`` findings for what the trace does not record. ``missing``: (kind, what it
    hides, pages not judged for it)."""
    out: list[Finding] = []
    how = "declared by the writer" if source == "declared" else "inferred from the trace"
    if no_events:
        return [Finding(
            rule="not-recorded", severity=Severity.INFO,
            title="the trace records no events: nothing was judged (no page read, fits "
                  "decision or output)",
            fix="record the run's events (docs/native-bridge.md lists the macros)",
            details={"what": "events", "count": 0, "source": source})]
    for kind, hides, pages in missing:
        tail = f"; {pages} page(s) not judged" if pages else ""
        out.append(Finding(
            rule="not-recorded", severity=Severity.INFO,
            title=f"{kind} events not recorded ({how}): {hides}{tail}",
            fix=f"record {kind} events (docs/native-bridge.md)",
            details={"what": kind, "source": source, "pages": pages}))
    g = groups.no_served
    if g.count:
        said = groups.annotated_classes
        note = ""
        if said:
            note = ("; the model's annotation of them (a cross-check, not a verdict) says "
                    + ", ".join(f"{n} {cls}" for cls, n in sorted(said.items())))
        out.append(Finding(
            rule="not-recorded", severity=Severity.INFO,
            title=(f"read.served not recorded: {g.count} read(s) ({g.pages} page(s)) carry no "
                   f"served runs, so their pages were not judged{note}"),
            evidence=tuple(g.evidence),
            fix="record the pages each read was served from (read.served, trace format 1.1)",
            details={"what": "read.served", "count": g.count, "pages": g.pages,
                     "annotation_says": dict(said), **g.caps()}))
    for why, g in sorted(groups.not_judged.items()):
        out.append(Finding(
            rule="not-recorded", severity=Severity.INFO,
            title=(f"{g.pages} page(s) in {g.count} read(s) not judged: {why_text[why]}"),
            evidence=tuple(g.evidence),
            details={"what": "pages", "why": why_text[why], "count": g.count,
                     "pages": g.pages, **g.caps(pages_command)}))
    g = groups.no_reference
    if g.count:
        out.append(Finding(
            rule="not-recorded", severity=Severity.INFO,
            title=(f"stream divergence not recorded: {g.count} output(s) have no reference "
                   "(max |Δ| and tolerance), so divergence was not judged for them"),
            evidence=tuple(g.evidence),
            fix="record a fully resident reference per output (ref_checksum, "
                "max_abs_delta, tolerance)",
            details={"what": "stream divergence", "count": g.count, **g.caps()}))
    return out


def cross_check(groups: Groups) -> list[Finding]:
    """``annotation-mismatch``: the model's annotation disagrees with the judgement."""
    out: list[Finding] = []
    for g, what in ((groups.annotation, "read.ranges"), (groups.versions, "write.versions")):
        if g.count:
            out.append(Finding(
                rule="annotation-mismatch", severity=Severity.INFO,
                title=(f"the writer's own annotation ({what}) disagrees with the judgement "
                       f"from the raw events in {g.count} event(s); the judgement is reported"),
                evidence=tuple(g.evidence),
                details={"what": what, "count": g.count, **g.caps()}))
    return out


def incomplete(end: ev.End | None, last_seq: int, last_step: int | None) -> Finding:
    """``trace-incomplete`` (error): the run did not complete — killed before its End event,
    or ended with status error (End.reason says why where the writer knew, format 1.1).
    ``kvdiag check --allow-incomplete`` lowers it to a warning."""
    at = f"at step {last_step}" if last_step is not None else "before the first step"
    if end is None:
        why = "no End event: the capture was killed or is still running"
        title = f"the run did not complete ({why}) {at}; analysed up to event #{last_seq}"
        evidence = Evidence(seq=last_seq, step=last_step, text=why)
    else:
        why = end.reason or "no reason recorded"
        title = f"the run did not complete: ended with status error {at} ({why})"
        evidence = Evidence(seq=end.seq, step=last_step, text=why)
    return Finding(
        rule="trace-incomplete", severity=Severity.ERROR, title=title, evidence=(evidence,),
        fix="rerun the capture to the end; findings cover only what ran before it stopped",
        details={"status": end.status if end else "incomplete", "reason": end.reason if end
                 else "", "last_step": last_step, "last_seq": last_seq})



def _seqs(g: Gap) -> str:
    if g.events == 1:
        return f"seq {g.first} (1 event)"
    return f"seq {g.first}–{g.last} ({g.events} events)"


def lost_events(gaps: SeqGaps, not_judged: Group | None,
                slot_classes: tuple[int, int, int] = (0, 0, 0)) -> Finding:
    """``events-lost`` (warning): seqs missing between events the trace holds
    (:mod:`~kvdiag.analysis.judgement.gaps`), one evidence item per gap, and events the End
    counts that no seq accounts for (place unknown), one more item at the End. Evidence is
    missing, so every verdict after the first gap rests on an incomplete record; the pages
    that need a slot's content from before a gap are not judged (``not_judged``: their reads,
    counted here and listed by the ``not-recorded`` finding of that reason). Events lost where
    no seq shows it may lie anywhere: every page read from a slot (``slot_classes``: exact,
    stale, foreign pages judged from pool and ring slots) may rest on them — said, with the
    classes kept, for the judgement is streamed and only the End reveals the loss (docs/
    trace-format.md, "Lost events")."""
    pages = not_judged.pages if not_judged is not None else 0
    reads = not_judged.count if not_judged is not None else 0
    said = (f" (the writer declares {gaps.declared_dropped} event(s) dropped: its flight "
            "recorder was full)" if gaps.declared_dropped else "")
    exact, stale, foreign = slot_classes
    in_slots = exact + stale + foreign
    rest = (f" (the {in_slots} page(s) judged from pool and ring slots: {exact} exact, "
            f"{stale} stale, {foreign} foreign; host pages are exact whatever was lost)"
            if in_slots else "")
    unknown = ""
    if gaps.unplaced:
        unknown = (f"{counted(gaps.as_json()['unplaced'])}; where they were lost is not "
                   "recorded (no gap in seq shows it), so page classes after the first event "
                   f"may rest on missing events{rest}")
    if gaps.count:
        first = gaps.gaps[0]
        where = between(first.step_before, first.step_after)
        more = f"; {gaps.count - 1} more gap(s)" if gaps.count > 1 else ""
        tail = (f"; {pages} page(s) in {reads} read(s) from slots whose content the lost "
                "events may have changed not judged" if pages else "")
        title = (f"{gaps.events} event(s) missing from the trace{said}: {_seqs(first)} "
                 f"{where}{more}; every verdict from there on rests on an incomplete record"
                 f"{tail}")
        if unknown:
            title += f"; {gaps.unplaced} of them where no seq shows it: {unknown}"
    else:
        title = f"{gaps.unplaced} event(s) missing from the trace{said}: {unknown}"
    # the End's item is always shown: the gaps' fill what room is left
    room = MAX_EVIDENCE - (1 if gaps.unplaced else 0)
    evidence = [Evidence(seq=g.last + 1, step=g.step_after,
                         text=(f"{_seqs(g)} missing before this event" + (" (a snapshot: the page state goes on from it)"
                                               if g.onto_snapshot else "")))
                for g in gaps.gaps[:room]]
    total = gaps.count
    if gaps.unplaced:
        total += 1
        evidence.append(Evidence(
            seq=gaps.end_seq, step=gaps.end_step,
            text=(f"the End counts {gaps.end_count} event(s) before it, the seqs account "
                  f"for {gaps.accounted}: {gaps.unplaced} lost, place unknown")))
    shown = len(evidence)
    return Finding(
        rule="events-lost", severity=Severity.WARNING, title=title, evidence=tuple(evidence),
        fix="judge the whole trace as written: lines removed (grep -v, an edit, a tool that "
            "numbers the rest again), a copy cut in the middle or damaged lines (the trace's "
            "problems) lose events; for kvtrace.h's flight recorder, a larger KVTRACE_RING_MB",
        details={"what": "events", **gaps.as_json(), "pages_not_judged": pages,
                 "reads_not_judged": reads,
                 "place": ("unknown" if not gaps.count else
                           "seq" if not gaps.unplaced else "seq and unknown"),
                 "slot_pages_in_question": in_slots if gaps.unplaced else 0,
                 "evidence_shown": shown, "evidence_total": total,
                 "evidence_left_out": total - shown})
