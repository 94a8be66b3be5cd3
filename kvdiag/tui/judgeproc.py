"""The judging pass in a child process, for big traces (no textual import).

The indexer and the Judge each cost a few microseconds per event and both hold the GIL, so in
one process they share one core; in a child process the Judge runs on another core while the
viewer indexes and draws. The child (``python -m kvdiag.tui.judgeproc PATH EVERY FD KEY``)
reads the same blocks of the file (:func:`~kvdiag.analysis.trace_index.line_blocks`), runs a
:class:`~kvdiag.tui.judging.JudgingPass`, writes the ledger blocks it seals to the ledger file
the viewer opened for it (descriptor ``FD``, :mod:`kvdiag.tui.judgecache`; ``KEY`` is the cache
key the footer records, ``-`` for none) and sends a :class:`~kvdiag.tui.digest.Delta` naming
where they lie to its standard output about every ``EVERY`` seconds, and one with ``done`` at
the end, as length-prefixed pickles; the viewer maps the blocks and folds the deltas into
digests as it does for a pass run in its own thread. A plain subprocess rather than
:mod:`multiprocessing`: spawning through it re-runs the parent's main script in the child,
which breaks any program that embeds the viewer without a ``__main__`` guard (and forking a
process with threads copies locks other threads hold).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import pickle
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from kvdiag.analysis.trace_index import CHUNK, header_end, line_blocks
from kvdiag.tui.digest import Delta
from kvdiag.tui.document import trace_source
from kvdiag.tui.judgecache import CacheKey, LedgerMap, LedgerWriter
from kvdiag.tui.judging import JudgingPass

_LENGTH = struct.Struct("<Q")
FIRST_DELTA_S = 0.25
"""The first delta comes this soon (the viewer shows a judged prefix), the others every
``EVERY`` seconds."""
PIPE_BYTES = 1 << 20
"""The pipe's buffer asked for (Linux's default most a user may ask, ``pipe-max-size``), and
the most read at once."""


@dataclass(frozen=True)
class Failed:
    """The pass stopped on an error (the message says which)."""

    message: str


class _Sender:
    """Length-prefixed pickles to the viewer, and the time spent waiting for the pipe."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.waited = 0.0

    def send(self, item: Delta | Failed) -> None:
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        t0 = time.perf_counter()
        self.out.write(_LENGTH.pack(len(data)))
        self.out.write(data)
        self.out.flush()
        self.waited += time.perf_counter() - t0


def run(path: str, out: BinaryIO, every: float, fd: int, key: CacheKey | None) -> None:
    """The child's work: judge ``path``, writing the ledger to ``fd`` and deltas to ``out``."""
    # The child holds nothing but the Judge: its objects live long and form no cycles, so
    # the cyclic GC would only re-scan them (a fifth of the pass, measured); a young
    # collection per delta keeps anything unexpected bounded.
    gc.disable()
    sender = _Sender(out)
    try:
        judging = JudgingPass(path, hand_over=True)
        ledger = LedgerWriter(fd, key)
        source = trace_source(path)  # a plain file, a segment set or a .zst
        last, wait = time.monotonic(), min(every, FIRST_DELTA_S)
        for offset, block in line_blocks(source, header_end(source), CHUNK):
            judging.feed(block, offset)
            if time.monotonic() - last >= wait:
                sender.send(ledger.put(judging.delta()))
                gc.collect(0)
                last, wait = time.monotonic(), every
        judging.finish()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        last_delta = dataclasses.replace(judging.delta(done=True), costs={
            "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": _peak_rss_mib(usage),
            "pipe_wait_s": sender.waited})
        sender.send(ledger.finish(last_delta))
    except Exception as exc:  # reported to the viewer, which says so and carries on
        sender.send(Failed(f"{type(exc).__name__}: {exc}"))


def _peak_rss_mib(usage: resource.struct_rusage) -> float:
    """This process's peak resident memory. Linux's ``ru_maxrss`` of a process started by
    fork (or vfork) and exec counts the parent's peak before the exec, so the process's own
    high-water mark (``VmHWM``) is read where there is one."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return usage.ru_maxrss / 1024


class JudgeProcess:
    """A child process judging ``path`` into the ledger file ``fd`` (the cache ``key`` written
    in its footer); :meth:`receive` collects what it has sent, its blocks mapped.

    A thread of this process reads the pipe as the child writes (a blocking read, without the
    GIL): read only when the loader asked, between the indexer's blocks, a delta bigger than
    the pipe's buffer kept the child waiting for several of those turns (bench_tui: wall ÷ CPU
    1.5 with an idle core for it)."""

    def __init__(self, path: str, every: float, fd: int, key: CacheKey | None = None) -> None:
        env = dict(os.environ)
        # the child imports this copy of kvdiag, installed or not
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # the judgement makes no BLAS call: numpy's OpenBLAS threads would only start and spin
        # on the viewer's core (~40 ms of CPU at import, measured)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self._ledger = LedgerMap(fd)
        self.completed = False
        """The child sent its last delta: the ledger file is whole."""
        coded = "-" if key is None else msgspec.json.encode(key).decode()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvdiag.tui.judgeproc", path, str(every), str(fd), coded],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, pass_fds=(fd,))
        assert self._proc.stdout is not None
        self._out = self._proc.stdout
        with contextlib.suppress(ImportError, AttributeError, OSError):
            import fcntl  # Linux: fewer, larger reads

            fcntl.fcntl(self._out.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._buffer = bytearray()
        self._ended = False
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._pump, name="kvdiag-judge-pipe",
                                        daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        fileno = self._out.fileno()
        while True:
            try:
                data = os.read(fileno, PIPE_BYTES)
            except OSError:
                data = b""
            with self._arrived:
                if data:
                    self._buffer += data
                else:
                    self._ended = True
                self._arrived.notify_all()
            if not data:
                return

    def receive(self, timeout: float) -> list[Delta | Failed]:
        """Everything sent so far, waiting up to ``timeout`` seconds when nothing is."""
        with self._arrived:
            out = self._frames()
            if not out and not self._ended and timeout > 0:
                self._arrived.wait(timeout)
                out = self._frames()
            ended = self._ended and not self._buffer
        if ended and not (out and (isinstance(out[-1], Failed) or out[-1].done)) \
                and not self.completed:
            code = self._proc.wait(timeout=5)
            out.append(Failed(f"the judging process ended early (exit code {code})"))
        return out

    def _frames(self) -> list[Delta | Failed]:
        items: list[Delta | Failed] = []
        buf = self._buffer
        while len(buf) >= _LENGTH.size:
            (n,) = _LENGTH.unpack_from(buf)
            if len(buf) < _LENGTH.size + n:
                break
            # the child is this module, started by this process: its pickles are trusted
            item = pickle.loads(bytes(buf[_LENGTH.size:_LENGTH.size + n]))
            del buf[:_LENGTH.size + n]
            if isinstance(item, Delta):
                item = self._ledger.resolve(item)
                self.completed = item.done
            items.append(item)
        return items

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)  # the pipe's end reached: the child is gone
        self._out.close()
        self._ledger.close()


def main(argv: list[str]) -> int:
    # the viewer ends the pass with SIGTERM when it closes: end quietly
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    out = os.fdopen(os.dup(1), "wb")
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    key = None if argv[3] == "-" else msgspec.json.decode(argv[3], type=CacheKey)
    run(argv[0], out, float(argv[1]), int(argv[2]), key)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
