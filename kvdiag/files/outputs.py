"""Where a command's output may go, and how it is written: one rule for every command.

An output path (``capture -o``, ``import -o``, ``trace export -o``, ``sweep --plot``,
``tui --export-svg``, ``devices --save``) is one of:

- ``-``: standard output (the command's own messages then go to standard error);
- the null device (``/dev/null``, or any node that is it): written through as a stream;
- a regular file, or a path that does not exist yet in an existing directory: written to a
  temporary file in the same directory and renamed over the path when complete
  (``os.replace``, atomic on POSIX: a reader sees the old file or the whole new one). On any
  failure — a full disk, a signal, an error in the command — the temporary file is removed
  and the path is left as it was. Only a process killed outright (SIGKILL, a power cut)
  leaves it, as ``<name>.<random>.part``: for a capture, a trace of every step written before
  the kill. A symbolic link to a regular file is followed: the file it points to is replaced
  and the link kept.

Anything else — a directory, FIFO, socket, or a device other than the null device — is
refused with exit code 2 and never opened, renamed over or removed, whoever runs kvdiag (root
included) and whatever the options (``--force`` included).

The overwrite rule, the same in every command: an existing regular file is replaced only
with ``--force``; without it the command stops before doing any work. Paths are checked by
:func:`plan_output` before the work starts (so a missing directory is reported at once, not
after a long sweep), and the target is checked again just before the rename.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from kvdiag.errors import EXIT_USAGE, KvdiagError
from kvdiag.files.inputs import STDIN_NAME, node_kind

OutputKind = Literal["stdout", "null", "file"]
#: The temporary file of an output being written is ``<name>.<random>.part`` beside it.
PART_SUFFIX = ".part"


class OutputError(KvdiagError):
    """An output that may not or cannot be written (exit 2, one line)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Output:
    """A checked output: ``given`` as the user wrote it, ``target`` the regular file a
    ``file`` output replaces (links resolved)."""

    given: str
    kind: OutputKind
    target: Path | None = None

    @property
    def display(self) -> str:
        return "<stdout>" if self.kind == "stdout" else self.given

    @property
    def to_stdout(self) -> bool:
        return self.kind == "stdout"


def is_null_device(st: os.stat_result) -> bool:
    """Whether ``st`` is the null device (by device number, so a link or a second node of
    it counts too)."""
    if not stat.S_ISCHR(st.st_mode):
        return False
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _refusal(given: str, kind: str) -> OutputError:
    return OutputError(f"{given}: {kind}; output goes only to a regular file or to standard "
                       "output ('-'), so it is left untouched")


