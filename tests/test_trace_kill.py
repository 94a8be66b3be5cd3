"""A capture process killed with SIGKILL: every event of every completed step stays readable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvdiag.model.events import Read, Step, Warn, Write
from kvdiag.trace import TraceReader

# Per step: Step, 3 Write, Warn (flushed at once), 3 Read, then end_step: 8 events, and a step
# can only be on disk whole or cut just after its Warn.
CHILD = textwrap.dedent(
    """
    import sys
    from kvdiag.model.events import Device, Read, Step, Warn, Write
    from kvdiag.trace import TraceWriter, make_header

    w = TraceWriter.create(sys.argv[1], make_header("numpy", Device("cpu")))
    step = 0
    while True:
        w.emit(Step, step, phase="decode", streams=(0,), tokens=1, n_kv=64)
        for layer in range(3):
            w.emit(Write, step, layer=layer, stream=0, cells=(step, step + 1), rows=(0, 1))
        w.emit(Warn, step, message="fallback", code="fallback")
        for layer in range(3):
            w.emit(Read, step, layer=layer, stream=0, pool=1, ring=0, host=0)
        w.end_step()
        print(step, flush=True)
        step += 1
    """
)
PER_STEP = [Step, Write, Write, Write, Warn, Read, Read, Read]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_mid_capture_keeps_every_completed_step(tmp_path: Path) -> None:
    path = tmp_path / "killed.kvtrace"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert child.stdout is not None
    try:
        reported = -1
        while reported < 40:  # the child said step 40 was handed to the OS
            line = child.stdout.readline()
            assert line, "child exited early"
            reported = int(line)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    with TraceReader.open(path) as reader:
        events = list(reader)
    assert not reader.complete
    assert reader.problems[-1].kind == "incomplete"
    assert {p.kind for p in reader.problems} <= {"truncated", "incomplete"}
    assert reader.truncated == any(p.kind == "truncated" for p in reader.problems)

    by_step: dict[int, list[type]] = {}
    for e in events:
        by_step.setdefault(e.step, []).append(type(e))
    last = max(by_step)
    assert last >= reported
    assert sorted(by_step) == list(range(last + 1))
    for step in range(last):
        assert by_step[step] == PER_STEP, step
    if reader.truncated:  # killed inside os.write: any whole lines of the last flush remain
        assert by_step[last] == PER_STEP[: len(by_step[last])]
    else:
        assert by_step[last] in (PER_STEP, PER_STEP[:5])
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
