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
import os
import re
import stat
import sys
from typing import BinaryIO

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
_LLAMA = re.compile(r"^\d+\.\d\d\.\d\d\d\.\d\d\d ([IWEDN]) ")


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


def open_log(path: str) -> tuple[str, BinaryIO, list[BinaryIO]]:
    """Open ``path`` for binary reading: ``-`` is stdin; gzip is detected by its magic bytes.

    Only regular files (and ``-``) are read: opening a FIFO without a writer would block
    forever, and a device never ends. Returns ``(display name, stream, handles the caller closes)``.
    """
    if path == "-":
        stdin: BinaryIO = sys.stdin.buffer
        stream = _maybe_gzip(stdin)
        return "<stdin>", stream, ([stream] if stream is not stdin else [])
    require_regular(path)
    try:
        fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
    stream = _maybe_gzip(fh)
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


def _maybe_gzip(stream: BinaryIO) -> BinaryIO:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return stream

