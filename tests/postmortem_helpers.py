"""Shared helpers for the post-mortem tests (not a test module)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from kvdiag.analysis.signatures import evaluate
from kvdiag.model.findings import Finding
from kvdiag.model.logrecords import LogScan
from kvdiag.postmortem.parse import LogParser

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def scan_bytes(data: bytes, name: str = "t.log") -> LogScan:
    parser = LogParser()
    parser.feed(name, io.BytesIO(data))
    return parser.result()


def scan_fixture(*names: str) -> LogScan:
    parser = LogParser()
    for n in names:
        with open(FIXTURES / n, "rb") as fh:
            parser.feed(n, fh)
    return parser.result()


def findings_of(scan: LogScan) -> list[Finding]:
    return evaluate(scan)


def run_command(argv: list[str], capsys: Any) -> tuple[int, str]:
    """Run ``kvdiag postmortem`` in-process; returns (exit code, stdout)."""
    from kvdiag.commands import postmortem

    parser = argparse.ArgumentParser(prog="kvdiag postmortem", allow_abbrev=False)
    postmortem.configure(parser)
    code = postmortem.run(parser.parse_args(argv))
    return code, capsys.readouterr().out


def run_json(argv: list[str], capsys: Any) -> tuple[int, dict[str, Any]]:
    code, out = run_command([*argv, "--json"], capsys)
    data: dict[str, Any] = json.loads(out)
    return code, data
