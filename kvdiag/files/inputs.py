"""Which paths a reader may open, and how: regular files and standard input only.

A FIFO, socket or device has no end a reader can count on (a FIFO without a writer blocks
``open`` and ``read`` forever, ``/dev/zero`` never ends), so it is refused before anything
waits on it, with the same words from every command. Compression is told from the content,
never from the name: gzip by its magic bytes (RFC 1952 §2.3.1, ID1 = 0x1f, ID2 = 0x8b), so a
``.gz`` that is not gzip is read as what it is, by every reader alike.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from kvdiag.errors import InputError

STDIN_NAME = "-"
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(head: bytes) -> bool:
    """Whether the first bytes of a file are gzip's magic number (RFC 1952 §2.3.1)."""
    return head[:2] == GZIP_MAGIC


def node_kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in the words of every message (None for a
    regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: str | os.PathLike[str], mode: int, *, what: str = "a regular file",
                hint: str = "") -> InputError:
    """The one-line error for reading ``path``, which is not a regular file."""
    kind = node_kind(mode) or "a regular file"
    if stat.S_ISDIR(mode):
        return InputError(f"{os.fspath(path)}: is a directory, not {what}")
    return InputError(f"{os.fspath(path)}: {kind}, not {what}{hint}")


def require_regular(path: str | os.PathLike[str], *, what: str = "a regular file",
                    hint: str = "") -> os.stat_result:
    """``os.stat(path)`` when it is a regular file (or a link to one), else a one-line
    :class:`InputError`. ``stat`` never blocks, where ``open`` on a FIFO waits for a writer."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{os.fspath(path)}: no such file") from None
    except OSError as exc:
        raise InputError(f"{os.fspath(path)}: cannot open: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode, what=what, hint=hint)
    return st


def open_input(path: str | os.PathLike[str], *, what: str = "a regular file",
               hint: str = "; only files are read (pipe it into '-' where the command accepts "
                           "it)",
               stdin: bool = False) -> BinaryIO:
    """``path`` opened for binary reading; a path that cannot be is a one-line
    :class:`InputError` (``what`` names what a directory is not, ``hint`` follows the refusal
    of a FIFO, socket or device).

    The file is opened with ``O_NONBLOCK`` so that opening a FIFO returns at once, and the
    type is checked on the open descriptor (no window between a check and the open). With
    ``stdin=True``, ``"-"`` is standard input, read as the user asked; a terminal there is
    refused, since nobody types a trace or a log.
    """
    if stdin and os.fspath(path) == STDIN_NAME:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("-: standard input is a terminal; pipe or redirect a file into it")
        return sys.stdin.buffer
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not {what}") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(p, mode, what=what, hint=hint)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Tapped:
    """A read-only stream that shows every block read from ``stream`` to ``hook`` (a boot
    sniffer, a progress bar): the log parser reads in large blocks, so this costs a few calls
    a second."""

    def __init__(self, stream: BinaryIO, hook: Callable[[bytes], None]) -> None:
        self._stream = stream
        self._hook = hook

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._hook(data)
        return data

    def read1(self, n: int = -1) -> bytes:
        read1 = getattr(self._stream, "read1", None)
        data: bytes = read1(n) if read1 is not None else self._stream.read(n)
        self._hook(data)
        return data
