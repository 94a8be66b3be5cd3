"""``kvdiag perf``'s inputs and its prediction: a log or a trace as a run with the shape its boot
gave, and the runtime model's play of the run's own requests (docs/perf.md).

Orchestration only: reading is :mod:`kvdiag.postmortem.perfscan` (logs) and
:mod:`kvdiag.analysis.perf_trace` (traces), the configuration comes from the boot lines as
``kvdiag import`` reads them (:mod:`kvdiag.logimport.header`), the model is
:mod:`kvdiag.kvstream.session`, the comparison :mod:`kvdiag.analysis.perf_predict`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvdiag.analysis.perf import RequestRow, rows
from kvdiag.analysis.perf_predict import Calibration, Predicted, calibrate, predict
from kvdiag.errors import InputError, UsageError
from kvdiag.files.inputs import STDIN_NAME
from kvdiag.model.logrecords import Problem
from kvdiag.model.perf import PerfRun

if TYPE_CHECKING:
    # the model side (--predict) is imported where it is used: kvstream imports numpy
    # (~0.13 s), which reading and binning a run never needs
    from kvdiag.kvstream.config import RuntimeConfig
    from kvdiag.kvstream.scenarios import Scenario
    from kvdiag.kvstream.timing import DeviceProfile

REQUIRED = ("layers", "ctx", "type_k", "type_v", "head_dim", "n_head", "n_head_kv",
            "stage_mib")
_FLAG = {"layers": "--layers", "ctx": "--ctx", "type_k": "--type-k", "type_v": "--type-v",
         "head_dim": "--head-dim", "n_head": "--n-head", "n_head_kv": "--n-head-kv",
         "stage_mib": "--stage-mib"}


@dataclass(frozen=True)
class LoadedRun:
    run: PerfRun
    config: dict[str, Any] = field(default_factory=dict)
    """``RuntimeConfig`` keys the run's boot gave (docs/log-import.md, "Header")."""
    device: str | None = None
    """The GPU the log or trace names, if it does."""


def _is_trace(path: str) -> bool:
    if path == STDIN_NAME:
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(256).lstrip(b"\xef\xbb\xbf")
    except OSError:
        return False  # the log reader words the error
    return head.startswith(b'{"format":"kvtrace"') or (head.startswith(b"{")
                                                       and b'"kvtrace"' in head)


def load(path: str) -> LoadedRun:
    """A llama-server log or a trace with ``timing`` events as a run (``InputError`` when it
    is neither)."""
    import msgspec

    from kvdiag.analysis.perf_trace import run_from_events
    from kvdiag.files.logs import open_log
    from kvdiag.logimport.header import BootSniffer, chosen_boot, plan_of, runtime_config
    from kvdiag.postmortem.perfread import scan_stream
    from kvdiag.trace.reader import TraceReader

    if _is_trace(path):
        with TraceReader.open(path) as reader:
            run = run_from_events(os.path.basename(path), path, reader)
            problems = tuple(Problem(source=path, message=p.message, line=p.line)
                             for p in reader.problems[:5])
            header = reader.header
        config = dict(header.scenario.get("config") or {})
        device = header.device.name if header.device.name not in ("unknown", "cpu") else None
        return LoadedRun(msgspec.structs.replace(run, problems=problems), config, device)
    sniffer = BootSniffer()
    with open_log(path) as log:
        run = scan_stream(log.name, log.stream, hook=sniffer.feed)
    boot = chosen_boot(run.boots)
    plan, _derived = plan_of(boot, sniffer.info)
    return LoadedRun(run, runtime_config(boot, plan),
                     sniffer.device[0] if sniffer.device else None)


def model_config(loaded: LoadedRun, preset: str | None,
                 overrides: dict[str, Any]) -> RuntimeConfig:
    """The run's shape for the model: the preset (if named), then what its boot gave, then
    the flags. A shape the log does not give is not guessed: a missing one is a usage error
    that names the flag."""
    from kvdiag.kvstream.config import PRESETS, RuntimeConfig

    values: dict[str, Any] = dict(PRESETS[preset]) if preset else {}
    values.update({k: v for k, v in loaded.config.items() if v not in ("", None)})
    values.update(overrides)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        flags = ", ".join(_FLAG[k] for k in missing)
        what = ("does not stream KV (no pool line) and " if "stage_mib" in missing else "")
        raise UsageError(f"--predict: {loaded.run.name} {what}does not give the model's "
                         f"{', '.join(missing)}; name them with {flags} (or --preset)")
    values["stage_mib"] = max(1, round(float(values["stage_mib"])))
    values.setdefault("np", 1)
    values.update(adaptive=True, layout="per-stream", dispatch="fits")
    try:
        return RuntimeConfig(**{k: v for k, v in values.items()
                                if k in RuntimeConfig.__dataclass_fields__})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--predict: {exc}") from None


