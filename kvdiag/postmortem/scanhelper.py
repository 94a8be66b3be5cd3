"""A second process that searches half of the anchors in the same blocks of a log file.

Substring search over every block is most of the scan's cost and ``bytes.find`` holds the GIL,
so on a machine with more than one core a helper process reads each block of a *regular file*
itself (from the page cache) and returns, for its share of the anchors, the positions of every
match and the block's newline count, while the main process searches its own share.

The helper is this module run as ``python -m kvdiag.postmortem.scanhelper PATH ANCHOR...``
(anchors hex-encoded); it speaks a fixed binary protocol on its standard streams: requests are
two little-endian u64 (start, end; start > end stops it), answers are three u64 (number of
hits, newlines, bytes read) followed by the hits as u64 offsets from ``start``.
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import subprocess
import sys
from typing import IO, BinaryIO

_REQ = struct.Struct("<QQ")
_ANS = struct.Struct("<QQQ")


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("scan helper: stream closed")
        buf += chunk
    return buf


def serve(path: str, anchors: list[bytes], inp: BinaryIO, out: BinaryIO) -> None:
    with open(path, "rb") as fh:
        while True:
            try:
                start, end = _REQ.unpack(_read_exact(inp, _REQ.size))
            except EOFError:
                return
            if start > end:
                return
            fh.seek(start)
            data = fh.read(end - start)
            hits: set[int] = set()
            for anchor in anchors:
                p = data.find(anchor)
                while p >= 0:
                    hits.add(p)
                    p = data.find(anchor, p + 1)
            out.write(_ANS.pack(len(hits), data.count(b"\n"), len(data)))
            out.write(array.array("Q", sorted(hits)).tobytes())
            out.flush()


class ScanHelper:
    """The helper process for one file; ``close()`` stops it."""

    def __init__(self, path: str, anchors: tuple[bytes, ...]) -> None:
        # the child must import this same kvdiag, wherever it was imported from
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvdiag.postmortem.scanhelper", path,
             *(a.hex() for a in anchors)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in: IO[bytes] = self._proc.stdin
        self._out: IO[bytes] = self._proc.stdout

    def ask(self, start: int, end: int) -> None:
        self._in.write(_REQ.pack(start, end))
        self._in.flush()

    def answer(self) -> tuple[list[int], int, int]:
        n, newlines, size = _ANS.unpack(_read_exact(self._out, _ANS.size))
        hits = array.array("Q")
        hits.frombytes(_read_exact(self._out, 8 * n))
        return hits.tolist(), newlines, size

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._in.write(_REQ.pack(1, 0))
            self._in.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        with contextlib.suppress(OSError, ValueError):
            self._out.close()


if __name__ == "__main__":
    serve(sys.argv[1], [bytes.fromhex(a) for a in sys.argv[2:]], sys.stdin.buffer,
          sys.stdout.buffer)
