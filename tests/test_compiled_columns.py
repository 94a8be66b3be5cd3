"""The page judgement's columns taken out in C (``columns.c``) against the Python reference.

``kvdiag check`` and the TUI's judging pass take the fields of every decoded event out in C
when a compiler is at hand (:mod:`kvdiag.compiled`); the Python of
:func:`~kvdiag.analysis.judgement.columns.extract_py` stays the reference and the path without
one. Both must give the same columns, array for array, on random traces of every page kind and
on the events the C pass declines (integers beyond ±2^62), and the loader must fall back to
Python, never fail, where it cannot build.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvdiag import compiled
from kvdiag.analysis.judgement import columns
from kvdiag.model import events as ev
from kvdiag.model.geometry import Tensor
from tests.test_judgement_fastpath import _trace

C = columns._compiled()
needs_c = pytest.mark.skipif(C is None, reason="no C compiler here: " + str(compiled.status()))

_BLANK = Tensor("", "", (0, 0, 0, 0), (0, 0, 0, 0))


def _mixed(seed: int) -> list[Any]:
    """A random page trace with the other kinds between its events: fits (their layers),
    outputs, marks, reads without served runs, annotated reads and writes, unknown bytes."""
    rng = random.Random(seed)
    out: list[Any] = []
    for e in _trace(seed):
        if isinstance(e, ev.Upload) and rng.random() < 0.1:
            e = ev.Upload(e.seq, e.t_ns, e.step, layer=e.layer, stream=e.stream, pages=e.pages,
                          slot=e.slot, target=e.target, bytes=None,
                          reason=rng.choice(("miss", "wide-query", "last-chunk")))
        if isinstance(e, ev.Read) and rng.random() < 0.1:
            e = ev.Read(e.seq, e.t_ns, e.step, layer=e.layer, stream=e.stream, pool=3,
                        ring=2, host=1)
        if isinstance(e, ev.Read) and seed % 2 and rng.random() < 0.3:
            e = ev.Read(e.seq, e.t_ns, e.step, layer=e.layer, stream=e.stream, pool=e.pool,
                        ring=e.ring, host=e.host, served=e.served,
                        ranges=(ev.ReadRange(0, 2, "pool", e.stream, "exact"),))
        if isinstance(e, ev.Write) and seed % 2 and rng.random() < 0.3:
            e = ev.Write(e.seq, e.t_ns, e.step, layer=e.layer, stream=e.stream, cells=e.cells,
                         rows=e.rows, versions=((e.cells[0] // 256, rng.randrange(9)),))
        out.append(e)
        if rng.random() < 0.1:
            out.append(ev.Fits(e.seq, 0, e.step, node="__fattn__", layer=rng.randrange(4),
                               q=_BLANK, k=_BLANK, v=_BLANK, dst=_BLANK, stage_bytes=1,
                               result=True, route="streamed"))
        if rng.random() < 0.05:
            out.append(ev.Output(e.seq, 0, e.step, stream=0, checksum="00"))
    return out


def _same(a: columns.Cols, b: columns.Cols) -> None:
    for name in (*columns._ARRAYS, *columns._TAIL_ARRAYS, "order"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and np.array_equal(x, y), name
    assert a.n == b.n and a.bounds == b.bounds
    assert (a.r_counts is None) == (b.r_counts is None)
    if a.r_counts is not None:
        assert np.array_equal(a.r_counts, b.r_counts)
    assert a.reads == b.reads


@needs_c
@pytest.mark.parametrize("seed", range(16))
def test_c_columns_equal_the_python_ones(seed: int) -> None:
    """GIVEN random runs of events of every kind (cut at random places, with a base)
    WHEN their columns are taken out in C and in Python
    THEN every array, the kind bounds, the annotations and the kept reads are equal."""
    events = _mixed(seed)
    rng = random.Random(seed)
    at = 0
    while at < len(events):
        run = events[at:at + rng.randint(1, 400)]
        base, keep = rng.randrange(0, 5000), rng.random() < 0.5
        got = columns.extract(run, list(map(type, run)), keep, base)
        want = columns.extract_py(run, list(map(type, run)), keep, base)
        _same(got, want)
        at += len(run)
    assert any(isinstance(e, ev.Fits) for e in events)


@needs_c
@pytest.mark.parametrize("seed", range(4))
def test_c_columns_of_fits_and_outputs_equal_the_python_ones(seed: int) -> None:
    """GIVEN runs of events with fits decisions of every route and result and outputs with
    and without a reference, diverged or not
    WHEN their columns are taken out in C and in Python
    THEN the fits (seq, route, result) and output (seq, stream, diverged) columns are equal."""
    from tests.test_compiled_judgement import _eventful

    events = _eventful(seed)
    rng = random.Random(seed)
    at = 0
    while at < len(events):
        run = events[at:at + rng.randint(1, 400)]
        base = rng.randrange(0, 5000)
        _same(columns.extract(run, list(map(type, run)), False, base),
              columns.extract_py(run, list(map(type, run)), False, base))
        at += len(run)
    whole = columns.extract_py(events, list(map(type, events)), False)
    assert set(whole.f_route.tolist()) == {0, 1, 2, 3}
    assert set(whole.o_div.tolist()) == {-1, 0, 1}


@needs_c
def test_c_pass_declines_integers_beyond_the_bound() -> None:
    """GIVEN a hostile write whose cells are beyond ±2^62 (and one beyond 64 bits)
    WHEN its columns are taken out
    THEN the C pass declines and the Python reference clips them, as before."""
    huge = [ev.Write(1, 0, 0, layer=0, stream=0, cells=(2**70, 2**70 + 1), rows=(0, 1)),
            ev.Write(2, 0, 0, layer=0, stream=0, cells=(0, 2**62 + 5), rows=(0, 1))]
    with pytest.raises(OverflowError):
        C.extract(huge, columns._C_TYPES, 0, False)
    got = columns.extract(huge, list(map(type, huge)), False)
    assert got.w_cells.tolist() == [[columns.BOUND, columns.BOUND], [0, columns.BOUND]]


def test_without_compiler_the_python_path_is_taken(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """GIVEN no working C compiler (and, separately, KVDIAG_COMPILED=0)
    WHEN a helper is loaded
    THEN load gives None, status says why in one line, and extract still gives the columns."""
    monkeypatch.setenv("KVDIAG_COMPILED_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_loaded", {})
    monkeypatch.setattr(compiled, "_compiler", lambda: ["false"])
    assert compiled.load(columns._C_SOURCE, "kvdiag.test_only._columns") is None
    why = compiled.status()["kvdiag.test_only._columns"]
    assert why.startswith("not compiled (false failed") and "\n" not in why
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    monkeypatch.setattr(compiled, "_loaded", {})
    assert compiled.load(columns._C_SOURCE, columns._C_MODULE) is None
    assert compiled.status()[columns._C_MODULE].startswith("KVDIAG_COMPILED=0")
    events = _mixed(3)[:200]
    got = columns.extract(events, list(map(type, events)), False)
    assert got.w.shape[0] == sum(isinstance(e, ev.Write) for e in events)


@needs_c
def test_a_planted_library_is_rebuilt_not_loaded(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """GIVEN a file at the cache's path of the helper that others may write (a plant)
    WHEN the helper is loaded
    THEN it is compiled over, and the module loaded is the real one."""
    monkeypatch.delenv("KVDIAG_COMPILED_DIR", raising=False)
    monkeypatch.setenv("KVDIAG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_loaded", {})
    name = "kvdiag.test_plant._columns"
    key = compiled._key(columns._C_SOURCE, ("-O2",), True)
    folder = tmp_path / "compiled" / f"{name}-{key}"
    folder.mkdir(parents=True)
    plant = folder / f"{name}{compiled._suffix()}"
    plant.write_bytes(b"not a library")
    os.chmod(plant, 0o666)
    module = compiled.load(columns._C_SOURCE, name)
    assert module is not None and hasattr(module, "extract")
    assert plant.read_bytes()[:4] == b"\x7fELF"
    assert not plant.stat().st_mode & 0o022


@pytest.mark.parametrize("where", ["beside", "shared"])
def test_a_changed_header_is_a_new_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         where: str) -> None:
    """GIVEN a helper whose source includes a header beside it, or one of the headers every
    helper may include (kvdiag/compiled/vec.h)
    WHEN only the header changes
    THEN the build's name changes (a cached library built from the old header is not used),
    and the build finds the header on its include path."""
    assert (compiled.SHARED / "vec.h").is_file()
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(compiled, "SHARED", shared)
    source = tmp_path / "x.c"
    source.write_text('#include "x.h"\nint f(void) { return A; }\n')
    header = (tmp_path if where == "beside" else shared) / "x.h"
    header.write_text("#define A 1\n")
    before = compiled._key(source, ("-O2",), False)
    header.write_text("#define A 2\n")
    assert compiled._key(source, ("-O2",), False) != before
    monkeypatch.setenv("KVDIAG_COMPILED_DIR", str(tmp_path / "out"))
    try:
        built = compiled.build(source, "x")
    except OSError as exc:  # no compiler here: the key is what this machine can check
        pytest.skip(f"no C compiler: {exc}")
    assert built.is_file() and built.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize(("platform_name", "extra"), [
    ("linux", []), ("darwin", ["-undefined", "dynamic_lookup"])])
def test_an_extension_links_as_the_platform_needs(platform_name: str, extra: list[str],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the platform (Linux; macOS, where an extension's Python symbols are resolved when
    the interpreter loads it) WHEN a helper is built as a Python extension THEN the compiler
    is asked for what that platform links with, and for no more."""
    import subprocess

    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"\x7fELF")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(compiled.sys, "platform", platform_name)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("KVDIAG_COMPILED_DIR", str(tmp_path))
    compiled.build(columns._C_SOURCE, "kvdiag.test_link._columns", python=True)
    cmd = seen[0]
    assert "-shared" in cmd and "-fPIC" in cmd
    got = [a for a in cmd if a in ("-undefined", "dynamic_lookup")]
    assert got == extra
