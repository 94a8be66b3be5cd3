"""Acceptance: the two bugs reproduce under the upstream model and vanish under the fixes.

GIVEN a scenario captured on the NumPy executor, WHEN the trace is checked, THEN the findings
name the failure class with its evidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.analysis.judgement import Judge
from kvdiag.cli import main
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader
from tests.conftest import Capture

STEPS = ("--steps", "4", "--prompt-tokens", "300")


def check_json(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    capsys.readouterr()  # drop what capture printed
    code = main(["check", str(path), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def events_of(path: Path) -> list[ev.AnyEvent | ev.Unknown]:
    with TraceReader.open(path) as r:
        return list(r)


def rules(doc: dict) -> list[str]:  # type: ignore[type-arg]
    return [f["rule"] for f in doc["findings"]]


def test_two_slot_membership_dispatch_aborts_on_the_fits_assert(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    path, code = captured("two-slot-concurrent", "shared", "membership", *STEPS)
    assert code == 3
    code, doc = check_json(capsys, path)
    assert code == 1
    assert rules(doc)[:2] == ["fits-dispatch-mismatch", "abort"]
    mismatch = doc["findings"][0]
    assert {"Q.ne[3]==1", "K.ne[3]==1", "V.ne[3]==1"} <= set(mismatch["details"]["failed"])
    # runtime identity holds: K and V are in one kv-stream runtime
    assert not any("runtime" in c for c in mismatch["details"]["failed"])
    abort = doc["findings"][1]
    assert abort["title"] == (
        "/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:1898: "
        "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed")
    assert abort["severity"] == "critical"
    # the run stopped at the first FA node of the first ubatch, as the server would
    evs = events_of(path)
    fits = [e for e in evs if isinstance(e, ev.Fits)]
    assert len(fits) == 1 and fits[0].route == "abort" and fits[0].k.ne[3] == 2
    assert fits[0].k.buffer == "CUDA_KV_Stream_Host" and fits[0].dst.ne == (256, 24, 256, 2)
    end = evs[-1]
    assert isinstance(end, ev.End) and end.status == "aborted"


def test_two_slot_fits_dispatch_falls_back_and_stays_exact(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    path, code = captured("two-slot-concurrent", "shared", "fits", *STEPS)
    assert code == 0
    code, doc = check_json(capsys, path)
    assert code == 0  # warnings only: below the default --fail-on error
    assert rules(doc) == ["fallback"]
    assert "Q.ne[3]==1" in doc["findings"][0]["details"]["failed"]
    assert doc["summary"]["status"] == "completed"
    outputs = [e for e in events_of(path) if isinstance(e, ev.Output)]
    assert {o.stream for o in outputs} == {0, 1}
    assert all(o.max_abs_delta == 0.0 for o in outputs)
    assert main(["check", str(path), "--fail-on", "warning"]) == 1


def test_slot1_first_shared_layout_diverges_on_stream_1(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    path, code = captured("slot1-first", "shared", "membership", *STEPS)
    assert code == 0
    code, doc = check_json(capsys, path)
    assert code == 1
    found = {f["rule"]: f for f in doc["findings"]}
    assert {"stale-page-read", "foreign-page-read", "stream-divergence"} <= set(found)
    assert found["stream-divergence"]["details"]["stream"] == 1
    assert found["stale-page-read"]["details"]["stream"] == 1
    assert found["foreign-page-read"]["details"]["stream"] == 1
    # the foreign pages hold slot 0's bytes
    assert "held stream 0 pages" in found["foreign-page-read"]["evidence"][0]["text"]
    # slot 0 is exact throughout
    outputs = [e for e in events_of(path) if isinstance(e, ev.Output)]
    assert all(o.max_abs_delta == 0.0 for o in outputs if o.stream == 0)
    assert any(o.max_abs_delta > o.tolerance for o in outputs if o.stream == 1)


def test_slot1_first_stale_read_is_the_first_decode_after_prefill(captured: Capture) -> None:
    path, _ = captured("slot1-first", "shared", "membership", *STEPS)
    evs = events_of(path)
    steps = {e.step: e for e in evs if isinstance(e, ev.Step)}
    first_bad = min(e.step for e in evs if isinstance(e, ev.Read)
                    and any(r.cls != "exact" for r in e.ranges))
    assert steps[first_bad].phase == "decode" and steps[first_bad].streams == (1,)
    # the write that made the page newer marked no resident page: global row 2048+cell
    # divides to page 8+, outside the 4-page window
    writes = [e for e in evs if isinstance(e, ev.Write) and e.step == first_bad]
    assert writes and all(w.dirty == () for w in writes)
    assert all(w.rows[0] == 2048 + w.cells[0] for w in writes)


def test_slot1_first_per_stream_layout_is_clean(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    path, code = captured("slot1-first", "per-stream", "membership", *STEPS)
    assert code == 0
    code, doc = check_json(capsys, path)
    assert code == 0 and doc["findings"] == []
    res = doc["summary"]["residency"]
    assert res["read_classes"]["stale"] == 0 and res["read_classes"]["foreign"] == 0
    assert res["pages_read"]["pool"] > 0  # the streamed path really ran


@pytest.mark.parametrize("layout", ["shared", "per-stream"])
@pytest.mark.parametrize("dispatch", ["membership", "fits"])
def test_single_slot_is_clean_and_bit_exact(
    captured: Capture, capsys: pytest.CaptureFixture[str], layout: str, dispatch: str
) -> None:
    path, code = captured("single-slot", layout, dispatch, *STEPS)
    assert code == 0
    code, doc = check_json(capsys, path, "--fail-on", "info")
    assert code == 0 and doc["findings"] == []
    outputs = [e for e in events_of(path) if isinstance(e, ev.Output)]
    assert len(outputs) == doc["summary"]["steps"]
    assert all(o.checksum == o.ref_checksum and o.max_abs_delta == 0.0 for o in outputs)
    assert doc["summary"]["residency"]["routes"] == {"streamed": 4 * len(outputs)}


def test_pool_pressure_streams_through_the_ring(captured: Capture) -> None:
    path, code = captured("pool-pressure", "shared", "membership", "--steps", "2",
                          "--prompt-tokens", "1500")
    assert code == 0
    with TraceReader.open(path) as r:
        j = Judge(r.header).feed_all(r).snapshot()
    res = j.summary()["residency"]
    assert res["pages_read"]["ring"] > res["pages_read"]["pool"] > 0
    ring_uploads = [e for e in events_of(path) if isinstance(e, ev.Upload) and e.target == "ring"]
    assert ring_uploads and all(e.pages[1] - e.pages[0] <= 32 for e in ring_uploads)
    assert j.findings == ()


def test_kv_unified_keeps_two_slots_on_the_streamed_path(
    captured: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    """-kvu puts both slots in one stream: the views stay 3-D, fits() holds, and the shared
    (layer, page) bookkeeping is exact because global rows are the stream's own cells."""
    path, code = captured("two-slot-concurrent", "shared", "membership", *STEPS, "--kv-unified")
    assert code == 0
    code, doc = check_json(capsys, path, "--fail-on", "info")
    assert code == 0 and doc["findings"] == []
    evs = events_of(path)
    fits = [e for e in evs if isinstance(e, ev.Fits)]
    assert {f.route for f in fits} == {"streamed"} and all(f.k.ne[3] == 1 for f in fits)
    steps = [e for e in evs if isinstance(e, ev.Step)]
    assert steps[-1].streams == (0,) and steps[-1].tokens == 2  # one decode token per slot
    outputs = [e for e in evs if isinstance(e, ev.Output)]
    assert all(o.checksum == o.ref_checksum for o in outputs)


