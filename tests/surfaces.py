"""What each surface says about a trace, against its judgement (tests/corpus.py's
:func:`~corpus.judged`): each function runs one surface on a list of traces and returns every
disagreement, said precisely (trace, read, page, what each side says). Not a test module."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from corpus import Entry, cli, judged

from kvdiag.model.findings import Severity


def check_disagreements(entries: Iterable[Entry]) -> list[str]:
    """``check --json``: page counts by class, steps, status, every finding (rule,
    severity, title) — the not-recorded ones included — and the exit code they make."""
    bad: list[str] = []
    for e in entries:
        j = judged(e.path).judgement
        code, out = cli("check", "--json", str(e.path))
        doc = json.loads(out)
        s = doc["summary"]
        got_classes = s["residency"].get("read_classes")
        if got_classes != j.residency["read_classes"]:
            bad.append(f"{e.name}: page classes: judgement {j.residency['read_classes']}, "
                       f"check {got_classes}")
        if s["steps"] != j.steps.count:
            bad.append(f"{e.name}: steps: judgement {j.steps.count}, check {s['steps']}")
        if s["status"] != j.status:
            bad.append(f"{e.name}: status: judgement {j.status}, check {s['status']}")
        if s["lost_events"] != j.summary()["lost_events"]:
            bad.append(f"{e.name}: events lost: judgement {j.lost}, check {s['lost_events']}")
        want = sorted((f.rule, f.severity.label, f.title) for f in j.findings)
        got = sorted((f["rule"], f["severity"], f["title"]) for f in doc["findings"])
        if got != want:
            bad.append(f"{e.name}: findings: only in the judgement {sorted(set(want) - set(got))}"
                       f"; only in check {sorted(set(got) - set(want))}")
        failing = any(f.severity >= Severity.ERROR for f in j.findings)
        if code != (1 if failing else 0):
            bad.append(f"{e.name}: exit {code} where the judgement's findings make "
                       f"{1 if failing else 0}")
    return bad


def info_disagreements(entries: Iterable[Entry]) -> list[str]:
    """``trace info --json``: events per kind, the steps (the span and the judgement's
    count), page classes, findings by severity and what is not recorded."""
    bad: list[str] = []
    for e in entries:
        j = judged(e.path).judgement
        _, out = cli("trace", "info", "--json", str(e.path))
        info = json.loads(out)
        said = info["judgement"]
        if info["counts"] != j.counts:
            bad.append(f"{e.name}: events per kind: judgement {j.counts}, info {info['counts']}")
        first, last = info["first_step"], info["last_step"]
        span = 0 if first is None else last - first + 1
        if span != j.steps.count or said["steps"] != j.steps.count:
            bad.append(f"{e.name}: steps: judgement {j.steps.count} ({j.steps.text()}), "
                       f"info {said['steps']}, its span {span} ({first}..{last})")
        if said["residency"]["read_classes"] != j.residency["read_classes"]:
            bad.append(f"{e.name}: page classes: judgement {j.residency['read_classes']}, "
                       f"info {said['residency']['read_classes']}")
        by_severity = Counter(f.severity.label for f in j.findings)
        if {k: n for k, n in said["findings"].items() if n} != dict(by_severity):
            bad.append(f"{e.name}: findings by severity: judgement {dict(by_severity)}, "
                       f"info {said['findings']}")
        if said["completeness"] != j.completeness.as_json():
            bad.append(f"{e.name}: completeness: judgement {j.completeness.as_json()}, "
                       f"info {said['completeness']}")
    return bad


def pages_disagreements(entries: Iterable[Entry]) -> list[str]:
    """``trace pages --json``: every judged page, once, with its class and writes missed;
    a read without served runs as one line counting its pages not judged; the totals."""
    bad: list[str] = []
    for e in entries:
        j = judged(e.path)
        _, out = cli("trace", "pages", str(e.path), "--json")
        listed: dict[tuple[int, int], tuple[str, int]] = {}
        totals: Counter[str] = Counter()
        for line in out.splitlines():
            p = json.loads(line)
            if p["page"] is None:
                totals[p["class"].replace(" ", "_")] += p["pages"]
                continue
            key = (p["seq"], p["page"])
            if key in listed:
                bad.append(f"{e.name}: read #{key[0]} page {key[1]} listed twice")
            listed[key] = (p["class"], p["lag"])
            totals[p["class"].replace(" ", "_")] += 1
        for key in sorted(set(listed) | set(j.pages)):
            if listed.get(key) != j.pages.get(key):
                bad.append(f"{e.name}: read #{key[0]} page {key[1]}: judgement "
                           f"{j.pages.get(key)}, trace pages {listed.get(key)}")
        want = {k: n for k, n in j.judgement.residency["read_classes"].items() if n}
        if dict(totals) != want:
            bad.append(f"{e.name}: pages per class: judgement {want}, trace pages "
                       f"{dict(totals)}")
    return bad


def export_command_disagreements(entries: Iterable[Entry], out_dir: Path
                                 ) -> list[str]:
    """``trace export``: every read's label and page classes, every flow, the closing
    judgement and what is not recorded; the command's own line says the same counts."""
    bad: list[str] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for e in entries:
        out = out_dir / f"{e.path.stem}.json"
        code, said = cli("trace", "export", str(e.path), "-o", str(out))
        assert code == 0, said
        bad += export_disagreements(e.name, e.path, json.loads(out.read_bytes()))
        j = judged(e.path)
        rc = j.judgement.residency["read_classes"]
        line = (f"({len(j.flows):,} flow{'' if len(j.flows) == 1 else 's'} from writes to "
                f"reads that missed them; pages exact {rc['exact']:,}, stale {rc['stale']:,}, "
                f"foreign {rc['foreign']:,}, not judged {rc['not_judged']:,})")
        if line not in said:
            bad.append(f"{e.name}: export says {said.strip()!r}, the judgement {line!r}")
    return bad


