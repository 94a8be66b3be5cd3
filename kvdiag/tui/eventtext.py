"""One-line descriptions of trace events for the timeline (plain text; no textual import).

Each event becomes a summary string plus a *mark* naming why the row deserves attention
(``abort``, ``warn``, ``foreign``, ``stale``, ``fits-false``, ``diverged``, ``corrupt``) or
``""``; the widget turns marks into styles from the stylesheet. A read's classes and a fits
decision's outcome are the judgement's (:mod:`kvdiag.analysis.judgement`), never the model's
annotation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from kvdiag.analysis.judgement import FitsVerdict, outcome
from kvdiag.analysis.judgement.classes import FOREIGN, NO_UPLOAD, NO_WRITE, STALE, WHY_KEY
from kvdiag.analysis.judgement.fits import BAD
from kvdiag.analysis.replay import LastRead, judged_runs
from kvdiag.model import events as ev
from kvdiag.model.geometry import Tensor


def ptr(value: int | None) -> str:
    return "-" if value is None else f"0x{value:x}"


def _dims(dims: tuple[int, int, int, int]) -> str:
    # all zeros: the writer did not know the shape (an imported log; docs/log-import.md)
    return "?" if dims == (0, 0, 0, 0) else "[" + ",".join(map(str, dims)) + "]"


def ne(t: Tensor) -> str:
    return _dims(t.ne)


def nb(t: Tensor) -> str:
    return _dims(t.nb)


def kib(n: int | None) -> str:
    """``n`` bytes in KiB or MiB; null or negative (a writer's "unknown": docs/trace-format.md,
    ``upload``) is said, not drawn as "-0 KiB"."""
    if n is None or n < 0:
        return "bytes unknown"
    return f"{n / 1024:.0f} KiB" if n < (1 << 20) else f"{n / (1 << 20):.1f} MiB"


def _key(key: tuple[int, int | None, int]) -> str:
    layer, stream, page = key
    return f"({layer},{'-' if stream is None else stream},{page})"


MAX_LISTED = 8
"""Items of one list field spelled out in a summary; the rest are counted."""


def _listed(items: Sequence[str], what: str) -> str:
    """``items`` joined, the first :data:`MAX_LISTED` only, with the count when cut."""
    shown = " ".join(items[:MAX_LISTED])
    if len(items) > MAX_LISTED:
        shown += f" … (first {MAX_LISTED} of {len(items)} {what})"
    return shown


def _run(r0: int, r1: int) -> str:
    """A half-open run as its inclusive ends."""
    return f"{r0}" if r1 - r0 == 1 else f"{r0}-{r1 - 1}"


JUDGING = "judging…"
"""What a row past the judged prefix says instead of its verdict."""


class ReadJudged(NamedTuple):
    """The judgement of one read: pages exact, stale, foreign, not judged, and its non-exact
    runs (rows of the ledger's ``pieces`` table)."""

    counts: tuple[int, int, int, int]
    pieces: np.ndarray

    @property
    def mark(self) -> str:
        return "foreign" if self.counts[FOREIGN] else ("stale" if self.counts[STALE] else "")


def _holder(r: LastRead, layer: int, stream: int) -> str:
    """Whose bytes a foreign run's slot held."""
    if r.holder_layer < 0:
        return "empty slot"
    if r.holder_layer != layer:
        return f"L{r.holder_layer} s{r.holder} p{r.holder_page}'s"
    if r.holder != stream:
        return f"s{r.holder}'s"
    return f"p{r.holder_page}'s"


def _verdict(r: LastRead, layer: int, stream: int) -> str:
    if r.cls == "stale":
        return f" STALE -{r.lag}v"
    if r.cls == "foreign":
        return f" FOREIGN ({_holder(r, layer, stream)})"
    if r.cls == "not judged":
        key = WHY_KEY.get(r.why, "?")
        return f" NOT JUDGED ({key}{' not recorded' if r.why in (NO_UPLOAD, NO_WRITE) else ''})"
    return ""


def read_runs(event: ev.Read, judged: ReadJudged) -> str:
    """The read's served runs with the judgement's classes: exact runs by source, the others
    with their class (``STALE -2v``, ``FOREIGN (s1's)``)."""
    if not event.served:
        return "not judged: read.served not recorded (where each page came from is unknown)"
    runs = judged_runs(event.step, event.layer, event.stream, event.served,
                       [p[1:] for p in judged.pieces.tolist()])
    return "; ".join(f"{_run(b, e)} {r.source}{_verdict(r, event.layer, event.stream)}"
                     for b, e, r in runs)


def fits_mark(event: ev.Fits, outcome: str) -> str:
    """The row mark of a fits decision: ``abort`` where the kernel's assert fired, else
    ``fits-false`` for the outcomes the judgement calls bad (a mismatch, a fallback)."""
    if event.route == "abort":
        return "abort"
    return "fits-false" if outcome in BAD else ""


def describe(event: object, judged: ReadJudged | FitsVerdict | None = None
             ) -> tuple[str, str]:
    """``(summary, mark)`` for one decoded event; a read or fits event with the judgement's
    verdict on it (``judged``; a read without one is still being judged)."""
    match event:
        case ev.Step():
            slots = f" slots {','.join(map(str, event.slots))}" if event.slots else ""
            return (f"{event.phase} streams {','.join(map(str, event.streams))} "
                    f"tokens {event.tokens} n_kv {event.n_kv}{slots}", "")
        case ev.Learn():
            if event.relearn and event.layer < 0:
                return "relearn: layer maps cleared", ""
            return f"layer {event.layer} <- K {ptr(event.k_ptr)}", ""
        case ev.Fits():
            verdict = "true" if event.result else "FALSE"
            text = f"{event.node} fits={verdict} route {event.route}"
            failed = judged.failed if isinstance(judged, FitsVerdict) else event.failed
            if failed:
                text += f" failed: {', '.join(failed)}"
                if isinstance(judged, FitsVerdict) and judged.by == "kvdiag":
                    text += " (evaluated by kvdiag)"
            return text, fits_mark(event, judged.outcome if isinstance(judged, FitsVerdict)
                                   else outcome(event))
        case ev.Write():
            text = f"cells {event.cells[0]}-{event.cells[1]} rows {event.rows[0]}-{event.rows[1]}"
            if event.dirty:
                # format 1.1: only the keys this write's own rows marked
                text += " marked " + _listed([_key(k) for k in event.dirty], "keys")
            if event.versions:
                text += " v " + " ".join(f"p{p}={v}" for p, v in event.versions)
            return text, ""
        case ev.Mark():
            runs = _listed([_run(r0, r1) for r0, r1 in event.rows], "runs")
            text = f"rows {runs}: "
            if event.all:
                text += "a negative row: EVERY page dirty"
            elif event.keys:
                text += "marked " + _listed([_key(k) for k in event.keys], "keys")
            else:
                text += "marked no key"
            if not event.outside:
                return text, ""
            pairs = _listed([f"({'-' if s is None else s},{p})" for s, p in event.outside],
                            "pages")
            return (text + f"; outside the window: {pairs}: their resident copies are never "
                    "refreshed", "outside")
        case ev.Upload():
            pages = event.pages
            rng = f"{pages[0]}" if pages[1] - pages[0] == 1 else f"{pages[0]}-{pages[1] - 1}"
            key = "" if event.target == "ring" else (
                " key (layer,page)" if event.key_stream is None
                else f" key stream {event.key_stream}")
            return (f"{event.target} pages {rng} -> slot {event.slot} ({event.reason}) "
                    f"{kib(event.bytes)}{key}", "")
        case ev.Evict():
            return (f"slot {event.slot} dropped L{event.layer} s{event.stream} p{event.page} "
                    f"({event.reason})", "")
        case ev.Read():
            text = f"pool {event.pool} ring {event.ring} host {event.host}: "
            if not isinstance(judged, ReadJudged):
                return text + JUDGING, ""
            return text + read_runs(event, judged), judged.mark
        case ev.Abort():
            return event.message, "abort"
        case ev.Warn():
            code = f"[{event.code}] " if event.code else ""
            return f"{code}{event.message}", "warn"
        case ev.Output():
            bad = event.diverged
            if bad is None:
                return f"crc {event.checksum} (no reference recorded)", ""
            rel = ">" if bad else "<="
            return (f"crc {event.checksum} ref {event.ref_checksum} max|d| "
                    f"{event.max_abs_delta:.3g} {rel} {event.tolerance:g}"
                    + (f" worst layer {event.worst_layer}" if event.worst_layer is not None
                       else ""), "diverged" if bad else "")
        case ev.Telemetry():
            parts = []
            if event.mem_used is not None:
                total = f"/{event.mem_total / (1 << 30):.1f}" if event.mem_total else ""
                parts.append(f"VRAM {event.mem_used / (1 << 30):.2f}{total} GiB")
            if event.gpu_util is not None:
                parts.append(f"util {event.gpu_util}%")
            if event.pcie_rx_kbps is not None or event.pcie_tx_kbps is not None:
                parts.append(f"PCIe rx {event.pcie_rx_kbps} tx {event.pcie_tx_kbps} KB/s")
            if event.sm_clock_mhz is not None:
                parts.append(f"SM {event.sm_clock_mhz} MHz")
            return " ".join(parts) or "(no fields)", ""
        case ev.Records():
            return "now also records " + _listed(list(event.kinds), "kinds"), ""
        case ev.Snapshot():
            return (f"segment starts ({event.reason or 'snapshot'}): "
                    f"{sum(len(c.versions) for c in event.pool)} pool and "
                    f"{sum(len(c.versions) for c in event.ring)} ring slots held, "
                    f"{sum(len(v.versions) for v in event.versions)} host pages"), ""
        case ev.End():
            return f"{event.status}: {event.steps} steps, {event.events} events", (
                "" if event.status == "completed" else "abort")
        case ev.Unknown():
            return f"{event.kind} {msgspec.json.encode(event.fields).decode()[:200]}", ""
        case _:
            fields = getattr(event, "__struct_fields__", ())
            text = " ".join(f"{f}={getattr(event, f)!r}" for f in fields
                            if f not in ("seq", "t_ns", "step"))
            return text[:300], ""
