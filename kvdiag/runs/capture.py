"""Capture: pick an executor, run a scenario through the runtime model, write the trace.

Joins kvstream (decisions), executors (data plane) and trace (the file); the CLI's
``capture`` and ``demo`` (kvdiag/commands/capture.py) call :func:`capture`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from kvdiag.errors import DeviceUnavailable, Terminated, UsageError
from kvdiag.files.outputs import Output, open_output, plan_output
from kvdiag.kvstream.backend import Executor
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.runner import ConfigError, EventSink, Runner, RunResult
from kvdiag.kvstream.scenarios import Scenario
from kvdiag.kvstream.timing import H200, DeviceProfile
from kvdiag.model.events import Device
from kvdiag.runs.limits import check_memory
from kvdiag.trace.writer import TraceWriter, make_header

EXECUTORS = ("auto", "numpy", "cupy")


@dataclass(frozen=True)
class CaptureResult:
    path: str
    result: RunResult
    events: int
    executor: str


def make_executor(name: str) -> tuple[Executor, Device]:
    """``auto`` takes CuPy when a GPU answers, else NumPy; ``cupy`` without one raises."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (one of {', '.join(EXECUTORS)})")
    if name in ("auto", "cupy"):
        try:
            # imported by name: the module needs cupy, which only the GPU extra installs
            module = importlib.import_module("kvdiag.executors.cupy_exec")
        except ImportError as exc:
            if name == "cupy":
                raise DeviceUnavailable(f"the cupy executor is not available: {exc}") from None
        else:
            try:
                opened: tuple[Executor, Device] = module.open_cupy_executor()
                return opened
            except DeviceUnavailable:
                if name == "cupy":
                    raise
    from kvdiag.executors.numpy_exec import NumpyExecutor

    return NumpyExecutor(), Device(name="CPU (NumPy reference executor)")


def capture(
    cfg: RuntimeConfig,
    scenario: Scenario,
    out: Path | Output,
    executor_name: str = "auto",
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    telemetry_ms: int = 100,
    profile: DeviceProfile = H200,
    on_start: Callable[[], None] | None = None,
) -> CaptureResult:
    """Run ``scenario`` and write its trace to ``out`` (a path is replaced if it exists; the
    command checks with ``--force`` first); ``on_start`` is called once the executor and
    runner exist, just before the first event (so notes are not printed for a run that a
    missing device or a bad option refuses).

    The trace is written through a temporary file (kvdiag.files.outputs) and renamed into
    place once its End line is written — also when a signal or a device fault ended the run
    (status ``error``) — and removed when writing it failed (a full disk)."""
    target = out if isinstance(out, Output) else plan_output(out, force=True)
    executor, device = make_executor(executor_name)
    sampler = _telemetry(executor.name, telemetry_ms)
    restore = _raise_on_termination()
    try:
        check_scenario_fits(cfg, scenario)
        check_memory(cfg, scenario, executor.name)
        try:
            runner = Runner(cfg, scenario, executor, seed=seed, progress=progress,
                            on_step_end=_emit_telemetry(sampler) if sampler else None,
                            profile=profile)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        header = make_header(
            executor.name, device,
            scenario={"name": scenario.name, "description": scenario.description,
                      "seed": seed, "config": cfg.as_dict(),
                      "requests": [vars(r) for r in scenario.requests]},
            plan=runner.plan.as_json(),
            extra=({"feedback": {"kind": "measured", "by": f"{executor.name} executor: "
                                 "deadline-sampling kernel and copy-stream events"}}
                   if hasattr(executor, "end_evaluation") else
                   {"feedback": {"kind": "modelled", "profile": msgspec.to_builtins(profile)}})
            if cfg.adaptive else {},
        )
        if on_start is not None:
            on_start()
        with open_output(target) as sink:
            writer = TraceWriter.create_on(sink.fileno(), target.display, header)
            try:
                with writer:
                    result = runner.run(writer)
                    writer.close(result.status, steps=result.steps)
            finally:
                if writer.ended:
                    sink.keep()
            return CaptureResult(target.display, result, writer.seq, executor.name)
    finally:
        restore()
        if sampler is not None:
            sampler.stop()
        executor.close()


