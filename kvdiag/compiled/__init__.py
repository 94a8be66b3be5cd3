"""C helpers for the hot loops, compiled on first use and cached; Python when there is no compiler.

Each helper is one C file beside the Python module it speeds up, which stays the reference
(``analysis/judgement/*.c``: the judgement's columns, its walk of a streamed chunk, the
annotation cross-check; ``postmortem/perfbytes.c`` and ``perfpairs.c``: where ``kvdiag
perf``'s patterns can match in a log, and the usual request read there;
``trace/blockscan.c``: the reader's block check; ``analysis/indexscan.c``: the viewer's index
rows read from a block's bytes; ``analysis/judgement/linescan.h``, included by ``columns.c``:
the judgement's columns read from lines' bytes), with the headers beside it and this package's
(``vec.h``: a growable array of int64; ``jsonscan.h``: JSON read from a line's bytes); :func:`build` also builds the NumPy executor's ctypes kernel
(``kernels/cpu_attend.c``, :mod:`kvdiag.executors.cpu_kernels`).
:func:`load` builds a helper once per source, headers, flags, compiler, Python and platform
(``$CC``, else the compiler Python was built with, else ``cc``) into ``$KVDIAG_COMPILED_DIR``
or the ``compiled`` folder of the user's cache folder (:mod:`kvdiag.files.cache`), and imports
it. Where that fails — no compiler, no Python headers, a read-only cache — :func:`load` returns
None once per process and the caller takes its Python path, which stays the reference the
tests hold the C helper to. ``KVDIAG_COMPILED=0`` chooses the Python path (a user who would
rather not run a compiler; the tests of both paths).

Measured choice (issue 15 §5, benchmarks/results/bench_check.txt): numba's import alone costs
0.3-0.5 s per process on this machine against 1.9 s for ``trace validate`` of the benchmark's
1M events, and numba cannot read the decoded (msgspec) events; a C extension imports in a
millisecond and reads them through the C API.

What is loaded is only what this module compiled: a cached library is used only when it is a
regular file owned by this user and writable by nobody else, in a folder of the same kind
(another user's planted file is rebuilt over, never loaded).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shlex
import stat
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from kvdiag.files.cache import cache_root

__all__ = ["build", "load", "status"]

SHARED = Path(__file__).parent
"""Headers every helper may include (``vec.h``: a growable array of int64; ``jsonscan.h``: JSON
read from a line's bytes)."""
_loaded: dict[str, ModuleType | None] = {}
_why: dict[str, str] = {}
COMPILE_TIMEOUT_S = 120


def _wanted() -> bool:
    return os.environ.get("KVDIAG_COMPILED", "1").strip().lower() not in ("0", "no", "off",
                                                                           "false")


def _suffix() -> str:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return suffix if isinstance(suffix, str) and suffix else ".so"


def _compiler() -> list[str]:
    """``$CC``, else the compiler Python was built with, else ``cc``."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC")
    words = shlex.split(cc) if isinstance(cc, str) and cc.strip() else []
    return words or ["cc"]


def _owned_safely(path: Path) -> bool:
    """A file or folder of this user's that nobody else can write (so not another's plant)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _key(source_path: Path, flags: Sequence[str], python: bool) -> str:
    """The build's name: the source, the headers beside it and the shared ones (``#include
    "x.h"``), the flags, the compiler, the platform, and for a Python extension Python's
    version."""
    h = hashlib.sha256(source_path.read_bytes())
    headers = {*source_path.parent.glob("*.h"), *SHARED.glob("*.h")}
    for header in sorted(headers, key=lambda p: (p.name, str(p))):
        h.update(header.name.encode())
        h.update(header.read_bytes())
    h.update("\0".join((*flags, *_compiler(), sys.platform, platform.machine())).encode())
    if python:
        h.update(sys.version.encode())
        h.update(_suffix().encode())
    return h.hexdigest()[:16]


def build(source_path: Path, name: str, flags: Sequence[str] = ("-O2",), *,
          python: bool = False) -> Path:
    """The shared library built from ``source_path`` with ``flags`` (and ``-shared -fPIC``),
    cached: ``$KVDIAG_COMPILED_DIR/NAME-KEY/`` or the cache root's ``compiled`` folder (a
    Python extension, ``python``, against this Python's headers). Raises OSError (no compiler,
    no headers, a failed build, no private folder to build in)."""
    root = os.environ.get("KVDIAG_COMPILED_DIR") or Path(cache_root()) / "compiled"
    suffix = _suffix() if python else ".so"
    out = Path(root) / f"{name}-{_key(source_path, flags, python)}" / f"{name}{suffix}"
    if out.is_file() and _owned_safely(out) and _owned_safely(out.parent):
        return out
    # only a build needs these (~12 ms of every start otherwise)
    import subprocess
    import tempfile

    cmd = [*_compiler(), *flags, "-shared", "-fPIC", f"-I{source_path.parent}", f"-I{SHARED}"]
    if python:
        include = sysconfig.get_paths()["include"]
        if not (Path(include) / "Python.h").is_file():
            raise OSError(f"no Python headers at {include}")
        cmd += ["-fvisibility=hidden", f"-I{include}", *_extension_link_flags()]
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not _owned_safely(out.parent):
        raise OSError(f"{out.parent}: not a private folder of this user's")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=suffix, dir=out.parent)
    os.close(fd)
    try:
        cmd += [str(source_path), "-o", tmp]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["(no message)"])[0]
            raise OSError(f"{cmd[0]} failed ({done.returncode}): {first}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: another process building the same source wins or loses
    except subprocess.SubprocessError as exc:  # a compiler that hangs
        raise OSError(f"{cmd[0]}: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _extension_link_flags() -> list[str]:
    """What linking a Python extension needs besides ``-shared`` on this platform: on macOS the
    Python symbols are resolved when the interpreter loads it (CPython's own ``LDSHARED`` there
    says ``-undefined dynamic_lookup``; without it the link fails and the Python path runs)."""
    return ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []


def _import(full: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(full, str(path))
    spec = importlib.util.spec_from_file_location(full, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(source_path: Path, full: str) -> ModuleType | None:
    """The C file ``source_path`` compiled as module ``full`` (its ``PyInit_`` names the last
    part), or None: no compiler, no headers, ``KVDIAG_COMPILED=0``, or a build that failed
    (:func:`status` says why)."""
    if full in _loaded:
        return _loaded[full]
    module: ModuleType | None = None
    if not _wanted():
        _why[full] = "KVDIAG_COMPILED=0: the Python path"
    else:
        try:
            out = build(source_path, full, ("-O2",), python=True)
            module = _import(full, out)
            _why[full] = f"compiled: {out}"
        except (OSError, ImportError) as exc:  # build() turns a compiler's hang into OSError
            _why[full] = f"not compiled ({exc}): the Python path"
    _loaded[full] = module
    return module


def status() -> dict[str, str]:
    """How each helper loaded so far runs (module name: one line)."""
    return dict(_why)
