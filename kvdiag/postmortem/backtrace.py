"""Backtrace frame lines in the forms ggml's crash path prints (domain brief §6.2–§6.4).

* gdb ``bt``: ``#N  0xADDR in func (args) at file:line`` / ``… () from /lib`` / the frame an
  inlined function sits in, without an address ``#N  func (args) at file:line`` (the frame
  before it is the inlined one: :func:`_gdb_inlined`); args may wrap onto following lines;
  pager prompts may be glued in front of a frame.
* glibc ``backtrace_symbols_fd``: ``module(sym+0xOFF)[0xADDR]``, ``module(+0xOFF) [0xADDR]``.
* lldb: ``frame #N: 0xADDR module`func + off at file:line``; an inlined frame
  ``module`caller [inlined] callee(args) at file:line``.
* macOS ``backtrace_symbols``: ``N   module   0xADDR func + off``.
* systemd-coredump: ``#N  0xADDR func (module + 0xOFF)``.
* Android (``Unwind``): ``N: 0xADDR symbol``.
* CPython 3.14 faulthandler's C stack (``Python/traceback.c`` ``_Py_backtrace_symbols_fd``):
  ``Binary file "module", at sym+0xOFF [0xADDR]`` / ``at +0xOFF [0xADDR]``, glibc's frame in
  other words (its Python stacks: ``pystack``).

``BacktraceBuilder`` gathers consecutive frame lines into one ``Backtrace`` and ends it when a
Go runtime trace (ollama) starts, so only the native part is kept.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec

from kvdiag.model.frames import Frame
from kvdiag.model.logrecords import Backtrace, BacktraceForm, LogLine
from kvdiag.postmortem.demangle import demangle

MAX_FRAMES = 256

_PAGER = re.compile(r"^--(?:Type <RET>|More--)[^-]*(?:--)?\s*")
_GDB = re.compile(r"^#(\d+) +(?:(0x[0-9a-fA-F]+) in )?(.*)$")
_COREDUMP = re.compile(r"^#(\d+) +(0x[0-9a-fA-F]+) (\S+) \((\S+) \+ (0x[0-9a-fA-F]+)\)$")
_GLIBC = re.compile(
    r"^(\S[^()\[]*?)?\(([^()+]*?)?(?:\+(0x[0-9a-fA-F]+))?\) ?\[(0x[0-9a-fA-F]+)\]\s*$"
)
_GLIBC_BARE = re.compile(r"^\[(0x[0-9a-fA-F]+)\]\s*$")
# glibc prints ``path[0xADDR]`` when dladdr finds no symbol and the module's load bias is 0 (an
# executable that is not position independent): the address is then its link-time address
_GLIBC_NOSYM = re.compile(r"^(\S*/[^()\[]*?)\[(0x[0-9a-fA-F]+)\]\s*$")
_LLDB = re.compile(
    r"^[* ]*frame #(\d+): (0x[0-9a-fA-F]+)(?: ([^`\s]+)`(.*?))?"
    r"(?: \+ (\d+))?(?: at ([^:]+):(\d+)(?::\d+)?)?(?: \[\w+\])?\s*$"
)
_MACOS = re.compile(r"^(\d+) +(\S+) +(0x[0-9a-fA-F]+) (.+?)(?: \+ (\d+))?\s*$")
_ANDROID = re.compile(r"^\s*(\d+): (0x[0-9a-fA-F]+) (.*)$")
_BARE_ADDR = re.compile(r"^0x[0-9a-fA-F]+$")
_PY_C_STACK = re.compile(r'^Binary file "(.+)", at (\S*?)\+(0x[0-9a-fA-F]+) \[(0x[0-9a-fA-F]+)\]$')
_GDB_AT = re.compile(r"^(.*) at (\S.*?):(\d+)$")
_GDB_FROM = re.compile(r"^(.*) from (\S+)$")
_GDB_CONT = re.compile(r"^\s+(?:at (\S.*?):(\d+)|from (\S+))\s*$")
_THREAD_HDR = re.compile(
    r"^(?:Thread \d+ \(.*\):|\* thread #\d+.*|  thread #\d+.*|Stack trace of thread \d+:|"
    r"Current thread's C stack trace \(most recent call first\):)$"
)
_GO_START = re.compile(r"^(?:goroutine \d+ (?:gp=\S+ )?\S*\s*\[|SIG[A-Z]+: |PC=0x|"
                       r"signal arrived during cgo execution|runtime\.\w+\()")
_NOTES = (
    "ptrace: Operation not permitted",
    "No symbol table is loaded",
    "No stack.",
    "Could not attach to process",
    "The program is not being run",
    "warning: process",
    "error: Could not convert process PID",  # lldb attach failing in ggml_print_backtrace
    "error: attach failed",
)

#: Functions that are the abort/backtrace machinery, not the crash site (issue 4 list).
ABORT_MACHINERY = frozenset({
    "abort", "raise", "gsignal", "__GI_raise", "__GI_abort", "__pthread_kill_implementation",
    "__pthread_kill_internal", "pthread_kill", "__pthread_kill", "__restore_rt", "_sigtramp",
    "<signal handler called>", "__kernel_rt_sigreturn", "__assert_fail", "__assert_fail_base",
    "__assert_rtn", "__GI___assert_fail", "ggml_abort", "ggml_print_backtrace",
    "ggml_print_backtrace_symbols", "ggml_uncaught_exception", "ggml_abort_callback",
    "__syscall_cancel_arch", "__internal_syscall_cancel", "__syscall_cancel", "__GI___wait4",
    "wait4", "__wait4", "waitpid", "__waitpid", "__libc_wait", "_Unwind_Backtrace",
    "backtrace", "__GI___backtrace", "std::terminate", "__cxa_throw", "__cxa_rethrow",
    "__cxxabiv1::__terminate", "__gnu_cxx::__verbose_terminate_handler", "__pthread_kill_impl",
})
_RUNTIME_FUNCS = frozenset({
    "_start", "__libc_start_main", "__libc_start_call_main", "__libc_start_main_impl",
    "start_thread", "clone", "clone3", "__clone", "__clone3", "__clone_internal",
    "execute_native_thread_routine", "start", "thread_start", "_pthread_start",
    "crosscall2", "BaseThreadInitThunk", "RtlUserThreadStart",
})
# Matched against the module's FILE NAME only: a library installed under a Python folder
# (``…/lib/python3.11/site-packages/llama_cpp/lib/libggml-base.so``) is the app, not Python.
_RUNTIME_MODULE = re.compile(
    r"^(?:libc(?:-[\d.]+)?\.so|libc\.so\.\d|libc\.musl|libpthread|libm\.so|libm-[\d.]+\.so|"
    r"libdl|librt|ld-linux|ld\.so|ld-musl|ld64\.so|libstdc\+\+|libc\+\+|libc\+\+abi|libgcc_s|"
    r"libffi|libpython|python(?:\d[\d.]*)?(?:\.exe)?$|python\d+\.dll$|libsystem_\w+\.dylib|"
    r"libdyld\.dylib|dyld$|libobjc|libunwind|ntdll\.dll|kernel32\.dll|KERNELBASE\.dll|ucrtbase\.dll|"
    r"msvcp\d+\.dll|vcruntime\d+\.dll|libcuda\.so|libcudart|libcublas|libamdhip64|"
    r"libhsa-runtime|linux-vdso|libgomp|libomp|libiomp|libsycl|libze_|libur_|libOpenCL|libmkl_|"
    r"libnvidia-|librocblas|libhipblas)",
    re.IGNORECASE,
)
# Folders that hold only a runtime's own modules (CPython's extension modules).
_RUNTIME_DIR = re.compile(r"(?:^|[/\\])lib-dynload[/\\]")
# Source paths gdb prints for glibc, libgcc and libstdc++ frames: glibc is built from its source
# root with relative paths (``../sysdeps/…``, ``./nptl/…``, ``./string/../sysdeps/…``); GCC's
# runtime sources live under ``libstdc++-v3``/``libgcc``; the C++ headers under
# ``include/c++/<ver>`` (an inlined std:: frame, whose caller is the app frame to blame).
_RUNTIME_SOURCE = re.compile(
    r"^(?:\.\.?/)+(?:[\w-]+/\.\./)?(?:sysdeps|nptl|libio|malloc|string|stdlib|posix|csu|elf|"
    r"signal|wcsmbs|stdio-common|misc|iconv|dlfcn|resolv|io|time|setjmp|assert|debug)/"
    r"|libstdc\+\+-v3/|libsupc\+\+/|(?:^|/)libgcc/|(?:^|/)include/c\+\+/\d|(?:^|/)glibc-[\d.]+/"
)
# glibc's IFUNC variants of the string functions (``__memmove_avx_unaligned_erms``).
_LIBC_VARIANT = re.compile(
    r"^__(?:mem|str|stp|wmem|wcs|raw)\w*_(?:avx|evex|sse|ssse3|erms|unaligned|aligned)"
)
_CLONE_SUFFIX = re.compile(r"(?: \[clone [^\]]+\])+$|\.(?:cold|part\.\d+|isra\.\d+|"
                           r"constprop\.\d+|llvm\.\d+|lto_priv\.\d+)$")


def base_name(function: str) -> str:
    """``ns::f(int) const [clone .cold]`` → ``ns::f``: the name used for matching and grouping."""
    name = _CLONE_SUFFIX.sub("", function.strip())
    name = _CLONE_SUFFIX.sub("", name)
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                head = name[:i].rstrip()
                if head and not head.endswith("operator"):
                    name = head
                break
    return name.strip()


def module_file_name(module: str) -> str:
    """The file name of a module path, POSIX or Windows."""
    return module.replace("\\", "/").rsplit("/", 1)[-1]


def is_in_app(function: str | None, module: str | None, file: str | None = None) -> bool:
    """False for the abort machinery and for system/runtime code: a runtime library by its file
    name (or a runtime-only folder such as ``lib-dynload``), a frame whose source is glibc's,
    libgcc's or libstdc++'s (see ``_RUNTIME_SOURCE``), a runtime function name."""
    if module and (_RUNTIME_MODULE.match(module_file_name(module))
                   or _RUNTIME_DIR.search(module)):
        return False
    if file and _RUNTIME_SOURCE.search(file.replace("\\", "/")):
        return False
    if function:
        base = base_name(function)
        if base in ABORT_MACHINERY or base in _RUNTIME_FUNCS:
            return False
        if base.startswith(("runtime.", "_cgo_", "__GI_", "__libc_")):
            return False
        if _LIBC_VARIANT.match(base):
            return False
    return True


def frames_of_names(names: tuple[str, ...]) -> tuple[Frame, ...]:
    """An abort event's ``backtrace`` (function names as ``kvdiag import`` wrote them, innermost
    first, ``name (inlined)`` for an inlined frame) as frames, each judged in-app by its name."""
    out: list[Frame] = []
    for n, name in enumerate(names):
        function = name.removesuffix(" (inlined)")
        out.append(Frame(index=n, function=function, inlined=name.endswith("(inlined)"),
                         in_app=is_in_app(function, None)))
    return tuple(out)


def _split_gdb_call(rest: str) -> tuple[str | None, str]:
    """Split ``func (args)`` into ``(func, args)``; C++ names keep their parameter list."""
    rest = rest.strip()
    if rest.endswith(")"):
        depth = 0
        for i in range(len(rest) - 1, -1, -1):
            ch = rest[i]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    if i > 0 and rest[i - 1] == " ":
                        func = rest[: i - 1].strip()
                        return (func or None), rest[i:]
                    break
    return (rest or None), ""


def _clean_function(func: str | None) -> str | None:
    if func is None or func in ("??", "???", ""):
        return None
    return demangle(func)


class Parsed(NamedTuple):
    form: BacktraceForm
    frame: Frame
    complete: bool
    symref: tuple[str, int] | None = None


def parse_frame(text: str) -> Parsed | None:
    """One frame line → ``(form, frame, complete)``; ``complete`` is False for a gdb frame whose
    argument list wraps onto the next line(s)."""
    s = text.strip()
    if not s:
        return None
    if s.startswith("--"):
        s = _PAGER.sub("", s)
        if not s:
            return None
    if s.startswith("#"):
        m = _COREDUMP.match(s)
        if m is not None:
            func = None if m.group(3) == "n/a" else m.group(3)
            function = _clean_function(func)
            module = m.group(4)
            return Parsed("coredump", Frame(
                index=int(m.group(1)), module=module, offset=int(m.group(5), 16),
                address=int(m.group(2), 16), function=function,
                in_app=is_in_app(function, module),
            ), True)
        m = _GDB.match(s)
        if m is not None:
            return _gdb_frame(int(m.group(1)), m.group(2), m.group(3))
        return None
    if "frame #" in s:
        m = _LLDB.match(s)
        if m is not None:
            module = m.group(3)
            # an inlined frame is "caller [inlined] callee(args)": the frame is the callee's
            # (the next frame is the caller it sits in, at the same pc)
            name, inlined = m.group(4), False
            if name and " [inlined] " in name:
                name, inlined = name.rsplit(" [inlined] ", 1)[1], True
            function = _clean_function(_strip_lldb_args(name))
            return Parsed("lldb", Frame(
                index=int(m.group(1)), module=module, address=int(m.group(2), 16),
                function=function, file=m.group(6),
                line=int(m.group(7)) if m.group(7) else None, inlined=inlined,
                in_app=is_in_app(function, module, m.group(6)),
            ), True)
    if s.endswith("]"):
        if s.startswith("Binary file "):
            m = _PY_C_STACK.match(s)
            if m is None:
                return None
            return _glibc_frame(m.group(1), m.group(2), m.group(3), m.group(4))
        m = _GLIBC.match(s)
        if m is not None and (m.group(1) or m.group(3)):
            return _glibc_frame(m.group(1), m.group(2), m.group(3), m.group(4))
        m = _GLIBC_BARE.match(s)
        if m is not None:
            return Parsed("glibc", Frame(index=-1, address=int(m.group(1), 16)), True)
        m = _GLIBC_NOSYM.match(s)
        if m is not None:
            module = m.group(1)
            return Parsed("glibc", Frame(index=-1, module=module, address=int(m.group(2), 16),
                                         in_app=is_in_app(None, module)), True)
    if s[0].isdigit():
        m = _MACOS.match(s)
        if m is not None and not m.group(2).startswith("0x"):
            function = _clean_function(m.group(4))
            module = m.group(2)
            return Parsed("macos", Frame(
                index=int(m.group(1)), module=module, address=int(m.group(3), 16),
                function=function, in_app=is_in_app(function, module),
            ), True)
        m = _ANDROID.match(s)
        if m is not None:
            function = _clean_function(m.group(3).split(" ")[0] or None)
            return Parsed("android", Frame(index=int(m.group(1)), address=int(m.group(2), 16),
                                           function=function, in_app=is_in_app(function, None)),
                          True)
    return None


def _glibc_frame(module_text: str | None, sym_text: str | None, off_text: str | None,
                 addr: str) -> Parsed:
    """glibc's ``module(sym+0xOFF) [0xADDR]`` from its parts (also CPython's C stack)."""
    module = (module_text or "").strip() or None
    # a versioned dynamic symbol (``memcpy@GLIBC_2.14``, ``f@@V1``): the name is before "@"
    sym = (sym_text or "").split("@", 1)[0] or None
    function = _clean_function(sym)
    off = int(off_text, 16) if off_text else None
    frame = Frame(
        index=-1, module=module, offset=off if sym is None else None,
        address=int(addr, 16), function=function, in_app=is_in_app(function, module),
    )
    ref = (sym, off) if sym is not None and off is not None else None
    return Parsed("glibc", frame, True, ref)


def _strip_lldb_args(func: str | None) -> str | None:
    """lldb prints ``f(a=1, b=0x2)`` with argument values; keep ``f``."""
    if func and func.endswith(")"):
        name, args = _split_gdb_call(func.replace("(", " (", 1)) if "(" in func else (func, "")
        if "=" in args and name:
            return name
    return func


def _gdb_frame(index: int, addr: str | None, rest: str) -> Parsed:
    if addr is None and _BARE_ADDR.match(rest.strip()):
        # a frame cut after its address (truncated log)
        return Parsed("gdb", Frame(index=index, address=int(rest.strip(), 16)), True)
    file: str | None = None
    line: int | None = None
    module: str | None = None
    m = _GDB_AT.match(rest)
    if m is not None:
        rest, file, line = m.group(1), m.group(2), int(m.group(3))
    else:
        m = _GDB_FROM.match(rest)
        if m is not None:
            rest, module = m.group(1), m.group(2)
    complete = rest.count("(") <= rest.count(")")
    func, _args = _split_gdb_call(rest)
    function = _clean_function(func)
    frame = Frame(
        index=index, module=module, address=int(addr, 16) if addr else None,
        function=function, file=file, line=line,
        in_app=is_in_app(function, module, file),
    )
    return Parsed("gdb", frame, complete)


def _gdb_inlined(frames: list[Frame]) -> list[Frame]:
    """Which gdb frames are inlined. gdb prints no address for a frame whose next (inner)
    frame is inlined into it: that frame's pc *is* the inlined frame's, and its line is the
    call site (gdb ``find_frame_sal``, ``frame_show_address``); an outer frame's return address
    is otherwise always shown. So frame N is inlined when frame N+1 has no address — not frame
    N+1 itself, which is the function it was inlined into (``#5 0x… in kv_stream_fattn (…) at
    a.cpp:9`` then ``#6 compute_forward (…) at a.cpp:12``: kv_stream_fattn is inlined into
    compute_forward). Frame 0 without an address only stopped at the start of a line;
    ``<signal handler called>`` has none and says nothing of inlining."""
    out = []
    for i, fr in enumerate(frames):
        nxt = frames[i + 1] if i + 1 < len(frames) else None
        inlined = (nxt is not None and nxt.address is None and nxt.index == fr.index + 1
                   and not (nxt.function or "").startswith("<"))
        out.append(fr if fr.inlined == inlined else _replace(fr, inlined=inlined))
    return out


def is_note(text: str) -> str | None:
    s = text.strip()
    for note in _NOTES:
        if s.startswith(note):
            return s
    return None


def is_noise(text: str) -> bool:
    """gdb chatter around a backtrace: source echo, LWP/thread lines, warnings."""
    s = text.strip()
    if not s:
        return True
    if s[0].isdigit() and ("\t" in text or " in " in s or ": No such file" in s):
        return True
    return s.startswith((
        "[New LWP", "[New Thread", "[Thread debugging", "Using host libthread_db",
        "[Inferior", "warning:", "⚠", "[Detaching", "This GDB supports", "Enable debuginfod",
        "Debuginfod has been", "To make this setting", "<https://", "Reading symbols",
        "Downloading", "[Switching to", "(gdb)", "(lldb)", "Process ", "Executable module",
        "Core file", "Current executable", "Architecture set", "[Nuevo LWP", "[Nouveau",
        "WARNING: Using native backtrace", "WARNING: GGML_BACKTRACE_LLDB", "See: https://",
        # CPython 3.14 faulthandler's C stack, when it has none to show
        "<system returned no stack trace>", "<truncated rest of calls>",
        "<cannot get C stack on this system>",
    )) or _is_localized_lwp(s)


def _is_localized_lwp(s: str) -> bool:
    return s.startswith("[") and "LWP" in s[:30]


def is_thread_header(text: str) -> bool:
    return _THREAD_HDR.match(text.strip()) is not None


def is_go_trace(text: str) -> bool:
    return _GO_START.match(text.strip()) is not None


class BacktraceBuilder:
    """Collects frame lines into ``Backtrace`` records (wrapped gdb frames joined)."""

    def __init__(self) -> None:
        self._frames: list[Frame] = []
        self._refs: list[tuple[str, int] | None] = []
        self._form: BacktraceForm | None = None
        self._where: LogLine | None = None
        self._thread: str | None = None
        self._notes: list[str] = []
        self._pending: str | None = None
        self._pending_index = 0
        self._pending_addr: str | None = None
        self.done: list[Backtrace] = []

    @property
    def active(self) -> bool:
        return bool(self._frames) or self._pending is not None

    def feed(self, where: LogLine, text: str) -> bool:
        """Consume one line; True if it belonged to a backtrace (frame, wrap, note, header)."""
        if self._pending is not None:
            joined = f"{self._pending} {text.strip()}"
            if joined.count("(") <= joined.count(")") or len(joined) > 4000:
                self._pending = None
                p = _gdb_frame(self._pending_index, self._pending_addr, joined)
                self._add(where, p.form, p.frame, None)
            else:
                self._pending = joined
            return True
        note = is_note(text)
        if note is not None:
            self._notes.append(note[:200])
            return True
        if is_go_trace(text):
            self.flush()
            return False
        if is_thread_header(text):
            self.flush()
            self._thread = text.strip()[:200]
            return True
        m = _GDB_CONT.match(text)
        if m is not None and self._frames and self._form == "gdb":
            last = self._frames[-1]
            if last.file is None and last.module is None:
                if m.group(1):
                    last = _replace(last, file=m.group(1), line=int(m.group(2)),
                                    in_app=is_in_app(last.function, None, m.group(1)))
                else:
                    mod = m.group(3)
                    last = _replace(last, module=mod, in_app=is_in_app(last.function, mod))
                self._frames[-1] = last
                return True
        parsed = parse_frame(text)
        if parsed is None:
            return False
        form, frame, complete, ref = parsed
        if form == "gdb" and not complete:
            gm = _GDB.match(_PAGER.sub("", text.strip()))
            if gm is not None:
                self._pending = gm.group(3)
                self._pending_index = int(gm.group(1))
                self._pending_addr = gm.group(2)
                if self._where is None:
                    self._where = where
                self._form = self._form or "gdb"
                return True
        self._add(where, form, frame, ref)
        return True

    def _add(
        self, where: LogLine, form: BacktraceForm, frame: Frame, ref: tuple[str, int] | None
    ) -> None:
        restart = (
            self._form is not None and form != self._form
        ) or (form in ("gdb", "coredump", "lldb", "macos") and frame.index == 0 and self._frames
              and self._frames[-1].index >= 0)
        if restart:
            self.flush()
        if self._where is None:
            self._where = where
        self._form = form
        if frame.index < 0:
            frame = _replace(frame, index=len(self._frames))
        if len(self._frames) < MAX_FRAMES:
            self._frames.append(frame)
            self._refs.append(ref)

    def flush(self) -> None:
        if self._pending is not None:
            p = _gdb_frame(self._pending_index, self._pending_addr, self._pending)
            self._pending = None
            assert self._where is not None
            self._add(self._where, p.form, p.frame, None)
        if self._frames and self._where is not None and self._form is not None:
            if self._form == "gdb":
                self._frames = _gdb_inlined(self._frames)
            self.done.append(Backtrace(
                where=self._where, form=self._form, frames=tuple(self._frames),
                thread=self._thread, notes=tuple(self._notes),
                symrefs=tuple(self._refs) if any(self._refs) else (),
            ))
            self._notes = []
        self._frames = []
        self._refs = []
        self._form = None
        self._where = None
        self._thread = None

    def take_notes(self) -> tuple[str, ...]:
        notes = tuple(self._notes)
        self._notes = []
        return notes


def _replace(frame: Frame, **changes: object) -> Frame:
    return msgspec.structs.replace(frame, **changes)