def self_diff_disagreements(entries: Iterable[Entry]) -> list[str]:
    """``diff A A``: a trace is equivalent to itself — unless it holds nothing diff compares
    (no read, write, fits or output event: a header and End, an imported log without them),
    which diff refuses to call equivalent (exit 2, verdict ``nothing-compared``), or it lost
    events (gaps in seq, as its judgement says): what they held is not compared, so neither
    is it shown equivalent (exit 2, verdict ``lost-events``)."""
    bad: list[str] = []
    for e in entries:
        code, out = cli("diff", str(e.path), str(e.path), "--json")
        doc = json.loads(out) if out.startswith("{") else {}
        j = judged(e.path).judgement
        counts = j.counts
        if not any(counts.get(k) for k in ("read", "write", "fits", "output")):
            if code != 2 or doc.get("verdict") != "nothing-compared":
                bad.append(f"{e.name}: holds nothing to compare, diff with itself: exit {code}, "
                           f"{doc.get('verdict')}")
            continue
        lost = j.summary()["lost_events"]["events"]
        if lost:
            said = [doc.get("ends", {}).get(s, {}).get("lost_events", {}).get("events")
                    for s in "ab"]
            if (code, doc.get("verdict"), doc.get("equivalent"), said) != (
                    2, "lost-events", None, [lost, lost]):
                bad.append(f"{e.name}: lost {lost} event(s), diff with itself: exit {code}, "
                           f"{doc.get('verdict')}, lost {said}")
            continue
        if code != 0 or not doc.get("equivalent"):
            bad.append(f"{e.name}: diff with itself: exit {code}, "
                       f"{doc.get('first') or out.strip()[:300]}")
    return bad


def pair_diff_disagreements(pairs: Iterable[tuple[Entry, Entry]]) -> tuple[list[str], int]:
    """``diff A B`` of two traces of one schedule (shared, per-stream): where diff finds a
    read whose page came differently, the class it gives each side is that trace's judgement
    of the page, and one of them is not exact; where it finds them equivalent, the judgement
    counts the same pages of each class in both. Also returns how many divergent reads diff
    named."""
    bad: list[str] = []
    divergent = 0
    for e, other in pairs:
        _, out = cli("diff", str(e.path), str(other.path), "--json")
        doc = json.loads(out)
        ja, jb = judged(e.path), judged(other.path)
        if doc["equivalent"]:
            if ja.judgement.residency["read_classes"] != jb.judgement.residency["read_classes"]:
                bad.append(f"{e.name} vs {other.name}: diff says equivalent, the judgement "
                           f"{ja.judgement.residency['read_classes']} vs "
                           f"{jb.judgement.residency['read_classes']}")
            continue
        reads = [d for d in (doc.get("first"), doc.get("effect"))
                 if d and d["kind"] == "provenance"]
        for d in reads:
            divergent += 1
            page = d["a"]["page"]
            if d["b"]["page"] != page or f"page {page} was read" not in d["text"]:
                bad.append(f"{e.name} vs {other.name}: diff names pages {d['a']['page']}/"
                           f"{d['b']['page']} and says {d['text']!r}")
            said = {}
            for side, jj in (("a", ja), ("b", jb)):
                want = jj.pages.get((d[side]["seq"], page), ("absent", 0))[0]
                said[side] = want
                if d[side]["class"] != want:
                    bad.append(f"{e.name} vs {other.name}: diff says side {side} read #"
                               f"{d[side]['seq']} page {page} {d[side]['class']}, its "
                               f"judgement {want}")
            if said["a"] == said["b"] == "exact":
                bad.append(f"{e.name} vs {other.name}: diff's divergent read page {page} is "
                           "exact on both sides")
    return bad, divergent


