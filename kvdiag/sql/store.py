"""The DuckDB side of ``kvdiag sql``: tables filled in batches, Parquet out, Parquet in.

Rows reach DuckDB through its JSON reader: each batch is written to a temporary JSON Lines
file (``msgspec`` encodes a batch of tuples or event Structs at C speed) and inserted with one
``INSERT … SELECT … FROM read_json(…)`` whose columns and casts come from
:mod:`kvdiag.sql.schema`. Measured against the other fast paths on this machine
(benchmarks/results/bench_sql.txt) it is as fast as building numpy columns and needs no
per-column Python work; events go in exactly as the trace reader decoded them.

Conversion uses an on-disk database in a temporary folder, so memory does not grow with the
input (DuckDB spills what does not fit).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from kvdiag.errors import InputError, UsageError
from kvdiag.files.outputs import plan_output
from kvdiag.model import events as ev
from kvdiag.sql.schema import BY_NAME, EVENT_TABLES, TABLES, Table, json_names

if TYPE_CHECKING:
    import duckdb

EVENT_TABLE_NAMES = frozenset(t.name for t in EVENT_TABLES)
BATCH_ROWS = 200_000
MAX_OBJECT = 64 << 20
"""The longest JSON line DuckDB reads: the trace reader's longest line (reader.MAX_LINE)."""
LOAD_MEMORY = "512MB"
"""DuckDB's memory while inputs are converted and written as Parquet (a query gets DuckDB's
default): what does not fit goes to the temporary folder, so the peak stays flat however long
the input (benchmarks/results/bench_sql.txt)."""
BATCH_EVENTS = 200_000
MISSING = "kvdiag sql needs DuckDB, an optional extra: pip install 'kvdiag[sql]'"


def duckdb_module() -> Any:
    """DuckDB, or the one-line error that says how to install it."""
    try:
        import duckdb
    except ImportError:
        raise UsageError(MISSING) from None
    return duckdb


def quote(text: str) -> str:
    """A string literal for SQL text (paths: DuckDB's table functions take no parameters)."""
    return "'" + text.replace("'", "''") + "'"


def _row_select(table: Table, path: str) -> str:
    cols = table.columns[1:]
    exprs = ", ".join(f"j[{i}]::{t}" for i, (_, t) in enumerate(cols, 1))
    return (f'INSERT INTO loaded."{table.name}" SELECT $file, {exprs} FROM '
            f"read_json({quote(path)}, format='newline_delimited', records=false, "
            f"columns={{'j': 'VARCHAR[]'}}, maximum_object_size={MAX_OBJECT})")


def _event_select(table: Table, path: str) -> str:
    names = json_names(table)
    cols = ", ".join(f"'{n}': '{t}'" for n, (_, t) in zip(names, table.columns[1:],
                                                           strict=True))
    return (f'INSERT INTO loaded."{table.name}" SELECT $file, '
            + ", ".join(f'"{n}"' for n in names)
            + f" FROM read_json({quote(path)}, format='newline_delimited', "
            f"columns={{{cols}}}, maximum_object_size={MAX_OBJECT})")


EVENTS_VIEW = "events"
"""The view of every events table (columns matched by name)."""


