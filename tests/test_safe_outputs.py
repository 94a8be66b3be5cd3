"""Where output may go (issue 16 item 1): every output flag of every command writes a regular
file through a temporary file and a rename, or standard output, or streams into the null
device; a directory, FIFO, socket or other device is refused with exit 2 and left untouched
(as root and with --force too); an existing file is replaced only with --force; a write that
fails leaves no temporary file and the old file as it was."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.files.outputs import OutputError, open_output, plan_output
from kvdiag.trace.reader import TraceReader

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "slot1-first-shared.kvtrace"
LOG = ROOT / "tests" / "fixtures" / "logs" / "kvstream_np2_gdb.log"
KVDIAG = [sys.executable, "-m", "kvdiag"]

# every command that writes a file, with OUT where the path goes (quick settings)
WRITERS: dict[str, list[str]] = {
    "capture": ["capture", "--scenario", "single-slot", "--steps", "2", "--prompt-tokens", "8",
                "--executor", "numpy", "-q", "-o", "OUT"],
    "import": ["import", str(LOG), "-o", "OUT"],
    "export": ["trace", "export", str(TRACE), "-o", "OUT"],
    "export-log": ["trace", "export", str(TRACE), "--format", "llama-log", "-o", "OUT"],
    "tui-svg": ["tui", str(TRACE), "--export-svg", "OUT", "--size", "80x24"],
    "sweep-plot": ["sweep", "--stage-mib", "4", "--steps", "2", "--prompt-tokens", "8", "-q",
                   "-j", "1", "--plot", "OUT"],
    "devices-save": ["devices", "--profile", "--save", "OUT"],
    "perf-plot": ["perf", str(LOG), "--plot", "OUT"],
}


def argv(name: str, out: str | Path, *extra: str) -> list[str]:
    return [str(out) if a == "OUT" else a for a in WRITERS[name]] + list(extra)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvdiag: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return err


def snapshot(path: Path) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_ino, st.st_rdev, st.st_size


@pytest.fixture
def device_node(tmp_path: Path) -> Iterator[Path]:
    """A character device to aim outputs at: as root, a node of our own with /dev/full's
    device number (so that a bug replaces our node, never the system's); else /dev/full
    itself, which a non-root process cannot replace."""
    real = Path("/dev/full")
    if not real.exists():
        pytest.skip("no /dev/full here")
    if os.geteuid() == 0:
        node = tmp_path / "full-node"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.stat(real).st_rdev)
        yield node
    else:
        yield real


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("kind", ["directory", "fifo", "socket", "device"])
def test_special_paths_are_refused_and_left_untouched(
        name: str, kind: str, tmp_path: Path, device_node: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / f"special-{kind}"
    held = None
    if kind == "directory":
        target.mkdir()
        (target / "inside").write_text("keep")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(str(target))
    else:
        target = device_node
    before = snapshot(target)
    try:
        for force in ([], ["--force"]):
            assert main(argv(name, target, *force)) == 2
            err = one_line(capsys)
            assert str(target) in err and "left untouched" in err
            assert snapshot(target) == before
    finally:
        if held is not None:
            held.close()
    if kind == "directory":
        assert (target / "inside").read_text() == "keep"
    # nothing was left beside it either
    assert sorted(p.name for p in tmp_path.glob("*.part")) == []


@pytest.mark.parametrize("name", ["capture", "import", "export", "export-log", "tui-svg"])
def test_the_null_device_is_written_through_as_a_stream(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    null = Path(os.devnull)
    before = snapshot(null)
    assert main(argv(name, null)) in (0, 3)  # capture of single-slot: 0
    assert snapshot(null)[:3] == before[:3]
    assert stat.S_ISCHR(os.stat(null).st_mode)
    capsys.readouterr()


@pytest.mark.parametrize("name", ["capture", "import", "export", "tui-svg"])
def test_an_existing_file_is_replaced_only_with_force(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "old.out"
    out.write_bytes(b"previous contents\n")
    out.chmod(0o640)
    assert main(argv(name, out)) == 2
    assert f"{out} exists (use --force to replace it)" in one_line(capsys)
    assert out.read_bytes() == b"previous contents\n"
    assert main(argv(name, out, "--force")) == 0
    capsys.readouterr()
    assert out.read_bytes() != b"previous contents\n" and out.stat().st_size > 100
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # the replaced file's mode is kept
    assert list(tmp_path.glob("*.part")) == []


def test_a_link_to_a_file_is_followed_and_kept(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real.json"
    real.write_text("[]")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert main(argv("export", link, "--force")) == 0
    capsys.readouterr()
    assert link.is_symlink() and real.read_bytes().startswith(b"[")
    assert real.stat().st_size > 1000


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_missing_folder_is_refused_before_any_work(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kvdiag.runs.capture
    import kvdiag.runs.sweep
    import kvdiag.tui.export

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("the work started before the output was checked")

    monkeypatch.setattr(kvdiag.runs.sweep, "run_sweep", never)
    monkeypatch.setattr(kvdiag.runs.capture, "make_executor", never)
    monkeypatch.setattr(kvdiag.tui.export, "KvdiagApp", never)
    out = tmp_path / "no" / "such" / "folder" / "out.bin"
    assert main(argv(name, out)) == 2
    assert f"directory {out.parent} does not exist" in one_line(capsys)
    assert not (tmp_path / "no").exists()


def test_dash_is_standard_output_for_capture_import_and_export(tmp_path: Path) -> None:
    for name in ("capture", "import", "export"):
        proc = subprocess.run([*KVDIAG, *argv(name, "-")], capture_output=True, timeout=300,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert not (tmp_path / "-").exists()
        assert b"<stdout>" in proc.stderr  # the summary goes to stderr
        if name == "export":
            assert proc.stdout.startswith(b"[")
            continue
        trace = tmp_path / f"{name}.kvtrace"
        trace.write_bytes(proc.stdout)
        with TraceReader.open(trace) as reader:
            events = list(reader)
        assert reader.complete and not reader.problems and len(events) > 3


def test_perf_plot_replaces_only_with_force_and_never_through_a_fifo(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """perf --plot wrote with matplotlib's own savefig: over an existing file without
    --force, through a link, and into a FIFO (where it blocked for a reader)."""
    pytest.importorskip("matplotlib")
    from tests.seed_arm117 import seed_logs

    stream = tmp_path / "stream.log"
    stream.write_text(seed_logs()[0])
    old = tmp_path / "old.svg"
    old.write_text("previous\n")
    link = tmp_path / "link.svg"
    link.symlink_to(old)
    fifo = tmp_path / "pipe.svg"
    os.mkfifo(fifo)
    for path in (old, link):
        assert main(["perf", str(stream), "--plot", str(path)]) == 2
        assert f"{path} exists (use --force to replace it)" in one_line(capsys)
        assert old.read_text() == "previous\n"
    assert main(["perf", str(stream), "--plot", str(fifo), "--force"]) == 2
    assert "a FIFO" in one_line(capsys) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert main(["perf", str(stream), "--plot", str(link), "--force"]) == 0
    assert f"plot saved to {link}" in capsys.readouterr().out
    assert link.is_symlink() and old.read_text().startswith("<?xml")
    assert list(tmp_path.glob("*.part")) == []


def test_sweep_plot_refuses_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv("sweep-plot", "-")) == 2
    assert "--plot -: standard output already carries" in one_line(capsys)


# -- writes that fail ----------------------------------------------------------------------


def fail_writes(monkeypatch: pytest.MonkeyPatch, after: int,
                error: Callable[[], OSError] = lambda: OSError(
                    errno.ENOSPC, os.strerror(errno.ENOSPC))) -> list[int]:
    """``os.write`` (the trace writer's) raises ``error()`` once more than ``after`` bytes
    went to files; returns the running count of bytes asked for."""
    real = os.write
    written = [0]

    def write(fd: int, data: bytes | memoryview) -> int:
        if fd > 2:
            written[0] += len(data)
            if written[0] > after:
                del data  # as the C function, keep no view of the caller's buffer
                raise error()
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return written


@pytest.mark.parametrize(("name", "after"), [("capture", 0), ("capture", 8000), ("import", 0),
                                             ("import", 1500)])
def test_a_full_disk_leaves_no_temporary_file_and_the_old_file_whole(
        name: str, after: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills at the header (0) or after some steps: the trace writer's os.write
    fails with ENOSPC (a capture writes about 19 KB here, an import 2.9 KB)."""
    out = tmp_path / "run.kvtrace"
    out.write_bytes(b"the last good trace\n")
    fail_writes(monkeypatch, after)
    assert main(argv(name, out, "--force")) == 2
    assert one_line(capsys) == f"kvdiag: error: cannot write {out}: No space left on device\n"
    assert out.read_bytes() == b"the last good trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.kvtrace"]


def _small_filesystem(where: Path) -> Path | None:
    """A 64 KiB tmpfs mounted at ``where`` when this process may mount one (root in a
    container, usually), else None."""
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                          capture_output=True, check=False)
    return where if proc.returncode == 0 else None


