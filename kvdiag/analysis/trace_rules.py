"""Findings over a capture trace: one streaming pass, bounded memory.

Rule ids (stable; CI scripts match on them): ``fits-dispatch-mismatch``, ``abort``,
``fallback``, ``stale-page-read``, ``foreign-page-read``, ``stream-divergence``,
``trace-incomplete``, ``not-recorded``, and the adaptive partition's ``partition-thrash``,
``ring-starved``, ``overprovisioned`` (:mod:`kvdiag.analysis.judgement.adapt`). Residency statistics go to the summary.

Read provenance (exact / stale / foreign) is derived from the raw events
(:mod:`kvdiag.analysis.provenance`) when reads carry ``served`` (format 1.1); a 1.0 trace's
reads carry only the model's annotated ``ranges``, which are used as they are; a read with
neither is not judged, and an ``info`` finding ``not-recorded`` says so (a CI gate at the
default ``--fail-on error`` passes; ``--fail-on info`` makes missing facts fail it). Outputs
without a reference are treated the same way. Counts are in pages wherever pages are counted
(the residency table and the stale/foreign titles); findings also say how many read events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvdiag.analysis.judgement.adapt import AdaptAnalyzer
from kvdiag.analysis.provenance import Provenance
from kvdiag.model import events as ev
from kvdiag.model.conditions import observed
from kvdiag.model.findings import Evidence, Finding, Severity

FitsEvaluator = Callable[[ev.Fits], "tuple[str, ...] | None"]
"""Failed conditions of a fits event evaluated from its logged geometry; None when the
geometry is not recorded (a log's fits=false line gives K/V pointers, not their shapes)."""
"""Names the failed conditions of a ``fits`` event from its logged geometry (the model's
predicate code; injected by :mod:`kvdiag.check`, since analysis does not import kvstream)."""

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


FIX_IDENTITY = (
    "identify resident layers by the K tensor and stream (tensor base and view offset), not by "
    "the view pointer learned in graph order; a decode whose slot's pointer was not seen in "
    "the last prefill graph otherwise runs out of layer numbers — the per-stream layout does this"
)


def _conditions(shown: str, by: str) -> str:
    """The title's account of the failed conditions (``shown``: with their logged values)."""
    if by == "not recorded":
        return "failed conditions not recorded"
    names = f"failed: {shown}" if shown else "no condition failed"
    return f"{names}; evaluated by kvdiag from the logged geometry" if by == "kvdiag" else names


def _shown(g: _Group) -> dict[str, int]:
    """How much evidence the finding lists of how much it counted (the first MAX_EVIDENCE)."""
    return {"evidence_shown": len(g.evidence), "evidence_total": g.count}


def _abort_fix(condition: str) -> str:
    if "fattn_fits" in condition:
        return FIX_DISPATCH
    if "next_layer" in condition:
        return FIX_IDENTITY
    return ""


@dataclass
class _Group:
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


@dataclass
class Residency:
    """Residency/upload statistics of a capture."""

    pool_pages_read: int = 0
    ring_pages_read: int = 0
    host_pages_read: int = 0
    exact_pages: int = 0
    stale_pages: int = 0
    foreign_pages: int = 0
    unjudged_pages: int = 0
    derived_reads: int = 0
    annotated_reads: int = 0
    unrecorded_reads: int = 0
    annotation_disagrees: int = 0
    uploads: Counter[str] = field(default_factory=Counter)
    upload_pages: Counter[str] = field(default_factory=Counter)
    upload_bytes: Counter[str] = field(default_factory=Counter)
    upload_reasons: Counter[str] = field(default_factory=Counter)
    evictions: int = 0
    routes: Counter[str] = field(default_factory=Counter)

    @property
    def resident_hit_rate(self) -> float | None:
        pool_uploads = self.upload_pages["resident"]
        if self.pool_pages_read == 0:
            return None
        return max(0.0, 1.0 - pool_uploads / self.pool_pages_read)

    def as_json(self) -> dict[str, Any]:
        return {
            "pages_read": {
                "pool": self.pool_pages_read,
                "ring": self.ring_pages_read,
                "host": self.host_pages_read,
            },
            "read_classes": {
                "exact": self.exact_pages,
                "stale": self.stale_pages,
                "foreign": self.foreign_pages,
                "not_recorded": self.unjudged_pages,
            },
            "provenance": {
                "derived_reads": self.derived_reads,
                "annotated_reads": self.annotated_reads,
                "not_recorded_reads": self.unrecorded_reads,
                "annotation_disagrees": self.annotation_disagrees,
            },
            "resident_hits": self.pool_pages_read - self.upload_pages["resident"],
            "resident_hit_rate": self.resident_hit_rate,
            "uploads": dict(self.uploads),
            "upload_pages": dict(self.upload_pages),
            "upload_bytes": dict(self.upload_bytes),
            "upload_reasons": dict(self.upload_reasons),
            "ring_pages": self.upload_pages["ring"],
            "evictions": self.evictions,
            "routes": dict(self.routes),
        }


def _incomplete(end: ev.End | None, last_seq: int, last_step: int | None) -> Finding:
    """``trace-incomplete`` (error): the run did not complete — killed before its End event,
    or ended with status error (End.reason says why where the writer knew, format 1.1).
    ``kvdiag check --allow-incomplete`` lowers it to a warning."""
    at = f"step {last_step}" if last_step is not None else "before the first step"
    if end is None:
        why = "no End event: the capture was killed or is still running"
        title = f"the run did not complete ({why}) at {at}; analysed up to event #{last_seq}"
        evidence = Evidence(seq=last_seq, step=last_step, text=why)
    else:
        why = end.reason or "no reason recorded"
        title = f"the run did not complete: ended with status error at {at} ({why})"
        evidence = Evidence(seq=end.seq, step=last_step, text=why)
    return Finding(
        rule="trace-incomplete", severity=Severity.ERROR, title=title, evidence=(evidence,),
        fix="rerun the capture to the end; findings cover only what ran before it stopped",
        details={"status": end.status if end else "incomplete", "reason": end.reason if end
                 else "", "last_step": last_step, "last_seq": last_seq})


class TraceAnalyzer:
    """Feed events in file order; ask for findings at the end."""

    def __init__(self, fits_evaluator: FitsEvaluator | None = None) -> None:
        self.fits_evaluator = fits_evaluator
        self.provenance = Provenance()
        self.mismatch: dict[tuple[tuple[str, ...], str], _Group] = {}
        self.fallback: dict[tuple[tuple[str, ...], str], _Group] = {}
        self.unrecorded_reads = _Group()
        self.unrecorded_outputs = _Group()
        self._folded: dict[tuple[str, str], list[int]] = {}
        self.aborts: list[ev.Abort] = []
        self.stale: dict[int, _Group] = {}
        self.foreign: dict[int, _Group] = {}
        self.divergence: dict[int, _Group] = {}
        self._res = Residency()
        self._table: dict[type, list[Any]] = {}
        self._unknown_counts: Counter[str] = Counter()
        self.steps: set[int] = set()
        self.end: ev.End | None = None
        self.last_seq = 0
        self.adapt = AdaptAnalyzer()
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.Step: self._step, ev.Fits: self._fits, ev.Read: self._read,
            ev.Upload: self.provenance.upload, ev.Evict: self._evict, ev.Abort: self.aborts.append,
            ev.Output: self._output, ev.End: self._end, ev.Write: self.provenance.write,
            ev.Invalidate: self.provenance.invalidate,
            ev.Repartition: self.adapt.feed, ev.Adapt: self.adapt.feed,
        }

    @property
    def residency(self) -> Residency:
        """Residency statistics so far. Upload statistics are kept by the derivation, which
        sees every upload anyway (uploads are a third of a decode trace's events); they are
        folded in here, counting only what arrived since the last fold."""
        r = self._res
        for (target, reason), acc in self.provenance.copies.items():
            done = self._folded.setdefault((target, reason), [0, 0, 0])
            count, pages, nbytes = (a - d for a, d in zip(acc, done, strict=True))
            r.uploads[target] += count
            r.upload_pages[target] += pages
            r.upload_bytes[target] += nbytes
            r.upload_reasons[reason] += pages
            done[:] = acc
        return r

    @property
    def counts(self) -> Counter[str]:
        """Events per kind."""
        out: Counter[str] = Counter(self._unknown_counts)
        for cls, (n, _) in self._table.items():
            if n and cls is not ev.Unknown:
                out[cls.__struct_config__.tag] += n  # type: ignore[attr-defined]
        return out

    def _entry(self, cls: type) -> list[Any]:
        """The [count, handler] of an event class (one dict lookup per event: analysis runs
        over millions of them)."""
        entry = self._table.get(cls)
        if entry is None:
            entry = self._table[cls] = [0, self._handlers.get(cls)]
        return entry

    def feed(self, event: ev.AnyEvent | ev.Unknown) -> None:
        entry = self._entry(type(event))
        entry[0] += 1
        self.last_seq = event.seq
        if entry[1] is not None:
            entry[1](event)
        elif type(event) is ev.Unknown:
            self._unknown_counts[event.kind] += 1

    def feed_all(self, events: Iterable[ev.AnyEvent | ev.Unknown]) -> TraceAnalyzer:
        # feed() inlined: a method call per event is a tenth of the analysis of a big trace
        table, entry_of = self._table, self._entry
        last: ev.AnyEvent | ev.Unknown | None = None
        for e in events:
            entry = table.get(type(e)) or entry_of(type(e))
            entry[0] += 1
            if entry[1] is not None:
                entry[1](e)
            elif type(e) is ev.Unknown:
                self._unknown_counts[e.kind] += 1
            last = e
        if last is not None:
            self.last_seq = last.seq
        return self

    def _step(self, e: ev.Step) -> None:
        self.steps.add(e.step)
        self.adapt.feed(e)  # decode loops, for partition-thrash

    def _evict(self, e: ev.Evict) -> None:
        self._res.evictions += 1

    def _end(self, e: ev.End) -> None:
        self.end = e

    def _output(self, e: ev.Output) -> None:
        diverged = e.diverged
        if diverged is None:
            self.unrecorded_outputs.add(Evidence(seq=e.seq, step=e.step, stream=e.stream,
                                                 text=f"checksum {e.checksum}, no reference"))
        elif diverged:
            assert e.max_abs_delta is not None
            g = self.divergence.setdefault(e.stream, _Group())
            g.add(Evidence(seq=e.seq, step=e.step, stream=e.stream, layer=e.worst_layer,
                           text=f"max |Δ| {e.max_abs_delta:.3g}"))
            g.extra["max_abs_delta"] = max(g.extra.get("max_abs_delta", 0.0), e.max_abs_delta)
            g.extra["tolerance"] = e.tolerance

    def _fits(self, e: ev.Fits) -> None:
        self._res.routes[e.route] += 1
        if not (e.route == "fallback" or (not e.result and e.route in ("streamed", "abort"))):
            return
        failed, by = e.failed, "writer"
        note = ""
        evaluated = None if e.evaluated or self.fits_evaluator is None else self.fits_evaluator(e)
        if not e.evaluated:
            if evaluated is None:
                by = "not recorded"
            else:
                failed, by = evaluated, "kvdiag"
                note = " (evaluated by kvdiag from the logged geometry"
                if (not failed) != e.result:
                    note += (f"; the writer's predicate returned {str(e.result).lower()}, "
                             f"the model's {str(not failed).lower()}")
                note += ")"
        # each failed condition with the logged values it tested: "Q.ne[3]==1 (Q.ne[3]=2)"
        tensors = {"Q": e.q, "K": e.k, "V": e.v, "mask": e.mask, "dst": e.dst}
        shown = ", ".join(observed(c, tensors) for c in failed)
        text = f"{e.node}: failed: {shown}" if failed else e.node
        evidence = Evidence(seq=e.seq, step=e.step, layer=e.layer, text=text + note)
        target = self.fallback if e.route == "fallback" else self.mismatch
        group = target.setdefault((failed, by), _Group())
        group.add(evidence)
        group.extra.setdefault("shown", shown)  # the first node's values, for the title

    def _read(self, e: ev.Read) -> None:
        r = self._res
        r.pool_pages_read += e.pool
        r.ring_pages_read += e.ring
        r.host_pages_read += e.host
        if e.served:
            r.derived_reads += 1
            exact = self.provenance.exact_pages(e)
            if exact is not None:
                r.exact_pages += exact
                for x in e.ranges:
                    if x.cls != "exact":
                        r.annotation_disagrees += 1
                        break
                return
            ranges = self.provenance.ranges(e)
            if e.ranges and ranges != e.ranges:
                r.annotation_disagrees += 1
        elif e.ranges:
            ranges = e.ranges
            r.annotated_reads += 1
        else:
            r.unrecorded_reads += 1
            r.unjudged_pages += e.pool + e.ring + e.host
            self.unrecorded_reads.add(Evidence(seq=e.seq, step=e.step, layer=e.layer,
                                               stream=e.stream), e.pool + e.ring + e.host)
            return
        stale: list[ev.ReadRange] = []
        foreign: list[ev.ReadRange] = []
        for rng in ranges:
            if rng.cls == "exact":
                r.exact_pages += rng.end - rng.begin
            elif rng.cls == "stale":
                stale.append(rng)
            else:
                foreign.append(rng)
        if stale:
            n = sum(x.end - x.begin for x in stale)
            r.stale_pages += n
            self.stale.setdefault(e.stream, _Group()).add(Evidence(
                seq=e.seq, step=e.step, layer=e.layer, stream=e.stream, page=stale[0].begin,
                text="; ".join(f"pages {x.begin}..{x.end - 1} are {x.version_lag} write(s) old"
                               for x in stale)), n)
        if foreign:
            n = sum(x.end - x.begin for x in foreign)
            r.foreign_pages += n
            self.foreign.setdefault(e.stream, _Group()).add(Evidence(
                seq=e.seq, step=e.step, layer=e.layer, stream=e.stream, page=foreign[0].begin,
                text="; ".join(f"pages {x.begin}..{x.end - 1} hold stream {x.holder}'s bytes"
                               if x.holder >= 0 else f"pages {x.begin}..{x.end - 1} never uploaded"
                               for x in foreign)), n)

    # -- results -------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for (failed, by), g in self.mismatch.items():
            out.append(Finding(
                rule="fits-dispatch-mismatch", severity=Severity.CRITICAL,
                title=(f"FA node routed to the streamed kernel while fits() was false "
                       f"({_conditions(g.extra['shown'], by)}) — {g.count} node(s)"),
                evidence=tuple(g.evidence), fix=FIX_DISPATCH,
                details={"failed": list(failed), "conditions_from": by, "count": g.count,
                         "first_step": g.first_step, **_shown(g)}))
        for a in self.aborts:
            out.append(Finding(
                rule="abort", severity=Severity.CRITICAL, title=a.message,
                evidence=(Evidence(seq=a.seq, step=a.step, text=a.condition or a.message),),
                fix=_abort_fix(a.condition),
                details={"file": a.file, "line": a.line, "condition": a.condition,
                         "backtrace": list(a.backtrace), "cuda_error": a.cuda_error}))
        for (failed, by), g in self.fallback.items():
            out.append(Finding(
                rule="fallback", severity=Severity.WARNING,
                title=(f"{g.count} FA node(s) fell back to ordinary flash attention over the "
                       f"host buffer (zero-copy): {_conditions(g.extra['shown'], by)}"),
                evidence=tuple(g.evidence),
                fix="expected with several KV streams per ubatch; use --kv-unified to keep "
                    "the streamed path",
                details={"failed": list(failed), "conditions_from": by, "count": g.count,
                         "first_step": g.first_step, **_shown(g)}))
        how = self._provenance_source()
        for rule, groups, what in (("stale-page-read", self.stale, "stale resident page(s)"),
                                   ("foreign-page-read", self.foreign,
                                    "resident page(s) holding another stream's bytes")):
            for stream, g in sorted(groups.items()):
                out.append(Finding(
                    rule=rule, severity=Severity.ERROR,
                    title=(f"stream {stream} read {g.pages} {what} in {g.count} read(s), "
                           f"first at step {g.first_step} ({how})"),
                    evidence=tuple(g.evidence), fix=FIX_ALIAS,
                    details={"stream": stream, "pages": g.pages, "count": g.count,
                             "reads": g.count, "first_step": g.first_step,
                             "provenance": how, **_shown(g)}))
        for stream, g in sorted(self.divergence.items()):
            out.append(Finding(
                rule="stream-divergence", severity=Severity.ERROR,
                title=(f"stream {stream} output diverges from the fully resident reference from "
                       f"step {g.first_step} (max |Δ| {g.extra['max_abs_delta']:.3g} > "
                       f"{g.extra['tolerance']:g}) in {g.count} step(s)"),
                evidence=tuple(g.evidence), fix=FIX_ALIAS,
                details={"stream": stream, "first_step": g.first_step, "count": g.count,
                         **g.extra, **_shown(g)}))
        out += self.adapt.findings()
        out += self._not_recorded()
        if self.end is None or self.end.status == "error":
            out.append(_incomplete(self.end, self.last_seq, max(self.steps, default=None)))
        return out

    def _provenance_source(self) -> str:
        r = self.residency
        if r.derived_reads and not r.annotated_reads:
            return "derived from served pages"
        if r.annotated_reads and not r.derived_reads:
            return "from the model's annotation"
        return "derived where served pages are recorded, else the model's annotation"

    def _not_recorded(self) -> list[Finding]:
        """What the trace does not record, as ``info`` findings: the rules that need it did not
        run on those events, which is not the same as finding nothing."""
        out: list[Finding] = []
        g = self.unrecorded_reads
        if g.count:
            out.append(Finding(
                rule="not-recorded", severity=Severity.INFO,
                title=(f"read provenance not recorded: {g.count} read(s) ({g.pages} page(s)) "
                       "carry neither served pages nor ranges, so stale and foreign page reads "
                       "were not judged for them"),
                evidence=tuple(g.evidence),
                fix="record the pages each read was served from (read.served, trace format 1.1)",
                details={"what": "read provenance", "count": g.count, "pages": g.pages,
                         **_shown(g)}))
        g = self.unrecorded_outputs
        if g.count:
            out.append(Finding(
                rule="not-recorded", severity=Severity.INFO,
                title=(f"stream divergence not recorded: {g.count} output(s) have no reference "
                       "(max |Δ| and tolerance), so divergence was not judged for them"),
                evidence=tuple(g.evidence),
                fix="record a fully resident reference per output (ref_checksum, "
                    "max_abs_delta, tolerance)",
                details={"what": "stream divergence", "count": g.count, **_shown(g)}))
        return out

    def summary(self) -> dict[str, Any]:
        counts = self.counts
        residency = self.residency.as_json()
        residency["provenance"]["out_of_range"] = self.provenance.out_of_range
        return {
            "events": sum(counts.values()),
            "counts": dict(counts),
            "steps": len(self.steps),
            "status": self.end.status if self.end else "incomplete",
            "residency": residency,
        }
