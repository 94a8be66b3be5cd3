"""Compare two traces of one schedule and explain their first divergence (exit 1; a run that
crashed, or stopped without completing, is not equivalent to one that completed), or say they
are equivalent (exit 0); bad input, different schedules (without --force), traces with
nothing in common to compare, and traces that agree in what both hold but lost events (gaps
in seq: verdict ``lost-events``, for what the lost events held is not compared) exit 2 —
neither verdict, as ``check`` leaves unjudged what a trace does not record."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="first trace (.kvtrace), e.g. upstream or model")
    parser.add_argument("b", metavar="B", help="second trace, e.g. patched or native")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--force", action="store_true",
                        help="compare even when the step schedules differ")


def run(args: argparse.Namespace) -> int:
    from kvdiag.analysis.diff import Differ, ScheduleMismatch
    from kvdiag.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, InputError
    from kvdiag.trace.reader import TraceReader

    with TraceReader.open(args.a) as ra, TraceReader.open(args.b) as rb:
        try:
            result = Differ(force=args.force).run(ra, rb)
        except ScheduleMismatch as exc:
            raise InputError(str(exc)) from None
        problems = {"A": [f"line {p.line}: {p.message}" for p in ra.problems],
                    "B": [f"line {p.line}: {p.message}" for p in rb.problems]}
    verdict = result.verdict
    doc: dict[str, Any] = {
        "a": args.a, "b": args.b, "verdict": verdict,
        # null, not false, when nothing was compared or events are lost: neither verdict
        "equivalent": None if verdict in _NO_VERDICT else result.equivalent,
        "lost_before_first": result.lost_before_first(),
        "steps_compared": result.steps_compared,
        "steps": {"a": result.lengths[0], "b": result.lengths[1]},
        "ends": {"a": result.ends[0], "b": result.ends[1]},
        "schedule_differs": result.schedule,
        "first": result.first.as_json() if result.first else None,
        "effect": result.effect.as_json() if result.effect and result.effect is not result.first
        else None,
        "chain": result.chain,
        "compared": result.compared,
        "problems": problems,
    }
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_text(doc))
    if verdict in _NO_VERDICT:
        return EXIT_USAGE
    return EXIT_OK if result.equivalent else EXIT_FINDINGS


_NO_VERDICT = ("nothing-compared", "lost-events")
"""Verdicts that are neither equivalent nor divergent (exit 2)."""


def _where(d: dict[str, Any]) -> str:
    parts = [f"step {d['step']}"]
    if d["layer"] is not None:
        parts.append(f"layer {d['layer']}")
    if d["stream"] is not None:
        parts.append(f"stream {d['stream']}")
    return " ".join(parts)


def _text(doc: dict[str, Any]) -> str:
    from kvdiag.analysis.judgement.gaps import lost_text, lost_where

    lines = []
    for side in ("a", "b"):
        end = doc["ends"][side]
        lines.append(f"{side.upper()} {doc[side]} ({doc['steps'][side]} step(s), "
                     f"{end['status']})")
        lines += [f"{side.upper()}: abort at step {a['step']} (#{a['seq']}): {a['message']}"
                  for a in end["aborts"]]
        lost_line = lost_text(end["lost_events"])
        if lost_line:
            lines.append(f"{side.upper()}: {lost_line}")
    for side, found in doc["problems"].items():
        lines += [f"{side}: trace problem at {p}" for p in found]
    if doc["schedule_differs"]:
        lines.append(f"schedules differ (compared with --force): {doc['schedule_differs']}")
    first = doc["first"]
    c = doc["compared"]
    lines.append(f"compared {c['writes']} write(s) of the same rows, {c['routes']} FA "
                 f"route(s), {c['reads']} read(s) page by page and {c['outputs']} output(s)"
                 + (f"; not recorded, so not compared: {c['reads_not_recorded']} read(s) without "
                    "served pages" if c["reads_not_recorded"] else "")
                 + (f", {c['outputs_not_recorded']} output(s) without a reference"
                    if c["outputs_not_recorded"] else ""))
    if doc["verdict"] == "nothing-compared":
        lines.append(f"not comparable: the traces have nothing in common in "
                     f"{doc['steps_compared']} aligned step(s) (no write of the same rows, FA "
                     "route, read with served pages or output with a reference on both "
                     "sides), so they are not shown equivalent")
        return "\n".join(lines) + "\n"
    lost = {s.upper(): doc["ends"][s]["lost_events"] for s in "ab"
            if doc["ends"][s]["lost_events"]["events"]}
    if doc["verdict"] == "lost-events":
        said = "; ".join(f"{side} lost {lost_where(v)}" for side, v in lost.items())
        lines.append(f"not shown equivalent (events lost): no divergence in "
                     f"{doc['steps_compared']} aligned step(s) over what both traces hold, but "
                     f"{said}: what they held is not compared")
        return "\n".join(lines) + "\n"
    if first is None:
        lines.append(f"equivalent: no divergence in {doc['steps_compared']} aligned step(s)")
        return "\n".join(lines) + "\n"
    lines.append(f"first divergence ({first['kind']}) at {_where(first)}: {first['text']}")
    if doc["lost_before_first"]:
        sides = " and ".join(s.upper() for s in doc["lost_before_first"])
        lines.append(f"events lost in {sides} come before it (above): an earlier divergence "
                     "may be among them")
    if doc["effect"]:
        e = doc["effect"]
        lines.append(f"first effect ({e['kind']}) at {_where(e)}: {e['text']}")
    if doc["chain"]:
        lines.append("cause chain:")
        lines += [f"  {c}" for c in doc["chain"]]
    return "\n".join(lines) + "\n"
