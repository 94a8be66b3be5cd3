"""The import directions of docs (design.md, "Components"), checked on the source text.

Each package may import only the packages its row allows; only executors/cupy* imports cupy,
only telemetry imports pynvml, only tui imports textual. Imports inside functions count too:
a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "kvdiag"

# package -> kvdiag packages it may import (besides itself and the leaf kvdiag.errors)
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "kvstream": {"model", "trace"},
    # the GPU executor names its device through telemetry's one NVML helper
    "executors": {"kvstream", "model", "telemetry"},
    "trace": {"model"},
    "telemetry": {"model"},
    "postmortem": {"model"},
    "analysis": {"model"},
    "report": {"analysis", "model"},
    # trace exports render the judgement: events in, Chrome JSON or a llama-server log out
    "export": {"analysis", "model"},
    # kvdiag import: reads logs with postmortem, sizes pages with kvstream, writes a trace
    "logimport": {"postmortem", "kvstream", "trace", "model"},
    # kvdiag tui --follow: the file followed as check --follow follows it (kvdiag/follow)
    "tui": {"report", "analysis", "trace", "model", "postmortem", "follow"},
    # kvdiag sql: traces judged (analysis), logs scanned (postmortem), into DuckDB
    "sql": {"analysis", "trace", "postmortem", "model"},
    # kvdiag check --follow: a growing trace or log (read as trace/logimport do), judged
    "follow": {"analysis", "trace", "postmortem", "logimport", "model", "report"},
}
LEAVES = {"errors", "files", "__init__"}


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_design(package: str) -> None:
    bad: list[str] = []
    for path in modules(package):
        for name in imports(path):
            parts = name.split(".")
            if parts[0] != "kvdiag" or len(parts) < 2:
                continue
            target = parts[1]
            if target in (package, *LEAVES) or target in ALLOWED[package]:
                continue
            if target == "__init__" or name == "kvdiag":
                continue
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


@pytest.mark.parametrize(("library", "where"), [
    ("cupy", lambda p: p.parts[-2] == "executors" and p.name.startswith("cupy")),
    ("pynvml", lambda p: "telemetry" in p.parts),
    ("textual", lambda p: "tui" in p.parts),
    ("duckdb", lambda p: "sql" in p.parts),
])
def test_heavy_libraries_stay_in_their_place(library: str, where) -> None:  # type: ignore[no-untyped-def]
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if any(n.split(".")[0] == library for n in imports(p)) and not where(p)]
    assert offenders == []


def test_model_needs_only_the_standard_library_and_msgspec() -> None:
    import sys

    third_party = set()
    for path in modules("model"):
        for name in imports(path):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("kvdiag", "__future__"):
                third_party.add(top)
    assert third_party <= {"msgspec"}


def test_the_judgement_imports_only_the_model() -> None:
    """kvdiag/analysis/judgement is the one place verdicts come from; it stands on the raw
    events alone (design.md, "One judgement, every surface")."""
    bad = [f"{p.relative_to(ROOT)} imports {name}"
           for p in sorted((ROOT / "analysis" / "judgement").rglob("*.py"))
           for name in imports(p)
           if name.startswith("kvdiag.") and not name.startswith(
               ("kvdiag.model", "kvdiag.analysis.judgement"))]
    assert bad == []
