"""The corpus of the one-truth test (issue 15 §2) and the judgement each trace of it gets.

Traces, each a file:

- **model**: every scenario × layout (shared, per-stream) × dispatch (membership, fits), and
  ``--kv-unified`` where a scenario has several slots (tests/judged_captures.py's small shape,
  written by ``kvdiag.runs.capture.capture`` as ``kvdiag capture`` writes them);
- **kvrt**: every run tests/native_runtime.py offers, each with the runtime's own page truth;
- **import**: ``kvdiag import`` of the real-format server logs in tests/fixtures/logs and of
  ``kvdiag trace export --format llama-log`` of model captures (abort, fallback, aliasing);
- **kvdemo** (slow; tests/test_corpus.py builds it as tests/test_native_ggml.py does);
- each of those with one judged event kind removed (:func:`strip`): its events, and the kind
  in the header's ``records`` declaration, so that a declaring writer reads as one that never
  calls that macro.

:func:`judged` is the reference every surface is compared with: a :class:`Judge` fed the
file, with every read page's verdict. Not a test module.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from native_runtime import CONFIGS, Built, TruthPage, prefix_through
from native_runtime import run as run_kvrt

from kvdiag.analysis.judgement import Judge, Judgement
from kvdiag.analysis.judgement.completeness import JUDGED_KINDS
from kvdiag.analysis.judgement.judge import batches
from kvdiag.cli import main
from kvdiag.errors import KvdiagError
from kvdiag.kvstream.plan import make_plan
from kvdiag.model import events as ev
from kvdiag.trace import TraceReader, TraceWriter, make_header
from tests.judged_captures import CASES, small
from tests.judged_captures import capture as captured

LOGS = Path(__file__).parent / "fixtures" / "logs"

#: model captures exported as a llama-server log and imported back: (case, what the log shows)
LOG_EXPORTS: dict[str, tuple[str, str, str, bool]] = {
    "two-slot-abort": ("two-slot-concurrent", "shared", "membership", False),
    "two-slot-fallback": ("two-slot-concurrent", "per-stream", "fits", False),
    "two-slot-fallback-shared": ("two-slot-concurrent", "shared", "fits", False),
}


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    """model, kvrt, kvdemo or import."""
    path: Path
    truth: tuple[TruthPage, ...] = ()
    """kvrt: the runtime's own verdict of every page it read (a killed run: the reads whose
    truth lines reached the disk)."""
    base: str | None = None
    """The entry this one was made from by removing a kind."""
    removed: str | None = None
    said: str = ""
    """What the command that made the trace printed (import's summary)."""
    schedule: tuple[str, str, bool] | None = None
    """model: (scenario, dispatch, unified) — the shared and per-stream captures of one
    schedule, for diff."""
    seqs: dict[int, int] = field(default_factory=dict)
    """A kind removed (:func:`strip`): each event's seq here → its seq in the base trace."""


def cli(*args: str) -> tuple[int, str]:
    """Run ``kvdiag ARGS`` in this process: (exit code, what it printed on stdout).
    ``--debug``: an internal error is a traceback here, not a one-line message."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # .buffer: trace pages
    with contextlib.redirect_stdout(out):
        try:
            code = main(["--debug", *args])
        except KvdiagError as exc:  # what the command says without --debug, in one line
            return exc.exit_code, f"kvdiag: error: {exc}"
    out.flush()
    return code, raw.getvalue().decode()


def model_entries(root: Path) -> list[Entry]:
    """The captures of tests/judged_captures.py (cached per session: tests/test_judgement.py
    judges the same events), each written as ``kvdiag capture`` writes a trace."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for name, layout, dispatch, unified in CASES:
        label = f"{name}-{layout}-{dispatch}" + ("-unified" if unified else "")
        path = root / f"{label}.kvtrace"
        cfg, scenario = small(name, layout, dispatch, unified)
        header = make_header(
            "numpy", ev.Device(name="CPU (NumPy reference executor)"),
            scenario={"name": scenario.name, "description": scenario.description, "seed": 0,
                      "config": cfg.as_dict(),
                      "requests": [vars(r) for r in scenario.requests]},
            plan=make_plan(cfg, allow_multiseq=True).as_json())
        events = captured(name, layout, dispatch, unified)
        with TraceWriter.create(path, header) as writer:
            for e in events:
                fields = msgspec.structs.asdict(e)
                for common in ("seq", "t_ns", "step"):
                    del fields[common]
                writer.emit(type(e), e.step, **fields)
            aborted = any(type(e) is ev.Abort for e in events)
            writer.close("aborted" if aborted else "completed",
                         steps=max((e.step for e in events), default=-1) + 1)
        out.append(Entry(f"model/{label}", "model", path,
                         schedule=(name, dispatch, unified)))
    return out


def kvrt_entries(root: Path, built: Built) -> list[Entry]:
    out = []
    for name in CONFIGS:
        result = run_kvrt(name, root, built)
        assert result.truth, f"kvrt {name}: no truth ({result.stderr[-500:]})"
        path = result.trace
        if name == "kill":  # the part of the trace the truth covers
            path = prefix_through(path, max(t.seq for t in result.truth),
                                  root / "kill-covered.kvtrace")
        out.append(Entry(f"kvrt/{name}", "kvrt", path, truth=result.truth))
    return out


def import_entries(root: Path, model: dict[str, Entry]) -> list[Entry]:
    root.mkdir(parents=True, exist_ok=True)
    logs: list[tuple[str, Path]] = [(p.stem, p) for p in sorted(LOGS.glob("*.log"))]
    for label, (name, layout, dispatch, unified) in LOG_EXPORTS.items():
        case = f"model/{name}-{layout}-{dispatch}" + ("-unified" if unified else "")
        log = root / f"{label}.log"
        code, said = cli("trace", "export", str(model[case].path), "--format", "llama-log",
                         "-o", str(log))
        assert code == 0, said
        logs.append((f"export-{label}", log))
    out = []
    for label, log in logs:
        path = root / f"{label}.kvtrace"
        code, said = cli("import", str(log), "-o", str(path))
        if code == 1:  # nothing importable in this log (config_rejected has only boot lines)
            continue
        assert code in (0, 2), said
        out.append(Entry(f"import/{label}", "import", path, said=said))
    return out


def edge_entries(root: Path, bases: Iterable[Entry]) -> list[Entry]:
    """Traces at the edges: each base with a tenth of its lines deleted from the middle (events
    lost; and, where it has an End, the same with the rest numbered again: lost where no seq
    shows it), each as its header and its End alone (nothing recorded: the
    End numbered as a writer that wrote nothing before it numbers it, seq 1 and 0 events — kept
    as it was, it would say the events before it were lost), and kvrt's killed run whole (no
    End; its last line may be cut)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for e in bases:
        lines = e.path.read_bytes().splitlines(keepends=True)
        end = [json.dumps({**json.loads(line), "seq": 1, "events": 0},
                          separators=(",", ":")).encode() + b"\n"
               for line in lines[1:] if b'"kind":"end"' in line]
        path = root / f"{e.path.stem}-header-and-end.kvtrace"
        path.write_bytes(lines[0] + b"".join(end))
        out.append(Entry(f"{e.name}-header-and-end", e.source, path, removed="everything"))
        # a run of lines deleted from the middle, seqs kept (a grep -v, an edit): events lost
        n = len(lines)
        cut = root / f"{e.path.stem}-lines-lost.kvtrace"
        cut.write_bytes(b"".join(lines[:n * 2 // 5] + lines[n // 2:]))
        out.append(Entry(f"{e.name}-lines-lost", e.source, cut, removed="lines"))
        # the same lines deleted and the rest numbered again, the End's count kept (a hand
        # edit, a tool that re-sequences): events lost where no seq shows it
        if b'"kind":"end"' in lines[-1]:
            renum = root / f"{e.path.stem}-renumbered.kvtrace"
            renum.write_bytes(b"".join([lines[0], *_numbered(lines[1:n * 2 // 5] + lines[n // 2:])]))
            out.append(Entry(f"{e.name}-renumbered", e.source, renum, removed="renumbered"))
        if e.name == "kvrt/kill":
            out.append(Entry("kvrt/kill-whole", "kvrt", root.parent / "kvrt" / "kill.kvtrace"))
    return out


def _numbered(lines: list[bytes]) -> list[bytes]:
    """Event lines numbered 1, 2, ... again (their other fields as written)."""
    out = []
    for seq, line in enumerate(lines, 1):
        e = json.loads(line)
        e["seq"] = seq
        out.append(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    return out


def strip(entry: Entry, kind: str, root: Path) -> Entry | None:
    """``entry`` without ``kind``: its events, its ``records`` entries (``kind`` and
    ``kind.field``), the seqs numbered again and the End's event count made to match, as a
    writer that never calls that macro writes it (deleted lines that keep their seqs are
    events lost: tests/test_lost_events.py); None when it has no such event and does not
    declare it."""
    lines = entry.path.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    declared = header.get("records")

    def drop(r: str) -> bool:
        return r == kind or r.startswith(kind + ".")

    found = isinstance(declared, list) and any(drop(r) for r in declared)
    if isinstance(declared, list):
        header["records"] = [r for r in declared if not drop(r)]
    kept: list[bytes] = [json.dumps(header, separators=(",", ":")).encode() + b"\n"]
    events = 0
    seqs: dict[int, int] = {}
    for line in lines[1:]:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            kept.append(line)  # damage stays as it was
            continue
        if e.get("kind") == kind:
            found = True
            continue
        if e.get("kind") == "records" and isinstance(e.get("kinds"), list):
            e["kinds"] = [r for r in e["kinds"] if not drop(r)]
        if e.get("kind") == "end":
            e["events"] = events
        else:
            events += 1
        if isinstance(e.get("seq"), int):
            new = events + (e.get("kind") == "end")
            seqs[new] = e["seq"]
            e["seq"] = new
        line = json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        kept.append(line)
    if not found:
        return None
    path = root / f"{entry.path.stem}-no-{kind}.kvtrace"
    path.write_bytes(b"".join(kept))
    return Entry(f"{entry.name}-no-{kind}", entry.source, path, truth=entry.truth,
                 base=entry.name, removed=kind, seqs=seqs)


def stripped(entries: Iterable[Entry], root: Path,
             kinds: Iterable[str] = JUDGED_KINDS) -> list[Entry]:
    root.mkdir(parents=True, exist_ok=True)
    return [s for e in entries for k in kinds if (s := strip(e, k, root)) is not None]


# -- the reference -------------------------------------------------------------------------


@dataclass
class Judged:
    """The judgement of one trace file and every judged page, by (read seq, page)."""

    judgement: Judgement
    pages: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    """(class, writes missed) of every page of every read with served runs."""
    reads: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    """Pages per class (exact, stale, foreign, not judged) of every read."""
    flows: list[tuple[int, int, str]] = field(default_factory=list)
    """(write seq, read seq, class) as the ledger has them."""
    where: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """(step, layer, stream) of every read, by seq."""


_JUDGED: dict[Path, Judged] = {}


def judged(path: Path) -> Judged:
    if path not in _JUDGED:
        with TraceReader.open(path) as reader:
            judge = Judge(reader.header, ledger=True, name=str(path))
            pages: dict[tuple[int, int], tuple[str, int]] = {}
            reads: dict[int, tuple[int, int, int, int]] = {}
            where: dict[int, tuple[int, int, int]] = {}
            for batch in batches(reader):
                judge.feed_all(batch)
                for e in batch:
                    if type(e) is not ev.Read:
                        continue
                    v = judge.verdict(e)
                    assert v is not None
                    reads[e.seq] = v.counts
                    where[e.seq] = (e.step, e.layer, e.stream)
                    for p in judge.pages(e):
                        pages[(p.seq, p.page)] = (p.cls, p.lag)
        j = judge.snapshot()
        assert j.ledger is not None
        flows = [(int(r["write_seq"]), int(r["read_seq"]), ("exact", "stale", "foreign")[
            r["cls"]]) for r in j.ledger.flows.array]
        _JUDGED[path] = Judged(j, pages, reads, flows, where)
    return _JUDGED[path]