def _raise_on_termination() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while a capture runs, so the writer's
    ``with`` block ends the trace with status error and the signal as End.reason (SIGINT
    already raises KeyboardInterrupt); returns what puts the previous handlers back.
    Signal handlers can only be set from the main thread; elsewhere nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved: dict[int, Any] = {}

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signal.Signals(signum).name, signum)

    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None:
            saved[number] = signal.signal(number, handler)

    def restore() -> None:
        for number, previous in saved.items():
            signal.signal(number, previous)

    return restore


def _telemetry(executor_name: str, interval_ms: int) -> Any:
    """An NVML sampler for GPU captures (None, after one warning, where NVML is missing);
    CPU captures and ``--telemetry-ms 0`` have nothing to sample."""
    if executor_name == "numpy" or interval_ms <= 0:
        return None
    from kvdiag.telemetry.sampler import open_sampler

    return open_sampler(interval_s=interval_ms / 1000)


def _emit_telemetry(sampler: Any) -> Callable[[int, EventSink], None]:
    from kvdiag.model.events import Telemetry

    def emit(step: int, sink: EventSink) -> None:
        for sample in sampler.drain():
            if not sample.empty:
                sink.emit(Telemetry, step, **sample.event_fields())

    return emit


def stream_cells_needed(scenario: Scenario, n_stream: int) -> dict[int, int]:
    """Cells each KV stream must hold at once for ``scenario``, without running it.

    A request takes one cell per prompt and decode token and keeps them until the next request
    on its slot starts (the scheduler's find_slot / memory_seq_rm), so a slot never holds more
    than its largest request, and a stream at most the sum of that over the slots it serves:
    with one stream per slot this is exact; with a unified stream it is reached whenever the
    slots' largest requests overlap, as in every built-in scenario.
    """
    largest: dict[int, int] = {}
    for r in scenario.requests:
        largest[r.slot] = max(largest.get(r.slot, 0), r.prompt + r.decode)
    needed: dict[int, int] = {}
    for slot, cells in largest.items():
        stream = slot if n_stream > 1 else 0
        needed[stream] = needed.get(stream, 0) + cells
    return needed


def check_scenario_fits(cfg: RuntimeConfig, scenario: Scenario) -> None:
    """Refuse, before anything runs, a scenario whose requests cannot fit the KV cells of the
    shape: one line naming the flags that change it (was an internal error mid-run)."""
    needed = stream_cells_needed(scenario, cfg.n_stream)
    stream, cells = max(needed.items(), key=lambda kv: (kv[1], -kv[0]))
    if cells <= cfg.kv_size:
        return
    from kvdiag.kvstream.pages import pad_ctx

    # kv_size = pad(n_ctx // np) when not unified (n_ctx when unified): the smallest n_ctx
    # whose share pads up to pad(cells) is np * (pad(cells) - 255), itself padded
    ctx = pad_ctx((cfg.np if cfg.n_stream > 1 else 1) * (pad_ctx(cells) - 255))
    tokens = sorted({(r.prompt, r.decode) for r in scenario.requests})
    what = ", ".join(f"{p} prompt + {d} decode" for p, d in tokens)
    from kvdiag.kvstream.limits import SHAPE_LIMITS

    limit, _why = SHAPE_LIMITS["ctx"]
    fix = (f"raise --ctx to {ctx} or lower --steps / --prompt-tokens" if ctx <= limit else
           f"lower --steps / --prompt-tokens (--ctx {ctx} would be more than the runtime can "
           f"hold: at most {limit:,})")
    raise UsageError(
        f"scenario {scenario.name} needs {cells} KV cells in stream {stream} ({what} tokens "
        f"per request) but --ctx {cfg.ctx} gives {cfg.kv_size} per stream"
        f"{f' (np {cfg.np})' if cfg.n_stream > 1 else ''}: {fix}")


def ctx_rounding_note(ctx: int | None) -> str | None:
    """The note printed when ``--ctx`` is not a multiple of 256 (it is rounded up, as
    llama_context pads n_ctx: brief §1.3)."""
    from kvdiag.kvstream.pages import pad_ctx

    if ctx is None or ctx <= 0 or ctx == pad_ctx(ctx):
        return None
    return f"note: --ctx {ctx} is rounded up to {pad_ctx(ctx)} (n_ctx is padded to a multiple of 256)"