class Loader:
    """A :class:`~kvdiag.sql.rows.Sink` that fills the ``loaded`` schema of a connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, spool: Path) -> None:
        self.con = con
        self.spool = spool
        self.file = ""
        self._rows: dict[str, list[tuple[Any, ...]]] = {t.name: [] for t in TABLES
                                                         if t.name not in EVENT_TABLE_NAMES}
        self._events: dict[str, list[Any]] = {t.name: [] for t in EVENT_TABLES}
        self._tag: dict[type, str] = {}
        self._encode = msgspec.json.Encoder().encode_lines
        self._n = 0
        con.execute("CREATE SCHEMA IF NOT EXISTS loaded")
        for t in TABLES:
            con.execute(t.ddl().replace('CREATE TABLE "', 'CREATE TABLE loaded."', 1))

    def start(self, file: str) -> None:
        self.flush()
        self.file = file

    def row(self, table: str, values: tuple[Any, ...]) -> None:
        rows = self._rows[table]
        rows.append(values)
        if len(rows) >= BATCH_ROWS:
            self._flush_table(table)

    def event(self, event: ev.AnyEvent | ev.Unknown) -> None:
        t = type(event)
        name = self._tag.get(t)
        if name is None:
            tag = t.__struct_config__.tag if t is not ev.Unknown else "other"
            name = self._tag[t] = f"events_{tag}"
        rows = self._events[name]
        if t is ev.Unknown:
            u: ev.Unknown = event  # type: ignore[assignment]
            rows.append({"kind": u.kind, "seq": u.seq, "t_ns": u.t_ns, "step": u.step,
                         "extra": u.fields})
        else:
            rows.append(event)
        if len(rows) >= BATCH_EVENTS:
            self._flush_events(name)

    def _spool_file(self, data: bytes) -> str:
        self._n += 1
        path = self.spool / f"batch-{self._n}.jsonl"
        path.write_bytes(data)
        return str(path)

    def _flush_table(self, name: str) -> None:
        rows = self._rows[name]
        if not rows:
            return
        path = self._spool_file(self._encode(rows))
        rows.clear()
        try:
            self._insert(_row_select(BY_NAME[name], path), name)
        finally:
            os.unlink(path)

    def _flush_events(self, name: str) -> None:
        rows = self._events[name]
        if not rows:
            return
        path = self._spool_file(self._encode(rows))
        rows.clear()
        try:
            self._insert(_event_select(BY_NAME[name], path), name)
        finally:
            os.unlink(path)

    def _insert(self, sql: str, table: str) -> None:
        try:
            self.con.execute(sql, {"file": self.file})
        except duckdb_module().Error as exc:
            # a value DuckDB's column type cannot hold (a hostile trace's integer beyond 64
            # bits signed where the type is BIGINT): one line, never a traceback
            text = str(exc).strip().splitlines()
            raise InputError(f"{self.file}: cannot load the {table} table: "
                             f"{text[0] if text else type(exc).__name__}") from None

    def flush(self) -> None:
        for name in self._rows:
            self._flush_table(name)
        for name in self._events:
            self._flush_events(name)


class Database:
    """A temporary on-disk DuckDB database: the ``loaded`` schema holds converted inputs and
    the main schema one view per table over them and over Parquet folders."""

    def __init__(self) -> None:
        duck = duckdb_module()
        self.dir = tempfile.TemporaryDirectory(prefix="kvdiag-sql-")
        root = Path(self.dir.name)
        (root / "spool").mkdir()
        self.con: duckdb.DuckDBPyConnection = duck.connect(str(root / "kvdiag.duckdb"))
        self.con.execute(f"SET temp_directory = {quote(str(root / 'tmp'))}")
        # converting needs little memory; what does not fit goes to the temporary folder
        self.con.execute(f"SET memory_limit = '{LOAD_MEMORY}'")
        self.loader = Loader(self.con, root / "spool")

    def close(self) -> None:
        self.con.close()
        self.dir.cleanup()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def views(self, parquet_dirs: Iterable[str]) -> None:
        """One view per table: the converted rows, and the same table of every Parquet
        folder (columns matched by name, so folders written by another version still join)."""
        self.loader.flush()
        self.con.execute("RESET memory_limit")
        dirs = list(parquet_dirs)
        for t in TABLES:
            parts = [f'SELECT * FROM loaded."{t.name}"']
            files = [str(Path(d) / f"{t.name}.parquet") for d in dirs
                     if (Path(d) / f"{t.name}.parquet").is_file()]
            if files:
                listed = ", ".join(quote(f) for f in files)
                parts.append(f"SELECT * FROM read_parquet([{listed}], union_by_name=true)")
            if files and not self._has_rows(t.name):
                parts = parts[1:]
            self.con.execute(f'CREATE OR REPLACE VIEW "{t.name}" AS '
                             + " UNION ALL BY NAME ".join(parts))
        self.con.execute(f'CREATE OR REPLACE VIEW "{EVENTS_VIEW}" AS ' + " UNION ALL BY NAME "
                         .join(f'SELECT * FROM "{t.name}"' for t in EVENT_TABLES))

    def _has_rows(self, name: str) -> bool:
        got = self.con.execute(f'SELECT count(*) FROM (SELECT 1 FROM loaded."{name}" LIMIT 1)'
                               ).fetchone()
        return bool(got and got[0])

    def write_parquet(self, out: str, force: bool,
                      tables: frozenset[str] | None = None) -> list[str]:
        """Every table (or those in ``tables``) as ``OUT/<table>.parquet``, each written
        beside its name and renamed into place when complete."""
        self.loader.flush()
        root = Path(out)
        if root.exists() and not root.is_dir():
            raise UsageError(f"--parquet {out}: exists and is not a directory")
        root.mkdir(parents=True, exist_ok=True)
        chosen = [t for t in TABLES if tables is None or t.name in tables]
        targets = [root / f"{t.name}.parquet" for t in chosen]
        there = [p.name for p in targets if p.exists()]
        if there and not force:
            raise UsageError(f"--parquet {out}: holds {', '.join(there)} (use --force to "
                             "replace)")
        for p in targets:  # the one output rule: a regular file, never a device or a link's FIFO
            plan_output(p, force=True, stdout=False, flag="--parquet")
        # bounded memory: COPY may then write a table's rows in another order than inserted
        self.con.execute(f"SET memory_limit = '{LOAD_MEMORY}'")
        self.con.execute("SET preserve_insertion_order = false")
        written = []
        for t, target in zip(chosen, targets, strict=True):
            tmp = root / f".{target.name}.{os.getpid()}.tmp"
            try:
                self.con.execute(f'COPY (SELECT * FROM "{t.name}") TO {quote(str(tmp))} '
                                 "(FORMAT parquet, COMPRESSION zstd)")
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            written.append(str(target))
        return written


_TABLE_WORD = re.compile(r"\b(" + "|".join([t.name for t in TABLES] + [EVENTS_VIEW])
                         + r")\b", re.IGNORECASE)


def tables_named(sql: str) -> frozenset[str]:
    """The tables a query names (a word anywhere in it): only these are filled; ``events``
    names every events table."""
    names = {m.lower() for m in _TABLE_WORD.findall(sql)}
    if EVENTS_VIEW in names:
        names |= EVENT_TABLE_NAMES
    return frozenset(names)


def is_parquet_dir(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / f"{t.name}.parquet").is_file() for t in TABLES)


def require_parquet_dir(path: str) -> None:
    if Path(path).is_dir() and not is_parquet_dir(path):
        raise InputError(f"{path}: a directory without kvdiag sql tables (*.parquet written "
                         "by kvdiag sql --parquet)")