def _limit_file_size() -> None:  # runs in the child before exec
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (48 << 10, 48 << 10))


@pytest.mark.parametrize("name", ["capture", "import", "export"])
def test_a_real_failing_write_is_one_line_and_leaves_nothing(name: str, tmp_path: Path) -> None:
    """The kernel refuses the write: a full 64 KiB tmpfs (ENOSPC) where one can be mounted,
    else a 48 KiB file-size limit (EFBIG)."""
    small = _small_filesystem(tmp_path / "small")
    args = dict(capture_output=True, text=True, timeout=300, check=False)
    try:
        folder = small if small is not None else tmp_path / "small"
        out = folder / "out.bin"
        cmd = [*KVDIAG, *argv(name, out)]
        if name == "capture":  # enough steps to outgrow 64 KiB (200 steps: 1.2 MB)
            cmd[cmd.index("--steps") + 1] = "200"
        if name == "import":  # a log with enough to import: a modelled run's own, 6 times
            log = tmp_path / "modelled.log"
            assert main(["trace", "export", str(TRACE.with_name("two-slot-fits-dispatch.kvtrace")),
                         "--format", "llama-log", "-o", str(log)]) == 0
            log.write_bytes(log.read_bytes() * 6)  # its trace: about 130 KB
            cmd[cmd.index(str(LOG))] = str(log)
        proc = (subprocess.run(cmd, **args) if small is not None else  # type: ignore[call-overload]
                subprocess.run(cmd, preexec_fn=_limit_file_size, **args))
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr.splitlines()
        assert err[-1] in (f"kvdiag: error: cannot write {out}: No space left on device",
                           f"kvdiag: error: cannot write {out}: File too large"), proc.stderr
        assert "Traceback" not in proc.stderr
        assert list(folder.iterdir()) == []
    finally:
        if small is not None:
            subprocess.run(["umount", str(small)], check=False)


