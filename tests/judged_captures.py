"""Small model captures for the judgement's tests: every scenario × layout × dispatch (and the
unified cache where a scenario has several slots), plus ring-heavy variants (small rings,
the adaptive partition) where one read cycles through the ring."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.kvstream.config import PRESETS, RuntimeConfig
from kvdiag.kvstream.runner import Runner
from kvdiag.kvstream.scenarios import SCENARIOS, Scenario
from tests.test_kvstream_properties import ListSink


def _cases() -> list[tuple[str, str, str, bool]]:
    out = []
    for name, sc in SCENARIOS.items():
        unified = (False, True) if sc.config.get("np", 1) > 1 else (False,)
        for layout in ("shared", "per-stream"):
            for dispatch in ("membership", "fits"):
                out += [(name, layout, dispatch, u) for u in unified]
    return out


CASES = _cases()

RING_CASES: list[tuple[str, str, dict[str, Any]]] = [
    # stage 3 MiB with one ring slot: a read uses ring slots twice (the ring cycles in a read)
    ("pool-pressure", "shared", {"stage_mib": 3, "ring_slots": 1}),
    ("pool-pressure", "per-stream", {"stage_mib": 3, "ring_slots": 1}),
    ("slot1-first", "shared", {"stage_mib": 3, "ring_slots": 1}),
    ("slot1-first", "per-stream", {"stage_mib": 3, "ring_slots": 1}),
    ("pool-pressure", "shared", {"adaptive": True}),
    ("pool-pressure", "per-stream", {"adaptive": True, "ring_slots": 2}),
    ("late-join", "shared", {"stage_mib": 3, "ring_slots": 1}),
]


def small(name: str, layout: str, dispatch: str, unified: bool, **extra: Any
          ) -> tuple[RuntimeConfig, Scenario]:
    """The scenario at a small shape (2 layers, 4 query heads; prompts ≤ 300 tokens, ≤ 4 decode
    steps; pool-pressure keeps 1500 prompt tokens so pages stream through the ring)."""
    sc = SCENARIOS[name]
    values: dict[str, Any] = dict(PRESETS["small"])
    values.update(sc.sizing)
    values.update(sc.config)
    values.update(layers=2, n_head=4, layout=layout, dispatch=dispatch, kv_unified=unified)
    values.update(extra)
    prompt = 1500 if name == "pool-pressure" or extra else 300
    return RuntimeConfig(**values), dataclasses.replace(sc, requests=tuple(
        dataclasses.replace(r, prompt=min(r.prompt, prompt), decode=min(r.decode, 4))
        for r in sc.requests))


@functools.cache
def capture(name: str, layout: str, dispatch: str, unified: bool, **extra: Any
            ) -> tuple[Any, ...]:
    """The events of :func:`small`'s run."""
    cfg, scenario = small(name, layout, dispatch, unified, **extra)
    sink = ListSink()
    Runner(cfg, scenario, NumpyExecutor()).run(sink)
    return tuple(sink.events)
