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
    # runs of the model that make raw events: capture and sweep
    "runs": {"kvstream", "executors", "telemetry", "trace", "model", "analysis"},
    # a trace file judged; logs and traces as perf runs beside the model's prediction
    "judged": {"analysis", "trace", "postmortem", "logimport", "kvstream", "model"},
}
# the command line: one module per subcommand (commands/) and the dispatcher (cli.py), above
# every package; nothing below them imports them
TOP_LEVEL = {"__init__", "__main__", "cli", "errors"}
LEAVES = {"errors", "files", "compiled", "__init__"}


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
    events alone (design.md, "One judgement, every surface"); kvdiag.compiled only builds
    the C twins of its hot loops."""
    bad = [f"{p.relative_to(ROOT)} imports {name}"
           for p in sorted((ROOT / "analysis" / "judgement").rglob("*.py"))
           for name in imports(p)
           if name.startswith("kvdiag.") and name != "kvdiag.compiled" and not name.startswith(
               ("kvdiag.model", "kvdiag.analysis.judgement"))]
    assert bad == []


def test_the_compiled_helpers_stand_on_the_files_leaf_alone() -> None:
    """kvdiag.compiled (the C build and load) is a leaf below the judgement: it imports no
    kvdiag package but kvdiag.files (the cache folder)."""
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in modules("compiled")
           for name in imports(p) if name.startswith("kvdiag") and name != "kvdiag.files.cache"]
    assert bad == []


def test_only_the_command_line_sits_beside_the_packages() -> None:
    """Issue 15 §7: modules that do work live in a package whose row above says what it may
    import; at the top only the entry points and the leaf of errors remain."""
    assert {p.stem for p in ROOT.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == {*ALLOWED, "commands", "files", "compiled"}


def test_nothing_below_the_command_line_imports_it() -> None:
    bad = [f"{p.relative_to(ROOT)} imports {name}"
           for p in ROOT.rglob("*.py") if p.parts[len(ROOT.parts)] not in ("commands", "cli.py",
                                                                           "__main__.py")
           for name in imports(p) if name.startswith(("kvdiag.commands", "kvdiag.cli"))]
    assert bad == []


def _runtime_imports(path: Path) -> set[str]:
    """kvdiag modules ``path`` imports when it runs (lazy imports in functions count; those
    under ``if TYPE_CHECKING:`` do not: they are for the type checker only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_no_two_modules_import_each_other() -> None:
    """Issue 15 §7 (report/check.py and report/check_output.py imported each other): the
    module graph has no cycle, so every arrow points one way."""
    mods = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in ROOT.rglob("*.py")}
    graph = {m: {d for d in _runtime_imports(p) if d in mods and d != m
                 and not m.startswith(d + ".")}  # a module's own package __init__
             for m, p in mods.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*path[path.index(d):], d])
            elif d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []
