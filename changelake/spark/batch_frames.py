"""A micro-batch's framed tables: the tables whose changes reach their sink as Spark DataFrames.

The processor names them (``framed_tables``: table -> primary key); for them ``foreachBatch``
(:meth:`changelake.spark.query.PipelineQuery.__call__`) keeps the changes on the executors::

    batch payloads -> CheckRows (mapInArrow): each ``rows`` payload of a framed mirror's route with its
                      key changes split by the table's key, its null-key rows out as dead letters
                      (``dl``: position, reason missing-key), the moves counted (``moves``)
                   -> persisted: the stateful operators run once, whatever reads the batch after
    driver:  every payload but the framed ones (stats, dead letters, truncates, moves, the rows of
             the other tables), collected as before; of a framed payload only its route and part
    per framed table with payloads: its typed rows (mapInArrow from the payloads, persisted);
             a graph table's given their sink ``_seq`` and lone ``-U`` made ``-D`` (:func:`sink_changes`);
             their changes counted per kind (one aggregation for all of them)
    -> the processor hands each to its sink's ``apply_frame``

These are the rules the driver applies to a collected batch (``BatchProcessor._check_keys``,
``graph_sink_changes``), on the executors: both paths write the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from changelake.changelog import _SEQ_WIDTH, DEAD_LETTER_SCHEMA, KIND, SEQ, RowKind, commit_position
from changelake.spark.compile import CHANGES_PART
from changelake.spark.decode_stage import check_keys, moves_payload, payload_batch
from changelake.spark.delta_sink_frames import POSITION, FrameChecks, checked_columns, checks_of, with_position
from changelake.spark.payloads import from_ipc, to_ipc

log = logging.getLogger(__name__)

ROWS_PART = "rows"
_LABEL = {int(k): k.short for k in RowKind}


@dataclass(frozen=True)
class TableFrame:
    """One framed table's changes of a micro-batch: a DataFrame in batch order, its counts per kind, and
    what its sink validates, counted with them (``apply_frame(..., checks=)``)."""

    changes: DataFrame
    kinds: dict[str, int]
    checks: FrameChecks | None = None


class CheckRows:
    """mapInArrow over a batch's payloads: the ``rows`` of ``routes`` (route -> the key of its table and
    the table's name) checked against that key; every other payload passes unchanged."""

    def __init__(self, routes: Mapping[int, tuple[Sequence[str], str]]) -> None:
        self.routes = {i: (tuple(key), table) for i, (key, table) in routes.items()}

    def __call__(self, batches):
        for batch in batches:
            out: list[tuple[int, str, bytes]] = []
            for route, part, payload in zip(batch.column("_route").to_pylist(), batch.column("part").to_pylist(),
                                             batch.column("payload").to_pylist()):
                if part != ROWS_PART or route not in self.routes:
                    out.append((route, part, payload))
                    continue
                key, table = self.routes[route]
                rows, dead, moves = check_keys(from_ipc(payload), DEAD_LETTER_SCHEMA.empty_table(), key,
                                               f"table {table!r}")
                if rows.num_rows:
                    out.append((route, ROWS_PART, to_ipc(rows)))
                if dead.num_rows:
                    out.append((route, "dl", to_ipc(dead)))
                if moves:
                    out.append((route, "moves", moves_payload(moves)))
            yield payload_batch(out)


class _Typed:
    """mapInArrow: the ``part`` payloads of ``route`` -> typed rows of ``schema``."""

    def __init__(self, route: int, part: str, schema: pa.Schema) -> None:
        self.route, self.part, self.schema = route, part, schema

    def __call__(self, batches):
        for batch in batches:
            mine = batch.filter(pc.and_(pc.equal(batch.column("_route"), self.route),
                                        pc.equal(batch.column("part"), self.part)))
            for payload in mine.column("payload").to_pylist():
                yield from from_ipc(payload).select(self.schema.names).cast(self.schema).to_batches()


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark schema of typed rows of ``schema`` (a naive timestamp stays naive); raises TypeError
    for an Arrow type Spark has no type for (such a table is collected instead)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def typed_rows(batch: DataFrame, routes: Mapping[int, pa.Schema], part: str) -> DataFrame:
    """The rows of the ``part`` payloads of ``routes`` (route -> the Arrow schema of its rows), as one
    DataFrame in batch order (no shuffle: the rows of one payload stay consecutive, in order)."""
    frames = []
    for route, schema in sorted(routes.items()):
        struct = spark_schema(schema)
        frames.append(batch.mapInArrow(_Typed(route, part, to_arrow_schema(struct, timezone="UTC")), struct))
    out = frames[0]
    for more in frames[1:]:
        out = out.unionByName(more, allowMissingColumns=True)
    return out


