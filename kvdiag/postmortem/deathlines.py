"""Lines that show a process died, in the words no scanner anchor holds (``parse`` finds them by
reading back where a server's output ends, docs/postmortem-json.md "How a death is found"):
a signal handler's number, the kernel's OOM killer, glibc's own fatal messages; and which frame
lines may open a crash, and which lines are the server's own output.
"""

from __future__ import annotations

import re

from kvdiag.model.logrecords import Abort, LogLine
from kvdiag.postmortem import serverlog
from kvdiag.postmortem.backtrace import parse_frame

#: Substrings one of which every line that may show a death holds (a signal line in any of the
#: words of ``crashlines._SIGNAL`` and below, a frame in any form (all but an inlined gdb frame #0
#: carry ``0x``), an uncaught exception, glibc's fatal messages, an OOM kill): reading back
#: finds these with ``bytes.find`` and parses only their lines, not every line.
MAY_SHOW_DEATH: tuple[bytes, ...] = (
    b"0x", b"#0 ", b"SIG", b"ignal", b"fault", b"error", b"nstruction", b"xception",
    b"status=", b"bort", b"exit code", b"trap", b"system call", b"Killed", b"terminate",
    b"***", b"(): ", b"corrupt",
)

# A signal handler's own line, by number ("caught signal 11", "received signal 6", "Fatal
# signal 8"); the numbers are Linux's (signal(7)). Only the signals that end a process without
# being asked to count: 2 (SIGINT) and 15 (SIGTERM) are a stop someone asked for.
_SIGNAL_NUMBER = re.compile(
    r"\b(?:[Cc]aught|[Rr]eceived|[Gg]ot|[Ff]atal|[Tt]erminated by|[Kk]illed by)(?: the)? "
    r"signal:? (\d{1,2})\b"
)
FATAL_NUMBERS = {4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
                 9: "SIGKILL", 11: "SIGSEGV", 31: "SIGSYS"}
# The kernel's OOM killer (mm/oom_kill.c): "Out of memory: Killed process <pid> (<comm>) …",
# in a cgroup "Memory cgroup out of memory: Killed process …"; comm is at most 15 characters.
_OOM_KILL = re.compile(r"[Oo]ut of memory: Killed process (\d+) \(([^)]{0,64})\)")
# glibc's own fatal messages, each followed by abort() (glibc malloc/malloc.c malloc_printerr,
# debug/fortify_fail.c, debug/stack_chk_fail.c): heap corruption found by malloc/free, a
# _FORTIFY_SOURCE overflow, a smashed stack canary. Older glibc names the program before
# "terminated".
_LIBC_FATAL = re.compile(
    r"^(\*\*\* (?:stack smashing|buffer overflow) detected \*\*\*:.{0,200}terminated|"
    r"(?:free|malloc|calloc|realloc|munmap_chunk|malloc_consolidate|_int_malloc|_int_free|"
    r"tcache_thread_shutdown)\(\): [a-z][\w .,()-]{2,80}|double free or corruption \(\w+\)|"
    r"corrupted (?:size vs\. prev_size|double-linked list)[\w ()-]{0,40})\s*$"
)


# CPython's faulthandler for a signal it has no name for (Modules/faulthandler.c, 3.11+).
_PY_SIGNUM = re.compile(r"^Fatal Python error from unexpected signum: (\d{1,2})\b")


# CPython's faulthandler on Windows (Modules/faulthandler.c, its vectored exception handler,
# 3.3 to 3.14): "Windows fatal exception: <what>", a blank line, then the threads' stacks as
# for a signal (no "Extension modules" line). <what> is one of seven names, else "code 0x"
# and the NTSTATUS in 8 lowercase hex digits (3.7+, bpo-30557; before: "code " and the
# decimal). Codes without the high bit, MSVC's C++ throw (0xE06D7363) and the CLR's
# (0xE0434352) are never printed. RustPython's faulthandler adds "illegal instruction".
_WIN_EXCEPTION = re.compile(
    r"^Windows fatal exception: (access violation|float divide by zero|float overflow|"
    r"int divide by zero|integer overflow|page error|stack overflow|illegal instruction|"
    r"code (?:0x([0-9a-fA-F]{1,8})|(\d{1,10})))\s*$")
