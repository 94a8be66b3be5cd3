"""Shared fixtures: captured traces of the core scenarios (captured once per test session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvdiag.cli import main

Capture = Callable[..., tuple[Path, int]]


@pytest.fixture(scope="session")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    """``captured(scenario, layout, dispatch, *extra)`` → (trace path, exit code); cached."""
    cache: dict[tuple[str, ...], tuple[Path, int]] = {}
    root = tmp_path_factory.mktemp("traces")

    def run(scenario: str, layout: str = "shared", dispatch: str = "membership",
            *extra: str) -> tuple[Path, int]:
        key = (scenario, layout, dispatch, *extra)
        if key not in cache:
            out = root / f"{'-'.join(key).replace(' ', '_')}.kvtrace"
            code = main(["capture", "--scenario", scenario, "--layout", layout, "--dispatch",
                         dispatch, "--executor", "numpy", "-q", "-o", str(out), *extra])
            cache[key] = (out, code)
        return cache[key]

    return run