SUMMARY = re.compile(r"^(?P<out>.+): (?P<n>\d+) events from (?P<lines>\d+) lines \((?P<kinds>"
                     r"[^)]*)\), (?P<steps>.+), end (?P<status>\w+)$", re.M)
UNRECORDED = re.compile(r"^  a log does not record (?P<kinds>.+) events: ", re.M)


def import_disagreements(entries: Iterable[Entry]) -> list[str]:
    """``import``'s summary line: events per kind, the steps, the status, and what a log
    does not record."""
    bad: list[str] = []
    for e in entries:
        m = SUMMARY.search(e.said)
        assert m, e.said
        j = judged(e.path).judgement
        kinds = dict((k, int(n)) for k, n in (p.rsplit(" ", 1) for p in
                                              m["kinds"].split(", ") if p))
        want = {k: n for k, n in j.counts.items() if k != "end"}
        if kinds != want or int(m["n"]) != sum(want.values()):
            bad.append(f"{e.name}: events per kind: judgement {want}, import {m['n']} "
                       f"({kinds})")
        if m["steps"] != j.steps.text():
            bad.append(f"{e.name}: steps: judgement {j.steps.text()!r}, import {m['steps']!r}")
        if m["status"] != j.status:
            bad.append(f"{e.name}: status: judgement {j.status}, import {m['status']}")
        u = UNRECORDED.search(e.said)
        said = u["kinds"].split(", ") if u else []
        if said != [k.kind for k in j.completeness.missing]:
            bad.append(f"{e.name}: not recorded: judgement "
                       f"{[k.kind for k in j.completeness.missing]}, import {said}")
    return bad


def truth_disagreements(entries: Iterable[Entry]) -> list[str]:
    """kvrt's own truth: the judgement of every page kvrt read equals the class kvrt found
    in the slot's bytes and, for stale pages, the writes the copy missed."""
    bad: list[str] = []
    for e in entries:
        j = judged(e.path)
        for t in e.truth:
            got = j.pages.get((t.seq, t.page))
            want = (t.cls, t.writes_old if t.cls == "stale" else 0)
            if got != want:
                bad.append(f"{e.name}: read #{t.seq} step {t.step} layer {t.layer} stream "
                           f"{t.stream} page {t.page} ({t.source} slot {t.slot}, holding "
                           f"{t.holder}): truth {want}, judgement {got}")
    return bad


def removed_kind_disagreements(entries: Iterable[Entry], by: dict[str, Entry]
                               ) -> list[str]:
    """A kind removed: a page is judged as before or not judged, never given another class;
    a kvrt page still judged is its truth; the kind is listed as not recorded whenever
    its absence hides something (a page no longer judged, a finding gone), and always
    where the writer declares what it records."""
    bad: list[str] = []
    for e in entries:
        assert e.base is not None and e.removed is not None
        base, j = judged(by[e.base].path), judged(e.path)
        missing = {k.kind for k in j.judgement.completeness.missing}
        gone = Counter(f.rule for f in base.judgement.findings if f.rule != "not-recorded")
        gone -= Counter(f.rule for f in j.judgement.findings)
        declared = j.judgement.completeness.source == "declared"
        if j.judgement.lost:
            bad.append(f"{e.name}: {j.judgement.lost['events']} event(s) lost, where the "
                       "kind was removed as a writer that never calls it writes")
        # the stripped trace numbers its events again: its reads by their seq in the base
        renumbered = {(e.seqs.get(s, s), p): v for (s, p), v in j.pages.items()}
        hidden = [k for k, (cls, _) in base.pages.items() if cls != "not judged"
                  and renumbered.get(k, ("not judged", 0))[0] == "not judged"]
        if e.removed not in missing and (declared or hidden or gone):
            bad.append(f"{e.name}: {e.removed} removed ({len(hidden)} page(s) no longer "
                       f"judged, findings gone {dict(gone)}), the judgement's completeness "
                       f"says missing {sorted(missing)}")
        for key, (cls, lag) in renumbered.items():
            if cls == "not judged":
                continue
            was = base.pages.get(key)
            if was != (cls, lag):
                bad.append(f"{e.name}: read #{key[0]} page {key[1]}: {cls} (lag {lag}) without "
                           f"{e.removed}, {was} with it")
        for t in e.truth:
            got = renumbered.get((t.seq, t.page))
            if got is not None and got[0] not in ("not judged", t.cls):
                bad.append(f"{e.name}: read #{t.seq} page {t.page}: truth {t.cls}, judged "
                           f"{got[0]} without {e.removed}")
    return bad