def sink_changes(changes: DataFrame, *, primary_key: Sequence[str], batch_id: int, generation: int = 0) -> DataFrame:
    """:func:`changelake.plan.physical.sink_changes` of a graph table's changes (``graph_sink_changes``):
    per key, in the order of the ``_seq`` the graph gave them (ties: batch order), ``_seq`` from the batch
    id and the change's rank in its key (after every earlier batch), and a key's last change, when
    it is a ``-U``, as a ``-D``. Only the order within a key matters to the sink; the collecting path
    numbers the changes across keys, so the ``_seq`` stored differs between the two, not its order."""
    key = [F.col("`" + k.replace("`", "``") + "`") for k in primary_key]
    ranked = with_position(changes)
    n = F.row_number().over(Window.partitionBy(*key).orderBy(F.col(SEQ), F.col(POSITION)))
    last = F.count(F.lit(1)).over(Window.partitionBy(*key))
    lone_retraction = (n == last) & (F.col(KIND) == int(RowKind.UPDATE_BEFORE))
    kind = F.when(lone_retraction, F.lit(int(RowKind.DELETE))).otherwise(F.col(KIND)).cast("byte")
    seq = F.concat(F.lit(f"b{commit_position(batch_id, generation):0{_SEQ_WIDTH}d}"), F.lpad(n.cast("string"), _SEQ_WIDTH, "0"))
    others = [F.col("`" + c.replace("`", "``") + "`") for c in changes.columns if c not in (KIND, SEQ)]
    return ranked.select(*others, kind.alias(KIND), seq.alias(SEQ))


def count_kinds(tables: Mapping[str, DataFrame], keys: Mapping[str, Sequence[str]]
                ) -> dict[str, tuple[dict[str, int], FrameChecks]]:
    """Each table's changes per kind (``+I`` ... ``-D``) and what its sink's ``validate_frame`` checks (rows
    per ``_kind`` code, NULLs in the key ``keys[table]`` and ``_seq``: :class:`FrameChecks`): one
    aggregation over all of them (which also fills their caches when they are persisted), a few numbers
    per table and kind to the driver. The sink then runs no aggregation of its own to validate."""
    if not tables:
        return {}
    columns = {name: checked_columns(keys[name]) for name in tables}
    width = max(len(c) for c in columns.values())
    parts = []
    for name, df in tables.items():
        nulls = [F.col(_bt(c)).isNull().cast("long") for c in columns[name]]
        nulls += [F.lit(0).cast("long")] * (width - len(nulls))
        parts.append(df.select(F.lit(name).alias("table"), F.col(KIND),
                               *[n.alias(f"n{i}") for i, n in enumerate(nulls)]))
    union = parts[0]
    for more in parts[1:]:
        union = union.unionAll(more)
    rows = union.groupBy("table", KIND).agg(F.count(F.lit(1)).alias("count"),
                                            *[F.sum(f"n{i}").alias(f"n{i}") for i in range(width)]).collect()
    out: dict[str, tuple[dict[str, int], FrameChecks]] = {}
    for name in tables:
        checks = checks_of([r for r in rows if r["table"] == name], columns[name])
        out[name] = {_LABEL[code]: n for code, n in checks.kinds.items() if code in _LABEL}, checks
    return out


def _bt(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class FramedBatch:
    """Where each framed table's payloads are in a batch: the routes of the mirrors (route -> table,
    its key and its rows' schema) and of the graph tables (``_route`` of the packed changes -> table,
    its key and its changes' schema)."""

    mirrors: dict[int, tuple[str, tuple[str, ...], pa.Schema]]
    graph: dict[int, tuple[str, tuple[str, ...], pa.Schema]]

    def framed_payload(self) -> Any:
        """A Column: the payload is a framed table's rows or changes (it stays on the executors)."""
        is_framed = F.lit(False)
        if self.mirrors:
            is_framed = is_framed | ((F.col("part") == ROWS_PART) & F.col("_route").isin(list(self.mirrors)))
        if self.graph:
            is_framed = is_framed | ((F.col("part") == CHANGES_PART) & F.col("_route").isin(list(self.graph)))
        return is_framed

    def keys(self) -> dict[str, tuple[str, ...]]:
        """Each framed table's primary key."""
        return {table: key for table, key, _ in (*self.mirrors.values(), *self.graph.values())}

    def tables(self, checked: DataFrame, present: set[tuple[int, str]], batch_id: int,
               generation: int = 0) -> dict[str, DataFrame]:
        """The framed tables that have payloads in the batch (``present``: their (route, part)), each as
        one DataFrame of changes (not yet persisted or counted)."""
        mirrors: dict[str, dict[int, pa.Schema]] = {}
        for route, (table, _, schema) in self.mirrors.items():
            if (route, ROWS_PART) in present:
                mirrors.setdefault(table, {})[route] = schema
        out = {table: typed_rows(checked, routes, ROWS_PART) for table, routes in mirrors.items()}
        for route, (table, key, schema) in self.graph.items():
            if (route, CHANGES_PART) in present:
                out[table] = sink_changes(typed_rows(checked, {route: schema}, CHANGES_PART), primary_key=key,
                                          batch_id=batch_id, generation=generation)
        return out
