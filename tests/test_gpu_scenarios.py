"""Whole scenarios on the GPU: the CuPy and NumPy executors make the same decisions.

GIVEN each scenario of the core issue captured once per executor, THEN the decision events
(steps, learned layers, fits results and failed conditions, routes, writes and dirty keys,
uploads, evictions, read classifications, warnings, aborts, the end) are identical, and each
stream's output delta against the resident reference agrees within twice the executors'
stated tolerance, with the same verdict against the runner's divergence threshold.
Skipped without CuPy or a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvdiag.cli import main
from kvdiag.errors import DeviceUnavailable
from kvdiag.kvstream.scenarios import SCENARIOS
from kvdiag.model import events as ev
from kvdiag.trace.reader import TraceReader

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:::cupy")]

STEPS = ("--steps", "4", "--prompt-tokens", "300")
NOT_DECISIONS = (ev.Output, ev.Telemetry, ev.Kernel)

# every scenario the capture command offers, so that a new one is covered without an edit here,
# and those of two slots once more with a unified KV cache (one stream: the kernels apply the
# runner's multi-sequence KQ mask)
LAYOUTS = (("shared", "membership"), ("shared", "fits"), ("per-stream", "fits"))
COMBOS = [(scenario, layout, dispatch, False) for scenario in SCENARIOS
          for layout, dispatch in LAYOUTS]
COMBOS += [(scenario, layout, dispatch, True) for scenario, sc in SCENARIOS.items()
           if sc.config.get("np", 1) > 1 for layout, dispatch in LAYOUTS]


@pytest.fixture(scope="module")
def gpu() -> None:
    pytest.importorskip("cupy", reason="CuPy is not installed")
    from kvdiag.executors.cupy_exec import load_cupy

    try:
        load_cupy()
    except DeviceUnavailable as exc:
        pytest.skip(f"no GPU: {exc}")


def _events(path: Path) -> list[Any]:
    with TraceReader.open(path) as r:
        return list(r)


def _strip_pointers(value: Any) -> Any:
    """Drop addresses: the CuPy executor logs its real pinned-store/pool pointers, the NumPy
    executor synthetic ones; the decisions must agree, the addresses cannot."""
    if isinstance(value, dict):
        return {k: _strip_pointers(v) for k, v in value.items() if k not in ("data", "k_ptr")}
    if isinstance(value, list):
        return [_strip_pointers(v) for v in value]
    return value


def _decision(e: Any) -> Any:
    """The event without its sequence number, time and addresses."""
    d = msgspec.to_builtins(e)
    d.pop("seq", None)
    d.pop("t_ns", None)
    if d.get("kind") == "end":
        d.pop("events", None)  # counts the GPU-only kernel and telemetry events too
    return _strip_pointers(d)


@pytest.mark.parametrize(("scenario", "layout", "dispatch", "unified"), COMBOS)
def test_cupy_and_numpy_make_the_same_decisions(
    gpu: None, tmp_path: Path, scenario: str, layout: str, dispatch: str, unified: bool
) -> None:
    paths = {}
    codes = {}
    for executor in ("numpy", "cupy"):
        paths[executor] = tmp_path / f"{executor}.kvtrace"
        codes[executor] = main(["capture", "--scenario", scenario, "--layout", layout,
                                "--dispatch", dispatch, "--executor", executor, "-q", "-o",
                                str(paths[executor]), *STEPS,
                                *(("--kv-unified",) if unified else ())])
    assert codes["cupy"] == codes["numpy"]
    evs = {k: _events(p) for k, p in paths.items()}
    decisions = {k: [_decision(e) for e in v if not isinstance(e, NOT_DECISIONS)]
                 for k, v in evs.items()}
    assert len(decisions["cupy"]) == len(decisions["numpy"])
    for a, b in zip(decisions["cupy"], decisions["numpy"], strict=True):
        assert a == b
    outs = {k: [e for e in v if isinstance(e, ev.Output)] for k, v in evs.items()}
    assert [(o.step, o.stream) for o in outs["cupy"]] == [(o.step, o.stream) for o in outs["numpy"]]
    from kvdiag.executors.cupy_exec import PARITY_ATOL

    worst = 0.0
    for c, n in zip(outs["cupy"], outs["numpy"], strict=True):
        worst = max(worst, abs(c.max_abs_delta - n.max_abs_delta))
        assert abs(c.max_abs_delta - n.max_abs_delta) <= 2 * PARITY_ATOL, (c, n)
        assert (c.max_abs_delta > c.tolerance) == (n.max_abs_delta > n.tolerance)
        if n.max_abs_delta == 0.0:  # exact reads: the GPU reads the host's bytes bit-for-bit
            assert c.max_abs_delta == 0.0
    report = os.environ.get("KVDIAG_GPU_REPORT")
    if report:
        diverged = sum(o.max_abs_delta > o.tolerance for o in outs["cupy"])
        with open(report, "a", encoding="utf-8") as f:
            f.write(f"scenario {scenario}{' (unified)' if unified else ''} {layout}/{dispatch}: "
                    f"exit {codes['cupy']}, "
                    f"{len(decisions['cupy'])} decision events identical, {len(outs['cupy'])} "
                    f"outputs ({diverged} diverged on both), max |Δdelta| = {worst:.2e}\n")


def test_adaptive_capture_on_the_gpu_measures_its_feedback(gpu: None, tmp_path: Path) -> None:
    """--adaptive on the CuPy executor: the controller is fed the device's own measurements —
    deadline samples/misses from the one-thread sampling kernel (kernels/deadline.cu) and copy
    busy from copy-stream events — and the header says so."""
    out = tmp_path / "adaptive.kvtrace"
    assert main(["capture", "--scenario", "pool-pressure", "--adaptive", "--stage-mib", "8",
                 "--prompt-tokens", "1200", "--steps", "6", "--executor", "cupy", "-q",
                 "-o", str(out)]) == 0
    with TraceReader.open(out) as r:
        assert r.header.extra["feedback"]["kind"] == "measured"
        events = list(r)
    adapt = [e for e in events if isinstance(e, ev.Adapt)]
    # the executor copies resident pages on its copy stream; ring pages it reads zero-copy
    # from the host store (the runner's ring uploads are bookkeeping), so each resident upload
    # batch is one deadline sample
    ring_uploads = sum(e.pages[1] - e.pages[0] for e in events
                       if isinstance(e, ev.Upload) and e.target == "ring")
    uploads = sum(1 for e in events if isinstance(e, ev.Upload) and e.target == "resident")
    assert adapt and all(a.eval_us is not None and a.eval_us > 0 for a in adapt)
    assert all(0 <= (a.misses or 0) <= (a.samples or 0) for a in adapt)
    assert all(a.busy_pct is not None and 0.0 <= a.busy_pct <= 100.0 for a in adapt)
    # one deadline sample per upload call (each batched copy publishes one number)
    assert sum(a.samples or 0 for a in adapt) == uploads and ring_uploads > 0
    report = Path(os.environ.get("KVDIAG_GPU_REPORT", os.devnull))
    with report.open("a") as f:
        f.write("adaptive pool-pressure on the GPU, measured feedback per evaluation: "
                + "; ".join(f"step {a.step} samples {a.samples} misses {a.misses} busy "
                            f"{a.busy_pct}% eval {a.eval_us:.0f} us" for a in adapt) + "\n")
