"""Filter and projection expressions, in SQL, evaluated with DuckDB over Arrow.

The planner checks an expression in Spark's dialect (:mod:`changelake.plan.spark_sql`), then
uses DuckDB to check it and derive its output type before the pipeline runs; the in-process
runner evaluates with DuckDB; the Spark executor hands the same text to Spark SQL (``F.expr``)
and casts to the planned type; both evaluate in UTC. Write expressions in the common subset of
Spark SQL and DuckDB (column references, arithmetic, comparisons, ``AND``/``OR``/``NOT``,
``CASE``, ``COALESCE``, ``CAST``, ``IS NULL``, ``IN``, ``LIKE``).
Case mapping is not in that subset for non-ASCII text: ``upper('ß')`` is ``'SS'`` in Spark and
``'ẞ'`` in DuckDB, ``lower('İ')`` differs too, so the two executors would write different rows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from changelake.changelog import KIND
from changelake.errors import ConfigError
from changelake.plan.spark_sql import check_expression


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
    check_expression(f"filter {node!r}", predicate)
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
    for name, expr in projections:
        check_expression(f"select {node!r} column {name!r}", expr)
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


# --- what can be NULL (for the planner's nullability, ``changelake.plan.nullability``) -------------

#: comparisons that are NULL, so a filter drops the row, when an operand is NULL
_NULL_REJECTING = frozenset({"COMPARE_EQUAL", "COMPARE_NOTEQUAL", "COMPARE_LESSTHAN", "COMPARE_GREATERTHAN",
                             "COMPARE_LESSTHANOREQUALTO", "COMPARE_GREATERTHANOREQUALTO"})


def _parse(expression: str) -> dict[str, Any] | None:
    """DuckDB's syntax tree of ``SELECT (expression)`` (``json_serialize_sql``), None if it does not parse."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect()
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [f"SELECT ({expression})"]).fetchall()[0][0])
    except duckdb.Error:
        return None
    if tree.get("error"):
        return None
    return tree["statements"][0]["node"]["select_list"][0]


def _column(node: dict[str, Any]) -> str | None:
    names = node.get("column_names") if node.get("class") == "COLUMN_REF" else None
    return names[0] if names and len(names) == 1 else None


def never_null(expression: str, not_null: Collection[str]) -> bool:
    """Whether ``expression`` is never NULL, given the input columns ``not_null`` never are: a
    reference to such a column, a non-NULL constant, or a COALESCE with such an argument.
    Anything else is taken as possibly NULL, which is always safe (a CAST too: Spark without ANSI
    mode casts a bad value to NULL)."""
    def walk(node: dict[str, Any] | None) -> bool:
        if node is None:
            return False
        kind = node.get("class")
        if kind == "COLUMN_REF":
            return _column(node) in not_null
        if kind == "CONSTANT":
            return node.get("literal", {}).get("kind") != "NULL_LITERAL"
        if node.get("type") == "OPERATOR_COALESCE":
            return any(walk(c) for c in node.get("children", ()))
        return False

    return walk(_parse(expression))


def null_rejected(predicate: str) -> frozenset[str]:
    """The columns in which a row that holds NULL never passes the filter ``predicate``: those a
    top-level ``AND`` term tests with ``IS NOT NULL`` (or ``NOT ... IS NULL``), compares (``=``,
    ``<>``, ``<``, ``>``, ``<=``, ``>=``) or tests with ``IN``."""
    out: set[str] = set()

    def conjuncts(node: dict[str, Any]):
        if node.get("type") == "CONJUNCTION_AND":
            for child in node.get("children", ()):
                yield from conjuncts(child)
        else:
            yield node

    tree = _parse(predicate)
    for term in conjuncts(tree) if tree is not None else ():
        kind, children = term.get("type"), term.get("children") or []
        if kind == "OPERATOR_NOT" and children and children[0].get("type") == "OPERATOR_IS_NULL":
            kind, children = "OPERATOR_IS_NOT_NULL", children[0].get("children") or []
        if kind == "OPERATOR_IS_NOT_NULL":
            operands = children
        elif kind == "COMPARE_IN":
            operands = children[:1]                       # the tested value; a NULL in the list rejects nothing
        elif kind in _NULL_REJECTING:
            operands = [term.get("left"), term.get("right")]
        else:
            continue
        out.update(c for c in (_column(o) for o in operands if o) if c is not None)
    return frozenset(out)
