"""Fits and outputs are counted, judged and tabled alike by every way events reach the Judge.

A list of events (``Judge.feed_all(list)``: the TUI, ``trace pages``), a stream taken out in
Python (``KVDIAG_COMPILED=0``, or a block the C pass declines) and a stream taken out in C
(``columns.c``'s accumulator: ``kvdiag check``) used to keep the fits and outputs books in
two implementations, which disagreed on a route the judgement does not know (counted under its
own name by one, dropped by the other) and on a route that is not a string (a crash in one).
Random events with every route (unknown strings and non-strings too), both results, outputs
with and without a reference go through all three; the summary, the findings and the ledger
must be equal, and equal to what the events say when counted here by hand.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag import compiled
from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement import columns as columns_module
from kvdiag.analysis.judgement.fits import OUTCOMES, UNKNOWN_ROUTE, route_name
from kvdiag.model import events as ev
from kvdiag.trace import make_header
from kvdiag.trace.writer import TraceWriter
from tests.corpus import cli
from tests.test_compiled_columns import _BLANK
from tests.test_judgement_fastpath import _small_chunks, _trace

ROUTES: tuple[Any, ...] = ("streamed", "streamed", "fallback", "abort", "ordinary", "split",
                           "Streamed", "", None, 7)
"""Routes drawn: the four the judgement knows, strings it does not, and values that are not
strings at all (the schema's Literal is not checked when an event is made in Python)."""


def _expected_outcome(route: Any, result: bool) -> str:
    """fits.py's rule, written out again (the judgement must say this for every way in)."""
    if route == "fallback":
        return "fallback"
    if route in ("streamed", "abort") and not result:
        return "mismatch"
    if route == "streamed":
        return "streamed"
    if route == "ordinary":
        return "ordinary"
    return "other"


def _events(seed: int, routes: tuple[Any, ...] = ROUTES) -> list[Any]:
    """A random page trace with fits decisions and outputs between its events: every route of
    ``routes``, both results, outputs diverged, within tolerance, without a reference (a
    run long enough to fill the no-reference finding's evidence) and with a NaN delta."""
    rng = random.Random(seed)
    out: list[Any] = []
    page_events = _trace(seed)
    burst = rng.randrange(len(page_events) // 2)
    for at, e in enumerate(page_events):
        out.append(e)
        if at == burst:  # the no-reference finding's evidence fills within a block
            out += [ev.Output(e.seq, 0, e.step, stream=0, checksum=f"{k:02x}")
                    for k in range(25)]
        r = rng.random()
        if r < 0.2:
            out.append(ev.Fits(e.seq, 0, e.step, node=f"fa-{rng.randrange(3)}",
                               layer=rng.randrange(4), q=_BLANK, k=_BLANK, v=_BLANK,
                               dst=_BLANK, stage_bytes=1, result=rng.random() < 0.6,
                               route=rng.choice(routes)))
        elif r < 0.3:
            kind = rng.randrange(4)
            delta = (None, rng.random(), 0.9, math.nan)[kind]
            tol = None if kind == 0 else 0.5
            out.append(ev.Output(e.seq, 0, e.step, stream=rng.randrange(2), checksum="0a",
                                 max_abs_delta=delta, tolerance=tol,
                                 worst_layer=None if kind == 0 else 1))
    last = out[-1]
    out.append(ev.End(last.seq + 1, 0, last.step, status="completed", steps=last.step + 1,
                      events=len(out)))
    return [msgspec.structs.replace(e, seq=i + 1) for i, e in enumerate(out)]


def _judged(judge: Judge) -> tuple[Any, ...]:
    snap = judge.snapshot()
    led = snap.ledger
    tables = ((led.fits.array.tolist(), led.outputs.array.tolist(), led.reads.array.tolist())
              if led is not None else None)
    return tables, msgspec.json.encode([snap.summary(), list(snap.findings)])


def _held(events: list[Any], ledger: bool) -> Judge:
    """Fed as the TUI's judging process feeds a followed file: many small streams, each
    one's pages held for the next (``hold``)."""
    judge = Judge(ledger=ledger)
    for at in range(0, len(events), 37):
        judge.feed_all(iter(events[at:at + 37]), hold=True)
    return judge


def _three_ways(monkeypatch: pytest.MonkeyPatch, events: list[Any], ledger: bool
                ) -> list[tuple[Any, ...]]:
    """The events judged as a list, streamed in C (where built) and streamed in Python (each
    stream also fed in small held pieces: the same result is asserted here)."""
    _small_chunks(monkeypatch)
    got = [_judged(Judge(ledger=ledger).feed_all(list(events))),
           _judged(Judge(ledger=ledger).feed_all(iter(events)))]
    assert _judged(_held(events, ledger)) == got[-1]
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    got.append(_judged(Judge(ledger=ledger).feed_all(iter(events))))
    assert _judged(_held(events, ledger)) == got[-1]
    return got


@pytest.mark.parametrize(("seed", "routes"), [
    *((seed, ROUTES) for seed in range(6)),
    # strings only: the C accumulator once dropped these from the counts the others kept
    *((seed, ("streamed", "fallback", "abort", "ordinary", "split", "")) for seed in (6, 7))])
def test_fits_and_outputs_are_booked_alike_every_way(monkeypatch: pytest.MonkeyPatch,
                                                     seed: int, routes: tuple[Any, ...]
                                                     ) -> None:
    """GIVEN random events with fits of every route (unknown strings, null, a number) and
    result, and outputs of every kind
    WHEN they are judged as a list, streamed through C and streamed in Python, with and
    without a ledger
    THEN the ledgers' fits, outputs and reads tables, the summaries and the findings are equal;
    the routes are counted per name as the events give them (a non-string under
    "unknown route"), the fits outcomes are the rule's, and every output without a reference
    is counted."""
    events = _events(seed, routes)
    fits = [e for e in events if isinstance(e, ev.Fits)]
    outputs = [e for e in events if isinstance(e, ev.Output)]
    for ledger in (True, False):
        listed, in_c, in_py = _three_ways(monkeypatch, events, ledger)
        monkeypatch.undo()
        assert in_c == listed
        assert in_py == listed
    tables, doc = listed
    assert tables is None
    summary, findings = msgspec.json.decode(doc)
    want = Counter(r if isinstance(r, str) else "unknown route" for r in (e.route for e in fits))
    assert summary["residency"]["routes"] == dict(sorted(want.items()))
    assert summary["counts"]["fits"] == len(fits) and summary["counts"]["output"] == len(outputs)
    unreferenced = sum(e.diverged is None for e in outputs)
    (nr,) = [f for f in findings if f["title"].startswith("stream divergence not recorded")]
    assert nr["details"]["count"] == unreferenced > 20  # past the evidence kept
    bad = Counter(_expected_outcome(e.route, e.result) for e in fits)
    shown = {f["rule"]: f["details"]["count"] for f in findings
             if f["rule"] in ("fits-dispatch-mismatch", "fallback")}
    # grouped by failed conditions: sum the groups
    per_rule: Counter[str] = Counter()
    for f in findings:
        if f["rule"] in shown:
            per_rule[f["rule"]] += f["details"]["count"]
    assert per_rule["fits-dispatch-mismatch"] == bad["mismatch"] > 0
    assert per_rule["fallback"] == bad["fallback"] > 0
    with_ledger = _judged(Judge(ledger=True).feed_all(list(events)))
    fits_rows, output_rows, _ = with_ledger[0]
    assert [OUTCOMES[row[4]] for row in fits_rows] == [
        _expected_outcome(e.route, e.result) for e in fits]
    assert [row[1] for row in fits_rows] == [e.seq for e in fits]
    assert [row[4] for row in output_rows] == [
        -1 if e.diverged is None else int(e.diverged) for e in outputs]


def test_a_route_is_named_as_the_summary_counts_it() -> None:
    """The name a route is counted under: its own where it is a string, "unknown route"
    where it is not (null, a number, a list)."""
    assert route_name("streamed") == "streamed"
    assert route_name("split") == "split"
    assert route_name(None) == route_name(7) == route_name([1]) == UNKNOWN_ROUTE
    assert UNKNOWN_ROUTE == "unknown route"


def test_an_unhashable_route_is_counted_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a fits decision whose route is a list (an event made in Python)
    WHEN it is judged every way
    THEN it is counted under "unknown route", its outcome "other", alike everywhere."""
    events = _events(1, routes=("streamed", ["streamed"], "fallback"))
    listed, in_c, in_py = _three_ways(monkeypatch, events, ledger=True)
    assert in_c == listed and in_py == listed
    summary, _ = msgspec.json.decode(listed[1])
    n = sum(isinstance(e, ev.Fits) and isinstance(e.route, list) for e in events)
    assert n and summary["residency"]["routes"]["unknown route"] == n


def test_the_c_pass_keeps_a_block_with_an_unknown_route(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The C accumulator takes out a block with routes it does not know (no fallback to the
    Python path), codes them as the Python columns do, and hands those decisions to Python,
    which names them."""
    acc = columns_module.accumulator(())
    if acc is None:
        pytest.skip("no C compiler here")
    routes = ("streamed", "split", None, "ordinary", 7, ["streamed"], "abort")
    fits = [ev.Fits(i + 1, 0, 0, node="fa", layer=0, q=_BLANK, k=_BLANK, v=_BLANK, dst=_BLANK,
                    stage_bytes=1, result=True, route=route)  # type: ignore[arg-type]
            for i, route in enumerate(routes)]
    assert acc.add(fits, 0, False) == [1, 2, 4, 5]
    want = [0, 4, 4, 3, 4, 4, 2]
    assert columns_module.taken(acc).f_route.tolist() == want
    assert columns_module.extract_py(fits, [ev.Fits] * len(fits), False).f_route.tolist() == want


def _write(path: Path, routes: list[str]) -> None:
    with TraceWriter.create(path, make_header("synthetic", ev.Device("test"))) as w:
        w.emit(ev.Step, 0, phase="decode", streams=(0,), tokens=1, n_kv=256)
        for i, route in enumerate(routes):
            w.emit(ev.Fits, 0, node=f"fa-{i}", layer=i, q=_BLANK, k=_BLANK, v=_BLANK,
                   dst=_BLANK, stage_bytes=1, result=i % 2 == 0, route=route)  # type: ignore[arg-type]
            w.emit(ev.Output, 0, stream=0, checksum="0a")


@pytest.mark.parametrize("routes", [["streamed", "split", "fallback", "bogus", "abort"],
                                    ["split"] * 3])
def test_check_json_of_unknown_routes_is_the_same_without_c(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, routes: list[str]) -> None:
    """GIVEN a trace file whose fits lines name routes the format does not define
    WHEN ``kvdiag check --json`` reads it with and without the C passes
    THEN the output is byte-identical, each such line is reported (not read as a decision)
    and the routes counted are the known ones'."""
    path = tmp_path / "t.kvtrace"
    _write(path, routes)
    code, with_c = cli("check", "--json", str(path))
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    code0, without = cli("check", "--json", str(path))
    assert (code0, without) == (code, with_c)
    doc = msgspec.json.decode(with_c)
    known = [r for r in routes if r in ("streamed", "fallback", "abort", "ordinary")]
    assert doc["summary"]["residency"]["routes"] == dict(sorted(Counter(known).items()))
    unknown = len(routes) - len(known)
    assert doc["summary"]["counts"].get("fits", 0) == len(known)
    assert sum("invalid fits event" in p["message"] for p in doc["summary"]["problems"]) == unknown
