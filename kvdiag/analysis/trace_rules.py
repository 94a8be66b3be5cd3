"""Findings over a capture trace: one streaming pass, bounded memory.

Rule ids (stable; CI scripts match on them): ``fits-dispatch-mismatch``, ``abort``,
``fallback``, ``stale-page-read``, ``foreign-page-read``, ``stream-divergence``,
``trace-incomplete``. Residency statistics go to the summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvdiag.model import events as ev
from kvdiag.model.conditions import observed
from kvdiag.model.findings import Evidence, Finding, Severity

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
    evidence: list[Evidence] = field(default_factory=list)
    first_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, evidence: Evidence) -> None:
        self.count += 1
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

    def __init__(self) -> None:
        self.mismatch: dict[tuple[str, ...], _Group] = {}
        self.fallback: dict[tuple[str, ...], _Group] = {}
        self.aborts: list[ev.Abort] = []
        self.stale: dict[int, _Group] = {}
        self.foreign: dict[int, _Group] = {}
        self.divergence: dict[int, _Group] = {}
        self.residency = Residency()
        self._type_counts: dict[type, int] = {}
        self._unknown_counts: Counter[str] = Counter()
        self.steps: set[int] = set()
        self.end: ev.End | None = None
        self.last_seq = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.Step: self._step, ev.Fits: self._fits, ev.Read: self._read,
            ev.Upload: self._upload, ev.Evict: self._evict, ev.Abort: self.aborts.append,
            ev.Output: self._output, ev.End: self._end,
        }

    @property
    def counts(self) -> Counter[str]:
        """Events per kind."""
        out: Counter[str] = Counter(self._unknown_counts)
        for cls, n in self._type_counts.items():
            if cls is not ev.Unknown:
                out[cls.__struct_config__.tag] += n  # type: ignore[attr-defined]
        return out

    def feed(self, event: ev.AnyEvent | ev.Unknown) -> None:
        # one dict dispatch per event: analysis runs over millions of them
        cls = type(event)
        counts = self._type_counts
        counts[cls] = counts.get(cls, 0) + 1
        self.last_seq = event.seq
        handler = self._handlers.get(cls)
        if handler is not None:
            handler(event)
        elif cls is ev.Unknown:
            self._unknown_counts[event.kind] += 1  # type: ignore[union-attr]

    def feed_all(self, events: Iterable[ev.AnyEvent | ev.Unknown]) -> TraceAnalyzer:
        feed = self.feed
        for e in events:
            feed(e)
        return self

    def _step(self, e: ev.Step) -> None:
        self.steps.add(e.step)

    def _upload(self, e: ev.Upload) -> None:
        r = self.residency
        n = e.pages[1] - e.pages[0]
        r.uploads[e.target] += 1
        r.upload_pages[e.target] += n
        r.upload_bytes[e.target] += e.bytes
        r.upload_reasons[e.reason] += n

    def _evict(self, e: ev.Evict) -> None:
        self.residency.evictions += 1

    def _end(self, e: ev.End) -> None:
        self.end = e

    def _output(self, e: ev.Output) -> None:
        if e.diverged:
            assert e.max_abs_delta is not None
            g = self.divergence.setdefault(e.stream, _Group())
            g.add(Evidence(seq=e.seq, step=e.step, stream=e.stream, layer=e.worst_layer,
                           text=f"max |Δ| {e.max_abs_delta:.3g}"))
            g.extra["max_abs_delta"] = max(g.extra.get("max_abs_delta", 0.0), e.max_abs_delta)
            g.extra["tolerance"] = e.tolerance

    def _fits(self, e: ev.Fits) -> None:
        self.residency.routes[e.route] += 1
        # each failed condition with the logged values it tested: "Q.ne[3]==1 (Q.ne[3]=2)"
        tensors = {"Q": e.q, "K": e.k, "V": e.v, "mask": e.mask, "dst": e.dst}
        shown = ", ".join(observed(c, tensors) for c in e.failed)
        evidence = Evidence(seq=e.seq, step=e.step, layer=e.layer,
                            text=f"{e.node}: failed: {shown}" if e.failed else e.node)
        group: _Group | None = None
        if not e.result and e.route in ("streamed", "abort"):
            group = self.mismatch.setdefault(e.failed, _Group())
        elif e.route == "fallback":
            group = self.fallback.setdefault(e.failed, _Group())
        if group is not None:
            group.add(evidence)
            group.extra.setdefault("shown", shown)  # the first node's values, for the title

    def _read(self, e: ev.Read) -> None:
        r = self.residency
        r.pool_pages_read += e.pool
        r.ring_pages_read += e.ring
        r.host_pages_read += e.host
        for rng in e.ranges:
            n = rng.end - rng.begin
            if rng.cls == "exact":
                r.exact_pages += n
                continue
            if rng.cls == "stale":
                r.stale_pages += n
                target = self.stale
                text = f"pages {rng.begin}..{rng.end - 1} are {rng.version_lag} write(s) old"
            else:
                r.foreign_pages += n
                target = self.foreign
                text = (f"pages {rng.begin}..{rng.end - 1} hold stream {rng.holder}'s bytes"
                        if rng.holder >= 0 else f"pages {rng.begin}..{rng.end - 1} never uploaded")
            target.setdefault(e.stream, _Group()).add(
                Evidence(seq=e.seq, step=e.step, layer=e.layer, stream=e.stream, page=rng.begin,
                         text=text))

    # -- results -------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for failed, g in self.mismatch.items():
            out.append(Finding(
                rule="fits-dispatch-mismatch", severity=Severity.CRITICAL,
                title=(f"FA node routed to the streamed kernel while fits() was false "
                       f"(failed: {g.extra['shown']}) — {g.count} node(s)"),
                evidence=tuple(g.evidence), fix=FIX_DISPATCH,
                details={"failed": list(failed), "count": g.count, "first_step": g.first_step}))
        for a in self.aborts:
            out.append(Finding(
                rule="abort", severity=Severity.CRITICAL, title=a.message,
                evidence=(Evidence(seq=a.seq, step=a.step, text=a.condition or a.message),),
                fix=_abort_fix(a.condition),
                details={"file": a.file, "line": a.line, "condition": a.condition,
                         "backtrace": list(a.backtrace), "cuda_error": a.cuda_error}))
        for failed, g in self.fallback.items():
            out.append(Finding(
                rule="fallback", severity=Severity.WARNING,
                title=(f"{g.count} FA node(s) fell back to ordinary flash attention over the "
                       f"host buffer (zero-copy): failed: {g.extra['shown']}"),
                evidence=tuple(g.evidence),
                fix="expected with several KV streams per ubatch; use --kv-unified to keep "
                    "the streamed path",
                details={"failed": list(failed), "count": g.count, "first_step": g.first_step}))
        for rule, groups, what in (("stale-page-read", self.stale, "stale"),
                                   ("foreign-page-read", self.foreign, "another stream's")):
            for stream, g in sorted(groups.items()):
                out.append(Finding(
                    rule=rule, severity=Severity.ERROR,
                    title=(f"stream {stream} read {what} resident pages in {g.count} read(s), "
                           f"first at step {g.first_step}"),
                    evidence=tuple(g.evidence), fix=FIX_ALIAS,
                    details={"stream": stream, "count": g.count, "first_step": g.first_step}))
        for stream, g in sorted(self.divergence.items()):
            out.append(Finding(
                rule="stream-divergence", severity=Severity.ERROR,
                title=(f"stream {stream} output diverges from the fully resident reference from "
                       f"step {g.first_step} (max |Δ| {g.extra['max_abs_delta']:.3g} > "
                       f"{g.extra['tolerance']:g}) in {g.count} step(s)"),
                evidence=tuple(g.evidence), fix=FIX_ALIAS,
                details={"stream": stream, "first_step": g.first_step, "count": g.count,
                         **g.extra}))
        if self.end is None or self.end.status == "error":
            out.append(_incomplete(self.end, self.last_seq, max(self.steps, default=None)))
        return out

    def summary(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "events": sum(counts.values()),
            "counts": dict(counts),
            "steps": len(self.steps),
            "status": self.end.status if self.end else "incomplete",
            "residency": self.residency.as_json(),
        }
