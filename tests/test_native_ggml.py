"""Proof against a real ggml, not a mock: kernels/native_demo built on ggml from PyPI.

The ggml is the one vendored in the ``ggml-python`` 0.0.45 sdist (sha256
10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05, checked against PyPI's JSON
API): ggml 0.15.3 per its CMakeLists.txt, git submodule commit
eced84c86f8b012c752c016f7fe789adea168e1e per ggml-python's tag v0.0.45 (the sdist has no git
metadata; its ``scripts/sync-llama.last`` names llama.cpp ded1561b4228). tests/native_build.py
fetches it and builds ``ggml-base`` once into ``platformdirs.user_cache_dir("kvdiag")``; this
module builds ``kvdemo`` against it and kernels/kvtrace.h, runs it, and reads its traces through
kvdiag's own CLI (``check --json``, ``trace export``, ``tui --export-svg``).

kvdemo builds the K/V cache as llama_kv_cache does for two slots (non-unified) in a buffer
type named ``CUDA_KV_Stream_Host``, the real ``ggml_flash_attn_ext`` node per layer, and
aborts through ggml's real ``GGML_ASSERT`` / ``ggml_abort`` under membership dispatch.
``GGML_NO_BACKTRACE=1`` keeps ggml from attaching gdb after the trace's abort hook ran.

The stale/foreign assertions come from the judgement of the raw events
(``kvdiag.analysis.judgement``): kvdemo writes no model annotation.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import kvdiag as kvdiag_package
from tests import native_build as nb
from tests.kvdemo_runs import DemoRun

pytestmark = pytest.mark.slow

KVDIAG_ROOT = Path(kvdiag_package.__file__).resolve().parents[1]
"""The kvdiag the CLI subprocesses run: the one this test process imports."""
DEMO_SOURCE = nb.DEMO_SOURCE / "kvdemo.cpp"
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def run(kvdemo_run: Callable[..., DemoRun]) -> Callable[..., DemoRun]:
    """kvdemo's runs, built and run once per session (tests/conftest.py: the corpus test
    reads the same traces)."""
    return kvdemo_run


def kvdiag(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(KVDIAG_ROOT)}
    return subprocess.run([sys.executable, "-m", "kvdiag", *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


_CHECKED: dict[Path, tuple[int, dict[str, Any]]] = {}


def check_json(trace: Path) -> tuple[int, dict[str, Any]]:
    """``kvdiag check TRACE --json``: (exit code, report); once per trace."""
    if trace not in _CHECKED:
        proc = kvdiag("check", str(trace), "--json")
        assert proc.returncode in (0, 1), proc.stderr
        _CHECKED[trace] = (proc.returncode, json.loads(proc.stdout))
    return _CHECKED[trace]


def findings(report: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["rule"] == rule]


def svg_text(path: Path) -> str:
    """The characters a Textual SVG screenshot shows, spans joined."""
    import html

    svg = path.read_text(encoding="utf-8")
    return html.unescape("".join(re.findall(r"<text[^>]*>(.*?)</text>", svg))).replace("\xa0", " ")


def assert_line() -> int:
    lines = DEMO_SOURCE.read_text(encoding="utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1)
                if "GGML_ASSERT(kv_stream_fattn_fits(dst));" in text)


# -- membership dispatch: the real ggml_abort -------------------------------------------------

def test_membership_dispatch_aborts_in_ggml_abort_and_check_names_the_conditions(
        run: Callable[..., DemoRun]) -> None:
    r = run("two-slot-concurrent", "shared", "membership")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr)
    # with no earlier callback the hook re-raises through ggml_abort, which prints to stderr
    assert f"kvdemo.cpp:{assert_line()}: GGML_ASSERT(kv_stream_fattn_fits(dst)) failed" in r.stderr

    code, report = check_json(r.trace)
    assert code == 1
    assert report["backend"] == "native"
    assert report["summary"]["status"] == "aborted"
    [mismatch] = findings(report, "fits-dispatch-mismatch")
    assert mismatch["severity"] == "critical"
    assert mismatch["details"]["failed"] == ["Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"]
    assert mismatch["details"]["first_step"] == 0
    assert mismatch["evidence"][0]["text"] == (
        "__fattn__-0: failed: Q.ne[3]==1 (Q.ne[3]=2), K.ne[3]==1 (K.ne[3]=2), V.ne[3]==1 (V.ne[3]=2)")
    [abort] = findings(report, "abort")
    assert abort["details"]["file"] == str(DEMO_SOURCE)
    assert abort["details"]["line"] == assert_line()
    assert abort["details"]["condition"] == "kv_stream_fattn_fits(dst)"
    assert "fattn_fits" in abort["fix"] or "fits" in abort["fix"]

    # the trace holds the program's own pointers and buffer names
    with r.trace.open(encoding="utf-8") as f:
        events = [json.loads(line) for line in f]
    assert events[0]["backend"] == "native" and events[0]["scenario"]["config"]["np"] == 2
    [fits] = [e for e in events if e.get("kind") == "fits"]
    assert fits["route"] == "abort" and fits["membership"] is True and fits["result"] is False
    for name in ("k", "v"):
        assert fits[name]["buffer"] == fits[name]["buffer_name"] == "CUDA_KV_Stream_Host"
        assert fits[name]["runtime"] == r.runtime
        assert fits[name]["ne"][3] == 2
    assert fits["k"]["data"] == fits["k"]["base"] == r.k_data(0)
    assert fits["q"]["ne"] == [256, 256, 4, 2] and fits["q"]["buffer"] == "CPU"
    assert fits["mask"]["type"] == "f16"
    assert events[-1]["kind"] == "end" and events[-1]["status"] == "aborted"

    exported = kvdiag("trace", "export", str(r.trace), "-o", str(r.trace.with_suffix(".json")))
    assert exported.returncode == 0, exported.stderr
    chrome = json.loads(r.trace.with_suffix(".json").read_text(encoding="utf-8"))
    [args] = [e["args"] for e in chrome if e.get("cat") == "fits"]  # every field of the event
    assert args["result"] is False
    assert args["failed"] == ["Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"]
    assert args["k"]["ne"] == [256, 256, 2, 2] and args["k"]["buffer"] == "CUDA_KV_Stream_Host"
    assert args["k"]["runtime"] == r.runtime


def test_tui_fits_screen_shows_the_real_node(run: Callable[..., DemoRun], tmp_path: Path) -> None:
    r = run("two-slot-concurrent", "shared", "membership")
    out = tmp_path / "fits.svg"
    proc = kvdiag("tui", str(r.trace), "--export-svg", str(out), "--screen", "fits",
                  "--size", "240x50")
    assert proc.returncode == 0, proc.stderr
    text = svg_text(out)
    assert "__fattn__-0" in text and "abort" in text
    assert "Q.ne[3]==1" in text and "K.ne[3]==1" in text and "V.ne[3]==1" in text
    assert "CUDA_KV_Stream_Host" in text
    assert f"0x{r.k_data(0):x}" in text
    assert f"0x{r.runtime:x}" in text  # the Fits table prints pointer-sized ids in hex


# -- slot1-first with the upstream (layer, page) keys ------------------------------------------

def test_slot1_first_shared_layout_diverges_on_stream_1(run: Callable[..., DemoRun]) -> None:
    r = run("slot1-first", "shared", "membership")
    assert r.returncode == 0, r.stderr
    printed = r.deltas()
    assert all(d == 0.0 for _, d in printed[0]), printed[0]
    bad = [(step, d) for step, d in printed[1] if d > TOLERANCE]
    # request 0 (slot 1) decodes on steps 2..9, request 2 (slot 1 again) runs steps 20..24
    assert [step for step, _ in bad] == [*range(2, 10), *range(20, 25)]

    code, report = check_json(r.trace)
    assert code == 1
    assert not findings(report, "fits-dispatch-mismatch") and not findings(report, "abort")
    [div] = findings(report, "stream-divergence")
    assert div["details"]["stream"] == 1
    assert div["details"]["first_step"] == 2
    assert div["details"]["count"] == len(bad)
    assert div["details"]["max_abs_delta"] == pytest.approx(max(d for _, d in bad), rel=1e-5)
    assert div["details"]["tolerance"] == TOLERANCE
    assert report["summary"]["residency"]["routes"] == {"streamed": 50}


def test_slot1_first_shared_layout_reads_stale_then_foreign_pages(
        run: Callable[..., DemoRun]) -> None:
    r = run("slot1-first", "shared", "membership")
    _, report = check_json(r.trace)
    [stale] = findings(report, "stale-page-read")
    [foreign] = findings(report, "foreign-page-read")
    # decode rows of stream 1 mark global page 4+ (outside the 4-page window): page 2 stays
    # as uploaded at step 1 while steps 2..9 write it
    assert (stale["details"]["stream"], stale["details"]["first_step"]) == (1, 2)
    # slot 1's second request finds pages 0..1 holding slot 0's bytes
    assert (foreign["details"]["stream"], foreign["details"]["first_step"]) == (1, 20)
    classes = report["summary"]["residency"]["read_classes"]
    assert classes["stale"] == 16 and classes["foreign"] == 20


def test_per_stream_layout_reads_only_exact_pages(run: Callable[..., DemoRun]) -> None:
    r = run("slot1-first", "per-stream", "fits")
    _, report = check_json(r.trace)
    classes = report["summary"]["residency"]["read_classes"]
    assert classes["stale"] == classes["foreign"] == 0
    assert classes["exact"] == report["summary"]["residency"]["pages_read"]["pool"] + \
        report["summary"]["residency"]["pages_read"]["ring"]


# -- the fixes ---------------------------------------------------------------------------------

def test_per_stream_layout_with_fits_dispatch_is_clean(run: Callable[..., DemoRun]) -> None:
    r = run("slot1-first", "per-stream", "fits")
    assert r.returncode == 0, r.stderr
    assert all(d == 0.0 for deltas in r.deltas().values() for _, d in deltas)
    code, report = check_json(r.trace)
    assert code == 0
    assert [f for f in report["findings"] if f["severity"] in ("error", "critical")] == []
    res = report["summary"]["residency"]
    assert res["routes"] == {"streamed": 50}
    # a 2-page window per stream: pages 0..1 resident, page 2 streams through the ring
    assert res["pages_read"]["pool"] > 0 and res["pages_read"]["ring"] > 0
    assert res["upload_reasons"].get("dirty", 0) > 0


def test_fits_dispatch_falls_back_for_two_stream_ubatches(run: Callable[..., DemoRun]) -> None:
    r = run("two-slot-concurrent", "per-stream", "fits")
    assert r.returncode == 0, r.stderr
    code, report = check_json(r.trace)
    assert code == 0
    assert not findings(report, "fits-dispatch-mismatch") and not findings(report, "abort")
    [fallback] = findings(report, "fallback")
    assert fallback["details"]["failed"] == ["Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"]
    assert fallback["details"]["count"] == 2 * report["summary"]["steps"]
    assert report["summary"]["residency"]["pages_read"]["host"] > 0
    assert all(d == 0.0 for deltas in r.deltas().values() for _, d in deltas)


def test_tui_findings_screen_of_the_diverging_run(run: Callable[..., DemoRun],
                                                  tmp_path: Path) -> None:
    r = run("slot1-first", "shared", "membership")
    out = tmp_path / "findings.svg"
    proc = kvdiag("tui", str(r.trace), "--export-svg", str(out), "--screen", "7",
                  "--size", "200x50")
    assert proc.returncode == 0, proc.stderr
    text = svg_text(out)
    assert "stream-divergence" in text
    assert "stream 1 output diverges" in text


RUNS = (("two-slot-concurrent", "shared", "membership"), ("slot1-first", "shared", "membership"),
        ("slot1-first", "per-stream", "fits"), ("two-slot-concurrent", "per-stream", "fits"))


@pytest.mark.parametrize("config", RUNS, ids="-".join)
def test_program_predicate_agrees_with_kvdiag_on_the_real_geometry(
        run: Callable[..., DemoRun], config: tuple[str, str, str]) -> None:
    """Every fits() the C++ program evaluated on the ggml node gives the same verdict and the
    same failed conditions when kvdiag's own predicate (kvstream.fits) reads the logged
    tensors; and the trace reads back with no problem."""
    from kvdiag.kvstream.fits import fits
    from kvdiag.kvstream.views import AttentionNode
    from kvdiag.model import events as ev
    from kvdiag.trace.reader import TraceReader

    r = run(*config)
    reader = TraceReader.open(r.trace)
    decisions = [e for e in reader if isinstance(e, ev.Fits)]
    assert reader.problems == [] and reader.complete
    assert decisions
    for e in decisions:
        assert e.evaluated and e.mask is not None
        node = AttentionNode(layer=e.layer, q=e.q, k=e.k, v=e.v, mask=e.mask, dst=e.dst, s0=0,
                             ns=e.q.ne[3])
        verdict = fits(node, e.stage_bytes)
        assert (verdict.ok, verdict.failed, verdict.membership) == (e.result, e.failed, True)


def test_bad_usage_is_one_line_and_exit_2(kvdemo: Path, tmp_path: Path) -> None:
    trace = tmp_path / "refused.kvtrace"
    proc = subprocess.run([str(kvdemo), "--schedule", "three-slots", "--layout", "shared",
                           "--dispatch", "fits"], capture_output=True, text=True, timeout=30,
                          check=False, env={**os.environ, "KVTRACE_FILE": str(trace)})
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        "kvdemo: --schedule must be two-slot-concurrent or slot1-first")
    assert not trace.exists()  # the trace opens only after the command line was accepted
    proc = subprocess.run([str(kvdemo), "--schedule", "slot1-first", "--layout", "shared",
                           "--dispatch", "fits", "--pool-mib", "1", "--layers", "5"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2  # 1 MiB holds 4 pages of 237568 B: not one per layer plus a ring
    assert proc.stderr.splitlines()[0] == (
        "kvdemo: the runtime would refuse this pool: pool of 4 pages cannot hold one page per "
        "layer for 5 layers plus a ring")


def test_concurrent_first_runs_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs racing on an empty cache: the flock lets one build; the other waits and reuses
    the renamed tree (the build itself is replaced by a slow stand-in: no network here)."""
    if nb.missing_tools():
        pytest.skip(str(nb.missing_tools()))
    builds: list[Path] = []

    def fake_build(tmp: Path) -> dict[str, object]:
        builds.append(tmp)
        time.sleep(0.5)
        (tmp / "lib").mkdir()
        (tmp / "lib" / nb.LIB_NAME).write_bytes(b"!<arch>\n")
        return {"sha256": nb.SDIST_SHA256}

    monkeypatch.setattr(nb, "_build_into", fake_build)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: nb.ensure_ggml(tmp_path), range(2)))
    assert len(builds) == 1
    assert results[0].root == results[1].root == tmp_path / nb.build_dir_name()
    assert sorted(r.info["cached"] for r in results) == [False, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        nb.build_dir_name(), nb.build_dir_name() + ".lock"]  # no temporary tree left behind


def test_ggml_build_is_cached_and_pinned(kvdemo: Path) -> None:
    again = nb.ensure_ggml()
    assert again.info["cached"] is True
    assert again.library.is_file() and (again.source / "include" / "ggml.h").is_file()
    stamp = json.loads((again.root / "build.json").read_text(encoding="utf-8"))
    assert stamp["sha256"] == nb.SDIST_SHA256 and stamp["ggml_version"] == "0.15.3"
    assert stamp["build_seconds"] > 0
