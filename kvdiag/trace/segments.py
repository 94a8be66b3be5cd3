"""Bounded traces on disk: a rotated trace's segments read as one trace, and zstd-compressed
trace files (docs/trace-format.md, "Segments").

kernels/kvtrace.h with ``KVTRACE_MAX_MB`` writes ``KVTRACE_FILE=<stem>.kvtrace`` as numbered
segments ``<stem>.000001.kvtrace``, ``<stem>.000002.kvtrace``, ... (six digits, so a glob sorts
them in order). Each starts with a header line whose ``extra.segment`` says ``index``,
``first_seq`` and ``run`` (one id per process), then a ``snapshot`` event. Closed segments
may be compressed with zstd (``<name>.kvtrace.zst``); ``KVTRACE_KEEP`` deletes the oldest.

A user names a set by any of:

- the ``KVTRACE_FILE`` path itself (``rig.kvtrace``), which is not a file when rotation is on;
- the folder that holds it, when the folder holds one set;
- a glob, quoted so the shell leaves it (``'rig.*.kvtrace*'``).

A path to one segment reads that segment alone (judged from its snapshot). The set is one
stream: the first segment whole, each later one from its second line on. What does not join
is said, never joined silently: segments missing between two that are present are a ``gap``
problem at the first line of the later one (with the seq range lost), and files that look like
segments of the set but belong to another run (a previous process with the same name) are left
out with a ``segment`` problem. Segments missing before the first present one (deleted by
``KVTRACE_KEEP``) are no problem: :class:`SetInfo` says how many.
"""

from __future__ import annotations

import bisect
import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec

from kvdiag.errors import InputError
from kvdiag.files.inputs import open_input
from kvdiag.trace.problems import Problem
from kvdiag.trace.version import looks_like_trace

SEGMENT = re.compile(r"^(?P<stem>.+)\.(?P<index>\d{6})\.kvtrace(?P<zst>\.zst)?$")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def starts_a_trace(head: bytes) -> bool:
    """Do a file's first bytes start a trace: a kvtrace header line, or a zstd-compressed
    segment (what import, postmortem and sql tell from a server log)?"""
    return looks_like_trace(head) or head.startswith(ZSTD_MAGIC)
_PIECE = 1 << 20
_HEADER_MAX = 1 << 20
_TAIL = 1 << 16
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Part:
    """One file of a set (or a lone compressed trace): ``index`` -1 when it is not a segment."""

    path: Path
    index: int
    compressed: bool


@dataclass(frozen=True)
class SetInfo:
    """What a segment set holds: the segments read, the run, and what is not there."""

    stem: str
    indices: tuple[int, ...]
    run: str
    keep: int | None
    """The writer's ``KVTRACE_KEEP`` (0: keep all), from the last segment's header."""
    left_out: tuple[str, ...]
    """Files left out (another run, not a segment)."""

    @property
    def dropped_before(self) -> int:
        """Segments before the first one present (deleted by ``KVTRACE_KEEP``)."""
        return self.indices[0] - 1 if self.indices else 0

    def text(self) -> str:
        first, last = self.indices[0], self.indices[-1]
        span = f"segment {first:06d}" if first == last else f"segments {first:06d}-{last:06d}"
        missing = last - first + 1 - len(self.indices)
        out = f"{span} of {self.stem}.kvtrace ({len(self.indices)} read"
        if missing:
            out += f", {missing} missing between"
        if self.dropped_before:
            keep = f" KVTRACE_KEEP={self.keep}" if self.keep else ""
            out += f"; {self.dropped_before} before them deleted by the writer's{keep} rotation"
        return out + ")"


def _segment_files(paths: list[str]) -> dict[str, dict[int, Part]]:
    """Segment files by stem and index; a plain segment wins over its .zst (being written)."""
    sets: dict[str, dict[int, Part]] = {}
    for name in paths:
        m = SEGMENT.match(name)
        if m is None or not os.path.isfile(name):
            continue
        index = int(m["index"])
        parts = sets.setdefault(m["stem"], {})
        have = parts.get(index)
        if have is None or (have.compressed and not m["zst"]):
            parts[index] = Part(Path(name), index, bool(m["zst"]))
    return sets