def export_disagreements(name: str, path: Path, doc: list[dict[str, Any]]) -> list[str]:
    """Where a Chrome export of ``path`` says something its judgement does not: each read's
    label and verdict (pages per class, the class of every page of its runs), every flow,
    and the closing judgement instant."""
    j = judged(path)
    bad: list[str] = []
    reads = {e["args"]["seq"]: e for e in doc
             if e["ph"] == "X" and e.get("args", {}).get("kind") == "read"}
    if set(reads) != set(j.reads):
        bad.append(f"{name}: exported reads {sorted(set(reads) ^ set(j.reads))[:5]} differ")
    for seq, counts in j.reads.items():
        e = reads.get(seq)
        if e is None:
            continue
        v = e["args"].get("verdict", {})
        got = tuple(v.get(k) for k in ("exact", "stale", "foreign", "not_judged"))
        if got != counts:
            bad.append(f"{name}: read #{seq} pages exact/stale/foreign/not judged: judgement "
                       f"{counts}, export {got}")
        classes = [c for c, n in zip(("stale", "foreign", "not judged"), counts[1:],
                                     strict=True) if n]
        label = f"read stream {e['args']['stream']}" + (
            f" ({', '.join(classes)})" if classes else "")
        if e["name"] != label:
            bad.append(f"{name}: read #{seq} label: judgement {label!r}, export {e['name']!r}")
        for run in v.get("runs", []):
            for page in range(*run["pages"]):
                want = j.pages.get((seq, page), ("?", 0))[0]
                if run["class"] != want:
                    bad.append(f"{name}: read #{seq} page {page}: judgement {want}, export "
                               f"{run['class']}")
    by_id: dict[int, dict[str, dict[str, Any]]] = {}
    for e in doc:
        if e["ph"] in ("s", "f"):
            by_id.setdefault(e["id"], {})[e["ph"]] = e
    at = {(e["pid"], e["tid"], e["ts"]): seq for seq, e in reads.items()}
    drawn = sorted((p["s"]["args"]["write_seq"], at.get((p["f"]["pid"], p["f"]["tid"],
                                                         p["f"]["ts"]), -1),
                    p["s"]["cat"].removesuffix("-read")) for p in by_id.values())
    if drawn != sorted(j.flows):
        bad.append(f"{name}: flows (write, read, class): judgement {sorted(j.flows)[:6]}… "
                   f"({len(j.flows)}), export {drawn[:6]}… ({len(drawn)})")
    closing = [e for e in doc if e.get("cat") == "judgement"]
    if len(closing) != 1 or closing[0]["args"]["read_classes"] != \
            j.judgement.residency["read_classes"]:
        bad.append(f"{name}: the closing judgement instant {closing[:1]} differs from "
                   f"{j.judgement.residency['read_classes']}")
    missing = sorted(e["args"]["kind"] for e in doc if e.get("cat") == "not-recorded")
    want_missing = sorted(k.kind for k in j.judgement.completeness.missing)
    if missing != want_missing:
        bad.append(f"{name}: not recorded: judgement {want_missing}, export {missing}")
    return bad


GLYPHS = {"stale": "~", "foreign": "!", "not judged": "?"}


