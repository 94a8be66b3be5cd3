"""Following one file as it grows, the way ``tail -F`` does: a :class:`Tail` is polled and hands
out the bytes appended since the last poll.

- The file need not exist yet (a writer that has not created it): polls return nothing until
  it does.
- **Rotation** — the path now names another file (its device and inode differ from the open
  one, as logrotate's rename-and-create or a writer's new segment leaves it): the rest of the
  old file is read first, then :class:`Reset` says so and the new file is read from its start.
- **Truncation** — the file is shorter than what was read (``copytruncate``, a writer that
  starts over with ``O_TRUNC``), or its first bytes changed (truncated and already written
  past the old length): :class:`Reset`, then the file from its start.
- Reads never block (a regular file at its end reads empty); a partial last line is handed out
  like any bytes — the readers keep it until its newline arrives.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import BinaryIO

from kvdiag.errors import InputError

BLOCK = 1 << 20
HEAD = 64
"""First bytes kept to notice a file rewritten from its start."""


@dataclass(frozen=True)
class Reset:
    """The followed file was replaced or cut: what follows is a new file from its start."""

    why: str


class Tail:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fh: BinaryIO | None = None
        self._id: tuple[int, int] | None = None
        self.offset = 0
        self._head = b""
        self.generation = 0
        """Files read so far (1 after the first was opened)."""

    @property
    def opened(self) -> bool:
        return self._fh is not None

    def reopen(self) -> int | None:
        """A new descriptor of the file being read (None before it exists), for a viewer that
        reads lines back by offset (``os.pread``) while this one reads on: it keeps the file
        of this generation after a rotation, and reads a truncated one short, never past its
        end. The caller closes it."""
        if self._fh is None:
            return None
        return os.dup(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self) -> bool:
        try:
            # O_NONBLOCK: open(2) of a FIFO waits for a writer (the follower hung, silent,
            # instead of refusing it); the type is checked on the open descriptor
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            raise InputError(f"{self.path}: is a directory, not a file to follow") from None
        except OSError as exc:
            raise InputError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise InputError(f"{self.path}: is a directory, not a file to follow")
            raise InputError(f"{self.path}: not a regular file (a pipe or device has no end to "
                             "follow; read it with kvdiag check -)")
        fh = os.fdopen(fd, "rb")
        self._fh, self._id = fh, (st.st_dev, st.st_ino)
        self.offset, self._head = 0, b""
        self.generation += 1
        return True

    def poll(self, limit: int = BLOCK) -> bytes | Reset | None:
        """New bytes (at most ``limit``), a :class:`Reset`, or None when nothing is new."""
        if self._fh is None and not self._open():
            return None
        fh = self._fh
        assert fh is not None
        try:
            data = fh.read(limit)
        except OSError as exc:
            raise InputError(f"{self.path}: read failed: {exc.strerror or exc}") from None
        if data:
            if len(self._head) < HEAD:
                self._head += data[:HEAD - len(self._head)]
            self.offset += len(data)
            return data
        return self._changed()

    def _changed(self) -> Reset | None:
        """At the end of the open file: was it replaced or cut?"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None  # moved away, the new one not created yet: keep waiting
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != self._id:
            self.close()
            if not self._open():
                return None
            return Reset(f"{self.path} was replaced (another file now has its name: "
                         "rotated?); reading the new file from its start")
        fh = self._fh
        assert fh is not None
        if st.st_size < self.offset:
            return self._restart(f"{self.path} was truncated ({st.st_size} bytes, "
                                 f"{self.offset} read); reading it again from its start")
        if self._head:
            now = os.pread(fh.fileno(), len(self._head), 0)
            if now != self._head:
                return self._restart(f"{self.path} was rewritten from its start; reading it "
                                     "again from its start")
        return None

    def _restart(self, why: str) -> Reset:
        fh = self._fh
        assert fh is not None
        fh.seek(0)
        self.offset, self._head = 0, b""
        self.generation += 1
        return Reset(why)
