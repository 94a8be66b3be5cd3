"""Chrome trace-event export of a capture trace."""

from __future__ import annotations

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


def test_steps_become_balanced_slices_and_aliasing_reads_are_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = export(tmp_path, "slot1-first-shared", capsys)
    begins = [e for e in doc if e["ph"] == "B"]
    ends = [e for e in doc if e["ph"] == "E"]
    assert len(begins) == len(ends) == 15
    assert all(e["ts"] >= b["ts"] for b, e in zip(begins, ends, strict=True))
    assert begins[0]["name"] == "step 0 prefill streams 1"
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
