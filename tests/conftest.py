"""Shared fixtures: captured traces of the core scenarios (captured once per test session) and
kvrt, the C runtime with its own truth (built once, tests/native_runtime.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvdiag.cli import main

Capture = Callable[..., tuple[Path, int]]
_CACHES = itertools.count()


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test its own, empty kvdiag cache folder (the viewer caches judgements, the
    symbolizer DWARF indexes): never the user's, and no test sees another's."""
    folder = tmp_path_factory.getbasetemp() / "kvdiag-cache" / str(next(_CACHES))
    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(folder))
    yield


@pytest.fixture(scope="session", autouse=True)
def _compiled_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The C helpers (kvdiag.compiled) built once for the session, not once per cache folder
    of each test: a command run in a child process finds them built."""
    import os

    before = os.environ.get("KVDIAG_COMPILED_DIR")
    os.environ["KVDIAG_COMPILED_DIR"] = str(tmp_path_factory.mktemp("compiled"))
    yield
    if before is None:
        os.environ.pop("KVDIAG_COMPILED_DIR", None)
    else:
        os.environ["KVDIAG_COMPILED_DIR"] = before


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


@pytest.fixture(scope="session")
def kvdemo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvdemo built against the cached ggml (tests/kvdemo_runs.py); skips where it cannot."""
    from tests.kvdemo_runs import build

    built = build(tmp_path_factory.mktemp("kvdemo-build"))
    if isinstance(built, str):
        pytest.skip(built)
    return built


@pytest.fixture(scope="session")
def kvdemo_run(kvdemo: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Callable[[str, str, str], Any]:
    """``kvdemo_run(schedule, layout, dispatch)`` → DemoRun, each configuration run once."""
    from tests.kvdemo_runs import runner

    return runner(kvdemo, tmp_path_factory.mktemp("kvdemo-traces"))


@pytest.fixture(scope="session")
def kvrt() -> Any:
    """kvrt built (content-hashed cache), or the test skipped where no compiler is."""
    from native_runtime import RuntimeUnavailable, build

    try:
        return build()
    except RuntimeUnavailable as exc:
        pytest.skip(f"kvrt cannot be built: {exc}")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--snapshot-update`` unless the textual and pytest-textual-snapshot versions
    pinned in pyproject's dev extra are installed: SVG snapshots drawn by other versions
    differ in ways unrelated to kvdiag and would be committed by mistake."""
    if not config.getoption("--snapshot-update", default=False):
        return
    import re
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    dev = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["dev"]
    pins = dict(m.groups() for d in dev if (m := re.fullmatch(
        r"(textual|pytest-textual-snapshot)==([\w.]+)", d)))
    wrong = []
    for name, pinned in sorted(pins.items()):
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "not installed"
        if installed != pinned:
            wrong.append(f"{name} {installed} (pinned {pinned})")
    if len(pins) != 2 or wrong:
        raise pytest.UsageError("refusing --snapshot-update: " + (
            ", ".join(wrong) or "textual/pytest-textual-snapshot pins missing in pyproject"))
