"""Reading a log for ``kvdiag perf``: from a path, stdin or gzip, in one process with a helper
for the substring search, or in two halves at once (:mod:`kvdiag.postmortem.perfsplit`), into
one :class:`~kvdiag.model.perf.PerfRun` (the scanner is :mod:`kvdiag.postmortem.perfscan`)."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Iterable
from typing import BinaryIO

from kvdiag.files.logs import describe_break, open_log
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfbytes, perfsplit
from kvdiag.postmortem.parse import PARALLEL_MIN_BYTES, spare_core
from kvdiag.postmortem.perfscan import BLOCK_BYTES, PerfScanner
from kvdiag.postmortem.scanhelper import ScanHelper
from kvdiag.postmortem.timinglines import RARE_ANCHORS


def _regular_size(name: str, stream: BinaryIO) -> int | None:
    """The size of the regular file ``stream`` reads from its start (not through gzip)."""
    if isinstance(stream, gzip.GzipFile):
        return None
    try:
        if stream.tell() != 0 or not os.path.isfile(name):
            return None
        return os.fstat(stream.fileno()).st_size
    except (OSError, ValueError, AttributeError):
        return None


def _helper_for(name: str, stream: BinaryIO) -> ScanHelper | None:
    """A helper process for the rare anchors of a large regular file read from its start."""
    size = _regular_size(name, stream)
    if size is None or size < PARALLEL_MIN_BYTES or not spare_core():
        return None
    if PerfScanner.compiled and perfbytes.module() is not None:
        return None  # the compiled pass finds the anchors faster than a helper is asked
    try:
        return ScanHelper(name, RARE_ANCHORS)
    except OSError:
        return None


def scan_stream(name: str, stream: BinaryIO, *, source: str | None = None,
                hook: Callable[[bytes], None] | None = None) -> PerfRun:
    """Read ``stream`` to its end (or to where it breaks, which is reported); ``hook`` sees the
    blocks read until the first request completed (the boot lines, for a boot sniffer: every
    further search of every block would cost a pass over the log)."""
    size = _regular_size(name, stream)
    if size is not None and perfsplit.usable(name, size):
        run = perfsplit.scan_split(name, size, source, hook)
        if run is not None:
            return run
    scanner = PerfScanner(name, source)
    read = getattr(stream, "read1", None) or stream.read
    scanner.use_helper(_helper_for(name, stream))
    try:
        while True:
            try:
                data = read(BLOCK_BYTES)
            except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
                scanner._problem(f"input breaks after line {scanner._lines}: "
                                 f"{describe_break(exc)}", None)
                break
            if not data:
                break
            if hook is not None and not scanner.requests:
                hook(data)
            scanner.feed(data)
    finally:
        if scanner._helper is not None:
            scanner._helper.close()
    return scanner.finish()


def scan_paths(paths: Iterable[str]) -> list[PerfRun]:
    """Each log (``-`` = stdin, ``.gz`` detected) as one run."""
    runs = []
    for path in paths:
        with open_log(path) as log:
            runs.append(scan_stream(log.name, log.stream))
    return runs
