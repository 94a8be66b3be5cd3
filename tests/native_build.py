"""Fetch a real ggml from the package registry and build what the native tests link against.

The ggml sources come from the ``ggml-python`` 0.0.45 sdist on PyPI (3.4 MB), which vendors
ggml under ``vendor/ggml``. What the sdist says about its ggml:

- ``vendor/ggml/CMakeLists.txt``: GGML_VERSION 0.15.3; the sdist has no ``.git``, so ggml's
  CMake records the build commit as "unknown";
- ``vendor/ggml/scripts/sync-llama.last``: ded1561b4228495daa58342ffc111ff172ec86ac (the
  llama.cpp commit ggml last synced from); ``sync-whisper.last``: 865ec171aa83625a…;
- ggml-python's own git tag ``v0.0.45`` (commit b513b74d) pins the ``vendor/ggml`` submodule
  at ggml commit eced84c86f8b012c752c016f7fe789adea168e1e (read from the public repository
  abetlen/ggml-python; not in the sdist itself).

The sdist is downloaded from the URL PyPI's JSON API gives and its sha256 is checked against
both that JSON and the digest pinned here. Only ``ggml-base`` is built (Release, static, no
CPU backend, no tests/examples: ``ggml.c``, ``ggml-alloc.c``, ``ggml-backend.cpp``,
``ggml-quants.c``, ...) — the program needs graph construction, the backend buffer
interface, ggml_abort and the reference (de)quantizers, not a compute backend.

The build goes once into ``platformdirs.user_cache_dir("kvdiag")/ggml-python-0.0.45-ggml-
0.15.3/`` and is reused: a ``flock`` on a sibling lock file serialises concurrent first runs,
and the tree is built in a temporary sibling directory and renamed into place, so a reader
never sees a half-built tree. ``build.json`` there records the sha256, the commit facts and
the build time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

ROOT = Path(__file__).resolve().parents[1]
DEMO_SOURCE = ROOT / "kernels" / "native_demo"

PACKAGE = "ggml-python"
VERSION = "0.0.45"
SDIST_NAME = "ggml_python-0.0.45.tar.gz"
SDIST_SHA256 = "10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05"
GGML_VERSION = "0.15.3"
GGML_COMMIT = "eced84c86f8b012c752c016f7fe789adea168e1e"
LLAMA_SYNC_COMMIT = "ded1561b4228495daa58342ffc111ff172ec86ac"
VENDOR_PREFIX = "ggml_python-0.0.45/vendor/ggml/"
PYPI_JSON = "https://pypi.org/pypi/ggml-python/json"
LIB_NAME = "libggml-base.a"


class NativeUnavailable(RuntimeError):
    """Something the native build needs is absent (compiler, CMake, the registry)."""


@dataclass(frozen=True)
class GgmlBuild:
    """A built ggml-base: headers (``include``, ``src`` for ggml-backend-impl.h) and the
    static library."""

    root: Path
    info: dict[str, object]

    @property
    def source(self) -> Path:
        return self.root / "ggml"

    @property
    def library(self) -> Path:
        return self.root / "lib" / LIB_NAME


def missing_tools() -> str | None:
    """Why the native build cannot run here, or None."""
    for tool in ("cc", "c++", "cmake"):
        if shutil.which(tool) is None:
            return f"{tool} not found (a C/C++ compiler and CMake are needed)"
    return None


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("kvdiag"))


def build_dir_name() -> str:
    return f"ggml-python-{VERSION}-ggml-{GGML_VERSION}"


def _sdist_entry() -> dict[str, object]:
    """The sdist file record of PyPI's JSON API (url, digests)."""
    try:
        with urllib.request.urlopen(PYPI_JSON, timeout=60) as resp:
            meta = json.load(resp)
    except OSError as exc:
        raise NativeUnavailable(f"PyPI unreachable ({PYPI_JSON}): {exc}") from exc
    for entry in meta.get("releases", {}).get(VERSION, []):
        if entry.get("packagetype") == "sdist" and entry.get("filename") == SDIST_NAME:
            return dict(entry)
    raise RuntimeError(f"PyPI lists no sdist {SDIST_NAME} for {PACKAGE} {VERSION}")


def fetch_sdist(dest_dir: Path) -> Path:
    """Download the sdist into ``dest_dir`` and verify its sha256 (PyPI's and the pinned one)."""
    entry = _sdist_entry()
    digests = entry.get("digests")
    listed = digests.get("sha256") if isinstance(digests, dict) else None
    if listed != SDIST_SHA256:
        raise RuntimeError(f"PyPI lists sha256 {listed} for {SDIST_NAME}, pinned {SDIST_SHA256}")
    out = dest_dir / SDIST_NAME
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(str(entry["url"]), timeout=120) as resp, out.open("wb") as f:
            while chunk := resp.read(1 << 16):
                h.update(chunk)
                f.write(chunk)
    except OSError as exc:
        raise NativeUnavailable(f"download of {entry['url']} failed: {exc}") from exc
    if h.hexdigest() != SDIST_SHA256:
        raise RuntimeError(f"{SDIST_NAME}: sha256 {h.hexdigest()} != {SDIST_SHA256}")
    return out