def plan_output(path: str | os.PathLike[str], *, force: bool = False,
                stdout: bool = True, flag: str = "-o") -> Output:
    """Check where ``path`` would be written, before any work; every refusal is a one-line
    :class:`OutputError`. ``stdout=False`` refuses ``-`` (the command's report already goes
    there); ``flag`` names the option in messages."""
    given = os.fspath(path)
    if given == STDIN_NAME:
        if not stdout:
            raise OutputError(f"{flag} -: standard output already carries this command's "
                              "report; give a file name")
        return Output(given, "stdout")
    if not given:
        raise OutputError(f"{flag}: empty path")
    p = Path(given)
    try:
        st: os.stat_result | None = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {given}: {exc.strerror or exc}") from None
    if st is not None:
        if is_null_device(st):
            return Output(given, "null")
        kind = node_kind(st.st_mode)
        if kind is not None:
            raise _refusal(given, kind)
        if not force:
            raise OutputError(f"{given} exists (use --force to replace it)")
    target = Path(os.path.realpath(p))
    parent = target.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise OutputError(f"cannot write {given}: directory {parent} does not exist") from None
    except OSError as exc:
        raise OutputError(f"cannot write {given}: {parent}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise OutputError(f"cannot write {given}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {given}: directory {parent} is not writable")
    return Output(given, "file", target)


class Sink:
    """An output being written: ``file`` takes the bytes (``fileno()`` for ``os.write``).

    Made by :func:`open_output`; :meth:`keep` asks for the file to be kept even when the
    ``with`` block ends with an exception (a capture cut short by a signal still wrote a
    complete trace, with status ``error``)."""

    def __init__(self, out: Output, file: BinaryIO, temp: str | None) -> None:
        self.out = out
        self.file = file
        self.temp = temp
        self.kept = False

    def fileno(self) -> int:
        return self.file.fileno()

    def keep(self) -> None:
        self.kept = True


@contextlib.contextmanager
def open_output(out: Output) -> Iterator[Sink]:
    """Write ``out``: yields a :class:`Sink`; a ``file`` output is renamed into place when
    the block ends normally (or after :meth:`Sink.keep`) and removed otherwise. A failed
    write (a full disk, a file-size limit, an I/O error), inside the block or at the end,
    becomes one :class:`OutputError` line."""
    if out.kind == "file":
        with _temporary(out) as sink:
            yield sink
        return
    if out.kind == "stdout":
        sys.stdout.flush()
        sink = Sink(out, sys.stdout.buffer, None)
        with _write_errors(out):
            yield sink
            _flush(sink)
        return
    try:
        fh: BinaryIO = open(out.given, "ab")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise OutputError(f"cannot write {out.given}: {exc.strerror or exc}") from None
    with fh, _write_errors(out):
        sink = Sink(out, fh, None)
        yield sink
        _flush(sink)


@contextlib.contextmanager
def _temporary(out: Output) -> Iterator[Sink]:
    assert out.target is not None
    try:
        # visible, so that what a process killed outright (SIGKILL) leaves is found beside
        # the output: a capture's events up to the kill, readable as a trace without End
        fd, temp = tempfile.mkstemp(dir=out.target.parent, prefix=f"{out.target.name}.",
                                    suffix=PART_SUFFIX)
    except OSError as exc:
        raise OutputError(f"cannot write {out.given}: {exc.strerror or exc}") from None
    sink = Sink(out, os.fdopen(fd, "wb"), temp)
    try:
        with _write_errors(out):
            yield sink
    except BaseException:
        if sink.kept:
            _commit(sink)
        else:
            _discard(sink)
        raise
    _commit(sink)


#: errno values of a write that failed for want of room or of a working device
_WRITE_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ENOSPC", "EFBIG", "EDQUOT", "EIO", "EROFS", "EPIPE", "ENXIO") if hasattr(errno, name))


@contextlib.contextmanager
def _write_errors(out: Output) -> Iterator[None]:
    """An OSError of a failed write inside the block is the output's one-line error; other
    OSErrors (an input that cannot be read) are the reader's to word."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        raise OutputError(f"cannot write {out.display}: {exc.strerror or exc}") from None


def write_output(out: Output, data: bytes) -> None:
    """Write ``data`` to ``out`` whole (atomically for a file)."""
    with open_output(out) as sink:
        sink.file.write(data)


def _flush(sink: Sink) -> None:
    try:
        sink.file.flush()
    except OSError as exc:
        raise OutputError(f"cannot write {sink.out.display}: {exc.strerror or exc}") from None


def _discard(sink: Sink) -> None:
    with contextlib.suppress(OSError):
        sink.file.close()
    if sink.temp is not None:
        with contextlib.suppress(OSError):
            os.unlink(sink.temp)


def _commit(sink: Sink) -> None:
    """Flush, sync and rename the temporary file over the target; on failure remove it."""
    out = sink.out
    assert out.target is not None and sink.temp is not None
    try:
        sink.file.flush()
        # the rename must not reach the disk before the bytes do (an empty file after a
        # power cut, where the old one was whole)
        os.fsync(sink.file.fileno())
        os.fchmod(sink.file.fileno(), _mode_for(out.target))
        sink.file.close()
        _recheck(out)
        os.replace(sink.temp, out.target)
    except OutputError:
        _discard(sink)
        raise
    except OSError as exc:
        _discard(sink)
        raise OutputError(f"cannot write {out.given}: {exc.strerror or exc}") from None


def _recheck(out: Output) -> None:
    """Between :func:`plan_output` and the rename the path may have become something else;
    a rename over a device node would replace it, so look again."""
    assert out.target is not None
    for path in (Path(out.given), out.target):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        kind = node_kind(st.st_mode)
        if kind is not None:
            raise _refusal(out.given, kind)


def _mode_for(target: Path) -> int:
    """The mode the output gets: the replaced file's, else 0666 less the umask (mkstemp
    creates 0600)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask
