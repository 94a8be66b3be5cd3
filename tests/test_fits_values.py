"""The fits finding names each failed condition with the value the event logged (issue 11 #17)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from trace_samples import end_line, event_line, header_line

from kvdiag import cli
from kvdiag.model.conditions import observed
from kvdiag.model.geometry import Tensor


def tensor(name: str, type_: str, ne: tuple[int, int, int, int]) -> dict[str, object]:
    nb = (1, 1, 1, 1)
    out: dict[str, object] = msgspec.to_builtins(Tensor(name, type_, ne, nb, runtime=7))
    return out


def test_fallback_finding_shows_the_logged_values(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    q = tensor("q", "f16", (128, 1, 8, 1))
    k = tensor("k", "q8_0", (128, 300, 2, 1))
    path = tmp_path / "fits.kvtrace"
    path.write_bytes(
        header_line("1.1")
        + event_line("step", 1, 0, phase="decode", streams=[0], tokens=1, n_kv=300)
        + event_line("fits", 2, 0, node="__fattn__-3", layer=3, q=q, k=k, v=k, dst=q,
                     stage_bytes=1 << 20, result=False, route="fallback",
                     failed=["Q.type==f32", "Q.ne[0]==256", "K.ne[1]%256==0"])
        + end_line(3, 2))
    assert cli.main(["check", "--json", str(path)]) == 0  # a fallback is a warning
    doc = json.loads(capsys.readouterr().out)
    [finding] = [f for f in doc["findings"] if f["rule"] == "fallback"]
    shown = "Q.type==f32 (Q.type=f16), Q.ne[0]==256 (Q.ne[0]=128), K.ne[1]%256==0 (K.ne[1]=300)"
    assert finding["title"].endswith(f"(zero-copy): failed: {shown}")
    assert finding["evidence"][0]["text"] == f"__fattn__-3: failed: {shown}"


def test_observed_names_both_sides_and_leaves_unlogged_fields() -> None:
    k = Tensor("k", "q8_0", (256, 512, 4, 1), (34, 1088, 272, 1))
    v = Tensor("v", "q5_1", (256, 256, 4, 1), (24, 768, 192, 1), runtime=None)
    tensors = {"K": k, "V": v, "mask": None}
    assert observed("K.ne[1]==V.ne[1]", tensors) == "K.ne[1]==V.ne[1] (K.ne[1]=512, V.ne[1]=256)"
    assert observed("V.runtime!=NULL", tensors) == "V.runtime!=NULL (V.runtime=NULL)"
    assert observed("mask.type==f16", tensors) == "mask.type==f16"  # no mask was logged
    assert observed("sinks==NULL", tensors) == "sinks==NULL"
