"""What the commands say (issue 16 #7): help that describes kvdiag and shows each command's
whole summary, paths in help never broken at a hyphen, one-line messages for list and size
flags that name the flag and the form, and text output off a terminal at a readable width
that cuts nothing."""

from __future__ import annotations

import ast
import gzip
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table
from rich.text import Text

from kvdiag.cli import COMMANDS, build_parser, summary
from kvdiag.report.console import READABLE_WIDTH, print_renderables

KVDIAG = [sys.executable, "-m", "kvdiag"]
COMMAND_DIR = Path(__file__).parent.parent / "kvdiag" / "commands"
LOGS = Path(__file__).parent / "fixtures" / "logs"


def run_cli(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin"}
    return subprocess.run([*KVDIAG, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _docstring(command: str) -> str:
    source = (COMMAND_DIR / f"{command}.py").read_text()
    doc = ast.get_docstring(ast.parse(source))
    assert doc
    return doc


def test_top_level_help_describes_kvdiag_and_every_whole_summary() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "The ``kvdiag`` command" not in proc.stdout and "``" not in proc.stdout
    flat = " ".join(proc.stdout.split())
    assert "Make adaptive KV-cache streaming in llama.cpp-style CUDA runtimes debuggable" in flat
    for command in COMMANDS:
        first = " ".join(_docstring(command).split("\n\n")[0].split()).replace("``", "")
        assert first in flat, command
    # the summary that used to stop at the end of the docstring's first line
    assert ("or say they are equivalent (exit 0); bad input, different schedules (without "
            "--force), traces with nothing in common to compare, and traces that agree in what "
            "both hold but lost events (gaps in seq: verdict lost-events, for what the lost "
            "events held is not compared) exit 2" in flat)


def test_summary_is_the_first_paragraph() -> None:
    assert summary("Do a thing with ``x``\nacross two lines.\n\nMore.") == \
        "Do a thing with x across two lines."
    assert summary("") is None


@pytest.mark.parametrize("command", [c.rstrip("_") for c in COMMANDS])
def test_command_help_keeps_paths_whole_and_paragraphs_apart(command: str) -> None:
    proc = run_cli(command, "--help", columns=72)
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout
    lines = proc.stdout.splitlines()
    # textwrap's default broke "docs/log-import.md" and ".build-id/xx" after the hyphen
    assert not [ln for ln in lines if re.search(r"[\w.]-$", ln)], proc.stdout
    assert max(len(ln) for ln in lines if "{" not in ln and "[" not in ln) <= 72, proc.stdout
    paragraphs = [p for p in _docstring(command.replace("import", "import_")).split("\n\n")
                  if p.strip()]
    if len(paragraphs) > 1:  # the description's paragraphs stay paragraphs
        second = " ".join(paragraphs[1].split()).replace("``", "")
        at = proc.stdout.index(second.split()[0] + " " + second.split()[1])
        assert proc.stdout[:at].endswith("\n\n"), proc.stdout


def test_every_argument_has_help() -> None:
    parser = build_parser()
    missing: list[str] = []
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():  # type: ignore[union-attr]
            for arg in sub._actions:
                if arg.help is None and arg.option_strings:
                    missing.append(f"{name} {arg.option_strings[-1]}")
    assert missing == []


@pytest.mark.parametrize(("args", "text"), [
    (["sweep", "--stage-mib", "256", "--np", "2,y"],
     "argument --np: '2,y' is not a comma list of positive slot counts (e.g. 1,2): 'y' is not "
     "a positive whole number"),
    (["sweep", "--stage-mib", "256", "--np", "1,,2"], "an empty item is not a positive"),
    (["sweep", "--stage-mib", "256", "--np", "-1"], "'-1' is not a positive whole number"),
    (["tui", "--size", "12x40", "t.kvtrace"],
     "argument --size: 12x40: 12 columns is too small; the minimum is 20 columns"),
    (["tui", "--size", "100x2", "t.kvtrace"],
     "argument --size: 100x2: 2 rows is too small; the minimum is 5 rows"),
    (["tui", "--size", "1200x40", "t.kvtrace"], "1200 columns is too large; the maximum is 1000"),
    (["tui", "--size", "big", "t.kvtrace"], "'big' is not COLUMNSxROWS in character cells"),
])
def test_list_and_size_flags_say_the_flag_and_the_form(args: list[str], text: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("kvdiag: error:") and text in line, line
    assert "invalid literal" not in line


# -- text off a terminal ----------------------------------------------------------------------


def _printed(*parts: object) -> list[str]:
    out = io.StringIO()
    print_renderables(parts, file=out)  # type: ignore[arg-type]
    return out.getvalue().splitlines()


def test_wide_prose_table_is_wrapped_between_words_at_a_readable_width() -> None:
    words = [f"word{i:03d}" for i in range(90)]
    table = Table(title="t")
    table.add_column("name", no_wrap=True)
    table.add_column("what", ratio=3)
    table.add_column("note", overflow="ellipsis")
    table.add_row("fits-dispatch-mismatch", " ".join(words[:60]), " ".join(words[60:]))
    lines = _printed(table)
    assert max(len(ln) for ln in lines) <= READABLE_WIDTH
    tokens = re.findall(r"word\d{3}", "\n".join(lines))
    assert sorted(tokens) == words  # every word once, none split, nothing cut
    assert "…" not in "\n".join(lines)
    assert sum("fits-dispatch-mismatch" in ln for ln in lines) == 1  # the no_wrap cell whole


def test_a_word_longer_than_the_width_widens_the_output_instead_of_being_split() -> None:
    path = "/very/long/build/path/" + "x" * 160 + "/ggml-cuda.cu:1898"
    table = Table()
    table.add_column("where")
    table.add_column("what")
    table.add_row(path, "a short note " * 12)
    lines = _printed(table, Text("see " + path + " for the assert"))
    assert sum(path in ln for ln in lines) == 2
    assert max(len(ln) for ln in lines) < len(path) + 30


def test_postmortem_and_check_text_off_a_terminal_stay_readable(tmp_path: Path) -> None:
    proc = run_cli("postmortem", str(LOGS / "kvstream_np2_gdb.log"), columns=300)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout
    # issue 16 measured ~470 columns; the widest line is now set by the longest words
    assert max(len(ln) for ln in lines) <= 170
    frames = [ln for ln in lines if "ggml_cuda_graph_evaluate_and_capture" in ln]
    assert len(frames) == 1 and "/ggml/src/ggml-cuda/ggml-cuda.cu:3710" in frames[0]
    trace = tmp_path / "two.kvtrace"
    subprocess.run([*KVDIAG, "capture", "--scenario", "two-slot-concurrent", "-q", "-o",
                    str(trace)], capture_output=True, timeout=300, check=False)
    proc = run_cli("check", str(trace), columns=300)
    assert proc.returncode == 1
    assert max(len(ln) for ln in proc.stdout.splitlines()) <= 130
    assert "…" not in proc.stdout
    assert any("GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst))" in ln
               for ln in proc.stdout.splitlines())


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "sarif", "junit"])
def test_check_output_ends_its_last_line(tmp_path: Path, fmt: str) -> None:
    """A warning another tool writes to stderr next must start on its own line."""
    trace = tmp_path / "s.kvtrace"
    subprocess.run([*KVDIAG, "capture", "--scenario", "single-slot", "--steps", "2", "-q",
                    "-o", str(trace)], capture_output=True, timeout=300, check=True)
    data = trace.read_bytes()
    trace.write_bytes(data[:len(data) * 2 // 3])  # cut: a trace problem and an error finding
    proc = run_cli("check", str(trace), "--format", fmt)
    assert proc.returncode == 1
    assert proc.stdout.endswith("\n") and not proc.stdout.endswith("\n\n\n")


def test_a_message_on_stderr_never_lands_inside_an_output_line(tmp_path: Path) -> None:
    """stdout and stderr into one pipe, Python's default block buffering (no
    PYTHONUNBUFFERED): postmortem --json prints a long report, then says on stderr where the
    input broke. The message must follow the report, on a line of its own."""
    log = (LOGS / "kvstream_np2_gdb.log").read_bytes() * 40
    data = bytearray(gzip.compress(log))
    data[-6] ^= 0xFF  # the CRC: the stream breaks at its very end
    path = tmp_path / "server.log.gz"
    path.write_bytes(bytes(data))
    proc = subprocess.run([*KVDIAG, "postmortem", str(path), "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert len(proc.stdout) > 65536  # longer than any pipe buffer
    read = log.count(b"\n")
    assert lines[-1] == (f"kvdiag: {path}: input breaks after line {read}: the "
                         "gzip data is corrupt (CRC check failed)")
    assert json.loads("\n".join(lines[:-1]))["crashes"]
