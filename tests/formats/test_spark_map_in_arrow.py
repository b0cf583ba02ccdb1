"""A decoder shipped to Spark's Python workers (pickled, run inside mapInArrow)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.formats import make_decoder
from changelake.formats.sqltypes import sql_schema
from tests.formats.helpers import change, records

pytestmark = pytest.mark.spark


def test_debezium_json_decoder_runs_in_map_in_arrow(spark) -> None:
    """On the test process's one session (tests/conftest.py; its Python workers run this interpreter),
    not a session of its own: starting and stopping one cost seconds, and a JVM started here would
    have been the one every later Spark test ran in, without the session's settings."""
    from pyspark.sql.pandas.types import from_arrow_schema

    columns = sql_schema([("id", "BIGINT NOT NULL"), ("name", "STRING"), ("price", "DOUBLE")])
    decoder = make_decoder("debezium-json", columns=columns, options={"metadata": ["source.table"]})
    values = [change("c", after={"id": i, "name": f"n{i}", "price": i / 2}) for i in range(200)]
    values += [change("u", before={"id": 1, "name": "n1", "price": 0.5}, after={"id": 1, "name": "x", "price": 9.0}),
               b"not json", None]
    raw = records(values)
    expected = decoder.decode(raw).rows

    # Spark's Arrow exchange takes timestamps in microseconds only (the contract's _source_ts is ms)
    spark_schema = pa.schema([pa.field(f.name, pa.timestamp("us", tz=f.type.tz), f.nullable)
                              if pa.types.is_timestamp(f.type) else f for f in decoder.output_schema])

    def decode(batches):
        for batch in batches:
            rows = decoder.decode(pa.Table.from_batches([batch])).rows
            yield from rows.cast(spark_schema).to_batches()

    df = spark.createDataFrame(raw).repartition(2)
    out = df.mapInArrow(decode, from_arrow_schema(spark_schema))
    got = pa.Table.from_batches(out._collect_as_arrow())
    key = ["_offset", "_kind"]
    assert got.num_rows == expected.num_rows == 202
    assert got.select(["id", "name", "price", "source.table", "_kind", "_seq", "_offset"]).sort_by(
        [(k, "ascending") for k in key]).to_pylist() == expected.select(
        ["id", "name", "price", "source.table", "_kind", "_seq", "_offset"]).sort_by(
        [(k, "ascending") for k in key]).to_pylist()
