"""The rich report, rendered into a fixed-width console, and the demangler fallback."""

from __future__ import annotations

import io

import pytest
from postmortem_helpers import findings_of, scan_fixture
from rich.console import Console

from kvdiag.postmortem import demangle as demangle_mod
from kvdiag.report.postmortem import postmortem_renderable


def _render(*names: str) -> str:
    scan = scan_fixture(*names)
    out = io.StringIO()
    Console(width=100, file=out, color_system=None).print(
        postmortem_renderable(scan, findings_of(scan)))
    return out.getvalue()


def test_report_sections_for_a_kvstream_crash() -> None:
    text = _render("kvstream_np2_gdb.log")
    lines = text.splitlines()
    assert lines[0] == "1 log(s), 67 lines, 1 crash(es) in 1 group(s), 1 boot(s)"
    assert any("KV streams" in ln and "2" in ln for ln in lines)
    assert any("KV buffer CUDA_KV_Stream_Host" in ln and "1024 MiB" in ln for ln in lines)
    assert "Slot activity before the crash (busy at the crash: 0, 1)" in text
    assert any("33" in ln and "launch" in ln and "│    0 │" in ln for ln in lines)
    assert "(inlined) ggml_cuda_kv_stream_fattn" in text
    assert "(inlined) ggml_cuda_compute_forward" not in text
    assert "…/ggml-cuda.cu:1898" in text
    assert "kvstream-fits-dispatch-abort" in text and "critical" in text


def test_report_groups_identical_crashes() -> None:
    text = _render("msvc_windows.log", "msvc_windows.log")
    assert "2 crash(es) in 1 group(s)" in text
    assert "(x2 with this fingerprint)" in text
    assert "no backtrace in the log" in text


def test_names_stay_mangled_without_a_demangler(monkeypatch: pytest.MonkeyPatch) -> None:
    demangle_mod.demangle.cache_clear()
    try:
        with monkeypatch.context() as m:
            m.setattr(demangle_mod, "_demangler", lambda: None)
            assert demangle_mod.demangle("_ZN13llama_context6decodeERK11llama_batch") == (
                "_ZN13llama_context6decodeERK11llama_batch")
    finally:
        demangle_mod.demangle.cache_clear()
    assert demangle_mod.demangle("_ZN13llama_context6decodeERK11llama_batch") == (
        "llama_context::decode(llama_batch const&)")
