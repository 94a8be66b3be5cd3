"""What ``kvdiag sql`` does: load each input (a trace, a server log or a Parquet folder), then
run one query or write every table as Parquet."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvdiag.errors import InputError, UsageError
from kvdiag.files.inputs import STDIN_NAME, open_input
from kvdiag.sql.rows import log_rows, trace_rows
from kvdiag.sql.schema import TABLES
from kvdiag.sql.store import Database, require_parquet_dir, tables_named
from kvdiag.trace.segments import find_set, starts_a_trace

ALL_TABLES = frozenset(t.name for t in TABLES)


@dataclass(frozen=True)
class Result:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


def input_kind(path: str) -> str:
    """``parquet`` (a folder ``--parquet`` wrote), ``trace`` or ``log``. A segment set named
    by its ``KVTRACE_FILE`` path, its folder or a glob is a trace, as every reader takes it
    (:func:`kvdiag.trace.segments.open_trace`), and so is one zstd-compressed segment."""
    if path == STDIN_NAME:
        raise UsageError("kvdiag sql reads files, not standard input (each input may be read "
                         "twice)")
    is_file = not os.path.isdir(path) and (os.path.exists(path) or os.path.islink(path))
    if not is_file and find_set(path) is not None:
        return "trace"
    if os.path.isdir(path):
        require_parquet_dir(path)
        return "parquet"
    with open_input(path) as fh:
        try:
            head = fh.read(4096)
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head:
        raise InputError(f"{path}: empty file")
    return "trace" if starts_a_trace(head) else "log"


def load(db: Database, inputs: Sequence[str], tables: frozenset[str],
         progress: Callable[[str], None] | None = None) -> list[str]:
    """Convert every trace and log into ``db``; return the Parquet folders (read as views)."""
    kinds = [(p, input_kind(p)) for p in inputs]  # refuse a bad input before converting any
    folders: list[str] = []
    for path, kind in kinds:
        if kind == "parquet":
            folders.append(path)
            continue
        if progress is not None:
            progress(path)
        db.loader.start(path)
        (trace_rows if kind == "trace" else log_rows)(path, db.loader, tables)
    db.views(folders)
    return folders


def query(sql: str, inputs: Sequence[str],
          progress: Callable[[str], None] | None = None) -> Result:
    """Run ``sql`` over the inputs; only the tables it names are filled."""
    duck = _duck()
    with Database() as db:
        load(db, inputs, tables_named(sql) | {"files", "problems"}, progress)
        try:
            cur = db.con.execute(sql)
        except duck.Error as exc:
            raise UsageError(f"sql: {_first_line(exc)}") from None
        columns = tuple(d[0] for d in cur.description or ())
        return Result(columns, cur.fetchall() if columns else [])


def parquet(out: str, inputs: Sequence[str], force: bool = False,
            progress: Callable[[str], None] | None = None,
            tables: Sequence[str] | None = None) -> list[str]:
    """Every table of the inputs (or those named: ``events`` for every events table) as
    ``OUT/<table>.parquet``; ``files`` and ``problems`` are always written."""
    wanted = ALL_TABLES
    if tables is not None:
        unknown = sorted(set(tables) - ALL_TABLES - {"events"})
        if unknown:
            raise UsageError(f"--tables: no table {', '.join(unknown)} (tables: "
                             f"{', '.join(sorted(ALL_TABLES | {'events'}))})")
        wanted = tables_named(" ".join(tables)) | {"files", "problems"}
    with Database() as db:
        load(db, inputs, wanted, progress)
        return db.write_parquet(out, force, wanted)


def _duck() -> Any:
    from kvdiag.sql.store import duckdb_module

    return duckdb_module()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