def test_a_device_fault_mid_run_ends_in_an_abort_event_and_a_valid_trace(tmp_path: Path) -> None:
    """A CUDA error in the executor becomes an abort carrying the driver's text; the trace
    closes cleanly (status aborted) and check reports it."""
    from kvdiag.errors import DeviceFault
    from kvdiag.executors.numpy_exec import NumpyExecutor
    from kvdiag.kvstream.config import PRESETS, RuntimeConfig
    from kvdiag.kvstream.scenarios import SCENARIOS
    from kvdiag.model.events import Device
    from kvdiag.runs.capture import capture

    class Faulty(NumpyExecutor):
        calls = 0

        def attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            Faulty.calls += 1
            if Faulty.calls == 7:
                raise DeviceFault("CUDA error during attention",
                                  "cudaErrorIllegalAddress: an illegal memory access was "
                                  "encountered")
            return super().attend(*args, **kwargs)

    import kvdiag.runs.capture as cap

    original = cap.make_executor
    cap.make_executor = lambda name: (Faulty(), Device(name="faulty"))  # type: ignore[assignment]
    try:
        sc = SCENARIOS["single-slot"]
        cfg = RuntimeConfig(**{**PRESETS["small"], **sc.sizing, **sc.config})
        result = capture(cfg, sc, tmp_path / "f.kvtrace", "numpy")
    finally:
        cap.make_executor = original
    assert result.result.status == "aborted"
    evs = events_of(tmp_path / "f.kvtrace")
    abort = [e for e in evs if isinstance(e, ev.Abort)]
    assert len(abort) == 1 and abort[0].cuda_error is not None
    assert abort[0].cuda_error.startswith("cudaErrorIllegalAddress")
    assert isinstance(evs[-1], ev.End) and evs[-1].status == "aborted"
    assert main(["trace", "validate", str(tmp_path / "f.kvtrace")]) == 0


def test_late_join_needs_both_fixes(captured: Capture, capsys: pytest.CaptureFixture[str]) -> None:
    """The dispatch fix alone is not enough: once slot 0's prefill has relearned the layer map
    with its own K pointers, slot 1 decoding alone presents a pointer the shared bookkeeping
    has no layer number left for (the identity assert, domain brief §2.3)."""
    path, code = captured("late-join", "shared", "fits")
    assert code == 3
    code, doc = check_json(capsys, path)
    abort = next(f for f in doc["findings"] if f["rule"] == "abort")
    assert abort["details"]["condition"] == "cache->next_layer < cache->layer_count"
    assert "per-stream layout" in abort["fix"]
    evs = events_of(path)
    last_step = [e for e in evs if isinstance(e, ev.Step)][-1]
    assert last_step.streams == (1,) and last_step.phase == "decode"
    fixed, code = captured("late-join", "per-stream", "fits")
    assert code == 0
    code, doc = check_json(capsys, fixed)
    assert [f["rule"] for f in doc["findings"]] == ["fallback"]
