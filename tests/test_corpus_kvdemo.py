"""The corpus test (tests/test_corpus.py) on kvdemo's traces: a real ggml's flash-attention
node and abort path writing through kernels/kvtrace.h (tests/test_native_ggml.py says what
kvdemo is). Every configuration — two-slot-concurrent and slot1-first × shared and per-stream
× membership and fits dispatch — and each with one judged kind removed; every surface agrees
with the judgement, and diff of shared against per-stream diverges where it says.

Slow, like tests/test_native_ggml.py (whose build and runs it shares: tests/conftest.py);
skips without a compiler, CMake or the cached ggml."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from corpus import Entry, judged, stripped
from surfaces import (
    check_disagreements,
    export_command_disagreements,
    info_disagreements,
    pages_disagreements,
    pair_diff_disagreements,
    removed_kind_disagreements,
    self_diff_disagreements,
    tui_disagreements,
)

from tests.kvdemo_runs import DISPATCHES, LAYOUTS, SCHEDULES, DemoRun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(kvdemo_run: Callable[[str, str, str], DemoRun],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Entry]]:
    root = tmp_path_factory.mktemp("corpus-kvdemo")
    base = []
    for schedule, layout, dispatch in itertools.product(SCHEDULES, LAYOUTS, DISPATCHES):
        run = kvdemo_run(schedule, layout, dispatch)
        path = root / run.trace.name  # a copy: the stripped variants are written beside it
        shutil.copyfile(run.trace, path)
        base.append(Entry(f"kvdemo/{schedule}-{layout}-{dispatch}", "kvdemo", path))
    return {"kvdemo": base, "kvdemo-stripped": stripped(base, root / "stripped")}


def agree(bad: list[str]) -> None:
    assert not bad, f"{len(bad)} disagreement(s):\n" + "\n".join(bad[:40])


def test_the_runs_are_what_the_corpus_needs(demo: dict[str, list[Entry]]) -> None:
    """Aborts, stale and foreign pages and a fallback: not a corpus of clean traces."""
    by = {e.name: judged(e.path).judgement for e in demo["kvdemo"]}
    abort = by["kvdemo/two-slot-concurrent-shared-membership"]
    assert abort.status == "aborted"
    aliasing = by["kvdemo/slot1-first-shared-membership"].residency["read_classes"]
    assert aliasing["stale"] > 0 and aliasing["foreign"] > 0
    assert by["kvdemo/slot1-first-per-stream-fits"].residency["read_classes"]["stale"] == 0
    assert "fallback" in {f.rule for f in by["kvdemo/two-slot-concurrent-per-stream-fits"].findings}
    assert {e.removed for e in demo["kvdemo-stripped"]} >= {"write", "upload", "read", "fits"}


@pytest.mark.parametrize("group", ["kvdemo", "kvdemo-stripped"])
def test_every_surface_renders_the_judgement(demo: dict[str, list[Entry]], group: str,
                                             tmp_path: Path) -> None:
    traces = demo[group]
    agree(check_disagreements(traces) + info_disagreements(traces)
          + pages_disagreements(traces) + export_command_disagreements(traces, tmp_path)
          + self_diff_disagreements(traces) + tui_disagreements(traces))


def test_diff_of_shared_and_per_stream_diverges_where_the_judgement_says(
        demo: dict[str, list[Entry]]) -> None:
    by = {e.name: e for e in demo["kvdemo"]}
    pairs = [(by[f"kvdemo/{s}-shared-{d}"], by[f"kvdemo/{s}-per-stream-{d}"])
             for s in SCHEDULES for d in DISPATCHES]
    bad, divergent = pair_diff_disagreements(pairs)
    assert divergent >= 1  # slot1-first: stream 1 reads stale pages under the shared key
    agree(bad)


def test_a_removed_kind_is_said_and_never_turns_a_verdict(
        demo: dict[str, list[Entry]]) -> None:
    by = {e.name: e for g in demo.values() for e in g}
    agree(removed_kind_disagreements(demo["kvdemo-stripped"], by))
