"""Decoding in the executors: the raw Kafka records of a micro-batch are decoded by
``mapInArrow`` in the Spark tasks, so the driver only merges.

One Spark row of the stage's output carries exactly one of:

* ``stats``: per topic-partition counts of one task (records read, offsets expired upstream);
* ``r<i>``: a changelog row of route ``i`` (its decoder's ``output_schema``, as a struct);
* ``dl``: a dead letter of route ``i`` (raw bytes, position, reason, error);
* ``raw``: a raw record of route ``i`` whose decoder learns its columns at run time
  (no ``columns`` configured): those are decoded on the driver.

``_route`` says which route the row belongs to (-1 for ``stats``).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.kafka_source import ARROW_SCHEMA, split_markers

ROUTE = "_route"
STATS = pa.struct([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                   pa.field("records", pa.int64()), pa.field("expired", pa.int64())])


def _nullable(schema_or_fields: Any) -> list[pa.Field]:
    return [pa.field(f.name, _nullable_type(f.type), nullable=True) for f in schema_or_fields]


def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct(_nullable(t))
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)     # what Spark hands back for TIMESTAMP
    return t


class DecodeStage:
    """Built on the driver from the routes; pickled into every task."""

    def __init__(self, routes: Sequence[Any]) -> None:
        self.routes = list(routes)
        fields = [pa.field(ROUTE, pa.int16()), pa.field("stats", STATS),
                  pa.field("raw", pa.struct(_nullable(ARROW_SCHEMA))),
                  pa.field("dl", pa.struct(_nullable(DEAD_LETTER_SCHEMA)))]
        self.executor_routes: dict[int, pa.Schema] = {}
        for i, route in enumerate(self.routes):
            schema = getattr(route.decoder, "output_schema", None)
            if schema is not None:
                self.executor_routes[i] = schema
                fields.append(pa.field(f"r{i}", pa.struct(_nullable(schema))))
        self.schema = pa.schema(fields)

    def spark_schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema
        return from_arrow_schema(self.schema, prefer_timestamp_ntz=False)

    # --- executor side -----------------------------------------------------
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch]).cast(ARROW_SCHEMA)
            records, expired = split_markers(table)
            yield from self._stats(records, expired)
            topics = records["topic"]
            present = pc.unique(topics).to_pylist()
            for i, route in enumerate(self.routes):
                names = [t for t in present if route.matches(t)]
                if not names:
                    continue
                mine = records.filter(pc.is_in(topics, pa.array(names, pa.string())))
                if i not in self.executor_routes:
                    raw = table.filter(pc.is_in(table["topic"], pa.array(names, pa.string())))
                    raw = raw.filter(pc.greater_equal(raw["offset"], 0))
                    yield self._wrap(i, "raw", raw)
                    continue
                result = route.decoder.decode(mine)
                if result.rows.num_rows:
                    yield self._wrap(i, f"r{i}", result.rows)
                if result.dead_letters.num_rows:
                    yield self._wrap(i, "dl", result.dead_letters.cast(DEAD_LETTER_SCHEMA))

    def _stats(self, records: pa.Table, expired: dict[tuple[str, int], int]) -> Iterator[pa.RecordBatch]:
        counts: dict[tuple[str, int], int] = {}
        if records.num_rows:
            grouped = records.group_by(["topic", "partition"]).aggregate([("offset", "count")])
            for t, p, n in zip(grouped["topic"].to_pylist(), grouped["partition"].to_pylist(),
                               grouped["offset_count"].to_pylist()):
                counts[(t, p)] = n
        keys = sorted(set(counts) | set(expired))
        if not keys:
            return
        stats = pa.StructArray.from_arrays(
            [pa.array([k[0] for k in keys], pa.string()), pa.array([k[1] for k in keys], pa.int32()),
             pa.array([counts.get(k, 0) for k in keys], pa.int64()),
             pa.array([expired.get(k, 0) for k in keys], pa.int64())], fields=list(STATS))
        yield self._batch(-1, {"stats": stats}, len(keys))

    def _wrap(self, route: int, column: str, table: pa.Table) -> pa.RecordBatch:
        target = self.schema.field(column).type
        casted = table.select([f.name for f in target]).cast(pa.schema(list(target)))
        struct = pa.StructArray.from_arrays([casted[f.name].combine_chunks() for f in target], fields=list(target))
        return self._batch(route, {column: struct}, table.num_rows)

    def _batch(self, route: int, columns: dict[str, pa.Array], n: int) -> pa.RecordBatch:
        arrays = [pa.array([route] * n, pa.int16())]
        for f in self.schema:
            if f.name == ROUTE:
                continue
            arrays.append(columns[f.name] if f.name in columns else pa.nulls(n, f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    # --- driver side -------------------------------------------------------
    def split(self, out: pa.Table) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[int, dict[str, pa.Table]]]:
        """The collected stage output -> (stats per partition, per route: rows / dead_letters / raw)."""
        route = out[ROUTE]
        stats: dict[tuple[str, int], tuple[int, int]] = {}
        st = out.filter(pc.equal(route, -1))["stats"].to_pylist()
        for s in st:
            k = (s["topic"], s["partition"])
            r, e = stats.get(k, (0, 0))
            stats[k] = (r + s["records"], e + s["expired"])
        parts: dict[int, dict[str, pa.Table]] = {}
        for i in range(len(self.routes)):
            mine = out.filter(pc.equal(route, i))
            if mine.num_rows == 0:
                continue
            got: dict[str, pa.Table] = {}
            for column, schema in (("raw", ARROW_SCHEMA), ("dl", DEAD_LETTER_SCHEMA),
                                   (f"r{i}", self.executor_routes.get(i))):
                if schema is None:
                    continue
                sel = mine.filter(pc.is_valid(mine[column]))
                if sel.num_rows:
                    flat = pa.Table.from_batches(
                        [pa.RecordBatch.from_struct_array(chunk) for chunk in sel[column].chunks if len(chunk)])
                    got[column] = flat.cast(schema)
            parts[i] = got
        return stats, parts
