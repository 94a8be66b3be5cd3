"""Seeded fuzzing of issue 16's classes through the whole commands, bounded and in-process:

- logs with stray NULs (NUL-filled starts included), invalid UTF-8 and gzip wrapping, read by
  postmortem, import and the viewer: the three agree on accepting or refusing (with the same
  words), and the bytes postmortem says it replaced are what an independent count finds;
- output paths that are not regular files (FIFO, directory, socket, device, the null
  device), for every output flag: refused and untouched, or streamed for the null device;
- absurd values of every numeric flag: exit 0-3, never an internal error, one line on 2;
- full disks at seeded points of a capture or an import: exit 2, one line, nothing left.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import json
import os
import random
import socket
import stat
from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.errors import InputError
from kvdiag.tui.document import LogDoc
from kvdiag.tui.loading import load_log
from tests.test_safe_outputs import WRITERS, argv, fail_writes

# seeded fuzzing, bounded, as tests/test_cli_fuzz.py (about 30 s in all on 2 busy cores)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
SEEDS = range(6)


def _mutate_log(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if op == 0:  # a stray NUL or a few
            out[at:at] = b"\0" * rng.choice((1, 1, 2, 7))
        elif op == 1:  # bytes that are not UTF-8 (0xff/0xfe never are; 0xc3 alone is not)
            out[at:at] = bytes(rng.choice((0xFF, 0xFE)) for _ in range(rng.randint(1, 3)))
        elif op == 2:  # a NUL block, as a crash mid-write leaves one
            out[at:at] = b"\0" * rng.choice((512, 4096, 70_000))
        elif op == 3:  # a NUL-filled start (copytruncate)
            out[0:0] = b"\0" * rng.choice((100, 65_536, 200_000))
        elif op == 4:  # binary garbage: enough of it makes the file not text
            out[at:at] = rng.randbytes(rng.choice((16, 4096, 80_000)))
        else:  # cut
            del out[at:]
    return bytes(out)


def _expected_damage(data: bytes) -> tuple[int, int, int]:
    """(NUL bytes, bytes that are not UTF-8, lines holding either), counted line by line
    with a codec error handler (not the reader's own surrogateescape arithmetic)."""
    bad = [0]

    def count(exc: UnicodeError) -> tuple[str, int]:
        assert isinstance(exc, UnicodeDecodeError)
        bad[0] += exc.end - exc.start
        return "", exc.end

    codecs.register_error("kvdiag-test-count", count)
    nul = invalid = lines = 0
    for line in data.split(b"\n"):
        before = bad[0]
        line.replace(b"\0", b"").decode("utf-8", "kvdiag-test-count")
        n = line.count(0)
        nul += n
        invalid += bad[0] - before
        lines += bool(n or bad[0] - before)
    return nul, invalid, lines


def _outcome(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (args, err)
    assert "internal error" not in err and "Traceback" not in err, (args, err)
    if code == 2:
        assert err.count("\n") >= 1
    return code, out, err


@pytest.mark.parametrize("seed", SEEDS)
def test_logs_with_stray_bytes_read_alike_everywhere(seed: int, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(seed)
    for n in range(8):
        data = _mutate_log(rng, rng.choice(LOGS).read_bytes())
        packed = rng.random() < 0.3
        path = tmp_path / f"m{n}.log{'.gz' if packed else ''}"
        path.write_bytes(gzip.compress(data, mtime=0) if packed else data)
        code, out, err = _outcome(["postmortem", str(path), "--json", "--no-auto-binaries"],
                                  capsys)
        refused = code == 2 and not out
        icode, _iout, ierr = _outcome(["import", str(path), "-o", str(tmp_path / "t"),
                                       "--force"], capsys)
        try:
            docs: list[object] = []
            load_log(str(path), docs.append)
            tui_error = None
        except InputError as exc:
            tui_error = str(exc)
        where = f"seed {seed} mutant {n}"
        if refused:
            # one rule: every reader refuses it, in the same words
            assert icode == 2 and tui_error is not None, where
            assert err.strip() == ierr.strip() == f"kvdiag: error: {tui_error}", where
            continue
        assert tui_error is None and isinstance(docs[-1], LogDoc), where
        assert "not a text log" not in ierr and "empty file" not in ierr, where
        doc = json.loads(out)
        nul, invalid, lines = _expected_damage(data)
        got = doc["replaced"][0] if doc["replaced"] else {}
        assert (got.get("nul_bytes", 0), got.get("invalid_bytes", 0),
                got.get("lines", 0)) == (nul, invalid, lines), where
        titles = [f.title for f in docs[-1].findings if f.rule == "log-bytes-replaced"]
        assert bool(titles) == bool(nul or invalid), where


@pytest.fixture
def device_node(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        node = tmp_path / "devnode"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.stat("/dev/full").st_rdev)
        return node
    return Path("/dev/full")  # not replaceable without root


@pytest.mark.parametrize("seed", SEEDS)
def test_special_output_paths(seed: int, tmp_path: Path, device_node: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(100 + seed)
    names = sorted(WRITERS)
    for n in range(4):
        name = rng.choice(names)
        kind = rng.choice(["fifo", "directory", "socket", "device", "null", "dir-link"])
        target = tmp_path / f"t{n}"
        held = None
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "directory":
            target.mkdir()
        elif kind == "dir-link":
            (tmp_path / f"d{n}").mkdir()
            target.symlink_to(tmp_path / f"d{n}")
        elif kind == "socket":
            held = socket.socket(socket.AF_UNIX)
            held.bind(str(target))
        elif kind == "device":
            target = device_node
        else:
            target = Path(os.devnull)
        before = os.stat(target)
        extra = ["--force"] if rng.random() < 0.5 else []
        try:
            code, _out, err = _outcome(argv(name, target, *extra), capsys)
        finally:
            if held is not None:
                held.close()
        after = os.stat(target)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode, before.st_ino, before.st_rdev), (seed, name, kind)
        if kind == "null":  # streamed into; devices --profile then finds no GPU here (1)
            assert code in (0, 1), (seed, name, err)
        else:
            assert code == 2 and "left untouched" in err, (seed, name, kind, err)
    assert list(tmp_path.glob("**/*.part")) == []


NUMBERS = ["0", "-1", "1", "2147483647", "2147483648", "4294967296", "9223372036854775808",
           "18446744073709551616", "-99999999999999999999", "99999999999999999999"]
NUMERIC = {
    "plan": ["--layers", "--streamed-layers", "--ctx", "--np", "--head-dim", "--n-head",
             "--n-head-kv", "--stage-mib", "--ubatch", "--ring-slots"],
    "capture": ["--steps", "--prompt-tokens", "--seed", "--telemetry-ms", "--ctx", "--np",
                "--ubatch", "--stage-mib", "--ring-slots", "--layers", "--head-dim"],
    "sweep": ["--steps", "--prompt-tokens", "--jobs", "--ctx", "--ubatch", "--layers"],
    "tui": ["--step"],
    "devices": ["--device"],
}
BASE = {
    "plan": ["plan", "--json"],
    "capture": ["capture", "--scenario", "single-slot", "--steps", "2", "--prompt-tokens",
                "8", "--executor", "numpy", "-q", "--force", "-o", "OUT"],
    "sweep": ["sweep", "--stage-mib", "4", "--steps", "2", "--prompt-tokens", "8", "-q",
              "--json"],
    "tui": ["tui", str(ROOT / "traces" / "single-slot.kvtrace"), "--export-svg", "OUT",
            "--force", "--screen", "pages", "--size", "80x24"],
    "devices": ["devices", "--profile"],
}


@pytest.mark.parametrize("seed", SEEDS)
def test_absurd_numbers_on_every_numeric_flag(seed: int, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(200 + seed)
    for command, flags in NUMERIC.items():
        for flag in rng.sample(flags, min(3, len(flags))):
            value = rng.choice(NUMBERS)
            args = [str(tmp_path / "out") if a == "OUT" else a for a in BASE[command]]
            if flag in args:  # the flag under test replaces the quick setting
                i = args.index(flag)
                del args[i:i + 2]
            code = main([*args, flag, value])
            err = capsys.readouterr().err
            where = f"seed {seed}: {command} {flag} {value}: {err}"
            assert code in (0, 1, 2, 3), where
            assert "internal error" not in err and "Traceback" not in err, where
            if code == 2:
                errors = [x for x in err.splitlines() if x.startswith("kvdiag: error:")]
                assert len(errors) == 1, where


@pytest.mark.parametrize("seed", SEEDS)
def test_full_disks_at_seeded_points(seed: int, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(300 + seed)
    name = rng.choice(["capture", "import"])
    after = rng.randrange(0, 20_000 if name == "capture" else 3000)
    code = rng.choice((errno.ENOSPC, errno.EDQUOT, errno.EIO))
    written = fail_writes(monkeypatch, after, lambda: OSError(code, "refused"))
    out = tmp_path / "t.kvtrace"
    exit_code = main(argv(name, out))
    err = capsys.readouterr().err
    where = f"seed {seed}: {name} fails after {after} bytes: {err}"
    if written[0] <= after:  # the whole output fitted
        assert exit_code == 0 and out.exists(), where
        return
    assert exit_code == 2 and err == f"kvdiag: error: cannot write {out}: refused\n", where
    assert list(tmp_path.iterdir()) == [], where