def test_plan_output_refuses_what_is_not_a_file_whatever_force_says(tmp_path: Path,
                                                                   device_node: Path) -> None:
    for force in (False, True):
        with pytest.raises(OutputError, match="a character device; output goes only to a "
                                              "regular file or to standard output"):
            plan_output(device_node, force=force)
    folder = tmp_path / "outputs"
    folder.mkdir()
    out = plan_output(folder / "new.txt")
    with pytest.raises(KeyError), open_output(out) as sink:
        sink.file.write(b"half")
        raise KeyError("the command failed")
    assert list(folder.iterdir()) == []


def test_perf_plot_of_a_log_without_requests_is_drawn_without_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crash log with no print_timing block: the plot is still written (empty axes), and
    matplotlib is never asked for a legend of nothing — its UserWarning reached the user's
    stderr (and, warnings being errors under the tests, read as an internal error)."""
    pytest.importorskip("matplotlib")
    log = tmp_path / "crash.log"
    log.write_text("llama_server: loading model\n"
                   "/s/ggml/src/ggml-cuda/ggml-cuda.cu:1898: "
                   "GGML_ASSERT(ggml_cuda_kv_stream_fattn_fits(dst)) failed\n")
    out = tmp_path / "empty.svg"
    assert main(["perf", str(log), "--plot", str(out)]) == 1
    said = capsys.readouterr()
    assert "no completed request" in said.out + said.err
    assert out.read_text().startswith("<?xml")
