"""kvdiag sql: the command, its tables and their shape, Parquet round trips, errors."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from kvdiag.cli import main
from kvdiag.sql.schema import EVENT_TABLES, RENAMES, TABLES, event_tables

LOG = Path(__file__).parent / "fixtures" / "logs" / "kvstream_np2_gdb.log"


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sql") / "two.kvtrace"
    assert main(["capture", "--scenario", "two-slot-concurrent", "-q", "--executor", "numpy",
                 "-o", str(out)]) == 3
    return out


def sql_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["sql", "--format", "json", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_every_event_kind_has_a_table_and_no_field_name_clashes() -> None:
    from typing import get_args

    from kvdiag.model import events as ev

    kinds = {c.__struct_config__.tag for c in get_args(ev.AnyEvent)}
    assert {t.name for t in EVENT_TABLES} == {f"events_{k}" for k in kinds} | {"events_other"}
    event_tables()  # raises when two kinds give one field name two types outside RENAMES
    cols = {t.name: dict(t.columns) for t in TABLES}
    assert cols["events_abort"]["abort_file"] == "VARCHAR"
    assert cols["events_repartition"]["resident_change"] == "BIGINT[]"
    assert cols["events_adapt"]["resident"] == "BIGINT"
    assert all(t.columns[0] == ("file", "VARCHAR") for t in TABLES)
    assert set(RENAMES.values()).isdisjoint({"file", "seq", "kind"})


def test_events_keep_every_field_and_the_view_joins_the_kinds(
        two: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = sql_json(capsys, "SELECT kind, seq, layer, route, abort_file, condition, q "
                            "FROM events ORDER BY seq", str(two))
    kinds = [r["kind"] for r in rows]
    assert kinds == ["warn", "step", "mark", "write", "write", "fits", "abort", "end"]
    fits = next(r for r in rows if r["kind"] == "fits")
    assert fits["route"] == "abort" and json.loads(fits["q"])["ne"][3] == 2
    abort = next(r for r in rows if r["kind"] == "abort")
    assert abort["abort_file"].endswith("ggml-cuda.cu")
    assert abort["condition"] == "ggml_cuda_kv_stream_fattn_fits(dst)"
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))


def test_several_inputs_and_a_parquet_folder_give_the_same_rows(
        two: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = ("SELECT file, rule, severity, first_step, count FROM findings "
         "ORDER BY file, finding")
    direct = sql_json(capsys, q, str(two), str(LOG))
    assert {r["file"] for r in direct} == {str(two), str(LOG)}
    assert main(["sql", "--parquet", str(tmp_path / "p"), str(two), str(LOG)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert sql_json(capsys, q, str(tmp_path / "p")) == direct
    # a folder and a trace together: the rows of both
    both = sql_json(capsys, "SELECT count(*) AS n FROM files", str(tmp_path / "p"), str(two))
    assert both == [{"n": 3}]
    # written once, replaced only with --force
    assert main(["sql", "--parquet", str(tmp_path / "p"), str(two)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["sql", "--parquet", str(tmp_path / "p"), "--force", str(two)]) == 0
    assert not list((tmp_path / "p").glob(".*tmp"))


def test_a_query_fills_only_the_tables_it_names() -> None:
    from kvdiag.sql.store import tables_named

    assert tables_named("select * from pages p join fits f using (file)") == {"pages", "fits"}
    named = tables_named("SELECT kind FROM Events")
    assert "events_read" in named and "pages" not in named
    assert tables_named("select 1 from events_upload") == {"events_upload"}


def test_a_damaged_trace_is_read_up_to_the_break_and_says_so(
        two: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.kvtrace"
    data = two.read_bytes()
    cut.write_bytes(data[: data.rfind(b'{"kind":"abort"') + 40])  # inside the abort line
    rows = sql_json(capsys, "SELECT f.status, p.kind, p.line, (SELECT count(*) FROM events) "
                            "AS events FROM files f, problems p", str(cut))
    assert {r["kind"] for r in rows} == {"truncated", "incomplete"}
    assert rows[0]["status"] == "incomplete" and rows[0]["events"] == 6


def test_errors_are_one_line(two: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["sql", "SELECT nope FROM pages", str(two)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvdiag: error: sql: Binder Error") and "\n" not in err
    assert main(["sql", "SELECT 1"]) == 2
    assert "at least one input" in capsys.readouterr().err
    assert main(["sql", "SELECT 1", str(tmp_path)]) == 2
    assert "without kvdiag sql tables" in capsys.readouterr().err
    assert main(["sql", "SELECT 1", str(tmp_path / "missing.kvtrace")]) == 2
    capsys.readouterr()
    real = builtins.__import__

    def no_duckdb(name: str, *a: Any, **k: Any) -> Any:
        if name == "duckdb":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_duckdb)
    assert main(["sql", "SELECT 1", str(two)]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvdiag: error: kvdiag sql needs DuckDB, an optional extra: pip install 'kvdiag[sql]'")


def test_text_and_csv_output(two: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind"
    assert main(["sql", "--format", "csv", q, str(two)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "kind,n" and "abort,1" in lines and "fits,1" in lines
    assert main(["sql", q, str(two)]) == 0
    out = capsys.readouterr().out
    assert out.split()[:2] == ["kind", "n"] and "7 row(s)" in out


def test_a_value_no_column_type_holds_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A 64-bit unsigned value where the column is BIGINT (a hostile trace): exit 2, one line
    naming the file and the table, no traceback."""
    t = tmp_path / "big.kvtrace"
    t.write_text('{"format":"kvtrace","version":"1.2","kvdiag_version":"t","created":"t",'
                 '"backend":"t","device":{"name":"t"},"scenario":{}}\n'
                 '{"kind":"evict","seq":1,"t_ns":0,"step":0,"slot":18446744073709551615,'
                 '"layer":0,"stream":0,"page":0,"bytes":1,"reason":"x"}\n')
    assert main(["sql", "SELECT count(*) FROM events_evict", str(t)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvdiag: error: {t}: cannot load the events_evict table:")
    assert "\n" not in err and "Traceback" not in err


def test_python_frames_are_their_own_table_beside_the_native_frames(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A segfault in a Python embedding that printed no native backtrace, only faulthandler's
    one-thread ``Stack`` form (no thread id, the thread the signal hit) with a ``File ???``."""
    log = tmp_path / "embed.log"
    log.write_text("\n".join((
        "llama_context: constructing llama_context",
        "Fatal Python error: Segmentation fault",
        "",
        "Stack (most recent call first):",
        '  File "/srv/bot/.venv/lib/python3.11/site-packages/llama_cpp/llama.py", line 1207'
        " in _create_completion",
        "  File ???, line ??? in ???",
        '  File "/srv/bot/handlers.py", line 41 in reply',
        '  File "/usr/lib/python3.11/asyncio/events.py", line 84 in _run',
        "",
    )) + "\n")
    rows = sql_json(capsys, "SELECT crash, stack, thread, signalled, frame, source_file, "
                    "source_line, function, in_app FROM python_frames WHERE source_line > 40 "
                    "ORDER BY frame", str(log))
    site = "/srv/bot/.venv/lib/python3.11/site-packages/llama_cpp/llama.py"
    assert [tuple(r.values()) for r in rows] == [
        (0, 0, None, True, 0, site, 1207, "_create_completion", True),
        (0, 0, None, True, 2, "/srv/bot/handlers.py", 41, "reply", True),
        (0, 0, None, True, 3, "/usr/lib/python3.11/asyncio/events.py", 84, "_run", False)]
    unknown = sql_json(capsys, "SELECT frame, source_file, function FROM python_frames "
                       "WHERE source_file IS NULL", str(log))
    assert unknown == [{"frame": 1, "source_file": None, "function": None}]
    # the native frames table holds no Python frame, and a query naming only it fills it alone
    assert sql_json(capsys, "SELECT count(*) AS n FROM frames", str(log)) == [{"n": 0}]
    from kvdiag.sql.store import tables_named

    assert tables_named("select * from python_frames") == {"python_frames"}
