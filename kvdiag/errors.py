"""Errors that reach the user: each carries the process exit code and a one-line message."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3


class KvdiagError(Exception):
    """An error the CLI reports as one line (no traceback unless ``--debug``)."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(KvdiagError):
    """Bad option values or an impossible configuration."""


class InputError(KvdiagError):
    """A file that cannot be read or is not what it claims to be."""


class DeviceUnavailable(KvdiagError):
    """The requested executor or device is not present on this machine."""


class DeviceFault(KvdiagError):
    """A device call or kernel failed mid-run; ``cuda_error`` is the driver's own text. The
    capture records it as an abort and ends, as the server would."""

    exit_code = EXIT_ABORTED

    def __init__(self, message: str, cuda_error: str) -> None:
        super().__init__(message)
        self.cuda_error = cuda_error


class Terminated(KvdiagError):
    """A termination signal arrived (SIGTERM, SIGHUP): raised by the handler that a long
    command installs so that its ``finally`` blocks run (a capture writes its End event);
    exit 128 + the signal number, as a shell reports it."""

    def __init__(self, signal_name: str, signum: int) -> None:
        super().__init__(f"terminated by {signal_name}", 128 + signum)
        self.signal_name = signal_name


STDIN_NAME = "-"


def open_input(
    path: str | os.PathLike[str],
    *,
    directory: str = "is a directory",
    stdin: bool = False,
) -> BinaryIO:
    """``path`` opened for binary reading; a path that cannot be is a one-line
    :class:`InputError` (``directory`` words the case of a folder).

    Only regular files are read: a FIFO, socket or device has no end a reader can count on
    (a FIFO without a writer blocks ``open`` and ``read`` forever), so it is refused before
    anything waits on it. The file is opened with ``O_NONBLOCK`` so that opening a FIFO
    returns at once, and the type is checked on the open descriptor (no window between a
    check and the open). With ``stdin=True``, ``"-"`` is standard input, read as the user
    asked; a terminal there is refused, since nobody types a trace.
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
        raise InputError(f"{p}: {directory}") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{p}: {directory}")
        if not stat.S_ISREG(mode):
            raise InputError(f"{p}: {_file_type(mode)}, not a regular file; only files are "
                             f"read (pipe it into '-' where the command accepts it)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"