#: The POSIX signal the C runtime raises for an exception (MSVC's CRT: an access violation is
#: SIGSEGV, an illegal instruction SIGILL, arithmetic SIGFPE), and the two it has none for that
#: are the same deaths on POSIX: a stack overflow (SIGSEGV there) and an in-page error (a
#: mapped file that cannot be read, as a model mmapped from a lost disk: SIGBUS there).
WINDOWS_SIGNALS: dict[int, str] = {
    0xC0000005: "SIGSEGV", 0xC00000FD: "SIGSEGV", 0xC0000006: "SIGBUS",
    0xC000001D: "SIGILL", 0xC0000096: "SIGILL",
    **{code: "SIGFPE" for code in range(0xC000008C, 0xC0000096)},
}
_WIN_NAMES = {"access violation": 0xC0000005, "float divide by zero": 0xC000008E,
              "float overflow": 0xC0000091, "int divide by zero": 0xC0000094,
              "integer overflow": 0xC0000095, "page error": 0xC0000006,
              "stack overflow": 0xC00000FD, "illegal instruction": 0xC000001D}


def parse_windows_exception(text: str) -> tuple[str, str] | None:
    """``(signal, exception)`` of faulthandler's ``Windows fatal exception: …`` line: the
    POSIX signal of the same death (``WINDOWS_SIGNALS``), or ``exception 0x…`` for a code
    with none, and the exception as printed (``access violation``, ``code 0xc0000409``)."""
    if not text.startswith("Windows fatal"):
        return None
    m = _WIN_EXCEPTION.match(text)
    if m is None:
        return None
    what = m.group(1)
    if m.group(2) is not None:
        code = int(m.group(2), 16)
    elif m.group(3) is not None:
        code = int(m.group(3)) & 0xFFFFFFFF
    else:
        code = _WIN_NAMES[what]
    return WINDOWS_SIGNALS.get(code, f"exception {code:#010x}"), what


def signal_number(text: str) -> int | None:
    """The number of a handler's ``caught signal N`` line (fatal or not: see
    ``FATAL_NUMBERS``)."""
    m = _SIGNAL_NUMBER.search(text) or _PY_SIGNUM.match(text)
    return int(m.group(1)) if m else None


def parse_oom_kill(text: str) -> tuple[int, str] | None:
    """``(pid, process name)`` of a kernel OOM-killer line."""
    m = _OOM_KILL.search(text)
    return (int(m.group(1)), m.group(2)) if m else None


def is_server_process(comm: str) -> bool:
    """Whether a process name the kernel printed is a llama.cpp server's: ``llama-server``,
    ollama's runner (``ollama_llama_se``, cut to 15 characters), older ``server`` builds
    named ``llama-*``. Another name (``python3`` running llama-cpp-python included) is not
    taken for the server: the log does not say it was."""
    return "llama" in comm.lower()


def parse_libc_fatal(where: LogLine, text: str) -> Abort | None:
    """One of glibc's fatal messages (``double free or corruption (out)``, ``*** stack
    smashing detected ***: terminated``): an abort whose cause glibc names, without a file."""
    if "***" not in text and "(): " not in text and "corrupt" not in text:
        return None
    m = _LIBC_FATAL.match(text.strip())
    return Abort(where=where, form="libc", message=m.group(1)) if m is not None else None


def opens_with_frame(text: str) -> bool:
    """A frame line that can open a crash: one that names a function or a module, or a gdb
    frame with only its address (``#0  0x… in ?? ()``: gdb's own syntax, nothing else prints
    it); a bare address or an Android-style ``N: 0x…`` line alone is too weak. A gdb frame
    needs an address or a location (``at file:line`` / ``from lib``): ``#1 Introduction`` is
    a heading in a prompt, not gdb."""
    parsed = parse_frame(text)
    if parsed is None:
        return False
    fr = parsed.frame
    if parsed.form == "gdb":
        if fr.address is None and fr.file is None and fr.module is None:
            return False
        return bool(fr.function or fr.module) or " in " in text
    return bool(fr.function or fr.module)


def server_line(text: str, level: str | None) -> bool:
    """A line llama-server itself printed: common/log.cpp's level letter, a slot, server or
    queue line (domain brief §7.1, §7.3), or the 2024 ``server_log`` form."""
    return level is not None or text.startswith(("slot ", "srv ", "que ")) or (
        serverlog.mentions(text))
