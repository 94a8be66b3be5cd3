"""Build and run kvrt (kernels/native_tests/kvrt/), the C kv-stream runtime with real bytes
and its own page-level truth, written independently of kvdiag's model (issue 15).

``run(name, out)`` runs one configuration of :data:`CONFIGS` and returns its trace and the
truth the runtime computed from the bytes it read (one :class:`TruthPage` per page served).
The corpus test and the judgement are checked against it; tests/test_native_truth.py compares
today's ``kvdiag check`` with it. Not a test module.

The build is cached by content: ``platformdirs.user_cache_dir("kvdiag")/kvrt-<hash>/`` holds
the program and its C++ shared object, the hash covering the sources, kvtrace.h, the flags and
the compilers' versions; a ``flock`` serialises concurrent first builds and the folder is
built beside its final name and renamed into place (as tests/native_build.py does for ggml).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from native_build import cache_root, locked
from native_cc import KERNELS, STRICT_C, STRICT_CXX, TESTS_C

SOURCE = TESTS_C / "kvrt"
PROGRAM_FLAGS = [*STRICT_C, "-O2", "-I", str(KERNELS), "-pthread"]
DSO_FLAGS = [*STRICT_CXX, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-I", str(KERNELS),
             "-pthread"]

#: The runs (flags of kvrt.c), by name. "dso" gets ``--dso <the shared object>``; "kill" runs
#: until the helper kills it.
CONFIGS: dict[str, tuple[str, ...]] = {
    # a ring slot reused by another layer within one step: check judges by the last ring copy
    # of the page (stale/exact), the slot holds the other layer's bytes (foreign)
    "ring-reuse": ("--layout", "per-stream", "--dispatch", "fits", "--ring-prefetch"),
    # reads of 6 ring pages through the 4 ring slots: prefetched before the FA node is
    # dispatched, a view's last pages replace its first ones (foreign, the view's own bytes) ...
    "ring-overrun": ("--layout", "per-stream", "--dispatch", "fits", "--ring-prefetch",
                     "--forever", "--rounds", "4", "--prompt", "900"),
    # ... copied by the running attention, each slot reused once its page is consumed (exact)
    "ring-cycle": ("--layout", "per-stream", "--dispatch", "fits", "--forever", "--rounds", "4",
                   "--prompt", "900"),
    # upstream (layer, page) bookkeeping, slot 1's request first: stale and foreign pages
    "slot1-first": ("--layout", "shared", "--dispatch", "fits", "--prompt", "900"),
    # the same aliasing with each stream's request on its own thread
    "threads": ("--layout", "shared", "--dispatch", "fits", "--threads", "--prompt", "900"),
    # ring copies and layer learns from a C++ shared object dlopen()ed after the header line
    "dso": ("--layout", "shared", "--dispatch", "fits"),
    # membership dispatch: the first two-stream ubatch aborts through KVTRACE_ABORT
    "abort": ("--layout", "shared", "--dispatch", "membership", "--schedule", "concurrent"),
    # SIGKILL mid-run
    "kill": ("--layout", "shared", "--dispatch", "fits", "--forever", "--prompt", "900"),
    # both fixes: (layer, stream, page) keys, fits dispatch with fallback and warning; clean
    "fixed": ("--layout", "per-stream", "--dispatch", "fits", "--schedule", "concurrent"),
    # the fixed run with fits events that do not name their failed conditions
    "unevaluated": ("--layout", "per-stream", "--dispatch", "fits", "--schedule",
                    "concurrent", "--unevaluated"),
}


class RuntimeUnavailable(RuntimeError):
    """No C or C++ compiler here."""


@dataclass(frozen=True)
class Built:
    program: Path
    dso: Path


@dataclass(frozen=True)
class TruthPage:
    """One page a read served, judged by kvrt from the bytes in the slot it read."""

    seq: int
    """seq of the read event in the trace (kvtrace_read.seq)."""
    step: int
    layer: int
    stream: int
    page: int
    source: str
    slot: int
    cls: str
    """exact / stale / foreign."""
    writes_old: int
    holder: tuple[int, int, int] | None
    """(stream, layer, page) whose bytes the slot held; None for a slot never filled."""


@dataclass(frozen=True)
class RuntimeRun:
    name: str
    trace: Path
    truth: tuple[TruthPage, ...]
    returncode: int
    stderr: str

    def counts(self) -> dict[str, int]:
        return counts(self.truth)


def missing_tools() -> str | None:
    for tool in ("cc", "c++"):
        if shutil.which(tool) is None:
            return f"{tool} not found (kvrt is built from C and C++ sources)"
    return None


def _version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else tool


def _digest() -> str:
    h = hashlib.sha256()
    for path in (*sorted(SOURCE.iterdir()), KERNELS / "kvtrace.h"):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(json.dumps([PROGRAM_FLAGS, DSO_FLAGS, _version("cc"), _version("c++")]).encode())
    return h.hexdigest()[:16]


def _compile(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def build(root: Path | None = None) -> Built:
    """The cached kvrt build (built first when absent); RuntimeUnavailable without compilers."""
    reason = missing_tools()
    if reason:
        raise RuntimeUnavailable(reason)
    root = root or cache_root()
    final = root / f"kvrt-{_digest()}"
    built = Built(final / "kvrt", final / "libkvrt_ring.so")
    if built.program.is_file() and built.dso.is_file():
        return built
    with locked(root / "kvrt.lock"):
        if built.program.is_file() and built.dso.is_file():
            return built
        tmp = Path(tempfile.mkdtemp(prefix="kvrt.tmp-", dir=root))
        try:
            _compile(["cc", *PROGRAM_FLAGS, str(SOURCE / "kvrt.c"), "-o", str(tmp / "kvrt"),
                      "-ldl"])
            _compile(["c++", *DSO_FLAGS, str(SOURCE / "kvrt_ring.cpp"), "-o",
                      str(tmp / "libkvrt_ring.so")])
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return built


def read_truth(path: Path) -> tuple[TruthPage, ...]:
    """The truth file; a last line cut by a kill is left out (kvrt writes each read's lines
    with one write after the read event, so whole lines are whole reads)."""
    pages = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        h = d["holder"]
        pages.append(TruthPage(d["seq"], d["step"], d["layer"], d["stream"], d["page"],
                               d["source"], d["slot"], d["class"], d["writes_old"],
                               None if h is None else (h["stream"], h["layer"], h["page"])))
    return tuple(pages)


def counts(truth: Iterable[TruthPage]) -> dict[str, int]:
    c = Counter(t.cls for t in truth)
    return {k: c.get(k, 0) for k in ("exact", "stale", "foreign")}


def run(name: str, out: Path, built: Built | None = None, kill_after: int = 3000) -> RuntimeRun:
    """Run configuration ``name`` in folder ``out`` (trace ``<name>.kvtrace``, truth
    ``<name>.truth``). "kill" is killed with SIGKILL once its truth holds ``kill_after``
    pages."""
    built = built or build()
    args = list(CONFIGS[name])
    if name == "dso":
        args += ["--dso", str(built.dso)]
    out.mkdir(parents=True, exist_ok=True)
    trace, truth = out / f"{name}.kvtrace", out / f"{name}.truth"
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_FILE", "KVTRACE_STATE_12")}
    env["KVTRACE_FILE"] = str(trace)
    cmd = [str(built.program), "--truth", str(truth), *args]
    if name != "kill":
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        return RuntimeRun(name, trace, read_truth(truth), proc.returncode, proc.stderr)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with truth.open("rb") as f:
                    if sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b"")) \
                            >= kill_after:
                        break
                time.sleep(0.005)
            os.kill(child.pid, signal.SIGKILL)
            code = child.wait(timeout=30)
        finally:
            child.kill()
        stderr = child.stderr.read() if child.stderr else ""
    return RuntimeRun(name, trace, read_truth(truth), code, stderr)


def prefix_through(trace: Path, seq: int, dest: Path) -> Path:
    """A copy of ``trace`` holding its header and the events up to ``seq``: the part of a
    killed run that the truth file covers (the kill may fall between a read event and its
    truth lines)."""
    with trace.open("rb") as src, dest.open("wb") as out:
        out.write(src.readline())
        for line in src:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by the kill: the trace ends there anyway
            if event.get("seq", 0) > seq:
                break
            out.write(line)
    return dest


def run_with(args: Iterable[str], trace: Path, truth: Path, env: dict[str, str],
             built: Built | None = None, timeout: float = 120) -> tuple[int, str]:
    """kvrt with ``args`` (kvrt.c's flags), KVTRACE_FILE=``trace`` and the extra environment
    ``env`` (KVTRACE_MAX_MB, KVTRACE_KEEP, KVTRACE_RING_MB): (exit code, stderr). A run that
    crashes on purpose (``--crash``) returns the signal as a negative code."""
    built = built or build()
    full = {k: v for k, v in os.environ.items()
            if k not in ("KVTRACE_FILE", "KVTRACE_STATE_12", "KVTRACE_MAX_MB", "KVTRACE_KEEP",
                         "KVTRACE_RING_MB")}
    full.update(env, KVTRACE_FILE=str(trace))
    proc = subprocess.run([str(built.program), "--truth", str(truth), *args], env=full,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stderr
