"""Filter and projection expressions, in SQL, evaluated with DuckDB over Arrow.

The planner uses DuckDB to check an expression and derive its output type before the
pipeline runs; the in-process runner evaluates with it; the Spark executor hands the same
text to Spark SQL (``F.expr``) and casts to the planned type; both evaluate in UTC. Write
expressions in the common subset of Spark SQL and DuckDB (column references, arithmetic, comparisons,
``AND``/``OR``/``NOT``, ``CASE``, ``COALESCE``, ``CAST``, ``IS NULL``, ``IN``, ``LIKE``).
Case mapping is not in that subset for non-ASCII text: ``upper('ß')`` is ``'SS'`` in Spark and
``'ẞ'`` in DuckDB, ``lower('İ')`` differs too, so the two executors would write different rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from changelake.changelog import KIND
from changelake.errors import ConfigError


#: one DuckDB connection per thread, reused: opening one costs ~30 ms here, a query over a batch ~2 ms
_local = threading.local()


def _query(table: pa.Table, sql: str) -> pa.Table:
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect()
        # as the Spark session (build_session): a TIMESTAMP is cast, truncated and printed in UTC, not in
        # the machine's zone (DuckDB's default), and comes back as timestamp[us, tz=UTC]
        con.execute("SET TimeZone = 'UTC'")
    con.register("t", table)
    try:
        return con.sql(sql).to_arrow_table()
    finally:
        con.unregister("t")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.append(pa.field(KIND, pa.int8())).empty_table()


def check_predicate(node: str, schema: pa.Schema, predicate: str) -> None:
    try:
        out = _query(_empty(schema), f"SELECT ({predicate}) AS p FROM t")
    except duckdb.Error as exc:
        raise ConfigError(f"filter {node!r}: cannot evaluate {predicate!r} over columns {schema.names}: {exc}") from None
    if not pa.types.is_boolean(out.schema.field("p").type):
        raise ConfigError(f"filter {node!r}: {predicate!r} is {out.schema.field('p').type}, not a boolean condition")


def project_schema(node: str, schema: pa.Schema, projections: Sequence[tuple[str, str]]) -> pa.Schema:
    names = [n for n, _ in projections]
    bad = [n for n in names if n.startswith("_")]
    if bad or len(set(names)) != len(names):
        raise ConfigError(f"select {node!r}: output columns must be unique and not start with '_'; got {names}")
    try:
        out = _query(_empty(schema), _select_sql(projections))
    except duckdb.Error as exc:
        raise ConfigError(f"select {node!r}: cannot evaluate {dict(projections)} over columns {schema.names}: "
                          f"{exc}") from None
    return pa.schema([out.schema.field(n) for n in names])


def _select_sql(projections: Sequence[tuple[str, str]]) -> str:
    items = ", ".join(f"({expr}) AS {_quote(name)}" for name, expr in projections)
    return f"SELECT {items}, {_quote(KIND)} FROM t"


def apply_filter(table: pa.Table, predicate: str) -> pa.Table:
    """The rows of a changelog batch for which ``predicate`` is true (kinds kept, order kept)."""
    if table.num_rows == 0:
        return table
    mask = _query(table, f"SELECT COALESCE(({predicate}), FALSE) AS p FROM t")["p"]
    return table.filter(mask)


def apply_project(table: pa.Table, projections: Sequence[tuple[str, str]], schema: pa.Schema) -> pa.Table:
    """The projected changelog batch (``schema`` + ``_kind``, order kept)."""
    out = _query(table, _select_sql(projections))
    return out.cast(schema.append(pa.field(KIND, pa.int8())))


def column(name: str) -> str:
    """A column reference both DuckDB and Spark SQL read as the column ``name`` (backquoted, so that
    a column named like a keyword, e.g. ``order``, is not parsed as one)."""
    return "`" + name.replace("`", "``") + "`"


def hash_bucket(columns: Sequence[str], buckets: int) -> str:
    """An INT in ``[0, buckets)`` from a hash of ``columns``: equal values give the same bucket within
    one engine (DuckDB's ``hash`` and Spark's Murmur3 ``hash`` differ, so the buckets of one row
    differ between the in-process runner and Spark; each is deterministic). ``% buckets`` of a
    negative Spark hash is negative, hence the ``+ buckets`` before the second modulo."""
    if not columns:
        raise ValueError("hash_bucket needs at least one column")
    h = f"hash({', '.join(column(c) for c in columns)})"
    return f"CAST((({h} % {buckets}) + {buckets}) % {buckets} AS INT)"