def tui_disagreements(entries: Iterable[Entry]) -> list[str]:
    """What the TUI shows (:func:`kvdiag.tui.shown.shown`, the viewer's own loading without
    running it): findings (Findings screen, Overview), events per kind, steps and what is not
    recorded (Overview, status line), each read's page classes and Timeline mark, the
    scrubber's marked steps (``n``/``N``), and at every step the Pages grid's glyphs — the
    stale, foreign and not-judged pages of each view's latest read up to that step."""
    from kvdiag.tui.shown import shown

    bad: list[str] = []
    for e in entries:
        jj = judged(e.path)
        j = jj.judgement
        steps = sorted({s for s, _, _ in jj.where.values()})
        view = shown(str(e.path), steps=steps)
        if list(view.findings) != [f.rule for f in j.findings]:
            bad.append(f"{e.name}: findings: judgement {[f.rule for f in j.findings]}, TUI "
                       f"{list(view.findings)}")
        if view.counts != j.counts:
            bad.append(f"{e.name}: events per kind: judgement {j.counts}, TUI {view.counts}")
        if view.steps != j.steps.count:
            bad.append(f"{e.name}: steps: judgement {j.steps.count}, TUI {view.steps}")
        if view.lost_events != (j.lost["events"] if j.lost else 0):
            bad.append(f"{e.name}: events lost: judgement {j.lost}, TUI {view.lost_events}")
        missing = [k.kind for k in j.completeness.missing]
        if list(view.not_recorded) != missing:
            bad.append(f"{e.name}: not recorded: judgement {missing}, TUI "
                       f"{list(view.not_recorded)}")
        for seq, counts in jj.reads.items():
            got = view.reads.get(seq)
            if got != counts:
                bad.append(f"{e.name}: read #{seq} pages exact/stale/foreign/not judged: "
                           f"judgement {counts}, TUI {got}")
            mark = "foreign" if counts[2] else "stale" if counts[1] else ""
            if view.marks.get(seq) != mark:
                bad.append(f"{e.name}: read #{seq} Timeline mark: judgement {mark!r}, TUI "
                           f"{view.marks.get(seq)!r}")
        for what, i in (("stale", 1), ("foreign", 2)):
            want_steps = sorted({jj.where[s][0] for s, c in jj.reads.items() if c[i]})
            if view.scrubber.get(what) != want_steps:
                bad.append(f"{e.name}: steps marked {what}: judgement {want_steps}, TUI "
                           f"{view.scrubber.get(what)}")
        latest: dict[tuple[int, int], int] = {}
        by_step = sorted(jj.where.items(), key=lambda kv: (kv[1][0], kv[0]))
        k = 0
        for step in steps:
            while k < len(by_step) and by_step[k][1][0] <= step:
                seq, (_, layer, stream) = by_step[k]
                latest[(layer, stream)] = max(latest.get((layer, stream), 0), seq)
                k += 1
            want = {(stream, layer, page, GLYPHS[cls])
                    for (layer, stream), seq in latest.items()
                    for (s, page), (cls, _) in jj.pages.items() if s == seq and cls in GLYPHS}
            got = set(view.pages.get(step, []))
            if got != want:
                bad.append(f"{e.name}: Pages at step {step}: only in the judgement "
                           f"{sorted(want - got)[:6]}, only in the TUI {sorted(got - want)[:6]}")
    return bad


def end_disagreements(entries: Iterable[Entry], out_dir: Path) -> list[str]:
    """How each run ended — its status and every abort (seq, step, message), the judgement's
    ``abort`` findings — as ``check --json``, ``trace info --json``, ``trace export`` (the
    abort instants and the closing judgement), ``diff`` (each side's end) and the TUI (status
    line, Backtrace screen) say it."""
    from kvdiag.tui.shown import shown

    bad: list[str] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for e in entries:
        j = judged(e.path).judgement
        aborts = [(f.evidence[0].seq, f.evidence[0].step, f.title) for f in j.findings
                  if f.rule == "abort"]
        want = (j.status, aborts)
        said: dict[str, tuple[str, list[tuple[int, int, str]]]] = {}
        _, out = cli("check", "--json", str(e.path))
        doc = json.loads(out)
        said["check"] = (doc["summary"]["status"], [
            (f["evidence"][0]["seq"], f["evidence"][0]["step"], f["title"])
            for f in doc["findings"] if f["rule"] == "abort"])
        _, out = cli("trace", "info", "--json", str(e.path))
        info = json.loads(out)
        said["trace info"] = (info["judgement"]["status"],
                              aborts if info["counts"].get("abort", 0) == len(aborts) else [])
        exported = out_dir / f"{e.path.stem}.json"
        cli("trace", "export", str(e.path), "-o", str(exported), "--force")
        chrome = json.loads(exported.read_bytes())
        closing = [x for x in chrome if x.get("cat") == "judgement"]
        said["trace export"] = (closing[0]["args"]["status"] if closing else "", [
            (x["args"]["seq"], x["args"]["step"], x["args"]["message"]) for x in chrome
            if x.get("cat") == "abort"])
        _, out = cli("diff", str(e.path), str(e.path), "--json")
        ends = json.loads(out)["ends"] if out.startswith("{") else {}
        for side in ("a", "b"):
            end = ends.get(side, {"status": "", "aborts": []})
            said[f"diff ({side})"] = (end["status"], [
                (a["seq"], a["step"], a["message"]) for a in end["aborts"]])
        view = shown(str(e.path), steps=[])
        said["TUI"] = (view.status, list(view.aborts))
        for surface, got in said.items():
            if got != want:
                bad.append(f"{e.name}: the end: judgement {want}, {surface} {got}")
    return bad
