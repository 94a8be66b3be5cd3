"""Real logs with stray bytes are read (issue 16 item 2): NULs and bytes that are not UTF-8 are
replaced, a NUL-filled start (logrotate copytruncate) is skipped, every report says how many
bytes in how many lines; only files that are mostly not text are refused, and every reader
(postmortem, import, tui) applies the same rule — gzip by content included."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.log_index import line_offsets
from kvdiag.cli import main
from kvdiag.errors import InputError
from kvdiag.files.logs import open_log
from kvdiag.files.text import MAX_NOT_TEXT_SHARE, Damage, check_text, not_text_bytes
from kvdiag.postmortem.parse import LogParser
from kvdiag.tui.document import detect_kind

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "logs" / "kvstream_np2_gdb.log"
KVDIAG = [sys.executable, "-m", "kvdiag"]


def damaged(text: bytes, rng: random.Random, n: int) -> tuple[bytes, int, int, set[int]]:
    """``text`` with ``n`` NULs and ``n`` invalid bytes put into random lines; returns the
    bytes, the NUL and invalid counts and the 1-based lines that got either."""
    lines = text.split(b"\n")
    hit: set[int] = set()
    nul = bad = 0
    for _ in range(n):
        i = rng.randrange(len(lines) - 1)
        j = rng.randrange(len(lines[i]) + 1)
        if rng.random() < 0.5:
            lines[i] = lines[i][:j] + b"\0" + lines[i][j:]
            nul += 1
        else:
            # 0xff and 0xfe never occur in UTF-8: one invalid byte each, whatever is next to it
            lines[i] = lines[i][:j] + rng.choice((b"\xff", b"\xfe")) + lines[i][j:]
            bad += 1
        hit.add(i + 1)
    return b"\n".join(lines), nul, bad, hit


def scan(path: Path) -> LogParser:
    parser = LogParser()
    with open_log(str(path)) as log:
        parser.feed(log.name, log.stream, leading_nuls=log.leading_nuls)
    return parser


@pytest.mark.parametrize("seed", range(4))
def test_stray_bytes_are_counted_exactly_and_the_crash_still_found(seed: int,
                                                                   tmp_path: Path) -> None:
    rng = random.Random(seed)
    clean = FIXTURE.read_bytes()
    assert clean.isascii() and b"\0" not in clean
    data, nul, bad, hit = damaged(clean, rng, 12)
    path = tmp_path / "server.log"
    path.write_bytes(data)
    result = scan(path).result()
    (r,) = result.replaced
    assert (r.nul_bytes, r.invalid_bytes, r.lines, r.first_line) == (nul, bad, len(hit),
                                                                      min(hit))
    assert result.lines == clean.count(b"\n")
    plain = scan(_write(tmp_path / "clean.log", clean)).result()
    assert len(result.crashes) == len(plain.crashes) >= 1
    assert result.replaced and not plain.replaced


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_nul_filled_start_is_skipped_in_every_reader(tmp_path: Path) -> None:
    """copytruncate: the writer's next lines land past a hole as long as the old file; the
    file here is sparse (SEEK_DATA skips it) and a copy of it dense."""
    text = FIXTURE.read_bytes()
    sparse = tmp_path / "rotated.log"
    with open(sparse, "wb") as fh:
        fh.seek(3 << 20)
        fh.write(text)
    dense = _write(tmp_path / "dense.log", sparse.read_bytes())
    for path in (sparse, dense):
        result = scan(path).result()
        (r,) = result.replaced
        assert (r.nul_bytes, r.invalid_bytes, r.lines, r.first_line) == (3 << 20, 0, 1, 1)
        assert result.lines == text.count(b"\n") and result.crashes
        assert result.boots and result.boots[0].evidence[0].line >= 1
        # the viewer's line 1 starts at the text, as the scanner's does
        source = LineSource.open(path)
        offsets = line_offsets(source)
        assert int(offsets[0]) == 3 << 20 and len(offsets) == text.count(b"\n")
        assert source.line(int(offsets[0])) == text.split(b"\n", 1)[0]
        source.close()
        assert detect_kind(path) == "log"
    # standard input cannot seek: the NULs are dropped while probing, and still counted
    proc = subprocess.run([*KVDIAG, "postmortem", "-", "--json"], input=dense.read_bytes(),
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [p["message"] for p in doc["problems"] if p.get("code") == "bytes-replaced"] == [
        f"{3 << 20:,} bytes replaced in 1 line ({3 << 20:,} NUL dropped); first at line 1"]


def test_every_report_says_how_many_bytes_were_replaced(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data, nul, bad, hit = damaged(FIXTURE.read_bytes(), random.Random(7), 6)
    log = _write(tmp_path / "server.log", data)
    title = (f"{nul + bad:,} stray bytes replaced in {len(hit)} line(s) of {log}: {nul:,} NUL "
             f"dropped, {bad:,} not UTF-8 replaced by U+FFFD")
    problem = (f"{Damage(nul_bytes=nul, invalid_bytes=bad, lines=len(hit)).summary()}; first "
               f"at line {min(hit)}")
    assert problem.startswith(f"{nul + bad} bytes replaced in {len(hit)} lines ({nul} NUL")
    for fmt in ("text", "json", "markdown", "sarif", "junit"):
        assert main(["postmortem", str(log), "--format", fmt, "--no-auto-binaries"]) == 1
        out = capsys.readouterr().out
        if fmt == "text":  # a table at 120 columns wraps the title: the problem line is whole
            assert "log-bytes-replaced" in out and problem in " ".join(out.split()), out
        else:
            assert title in out, (fmt, out[-2000:])
    doc = json.loads(_run_json(capsys, ["postmortem", str(log), "--json"]))
    assert doc["replaced"] == [{"source": str(log), "nul_bytes": nul, "invalid_bytes": bad,
                                "lines": len(hit), "first_line": min(hit)}]
    (finding,) = [f for f in doc["findings"] if f["rule"] == "log-bytes-replaced"]
    assert finding["severity"] == "info" and finding["details"] == {
        "nul_bytes": nul, "invalid_bytes": bad, "lines": len(hit), "first_line": min(hit)}
    # kvdiag import says it in its summary
    assert main(["import", str(log), "-o", str(tmp_path / "t.kvtrace")]) == 0
    out = capsys.readouterr().out
    assert (f"{log}: {nul + bad:,} bytes replaced in {len(hit)} line(s) ({nul} NUL dropped, "
            f"{bad} not UTF-8 replaced by U+FFFD; first at line {min(hit)})") in out
    # the viewer shows the same finding
    from kvdiag.tui.document import LogDoc
    from kvdiag.tui.loading import load_log

    docs: list[object] = []
    load_log(str(log), docs.append)
    final = docs[-1]
    assert isinstance(final, LogDoc)
    assert [f.title for f in final.findings if f.rule == "log-bytes-replaced"] == [title]


def _run_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    main(args)
    return capsys.readouterr().out


def test_the_threshold_between_a_damaged_log_and_binary_data() -> None:
    """Below MAX_NOT_TEXT_SHARE of the bytes that are not NUL a start is text, above it
    binary; NUL bytes themselves do not count (they are dropped, as a hole's are)."""
    line = b"srv  update_slots: all slots are idle\n"
    base = line * 100
    n = len(base)
    below = int(n * MAX_NOT_TEXT_SHARE / (1 - MAX_NOT_TEXT_SHARE)) - 2
    check_text("ok", base + b"\xff" * below)
    with pytest.raises(InputError, match="not a text log"):
        check_text("binary", base + b"\xff" * (below + 8))
    # NULs, however many, are not counted against the text
    check_text("holes", base + b"\0" * (10 * n))
    assert not_text_bytes(b"\x1b[31mred\x1b[0m\ttab\r\n") == 0
    assert not_text_bytes(b"\x01\x02\x7f") == 3
    assert not_text_bytes("é".encode("latin-1") + "é".encode()) == 1


@pytest.mark.parametrize(("data", "message"), [
    (b"", "empty file"),
    (b"\0" * 5000, "no text: all 5,000 bytes are NUL"),
    ("slot x\r\nsrv ready\r\n".encode("utf-16-le") * 50, "every other byte is NUL"),
    (random.Random(3).randbytes(4000), "not a text log"),
    (gzip.compress(b""), "empty file"),
    (b"\x1f\x8b\x08\x00" + b"\xee" * 40, "gzip data that does not decompress"),
    (b"\x1f\x8b", "gzip data that does not decompress"),
])
def test_every_reader_refuses_the_same_files_with_the_same_words(
        data: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "server.log.gz", data)
    for argv in (["postmortem", str(path)], ["import", str(path), "-o", str(tmp_path / "t")],
                 ["tui", str(path), "--export-svg", str(tmp_path / "s.svg")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
    assert list(tmp_path.iterdir()) == [path]


def test_a_gz_name_does_not_make_gzip_and_a_cut_gzip_is_read_to_the_break(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = FIXTURE.read_bytes()
    named = _write(tmp_path / "plain.log.gz", text)  # not gzip, whatever the name says
    assert main(["postmortem", str(named), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["crashes"]) >= 1 and doc["replaced"] == []
    whole = gzip.compress(text * 50, mtime=0)
    cut = _write(tmp_path / "cut.log.gz", whole[: len(whole) // 2])
    assert main(["postmortem", str(cut)]) == 2
    assert "the .gz file is truncated" in capsys.readouterr().err
    source = LineSource.open(cut)
    assert source.broken == "the gzip data ends early (the .gz file is truncated)"
    assert 0 < source.size < len(text) * 50
    source.close()
    assert main(["import", str(cut), "-o", str(tmp_path / "cut.kvtrace")]) == 2
    assert "the .gz file is truncated" in capsys.readouterr().err
    assert (tmp_path / "cut.kvtrace").exists()  # every event before the break is kept


def test_damage_counts_a_line_once_across_blocks() -> None:
    d = Damage()
    # a NUL run that spans two blocks of one line, then a line with a NUL and invalid UTF-8
    assert d.nul_block(b"\0" * 10, 1) == b""
    assert d.nul_block(b"\0\0abc\nx\0y\xff\n", 1) == b"abc\nxy\xff\n"
    d.invalid_region(b"abc\nxy\xff\n", 0, 8, 1)
    assert (d.nul_bytes, d.invalid_bytes, d.lines, d.first_line) == (13, 1, 2, 1)