def replay(table: list[RequestRow]) -> Scenario:
    """The run's own requests as a scenario, in the order they began: a request whose cache
    kept tokens continues its slot's conversation (``Request.cont``) with its new tokens only,
    and waits for the slot's previous request."""
    from kvdiag.kvstream.scenarios import Request, Scenario

    requests: list[Request] = []
    last: dict[int, int] = {}
    for row in table:
        r = row.request
        slot = max(r.slot or 0, 0)
        start = row.depth_start or r.prompt_tokens or 1
        cont = bool(r.cached) and slot in last
        prompt = max(1, start - (r.cached or 0)) if cont else max(1, start)
        requests.append(Request(slot=slot, prompt=prompt, decode=max(1, r.decode_tokens or 1),
                                after=last.get(slot), cont=cont))
        last[slot] = len(requests) - 1
    np_ = max((q.slot for q in requests), default=0) + 1
    return Scenario("replay", f"{len(requests)} requests of a measured run", dict(np=np_),
                    tuple(requests))


@dataclass(frozen=True)
class Prediction:
    profile: DeviceProfile
    profile_why: str
    config: RuntimeConfig
    predicted: tuple[Predicted, ...]
    calibration: Calibration | None
    pool: dict[str, int]

    def curve(self) -> tuple[list[float], list[float], list[float]]:
        """The model's decode tok/s at each request's depth (the middle of its decode) and the
        resident pages/layer it played there: what ``perf --plot`` and the Perf screen draw
        beside the measured rates (requests without a predicted rate left out)."""
        points = [p for p in self.predicted if p.predicted_tps]
        return ([p.row.depth_mid or 0.0 for p in points], [p.predicted_tps or 0.0 for p in points],
                [float(p.model.resident_pages[0]) for p in points])


def predict_run(loaded: LoadedRun, base: LoadedRun | None, profile: DeviceProfile,
                profile_why: str, preset: str | None, overrides: dict[str, Any]) -> Prediction:
    from kvdiag.kvstream.session import SessionError, play

    cfg = model_config(loaded, preset, overrides)
    table = sorted(rows(loaded.run), key=lambda r: r.order)
    if cfg.np < max((max(r.request.slot or 0, 0) for r in table), default=0) + 1:
        cfg = cfg.replace(np=max(max(r.request.slot or 0, 0) for r in table) + 1)
    try:
        session = play(cfg, replay(table), profile)
    except (SessionError, ValueError) as exc:
        raise UsageError(f"--predict: the model cannot play {loaded.run.name}: {exc}") from None
    cost = session.cost
    calibration = calibrate(rows(base.run), cost) if base is not None else None
    predicted = predict(table, list(session.requests), calibration, cost)
    pool = session.plan.pool
    assert pool is not None
    return Prediction(profile, profile_why, cfg, tuple(predicted), calibration,
                      {"pool_pages": pool.pool_pages, "page_bytes": pool.page_bytes,
                       "resident_pages_per_layer": pool.resident_pages_per_layer,
                       "ring_slots": pool.ring_slots, "streamed_layers": cfg.n_streamed})


def choose_profile(spec: str | None, *devices: str | None) -> tuple[DeviceProfile, str]:
    """The profile to predict with, and why it is that one: ``--profile``; else the built-in
    card a run's device line names; else the measured H200, saying the GPU is unknown."""
    from kvdiag.kvstream.cards import card_for
    from kvdiag.kvstream.profiles import BUILTIN, load_profile

    if spec:
        profile = load_profile(spec)
        return profile, f"--profile {spec}"
    for device in devices:
        if device:
            key = card_for(device)
            if key is not None:
                return BUILTIN[key], f"the log's device line names {device}"
    named = next((d for d in devices if d), None)
    if named is not None:
        why = (f"the log names {named}, which has no built-in profile; predicted with the h200 "
               "profile (measured by kvdiag) — name yours with --profile")
    else:
        why = ("the run's GPU is unknown (its log names none); predicted with the h200 profile "
               "(measured by kvdiag) — name yours with --profile (a built-in card such as "
               "rtx-5080, or a file from kvdiag devices --profile)")
    return BUILTIN["h200"], why


def require_runs(paths: list[str]) -> list[LoadedRun]:
    out = [load(p) for p in paths]
    for r in out:
        if r.run.lines == 0 and not r.run.requests and r.run.kind == "log":
            raise InputError(f"{r.run.source}: empty")
    return out
