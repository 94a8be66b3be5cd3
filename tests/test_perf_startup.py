"""``kvdiag perf LOG`` starts without the model side: numpy (~0.13 s to import) is needed only
by ``--predict`` (the runtime model) and the causes of a slow bin against ``--baseline`` (their
thresholds come from the judgement package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_logs import ServerLog, Turn

PROBE = """
import contextlib, io, sys
from kvdiag.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(code, 'numpy' in sys.modules, out.getvalue().count('\\n'))
"""


def _perf(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, "perf", *args], capture_output=True,
                          text=True, check=True, timeout=120)
    return proc.stdout.split()


def test_perf_of_a_log_does_not_import_numpy(tmp_path: Path) -> None:
    log = ServerLog(shape="older")
    log.boot(np=2)
    log.requests(Turn(0, 1, 5000, 1000, 200, 25.0), Turn(1, 2, 3000, 0, 100, 30.0))
    path = tmp_path / "server.log"
    path.write_text(log.text())
    code, numpy, lines = _perf(str(path))
    assert (code, numpy) == ("0", "False") and int(lines) > 5
