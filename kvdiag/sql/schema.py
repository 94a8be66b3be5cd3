"""The tables of ``kvdiag sql``: their columns and DuckDB types, in one place.

Every table has a ``file`` column (the input as given on the command line), so that several
traces and logs load into the same tables. The events tables are derived from the event Structs
of :mod:`kvdiag.model.events`: one per kind (``events_upload`` …), and the ``events`` view of
them all (every kind's fields, one column per field name); a field that two kinds give
different types is renamed by :data:`RENAMES`, and a test checks that no other name clashes. What each column means is in docs/sql.md.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import msgspec.inspect as mi

from kvdiag.model import events as ev


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    """(name, DuckDB type), ``file`` first."""
    doc: str

    def ddl(self) -> str:
        cols = ", ".join(f'"{n}" {t}' for n, t in self.columns)
        return f'CREATE TABLE "{self.name}" ({cols})'


def _t(name: str, doc: str, cols: str) -> Table:
    pairs = tuple(tuple(c.split(":")) for c in cols.split())
    return Table(name, (("file", "VARCHAR"), *pairs), doc)  # type: ignore[arg-type]


FILES = _t("files", "one row per input: what it is and how it ended",
           "kind:VARCHAR format:VARCHAR events:BIGINT lines:BIGINT status:VARCHAR "
           "reason:VARCHAR steps:BIGINT problems:BIGINT device:VARCHAR backend:VARCHAR "
           "layout:VARCHAR dispatch:VARCHAR scenario:VARCHAR header:JSON")
PROBLEMS = _t("problems", "where an input is damaged or breaks off (read up to there)",
              "line:BIGINT kind:VARCHAR message:VARCHAR")
PAGES = _t("pages", "judged read pages, one row per run of consecutive pages with one verdict",
           "seq:BIGINT step:BIGINT layer:BIGINT stream:BIGINT source:VARCHAR slot:BIGINT "
           "page_begin:BIGINT page_end:BIGINT pages:BIGINT class:VARCHAR lag:BIGINT "
           "holder_layer:BIGINT holder_stream:BIGINT holder_page:BIGINT copied_step:BIGINT "
           "copied_seq:BIGINT why:VARCHAR")
FITS = _t("fits", "every fits decision judged: outcome and failed conditions",
          "seq:BIGINT step:BIGINT layer:BIGINT node:VARCHAR route:VARCHAR result:BOOLEAN "
          "outcome:VARCHAR failed:VARCHAR[] failed_by:VARCHAR note:VARCHAR "
          "conditions_id:BIGINT")
CONDITIONS = _t("conditions", "each condition of a set of fits conditions (fits.conditions_id)",
                "conditions_id:BIGINT position:BIGINT name:VARCHAR state:VARCHAR "
                "value:VARCHAR why:VARCHAR")
FINDINGS = _t("findings", "what kvdiag check (traces) or kvdiag postmortem (logs) reports",
              "finding:BIGINT rule:VARCHAR severity:VARCHAR severity_rank:BIGINT "
              "title:VARCHAR first_step:BIGINT count:BIGINT stream:BIGINT fix:VARCHAR "
              "details:JSON")
EVIDENCE = _t("evidence", "the evidence each finding lists (capped as check caps it)",
              "finding:BIGINT position:BIGINT seq:BIGINT step:BIGINT layer:BIGINT "
              "stream:BIGINT page:BIGINT source:VARCHAR line:BIGINT text:VARCHAR")
TIMINGS = _t("timings", "one row per request a server slot completed (print_timing)",
             "seq:BIGINT line:BIGINT t_ns:BIGINT boot:BIGINT slot:BIGINT task:BIGINT "
             "prompt_tokens:BIGINT prompt_ms:DOUBLE prompt_tps:DOUBLE decode_tokens:BIGINT "
             "decode_ms:DOUBLE decode_tps:DOUBLE ms_per_token:DOUBLE depth_start:BIGINT "
             "depth_end:BIGINT cached:BIGINT n_ctx_slot:BIGINT truncated:BOOLEAN "
             "graphs_reused:BIGINT")
CRASHES = _t("crashes", "crashes of a log (post-mortem scanner) and abort events of a trace",
             "crash:BIGINT line:BIGINT seq:BIGINT kind:VARCHAR boot:BIGINT signal:VARCHAR "
             "windows_exception:VARCHAR abort_file:VARCHAR abort_line:BIGINT condition:VARCHAR message:VARCHAR "
             "gpu_backend:VARCHAR gpu_error:VARCHAR fingerprint:VARCHAR "
             "active_slots:BIGINT[] frames:BIGINT")
FRAMES = _t("frames", "the backtrace frames of each crash, as printed",
            "crash:BIGINT frame:BIGINT address:HUGEINT module:VARCHAR offset:HUGEINT "
            "function:VARCHAR source_file:VARCHAR source_line:BIGINT inlined:BOOLEAN "
            "in_app:BOOLEAN text:VARCHAR")
PYTHON_FRAMES = _t("python_frames",
                   "the Python stacks of each crash (faulthandler), one row per frame",
                   "crash:BIGINT stack:BIGINT thread:VARCHAR thread_name:VARCHAR "
                   "signalled:BOOLEAN frame:BIGINT source_file:VARCHAR source_line:BIGINT "
                   "function:VARCHAR in_app:BOOLEAN")

RENAMES: dict[tuple[str, str], str] = {
    ("abort", "file"): "abort_file",
    ("repartition", "resident"): "resident_change",
    ("repartition", "ring"): "ring_change",
    ("mark", "rows"): "mark_rows",
    ("snapshot", "pool"): "snapshot_pool",
    ("snapshot", "ring"): "snapshot_ring",
}
"""(kind, field) → column, where a field's name is taken (``file``) or another kind gives the
same name another type (adapt's ``resident`` is a page count, repartition's a from/to pair)."""

POINTERS = frozenset({("learn", "k_ptr")})
"""Pointers among the integer fields: HUGEINT, since a trace may hold any value from -2^63 to
2^64-1 there (the reader's range)."""

COMMON = (("seq", "BIGINT"), ("t_ns", "BIGINT"), ("step", "BIGINT"), ("kind", "VARCHAR"))
"""The columns every event has (``kind`` names its table in the ``events`` view)."""


def _duck(t: mi.Type) -> str:
    """The DuckDB type of one msgspec field type (nested values are JSON)."""
    if isinstance(t, mi.UnionType):
        inner = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return _duck(inner[0]) if len(inner) == 1 else "JSON"
    if isinstance(t, mi.IntType):
        return "BIGINT"
    if isinstance(t, mi.FloatType):
        return "DOUBLE"
    if isinstance(t, mi.BoolType):
        return "BOOLEAN"
    if isinstance(t, mi.StrType | mi.LiteralType):
        return "VARCHAR"
    if isinstance(t, mi.TupleType | mi.VarTupleType | mi.ListType):
        items = t.item_types if isinstance(t, mi.TupleType) else (t.item_type,)
        kinds = {_duck(i) for i in items}
        if kinds == {"BIGINT"} or kinds == {"VARCHAR"}:
            return f"{kinds.pop()}[]"
    return "JSON"


def event_fields() -> dict[str, list[tuple[str, str]]]:
    """Field name → [(kind, DuckDB type)] over every event kind, common fields left out."""
    out: dict[str, list[tuple[str, str]]] = {}
    for cls in typing.get_args(ev.AnyEvent):
        kind = cls.__struct_config__.tag
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            if f.name in ("seq", "t_ns", "step"):
                continue
            duck = "HUGEINT" if (kind, f.name) in POINTERS else _duck(f.type)
            out.setdefault(f.name, []).append((kind, duck))
    return out


def event_tables() -> tuple[Table, ...]:
    """One table per event kind, ``events_<kind>``: the common columns and the kind's fields
    (renamed by :data:`RENAMES`), and ``events_other`` for kinds this version does not know
    (their fields in ``extra``). Narrow tables load several times faster than one wide table
    of every field (benchmarks/results/bench_sql.txt); the ``events`` view joins them."""
    fields = event_fields()
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for cls in typing.get_args(ev.AnyEvent):
        by_kind[cls.__struct_config__.tag] = []
    for name, uses in fields.items():
        kept = {t for k, t in uses if (k, name) not in RENAMES}
        if len(kept) > 1:
            raise AssertionError(f"event field {name!r} has types {sorted(kept)} across "
                                 "kinds: add it to kvdiag.sql.schema.RENAMES")
        for kind, duck in uses:
            by_kind[kind].append((RENAMES.get((kind, name), name), duck))
    out = [Table(f"events_{kind}", (("file", "VARCHAR"), *COMMON, *cols),
                 f"every {kind} event") for kind, cols in by_kind.items()]
    out.append(Table("events_other", (("file", "VARCHAR"), *COMMON, ("extra", "JSON")),
                     "events of kinds this version does not know (fields in extra)"))
    return tuple(out)


def json_names(table: Table) -> list[str]:
    """The JSON field names of an events table's columns (after ``file``)."""
    kind = table.name.removeprefix("events_")
    back = {v: f for (k, f), v in RENAMES.items() if k == kind}
    return [back.get(n, n) for n, _ in table.columns[1:]]


EVENT_TABLES = event_tables()
EVENT_TABLE: dict[str, Table] = {t.name.removeprefix("events_"): t for t in EVENT_TABLES}

TABLES: tuple[Table, ...] = (FILES, PROBLEMS, PAGES, FITS, CONDITIONS, FINDINGS, EVIDENCE,
                             TIMINGS, CRASHES, FRAMES, PYTHON_FRAMES,
                             *EVENT_TABLES)
BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}
