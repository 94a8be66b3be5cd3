"""Bad input gets one line on stderr and exit 2 — never a traceback — through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvdiag.cli import main

KVDIAG = [sys.executable, "-m", "kvdiag"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVDIAG, *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvdiag: error:") and text in lines[0]


@pytest.mark.parametrize(("args", "text"), [
    (["plan", "--ctx", "-5"], "--ctx must be positive"),
    (["plan", "--type-k", "q9_9"], "not a supported KV type"),
    (["plan", "--ctx", "many"], "invalid int value"),
    (["capture", "-o", "/nonexistent-dir/x.kvtrace"], "does not exist"),
    (["capture", "--scenario", "nope", "-o", "x.kvtrace"], "invalid choice"),
    (["capture", "--steps", "-3", "-o", "x.kvtrace"], "--steps must be positive"),
    (["capture", "--executor", "cupy", "-o", "x.kvtrace"], "the cupy executor"),
    (["check", "t.kvtrace", "--fail-on", "panic"], "unknown severity"),
])
def test_usage_errors(args: list[str], text: str, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    if args[0] == "check":
        assert main(["capture", "--scenario", "single-slot", "--steps", "1", "--prompt-tokens",
                     "8", "-q", "-o", str(tmp_path / "t.kvtrace")]) == 0
        args = ["check", str(tmp_path / "t.kvtrace"), *args[2:]]
    proc = subprocess.run([*KVDIAG, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    if "cupy" in args and proc.returncode == 0:
        pytest.skip("a GPU and CuPy are present here")
    assert_one_line_error(proc, 2, text)


def test_bad_trace_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.kvtrace"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.kvtrace"
    garbage.write_bytes(os.urandom(4096))
    newer = tmp_path / "newer.kvtrace"
    newer.write_text('{"format":"kvtrace","version":"2.0","kvdiag_version":"9","created":"x",'
                     '"backend":"numpy","device":{"name":"cpu"}}\n')
    for path, text in [(tmp_path / "missing.kvtrace", "no such file"),
                       (tmp_path, "is a directory"), (empty, "empty file"),
                       (garbage, "not a kvtrace trace"), (newer, "2.0 is newer")]:
        for cmd in (["check"], ["trace", "info"], ["trace", "validate"]):
            proc = run_cli(*cmd, str(path))
            assert proc.returncode == 2, (cmd, path, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1
            assert text in proc.stderr


def test_sigkill_mid_capture_leaves_a_readable_trace(tmp_path: Path) -> None:
    out = tmp_path / "killed.kvtrace"
    proc = subprocess.Popen([*KVDIAG, "capture", "--scenario", "pool-pressure", "--steps",
                             "400", "--prompt-tokens", "300", "-q", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    # the trace is written through OUT.<random>.part, renamed to OUT only once it ends
    parts: list[Path] = []
    # wait until a few steps have reached the file, then kill without warning
    while time.monotonic() < deadline:
        parts = list(tmp_path.glob("killed.kvtrace.*.part"))
        if parts and parts[0].read_bytes().count(b'"kind":"step"') >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # a kill leaves the part file (every step before it) and never a half-written OUT
    assert not out.exists() and len(parts) == 1
    out = parts[0]
    validate = run_cli("trace", "validate", str(out))
    assert validate.returncode == 1
    assert "Traceback" not in validate.stderr
    said = validate.stdout + validate.stderr
    assert "no End event" in said and ("incomplete" in said or "truncated" in said)
    check = run_cli("check", str(out), "--json")
    assert check.returncode in (0, 1), check.stderr
    doc = json.loads(check.stdout)
    assert "trace-incomplete" in [f["rule"] for f in doc["findings"]]
    assert doc["summary"]["counts"]["step"] >= 5
    # every completed step has its output event
    assert doc["summary"]["counts"]["output"] >= doc["summary"]["counts"]["step"] - 1


def test_check_imports_neither_textual_nor_cupy_nor_pynvml(tmp_path: Path) -> None:
    trace = tmp_path / "t.kvtrace"
    assert main(["capture", "--scenario", "single-slot", "--steps", "1", "--prompt-tokens", "8",
                 "--executor", "numpy", "-q", "-o", str(trace)]) == 0
    code = (
        "import sys\n"
        "from kvdiag.cli import main\n"
        f"rc = main(['check', {str(trace)!r}])\n"
        "bad = [m for m in ('textual', 'cupy', 'pynvml') if m in sys.modules]\n"
        "print('LOADED', bad)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout


def test_a_package_a_dependency_imports_is_a_missing_dependency_not_a_bug(
        tmp_path: Path) -> None:
    """GIVEN an installation where textual's own dependency pygments is missing (kvdiag does
    not import it; textual does, on the TUI's path)
    WHEN the TUI runs
    THEN exit 69 and one line naming pygments, the package that needs it and the install
    command, not "internal error" (70)."""
    out = tmp_path / "x.svg"
    trace = Path(__file__).parent.parent / "traces" / "single-slot.kvtrace"
    code = ("import sys; sys.modules['pygments'] = None\n"
            "from kvdiag.cli import main\n"
            f"sys.exit(main(['tui', {str(trace)!r}, '--export-svg', {str(out)!r}, "
            "'--screen', '6']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert_one_line_error(proc, 69, "pygments is not installed, and textual, which kvdiag "
                          "uses, needs it: the installation is incomplete (pip install pygments "
                          "installs it)")
    assert not out.exists()


def test_which_missing_module_is_the_installation_s_and_which_a_bug(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The importing code decides: a package's import of a module it requires names that
    requirement's distribution (markdown-it-py's ``mdurl``; textual's ``markdown_it``, whose
    distribution is ``markdown-it-py``); one it does not declare still says the installation
    is incomplete; kvdiag's own import of a module it does not require is a bug."""
    from kvdiag import cli

    def failed(module: str, missing: str) -> ModuleNotFoundError:
        monkeypatch.setitem(sys.modules, missing, None)
        try:
            exec(f"import {missing}", {"__name__": module})
        except ModuleNotFoundError as exc:
            return exc
        raise AssertionError("the import did not fail")

    assert cli._missing_dependency(failed("markdown_it.main", "mdurl")) == (
        "mdurl is not installed, and markdown-it-py, which kvdiag uses, needs it: the "
        "installation is incomplete (pip install mdurl installs it)")
    assert "(pip install markdown-it-py installs it)" in str(
        cli._missing_dependency(failed("textual.widgets._markdown", "markdown_it")))
    assert cli._missing_dependency(failed("rich.console", "no_such_module_kv")) == (
        "no_such_module_kv is not installed, and rich, which kvdiag uses, needs it: the "
        "installation is incomplete (pip install kvdiag installs it)")
    assert cli._missing_dependency(failed("kvdiag.report.sweep", "no_such_module_kv")) is None
    assert cli._missing_dependency(failed("kvdiag.report.sweep", "plotext")) == (
        "plotext is not installed, and kvdiag needs it: the installation is incomplete "
        "(pip install kvdiag installs it)")
