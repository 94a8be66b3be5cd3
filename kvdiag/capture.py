"""Capture: pick an executor, run a scenario through the runtime model, write the trace.

Joins kvstream (decisions), executors (data plane) and trace (the file); the CLI's
``capture`` and ``demo`` call :func:`capture`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdiag.errors import DeviceUnavailable, InputError, UsageError
from kvdiag.kvstream.backend import Executor
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.runner import ConfigError, Runner, RunResult
from kvdiag.kvstream.scenarios import Scenario
from kvdiag.model.events import Device
from kvdiag.trace.writer import TraceWriter, make_header

EXECUTORS = ("auto", "numpy", "cupy")


@dataclass(frozen=True)
class CaptureResult:
    path: Path
    result: RunResult
    events: int
    executor: str


def make_executor(name: str) -> tuple[Executor, Device]:
    """``auto`` takes CuPy when a GPU answers, else NumPy; ``cupy`` without one raises."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (one of {', '.join(EXECUTORS)})")
    if name in ("auto", "cupy"):
        try:
            from kvdiag.executors.cupy_exec import open_cupy_executor
        except ImportError as exc:
            if name == "cupy":
                raise DeviceUnavailable(f"the cupy executor is not available: {exc}") from None
        else:
            try:
                return open_cupy_executor()
            except DeviceUnavailable:
                if name == "cupy":
                    raise
    from kvdiag.executors.numpy_exec import NumpyExecutor

    return NumpyExecutor(), Device(name="CPU (NumPy reference executor)")


def capture(
    cfg: RuntimeConfig,
    scenario: Scenario,
    out: Path,
    executor_name: str = "auto",
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> CaptureResult:
    if out.is_dir():
        raise InputError(f"{out} is a directory")
    if not out.parent.exists():
        raise InputError(f"directory {out.parent} does not exist")
    executor, device = make_executor(executor_name)
    try:
        try:
            runner = Runner(cfg, scenario, executor, seed=seed, progress=progress)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        header = make_header(
            executor.name, device,
            scenario={"name": scenario.name, "description": scenario.description,
                      "seed": seed, "config": cfg.as_dict(),
                      "requests": [vars(r) for r in scenario.requests]},
            plan=runner.plan.as_json(),
        )
        with TraceWriter.create(out, header) as writer:
            result = runner.run(writer)
            writer.close(result.status, steps=result.steps)
            return CaptureResult(out, result, writer.seq, executor.name)
    finally:
        executor.close()
