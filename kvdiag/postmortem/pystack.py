"""Python stacks as CPython's faulthandler prints them when a process dies of a signal.

An embedding of llama.cpp in Python (llama-cpp-python's server, any script with
``faulthandler.enable()`` or ``PYTHONFAULTHANDLER``) dies with, on standard error
(CPython ``Modules/faulthandler.c`` ``faulthandler_fatal_error``, ``Python/traceback.c``
``_Py_DumpTracebackThreads``, ``dump_traceback``, ``dump_frame``; the same from 3.8 to 3.14)::

    Fatal Python error: Segmentation fault          (the signal: crashlines.parse_signal)

    Current thread 0x00007f3b8a242740 (most recent call first):
      Garbage-collecting                            (3.9+, when the collector was running)
      File "/srv/app/llama_cpp/llama.py", line 1234 in eval
      File "???", line ??? in ???                   (a name or line it could not read)
      ...                                           (after 100 frames)

    Thread 0x00007f3b7d1ff640 (most recent call first):
      <no Python frame>                             (a thread running only C code)

    Extension modules: numpy.core._multiarray_umath, ... (total: 12)   (3.10+)

On Windows the same dump follows ``Windows fatal exception: access violation`` (or another of
the exception handler's names, or ``code 0x…``; read by ``deathlines.parse_windows_exception``)
instead of the signal's line, with CRLF line ends, and without the extension modules.

3.14 prints a thread's name after its id (``Thread 0x00006754 [Thread-8] (most recent call
first):``). ``Stack (most recent call first):`` heads the single thread of ``all_threads=False``, and a
free-threaded build prints ``<Cannot show all threads while the GIL is disabled>`` before it.
3.14 adds ``Current thread's C stack trace`` with ``Binary file "…", at sym+0xOFF [0xADDR]``
lines: those are native frames (``backtrace.parse_frame``), not Python ones. A frame line has
no comma before ``in``, unlike an exception's ``Traceback (most recent call last):``, which is
not a death and is not read here. Python frames carry their file and line: nothing about them
is looked up in a binary.
"""

from __future__ import annotations

import re

from kvdiag.model.frames import PYTHON_MARKS as _MARKS
from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import LogLine, PythonStack

#: faulthandler prints at most 100 frames and 100 threads (``MAX_FRAME_DEPTH``,
#: ``MAX_NTHREADS``); more here is a log that is not faulthandler's.
MAX_FRAMES = 100
MAX_STACKS = 100

# 3.14 prints the thread's name after its id: "Thread 0x00006754 [Thread-8] (most …)"
_HEADER = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.{1,80})\])? \(most recent call first\):\s*$"
)
_STACK = "Stack (most recent call first):"
_FRAME = re.compile(r'^\s+File (?:"(.*)"|\?\?\?), line (\d+|\?\?\?) in (.*?)\s*$')
_GIL_DISABLED = "<Cannot show all threads while the GIL is disabled>"
_EXT_MODULES = "Extension modules: "
# CPython's own library (``…/lib/python3.11/json/…``; on Windows ``C:\\Python311\\Lib\\…``, the
# installer's ``…\\Programs\\Python\\Python312\\Lib\\…``, conda's ``…\\miniconda3\\Lib\\…``) and
# frozen modules are the runtime; an installed package under site-/dist-packages is the app.
_STDLIB = re.compile(
    r"^<frozen |[/\\]lib[/\\]python\d[\d.]*t?[/\\](?!(?:site|dist)-packages[/\\])|"
    # Windows spells them so: a project's own "python\lib" folder is not the runtime
    r"(?-i:(?:[/\\]Python\d*|[/\\](?:ana|mini)conda\d*|[/\\]envs[/\\][^/\\]+)[/\\]Lib[/\\]"
    r"(?!site-packages[/\\]))", re.IGNORECASE,
)


def parse_frame(text: str) -> tuple[str | None, int | None, str | None] | None:
    """``(file, line, function)`` of a faulthandler frame line; ``???`` is None."""
    m = _FRAME.match(text)
    if m is None:
        return None
    line = m.group(2)
    func = m.group(3)
    return m.group(1), (int(line) if line != "???" else None), (func if func != "???" else None)


def is_in_app(file: str | None) -> bool:
    """False for CPython's own library and frozen modules; true for the rest (the
    application, packages installed under site-/dist-packages, ``<stdin>``)."""
    return not (file and _STDLIB.search(file))


def _same(a: PythonStack, b: PythonStack) -> bool:
    return (a.thread, a.current, a.name, a.frames, a.notes) == (
        b.thread, b.current, b.name, b.frames, b.notes)


class PythonStackBuilder:
    """Collects faulthandler lines into :class:`PythonStack` records in ``done``."""

    def __init__(self) -> None:
        self.done: list[PythonStack] = []
        self._where: LogLine | None = None
        self._thread: str | None = None
        self._current = False
        self._name: str | None = None
        self._frames: list[Frame] = []
        self._notes: list[str] = []
        self._gil_note: str | None = None

    def feed(self, where: LogLine, text: str) -> bool:
        """One line; True when it was part of a faulthandler dump."""
        if text.startswith("  File ") or text.startswith("\tFile "):
            parsed = parse_frame(text)
            if parsed is None:
                return False
            if self._where is None:
                self._open(where, None, False, None)
            if len(self._frames) < MAX_FRAMES:
                file, line, func = parsed
                self._frames.append(Frame(index=len(self._frames), function=func, file=file,
                                          line=line, in_app=is_in_app(file)))
            return True
        s = text.strip()
        if s.endswith("(most recent call first):"):
            if s == _STACK:
                self._open(where, None, True, None)
                return True
            m = _HEADER.match(s)
            if m is not None:
                self._open(where, m.group(2), m.group(1) == "Current thread", m.group(3))
                return True
            return False
        if s == _GIL_DISABLED:
            self._gil_note = "only the current thread is shown (the GIL is disabled)"
            return True
        if s.startswith(_EXT_MODULES):
            self.flush()
            return True
        note = _MARKS.get(s)
        if note is not None and self._where is not None:
            if s != "..." or text.startswith(" "):
                self._notes.append(note)
            else:
                self._notes.append(f"cut after {MAX_STACKS} threads")
            return True
        return False

    def _open(self, where: LogLine, thread: str | None, current: bool,
              name: str | None) -> None:
        self.flush()
        self._where, self._thread, self._current, self._name = where, thread, current, name
        if current and self._gil_note is not None:
            self._notes.append(self._gil_note)

    def flush(self) -> None:
        if self._where is not None and len(self.done) < MAX_STACKS:
            stack = PythonStack(
                where=self._where, thread=self._thread, current=self._current,
                name=self._name, frames=tuple(self._frames), notes=tuple(self._notes))
            # On Windows one death can be dumped twice: the exception handler's dump, then
            # the C runtime raises the signal (SIGFPE, SIGILL) whose handler dumps again
            if not any(_same(stack, d) for d in self.done):
                self.done.append(stack)
        self._where = None
        self._thread = None
        self._current = False
        self._name = None
        self._frames = []
        self._notes = []

    def stacks(self) -> tuple[PythonStack, ...]:
        """Every stack read, the thread the signal hit first."""
        self.flush()
        return tuple(sorted(self.done, key=lambda st: not st.current))