def find_set(path: str) -> tuple[str, list[Part]] | None:
    """The set ``path`` names (module docstring): (stem, parts by index), None when it names
    none. A folder with several sets is an :class:`InputError` naming them."""
    if any(c in _GLOB_CHARS for c in path):
        sets = _segment_files(glob.glob(path))
    elif os.path.isdir(path):
        sets = _segment_files([os.path.join(path, n) for n in os.listdir(path)])
        if len(sets) > 1:
            names = ", ".join(f"{s}.kvtrace" for s in sorted(sets))
            raise InputError(f"{path}: a folder with {len(sets)} segment sets; name one: {names}")
    else:
        stem = path[:-len(".kvtrace")] if path.endswith(".kvtrace") else path
        sets = _segment_files(glob.glob(glob.escape(stem) + ".[0-9]*.kvtrace*"))
        sets = {k: v for k, v in sets.items() if k == stem}
    if not sets:
        return None
    if len(sets) > 1:
        raise InputError(f"{path}: names {len(sets)} segment sets; name one: "
                         + ", ".join(f"{s}.kvtrace" for s in sorted(sets)))
    stem, parts = next(iter(sets.items()))
    return stem, [parts[i] for i in sorted(parts)]


def _open_part(part: Part) -> BinaryIO:
    raw = open_input(part.path, what="a trace file")
    if not part.compressed:
        return raw
    return _zstd_reader(raw, part.path)


def _zstd_reader(raw: BinaryIO, path: Path) -> BinaryIO:
    # a reader of the interface TraceReader uses (read, readline, close), typed as the file
    return cast(BinaryIO, _Zstd(raw, str(path)))


class _Buffered:
    """A read-only binary stream over a buffer that ``_more()`` refills (False: nothing more);
    ``read`` and ``readline`` as a file's."""

    _buf: bytes
    _pos: int

    def _more(self) -> bool:
        raise NotImplementedError

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) - self._pos < n) and self._more():
            pass
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = self._buf[self._pos:end]
        self._pos = end
        return out

    def readline(self, limit: int = -1) -> bytes:
        while True:
            nl = self._buf.find(b"\n", self._pos)
            if nl >= 0 or 0 <= limit <= len(self._buf) - self._pos or not self._more():
                break
        end = len(self._buf) if nl < 0 else nl + 1
        if limit >= 0:
            end = min(end, self._pos + limit)
        out = self._buf[self._pos:end]
        self._pos = end
        return out


