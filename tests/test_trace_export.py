"""Chrome trace-event export of a capture trace."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kvdiag.cli import main

TRACES = Path(__file__).resolve().parent.parent / "traces"


def export(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> list[dict]:  # type: ignore[type-arg]
    out = tmp_path / f"{name}.json"
    assert main(["trace", "export", str(TRACES / f"{name}.kvtrace"), "-o", str(out)]) == 0
    assert "trace events" in capsys.readouterr().out
    doc: list[dict] = json.loads(out.read_text())  # type: ignore[type-arg]
    return doc


def test_steps_become_slices_and_aliasing_reads_are_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "s1.kvtrace"  # a 1.1 capture: reads record the slots they served
    assert main(["capture", "--scenario", "slot1-first", "--prompt-tokens", "300", "--steps",
                 "4", "-o", str(trace)]) == 0
    out = tmp_path / "s1.json"
    assert main(["trace", "export", str(trace), "-o", str(out)]) == 0
    doc: list[dict] = json.loads(out.read_text())  # type: ignore[type-arg]
    steps = [e for e in doc if e.get("cat") == "step"]
    assert len(steps) == 15 and all(e["ph"] == "X" and e["dur"] > 0 for e in steps)
    # each step lasts until the next begins
    assert all(a["ts"] + a["dur"] == b["ts"] for a, b in itertools.pairwise(steps))
    assert steps[0]["name"] == "step 0 prefill streams 1"
    alias = [e for e in doc if e.get("cat") == "alias"]
    assert alias and all(e["name"].startswith("read stream 1 (") for e in alias)
    assert any("stale" in e["name"] for e in alias) and any("foreign" in e["name"] for e in alias)
    names = {e["args"]["name"] for e in doc if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"ubatch", "layer 0", "layer 3"} <= names


def test_abort_is_a_global_instant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = export(tmp_path, "two-slot-upstream", capsys)
    aborts = [e for e in doc if e.get("cat") == "abort"]
    assert len(aborts) == 1 and aborts[0]["s"] == "g"
    assert "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed" in aborts[0]["name"]
    fits = [e for e in doc if e.get("cat") == "fits"]
    assert fits[0]["args"]["failed"] == ["Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"]


def test_export_to_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    code = main(["trace", "export", str(TRACES / "single-slot.kvtrace"), "-o",
                 str(tmp_path / "nope" / "x.json")])
    assert code == 2


def _postmortem_json(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    log = tmp_path / f"{name}.log"
    assert main(["trace", "export", str(TRACES / f"{name}.kvtrace"), "--format", "llama-log",
                 "-o", str(log)]) == 0
    capsys.readouterr()
    code = main(["postmortem", str(log), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_modelled_abort_log_is_diagnosed_by_postmortem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _postmortem_json(tmp_path, "two-slot-upstream", capsys)
    assert code == 1
    crash = doc["crashes"][0]
    assert crash["assert"] == {"file": "/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
                               "line": 1898, "condition": "ggml_cuda_kv_stream_fattn_fits(dst)"}
    assert [f["function"] for f in crash["frames"]][1:3] == ["ggml_print_backtrace", "ggml_abort"]
    rules = [f["rule"] for f in doc["findings"]]
    assert rules[0] == "kvstream-fits-dispatch-abort"
    assert doc["config"]["n_stream"] == 2 and doc["config"]["kv_stream"] is True


def test_the_modelled_slot1_log_raises_the_aliasing_risk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _postmortem_json(tmp_path, "slot1-first-shared", capsys)
    # no crash, but an error-level risk: postmortem fails on it as check does (issue 16)
    assert code == 1 and doc["crashes"] == []
    risk = [f for f in doc["findings"] if f["rule"] == "kvstream-multislot-aliasing-risk"]
    assert risk and risk[0]["details"]["slot"] == 1 and risk[0]["details"]["n_stream"] == 2
    assert "K (q8_0):   17.00 MiB, V (q5_1):   12.00 MiB" in " ".join(
        e["text"] for e in risk[0]["evidence"])


def test_the_log_prints_fits_false_for_every_decision_the_judgement_finds_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A native writer that does not record ``membership`` (it defaults to false): its
    fallback decisions are still bad (the judgement's outcome), so the log has their
    ``fits=false`` lines — the exporter's own rule (result false and membership) printed none —
    and importing the log gives them back as fallbacks."""
    from tests.test_chrome_export import tensor
    from tests.trace_samples import event_line, header_line

    streamed = {"node": "__fattn__", "q": tensor("q"), "k": tensor("k"), "v": tensor("v"),
                "dst": tensor("dst"), "stage_bytes": 1 << 22}
    path = tmp_path / "native.kvtrace"
    path.write_bytes(header_line("1.2") + b"".join([
        event_line("step", 1, 0, phase="decode", streams=[0, 1], tokens=2, n_kv=512,
                   slots=[0, 1]),
        event_line("fits", 2, 0, layer=0, result=False, route="fallback", **streamed),
        event_line("warn", 3, 0, message="kv-stream: fits() false, falling back", layer=0,
                   code="kv-stream-fallback"),
        event_line("fits", 4, 0, layer=1, result=True, route="streamed", **streamed),
        event_line("fits", 5, 0, layer=2, result=False, route="fallback", **streamed),
        event_line("end", 6, 0, status="completed", steps=1, events=5),
    ]))
    log = tmp_path / "native.log"
    assert main(["trace", "export", str(path), "--format", "llama-log", "-o", str(log)]) == 0
    assert "(2 fits=false lines: the decisions the judgement finds bad)" in \
        capsys.readouterr().out
    lines = [line for line in log.read_text().splitlines() if "fits=false" in line]
    assert len(lines) == 2 and all("ne=[256,512,4,2]" in line for line in lines)
    back = tmp_path / "back.kvtrace"
    assert main(["import", str(log), "-o", str(back)]) == 0
    capsys.readouterr()
    main(["check", "--json", str(back)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["residency"]["routes"] == {"fallback": 2}


def test_the_log_of_a_native_trace_prints_no_figure_its_header_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GIVEN a native trace whose plan knows the stage bytes and pages but not the context,
    the host buffer or the K/V types (kvtrace_plan_defaults leaves them unknown) THEN its log
    has no n_ctx, buffer-size or size line and no ``None`` — postmortem used to read back
    n_ctx 0, 0 cells, a 0 MiB buffer and type_k "None" — and the pool line says the stage."""
    trace = tmp_path / "native.kvtrace"
    header = {"format": "kvtrace", "version": "1.2", "kvdiag_version": "kvtrace.h 1.2",
              "created": "2026-12-01T00:00:00+00:00", "backend": "native",
              "device": {"name": "unknown"},
              "scenario": {"name": "fork", "source": "native",
                           "config": {"np": 2, "layout": "per-stream", "dispatch": "fits"}},
              "plan": {"page_bytes": 4096, "pool_pages": 10, "resident_pages_per_layer": 4,
                       "ring_slots": 2, "streamed_layers": 2, "n_stream": 2,
                       "stage_bytes": 3 << 19},
              "extra": {}, "records": ["step", "warn", "end"]}
    events = [{"kind": "step", "seq": 1, "t_ns": 5, "step": 0, "phase": "decode",
               "streams": [0, 1], "tokens": 1, "n_kv": 512},
              {"kind": "end", "seq": 2, "t_ns": 9, "step": 0, "status": "completed",
               "steps": 1, "events": 1}]
    trace.write_text("\n".join(json.dumps(x) for x in (header, *events)) + "\n")
    log = tmp_path / "native.log"
    assert main(["trace", "export", str(trace), "--format", "llama-log", "-o", str(log)]) == 0
    text = log.read_text()
    assert "None" not in text and "n_ctx" not in text and "cells" not in text
    assert "KV buffer size" not in text
    assert "experimental block KV streaming enabled, pool = 1.5 MiB" in text
    capsys.readouterr()
    assert main(["postmortem", str(log), "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["kv_stream_pool_mib"] == 1.5 and config["n_seq_max"] == 2
    assert not {"n_ctx", "kv_cells", "type_k", "type_v", "kv_buffers"} & {
        k for k, v in config.items() if v not in (None, {}, [])}
