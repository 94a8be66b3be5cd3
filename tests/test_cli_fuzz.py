"""A seeded mutator over real and hand-made traces, through every command that reads one
(with issue 16's classes: unknown keys that are not UTF-8, in newer minor versions too, and
stray NULs and invalid bytes inside lines).

Each mutant must end with exit 0, 1 or 2 and at most a one-line error: never an internal
error (exit 70) or a traceback, and the JSON outputs must parse. Bounded: a fixed number of
mutants from fixed seeds, run in-process.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_chrome_export import check_trace_events, every_kind_trace

from kvdiag import cli

TRACES = Path(__file__).resolve().parent.parent / "traces"
MUTANTS_PER_SEED = 12
SEEDS = range(8)

_VALUES: list[bytes] = [
    b"1" + b"0" * 40, b"-" + b"9" * 25, b"1e308", b"-1", b"null", b"true", b'"x"', b"[]",
    b"{}", b"[[0,1,\"pool\",-7]]", b'"' + b"A" * 200_000 + b'"', b"0.5", b"18446744073709551615",
]


#: keys no Struct declares, some of them not UTF-8 (issue 16: one crashed every reader)
_KEYS: list[bytes] = [b"gpu_uuid", b"k\xff\xfe", b"\xc3(", b"tail\xed\xa0\x80", b"\x80"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    if rng.random() < 0.5:  # a newer minor version: unknown keys are then kept, and decoded
        lines[0] = lines[0].replace(b'"version":"1.0"', b'"version":"1.9"', 1).replace(
            b'"version":"1.1"', b'"version":"1.9"', 1)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        op = rng.randrange(10)
        line = lines[i]
        if op == 0 and line:  # flip a byte
            j = rng.randrange(len(line))
            lines[i] = line[:j] + bytes([rng.randrange(256)]) + line[j + 1:]
        elif op == 1:  # replace a number with an odd value
            digits = [k for k, c in enumerate(line) if 48 <= c <= 57]
            if digits:
                j = rng.choice(digits)
                k = j
                while k < len(line) and 48 <= line[k] <= 57:
                    k += 1
                lines[i] = line[:j] + rng.choice(_VALUES) + line[k:]
        elif op == 2:  # duplicate a line
            lines.insert(i, line)
        elif op == 3:  # drop a line
            del lines[i]
        elif op == 4:  # cut the file here
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: rng.randrange(len(lines[-1]) + 1)]
        elif op == 5:  # an event of an unknown kind
            lines.insert(i, b'{"kind":"zz%d","seq":%d,"t_ns":1,"step":0,"x":%s}'
                         % (rng.randrange(9), rng.randrange(1, 99), rng.choice(_VALUES)))
        elif op == 6 and b'":"' in line:  # a string field replaced
            j = line.index(b'":"') + 2
            k = line.find(b'"', j + 1)
            if k > j:
                lines[i] = line[:j] + rng.choice(_VALUES) + line[k + 1:]
        elif op == 7:  # swap two lines
            k = rng.randrange(len(lines))
            lines[i], lines[k] = lines[k], lines[i]
        elif op == 8 and line.endswith(b"}"):  # an unknown key, maybe not UTF-8
            lines[i] = line[:-1] + b',"' + rng.choice(_KEYS) + b'":' + rng.choice(_VALUES) + b"}"
        elif op == 9 and line:  # a stray NUL or invalid UTF-8 byte inside a line
            j = rng.randrange(len(line))
            lines[i] = line[:j] + rng.choice((b"\0", b"\xff", b"\xc3")) + line[j:]
    return b"\n".join(lines)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    made = every_kind_trace(tmp_path_factory.mktemp("fuzz") / "all.kvtrace")
    return [made.read_bytes(), (TRACES / "slot1-first-shared.kvtrace").read_bytes(),
            (TRACES / "two-slot-upstream.kvtrace").read_bytes()]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_traces_never_crash_a_command(seed: int, sources: list[bytes], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    rng = random.Random(seed)
    for n in range(MUTANTS_PER_SEED):
        path = tmp_path / f"m{n}.kvtrace"
        path.write_bytes(mutate(rng.choice(sources), rng))
        out = tmp_path / "out.json"
        for argv in (["trace", "info", str(path)], ["trace", "info", "--json", str(path)],
                     ["trace", "validate", str(path)], ["check", "--json", str(path)],
                     ["check", str(path)], ["check", "--format", "sarif", str(path)],
                     ["trace", "export", str(path), "-o", str(out), "--force"],
                     ["trace", "export", str(path), "--format", "llama-log", "-o",
                      str(tmp_path / "out.log"), "--force"]):
            code = cli.main(argv)
            stdout, stderr = capsys.readouterr()
            where = f"seed {seed} mutant {n}: {' '.join(argv)}: {stderr}"
            assert code in (0, 1, 2), where
            assert "internal error" not in stderr and "Traceback" not in stderr, where
            if code == 2:
                assert stderr.count("\n") == 1, where
                continue
            if "--json" in argv or "sarif" in argv:
                json.loads(stdout)
            if argv[1] == "export" and "llama-log" not in argv:
                check_trace_events(json.loads(out.read_text()))