class _Zstd(_Buffered):
    """A zstd-compressed file decompressed as it is read, frame after frame, up to where its
    data breaks (a corrupt frame, or one cut short: the writer of the .zst was stopped); there
    it ends, and ``broken`` says why (the reader reports the trace as truncated)."""

    def __init__(self, raw: BinaryIO, name: str) -> None:
        import zstandard  # only where a compressed file is read

        self.raw = raw
        self.name = name
        self.broken = ""
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._error = zstandard.ZstdError
        self._obj = self._new()
        self._in_frame = False
        self._buf = b""
        self._pos = 0

    def _more(self) -> bool:
        while not self.broken:
            chunk = self.raw.read(_PIECE // 4)
            if not chunk:
                if self._in_frame:
                    self.broken = (f"compressed data of {Path(self.name).name} ends inside a "
                                   "zstd frame (cut short)")
                return False
            out = []
            try:
                while chunk:
                    self._in_frame = True
                    out.append(self._obj.decompress(chunk))
                    chunk = b""
                    if self._obj.eof:
                        chunk = self._obj.unused_data
                        self._obj = self._new()
                        self._in_frame = False
            except self._error as exc:
                self.broken = f"compressed data of {Path(self.name).name} breaks: {exc}"
            data = b"".join(out)
            if data:
                self._buf = self._buf[self._pos:] + data
                self._pos = 0
                return True
        return False

    def close(self) -> None:
        self.raw.close()


def _header(part: Part) -> dict[str, Any] | None:
    """The header line of a part as JSON (None: not a trace header)."""
    try:
        stream = _open_part(part)
    except InputError:
        return None
    try:
        line = stream.readline(_HEADER_MAX)
        raw = msgspec.json.decode(line)
    except (InputError, msgspec.MsgspecError, ValueError, RecursionError):
        return None
    finally:
        stream.close()
    return raw if isinstance(raw, dict) and raw.get("format") == "kvtrace" else None


def _segment_extra(header: dict[str, Any]) -> dict[str, Any]:
    extra = header.get("extra")
    seg = extra.get("segment") if isinstance(extra, dict) else None
    return seg if isinstance(seg, dict) else {}


class JoinedStream(_Buffered):
    """One binary stream over the parts of a set: the first part whole, each later part from
    its second line (its own header) on. A part whose last line has no newline gets one, so a
    line cut by a kill stays one damaged line. ``problems`` (gaps) and :meth:`locate` (which
    file a joined line came from) are read by :class:`~kvdiag.trace.reader.TraceReader`."""

    def __init__(self, parts: list[Part], name: str, problems: list[Problem],
                 first_seqs: list[int | None]) -> None:
        self.name = name
        self.parts = parts
        self.problems = problems
        self.skipped_seqs = 0
        """Seqs lost in gaps between parts (the End event's count leaves them out)."""
        self._first_seqs = first_seqs
        self._next = 0
        self._cur: BinaryIO | None = None
        self._buf = b""
        self._pos = 0
        self._lines = 0  # newlines handed to the buffer so far
        self._starts: list[int] = []  # joined line number where each part's first line is
        self._local: list[int] = []  # that line's number inside its file
        self._tail = b""
        self._last_seq: int | None = None
        self.size = sum(_size(p.path) for p in parts)

    def locate(self, line: int) -> tuple[str, int] | None:
        """(file name, line in that file) of joined line ``line``."""
        i = bisect.bisect_right(self._starts, line) - 1
        if i < 0:
            return None
        return self.parts[i].path.name, line - self._starts[i] + self._local[i]

    def _append(self, data: bytes) -> None:
        if self._pos:
            self._buf = self._buf[self._pos:]
            self._pos = 0
        self._buf += data
        self._lines += data.count(b"\n")
        self._tail = (self._tail + data)[-_TAIL:]

    def _open_next(self) -> bool:
        if self._next >= len(self.parts):
            return False
        i = self._next
        part = self.parts[i]
        self._next += 1
        stream = _open_part(part)
        local = 1
        if i > 0:
            stream.readline(_HEADER_MAX)  # its header: the set's header is the first part's
            local = 2
            self._gap(i)
        self._starts.append(self._lines + 1)
        self._local.append(local)
        self._cur = stream
        self._tail = b""
        return True

    def _gap(self, i: int) -> None:
        prev, part = self.parts[i - 1], self.parts[i]
        first = self._first_seqs[i]
        if part.index == prev.index + 1 and (first is None or self._last_seq is None
                                             or first == self._last_seq + 1):
            return
        lost = ""
        if first is not None and self._last_seq is not None and first > self._last_seq + 1:
            n = first - self._last_seq - 1
            self.skipped_seqs += n
            lost = f"seq {self._last_seq + 1}-{first - 1} ({n} events) not in the set; "
        if part.index > prev.index + 1:
            what = (f"segment {prev.index + 1:06d}" if part.index == prev.index + 2 else
                    f"segments {prev.index + 1:06d}-{part.index - 1:06d}")
            what += " missing"
        else:
            what = "events missing"
        self.problems.append(Problem(
            self._lines + 1, "gap",
            f"{what} between {prev.path.name} and {part.path.name}: {lost}judged on from "
            f"{part.path.name}'s snapshot"))

    def _finish_part(self) -> None:
        assert self._cur is not None
        broken = getattr(self._cur, "broken", "")
        if broken:
            self.problems.append(Problem(self._lines + 1, "truncated", broken))
        self._cur.close()
        self._cur = None
        if self._tail and not self._tail.endswith(b"\n"):
            self._append(b"\n")
        lines = [ln for ln in self._tail.split(b"\n") if ln.strip()]
        self._last_seq = None
        if lines:
            try:
                raw = msgspec.json.decode(lines[-1])
            except (msgspec.MsgspecError, ValueError, RecursionError):
                raw = None
            seq = raw.get("seq") if isinstance(raw, dict) else None
            self._last_seq = seq if type(seq) is int else None

    def _more(self) -> bool:
        """Read more into the buffer; False at the end of the last part."""
        while True:
            if self._cur is None and not self._open_next():
                return False
            assert self._cur is not None
            data = self._cur.read(_PIECE)
            if data:
                self._append(data)
                return True
            self._finish_part()

    def close(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self._cur = None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class Opened:
    stream: BinaryIO
    name: str
    segments: SetInfo | None


def open_trace(path: str | os.PathLike[str]) -> Opened:
    """Open what ``path`` names: a plain trace file as it is, a zstd-compressed one
    decompressed as it is read, a segment set (module docstring) as one stream. Nothing there
    is an :class:`InputError` ("no such file")."""
    text = os.fspath(path)
    p = Path(text)
    if not p.is_dir() and (p.exists() or p.is_symlink()):  # a file, whatever its name
        stream = open_input(p, what="a trace file")
        head = stream.peek(4)[:4] if hasattr(stream, "peek") else b""
        if head == ZSTD_MAGIC:
            return Opened(_zstd_reader(stream, p), str(p), None)
        return Opened(stream, str(p), None)
    found = find_set(text)
    if found is None:
        if any(c in _GLOB_CHARS for c in text):
            raise InputError(f"{text}: matches no trace segment (<stem>.NNNNNN.kvtrace[.zst])")
        if p.is_dir():
            raise InputError(f"{text}: is a directory, not a trace file")
        raise InputError(f"{text}: no such file")
    stem, parts = found
    return _open_set(stem, parts)


def _open_set(stem: str, parts: list[Part]) -> Opened:
    headers = [_header(p) for p in parts]
    problems: list[Problem] = []
    left_out: list[str] = []
    good = [i for i, h in enumerate(headers) if h is not None]
    if not good:
        raise InputError(f"{stem}.kvtrace: no segment has a kvtrace header ("
                         + ", ".join(p.path.name for p in parts[:5]) + ")")
    # the newest writer's run: the segment written last (a longer run before it under the same
    # name can leave segments with higher numbers behind)
    newest = max(good, key=lambda i: (_mtime(parts[i].path), parts[i].index))
    last_extra = _segment_extra(headers[newest] or {})
    run = last_extra.get("run")
    keep = last_extra.get("keep")
    used: list[Part] = []
    firsts: list[int | None] = []
    for i, (part, header) in enumerate(zip(parts, headers, strict=True)):
        seg = _segment_extra(header) if header is not None else {}
        why = ("not a kvtrace segment (no header line)" if header is None else
               f"from another run ({seg.get('run')!r}, the set's newest segment is from "
               f"{run!r})" if seg.get("run") != run else "")
        if why and i != newest:
            left_out.append(f"{part.path.name}: {why}")
            continue
        used.append(part)
        first = seg.get("first_seq")
        firsts.append(first if type(first) is int else None)
    for text in left_out:
        problems.append(Problem(1, "segment", f"{text}; left out"))
    info = SetInfo(stem=stem, indices=tuple(p.index for p in used),
                   run=run if isinstance(run, str) else "",
                   keep=keep if type(keep) is int else None, left_out=tuple(left_out))
    name = f"{stem}.kvtrace" if len(used) > 1 else str(used[0].path)
    return Opened(cast(BinaryIO, JoinedStream(used, name, problems, firsts)), name, info)


def read_all(path: str | os.PathLike[str]) -> tuple[bytes, str, SetInfo | None] | None:
    """The whole bytes of a compressed trace or a segment set (for a viewer that addresses
    lines by offset), None for a plain file (map it instead)."""
    opened = open_trace(path)
    if isinstance(opened.stream, JoinedStream | _Zstd):
        try:
            return opened.stream.read(), opened.name, opened.segments
        finally:
            opened.stream.close()
    opened.stream.close()
    return None
