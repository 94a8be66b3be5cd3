"""``kvdiag sql``: traces, server logs and Parquet folders as SQL tables, on DuckDB (an optional
extra, ``pip install 'kvdiag[sql]'``).

- :mod:`.schema` — the tables and their columns (docs/sql.md explains each);
- :mod:`.rows` — a trace or a log as rows, streamed, every verdict the judgement's;
- :mod:`.store` — DuckDB: batches in, views over converted inputs and Parquet, Parquet out;
- :mod:`.run` — what the command does: load the inputs, run the query or write Parquet.
"""