def extract_ggml(sdist: Path, dest: Path) -> Path:
    """Extract ``vendor/ggml`` only, through tarfile's ``data`` filter (no links out of the
    tree, no device files)."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(VENDOR_PREFIX):
                continue
            m.name = m.name[len(VENDOR_PREFIX):]
            if m.name:
                members.append(m)
        tar.extractall(dest, members=members, filter="data")
    if not (dest / "include" / "ggml.h").is_file():
        raise RuntimeError(f"{sdist.name} has no vendor/ggml/include/ggml.h")
    return dest


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}):\n{tail}")


def _generator() -> list[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def _build_into(tmp: Path) -> dict[str, object]:
    t0 = time.monotonic()
    sdist = fetch_sdist(tmp)
    fetched = time.monotonic()
    src = extract_ggml(sdist, tmp / "ggml")
    sdist.unlink()
    build = tmp / "build"
    log = tmp / "build.log"
    _run(["cmake", "-S", str(src), "-B", str(build), *_generator(),
          "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CPU=OFF",
          "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", "-DGGML_OPENMP=OFF",
          "-DGGML_NATIVE=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON"], log)
    _run(["cmake", "--build", str(build), "--target", "ggml-base", "-j",
          str(max(1, min(4, os.cpu_count() or 1)))], log)
    libs = list(build.rglob(LIB_NAME))
    if not libs:
        raise RuntimeError(f"the ggml-base build produced no {LIB_NAME}")
    (tmp / "lib").mkdir()
    shutil.copy2(libs[0], tmp / "lib" / LIB_NAME)
    shutil.rmtree(build)  # objects are not needed once the archive exists
    return {
        "package": f"{PACKAGE}=={VERSION}", "sdist": SDIST_NAME, "sha256": SDIST_SHA256,
        "ggml_version": GGML_VERSION, "ggml_commit": GGML_COMMIT,
        "llama_sync_commit": LLAMA_SYNC_COMMIT, "target": "ggml-base (Release, static)",
        "fetch_seconds": round(fetched - t0, 2),
        "build_seconds": round(time.monotonic() - fetched, 2),
    }


@contextmanager
def locked(path: Path) -> Iterator[None]:
    import fcntl  # POSIX only, like the rest of the native build

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(final: Path) -> GgmlBuild | None:
    stamp = final / "build.json"
    if not stamp.is_file() or not (final / "lib" / LIB_NAME).is_file():
        return None
    return GgmlBuild(final, json.loads(stamp.read_text(encoding="utf-8")))


def ensure_ggml(root: Path | None = None) -> GgmlBuild:
    """The cached ggml-base build, building it first if absent (raises NativeUnavailable
    when tools or the registry are missing)."""
    reason = missing_tools()
    if reason:
        raise NativeUnavailable(reason)
    root = root or cache_root()
    final = root / build_dir_name()
    found = _load(final)
    if found is not None:
        return GgmlBuild(found.root, {**found.info, "cached": True})
    with locked(root / (build_dir_name() + ".lock")):
        found = _load(final)  # another run may have finished while we waited
        if found is not None:
            return GgmlBuild(found.root, {**found.info, "cached": True})
        tmp = Path(tempfile.mkdtemp(prefix=build_dir_name() + ".tmp-", dir=root))
        try:
            info = _build_into(tmp)
            (tmp / "build.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
            if final.exists():  # a stale, incomplete tree from an older layout
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return GgmlBuild(final, {**info, "cached": False})


def build_demo(ggml: GgmlBuild, out: Path) -> tuple[Path, float]:
    """Configure and build kernels/native_demo against ``ggml``; (executable, seconds)."""
    t0 = time.monotonic()
    log = out / "demo-build.log"
    out.mkdir(parents=True, exist_ok=True)
    _run(["cmake", "-S", str(DEMO_SOURCE), "-B", str(out), *_generator(),
          "-DCMAKE_BUILD_TYPE=Release", f"-DKVDIAG_GGML_ROOT={ggml.root}"], log)
    _run(["cmake", "--build", str(out), "-j", str(max(1, min(4, os.cpu_count() or 1)))], log)
    exe = out / "kvdemo"
    if not exe.is_file():
        raise RuntimeError(f"the demo build produced no {exe}")
    return exe, time.monotonic() - t0
