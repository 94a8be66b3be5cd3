"""Opening logs and turning one raw line into clean text.

A line as it reaches a user may carry, outside in: a journald (``Jan 10 16:31:55 host
prog[pid]: ``, or the short ``prog[pid]: `` that ``journalctl -o cat``-style copies and
syslog forwarders leave), ISO-timestamp (``docker logs -t``, Kubernetes CRI ``<ts> stderr F``) or
docker-compose (``svc-1  | ``) prefix, llama-server router's ``[port] `` prefix (port right-aligned in 5 columns), ANSI colour codes
(gdb runs with ``set style enabled on``) and llama.cpp's own ``<min>.<ss>.<ms>.<us> <L> `` prefix
(common/log.cpp; domain brief §6.3, §7.1). ``clean`` removes all of them and reports the level
letter when there was one.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import sys
import zlib
from typing import Any, BinaryIO

from kvdiag.errors import InputError

#: Text kept per line; longer lines are cut (the scanner reports it once per source).
MAX_LINE_CHARS = 4096

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
_JOURNALD = re.compile(
    r"^(?:[A-Z][a-z]{2}|\d{1,2}月) {1,2}\d{1,2} \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: "
)
_ISO = re.compile(
    r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?: (?:stdout|stderr) [FP]| \S+ [^\s:\[]+(?:\[\d+\])?:)? "
)
# journald's identifier and pid without date and host (what remains when the date column is cut
# off a copied journal, e.g. "ollama[1297]: "); the name is a program name, never a bracket.
_JOURNALD_SHORT = re.compile(r"^[A-Za-z_][\w.@+-]{0,63}\[\d{1,10}\]: ")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]*-\d+ +\| ?")
_ROUTER = re.compile(r"^\[ *\d{1,5}\] ")
# common/log.cpp prints the level letter with or without the timestamp (--log-prefix alone)
_LLAMA = re.compile(r"^(?:\d+\.\d\d\.\d\d\d\.\d\d\d )?([IWEDN]) ")


def clean(raw: bytes) -> tuple[str, str | None]:
    """Decode one raw line and strip every prefix; return ``(text, level letter or None)``."""
    if len(raw) > MAX_LINE_CHARS * 4:
        raw = raw[: MAX_LINE_CHARS * 4]
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.replace("\r", "")
    for _ in range(3):
        m = (_JOURNALD.match(text) or _ISO.match(text) or _COMPOSE.match(text)
             or _JOURNALD_SHORT.match(text))
        if m is None:
            break
        text = text[m.end():]
    m = _ROUTER.match(text)
    if m is not None:
        text = text[m.end():]
    level: str | None = None
    m = _LLAMA.match(text)
    if m is not None:
        level = m.group(1)
        text = text[m.end():]
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS]
    return text, level


#: How much of a log's start decides whether it is text (after gzip is undone).
TEXT_PROBE = 64 << 10
#: Share of undecodable bytes above which the start of a file is binary, not a log with a few
#: stray bytes (a Latin-1 name in a path, a cut multi-byte character).
MAX_INVALID_SHARE = 0.1


def open_log(path: str) -> tuple[str, BinaryIO, list[BinaryIO]]:
    """Open ``path`` for binary reading: ``-`` is stdin; gzip is detected by its magic bytes.

    Only regular files (and ``-``) are read: opening a FIFO without a writer would block
    forever, and a device never ends. A file whose first ``TEXT_PROBE`` bytes (decompressed)
    are not text is refused. Returns ``(display name, stream, handles the caller closes)``.
    """
    if path == "-":
        stdin: BinaryIO = sys.stdin.buffer
        stream = _maybe_gzip(stdin)
        head = _probe(stream)
        _check_text("<stdin>", head)
        # stdin cannot seek back: what the probe read is handed out again first
        replay: BinaryIO = io.BufferedReader(_Replay(head, stream))
        return "<stdin>", replay, [replay]
    require_regular(path)
    try:
        fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        stream = _maybe_gzip(fh)
        _check_text(path, _probe(stream))
        stream.seek(0)
    except BaseException:
        fh.close()
        raise
    return path, stream, ([stream, fh] if stream is not fh else [fh])


def require_regular(path: str, what: str = "log") -> None:
    """A one-line ``InputError`` unless ``path`` is an existing regular file (or a link to one).

    ``os.stat`` never blocks, where ``open`` on a FIFO waits for a writer that may never come."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"cannot open {path}: no such file") from None
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot read {path}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "not a regular file")
        hint = "; pipe it to '-' instead" if what == "log" else ""
        raise InputError(f"cannot read {path}: {kind}, not a regular {what} file{hint}")


def _probe(stream: BinaryIO) -> bytes:
    """Up to ``TEXT_PROBE`` bytes from the start; a stream that breaks inside them gives what
    came before the break (the parser reports the break itself)."""
    parts: list[bytes] = []
    got = 0
    read = getattr(stream, "read1", None) or stream.read
    while got < TEXT_PROBE:
        try:
            chunk = read(TEXT_PROBE - got)
        except (EOFError, OSError, zlib.error):
            break
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _check_text(name: str, head: bytes) -> None:
    """Refuse a start that is not text: a NUL byte, or more than ``MAX_INVALID_SHARE`` of bytes
    that are not UTF-8 (a log is ASCII almost everywhere)."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise InputError(f"{name}: not a UTF-8 log: starts with a UTF-16 byte-order mark "
                         "(convert it to UTF-8 first, e.g. with iconv -f UTF-16)")
    nul = head.find(b"\0")
    if nul >= 0:
        raise InputError(f"{name}: not a text log: binary data (NUL byte at offset {nul})")
    if head:
        text = head.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        if bad > MAX_INVALID_SHARE * len(head):
            raise InputError(f"{name}: not a text log: {bad} of its first {len(head)} bytes "
                             "are not UTF-8")


class _Replay(io.RawIOBase):
    """``head`` first, then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = memoryview(head)
        self._stream = stream
        self._read = getattr(stream, "read1", None) or stream.read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head.nbytes:
            n = min(len(view), self._head.nbytes)
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._stream is not sys.stdin.buffer:
            self._stream.close()
        super().close()


def _maybe_gzip(stream: BinaryIO) -> BinaryIO:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return stream


def describe_break(exc: BaseException) -> str:
    """A stream failure in the user's terms (Python's gzip and zlib texts name internals)."""
    text = str(exc)
    if isinstance(exc, EOFError) or "end-of-stream marker" in text:
        return "the gzip data ends early (the .gz file is truncated)"
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        if "CRC" in text:
            return "the gzip data is corrupt (CRC check failed)"
        if "Not a gzipped file" in text:
            return "a second gzip member has a bad header (the .gz file is corrupt)"
        return f"the gzip data is corrupt ({text.split(': ', 1)[-1]})"
    return f"read error: {getattr(exc, 'strerror', None) or text}"
