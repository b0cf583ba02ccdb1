"""Spark reads what the delta-rs engine wrote.

The Delta jars are not assumed: Spark's plain parquet reader reads exactly the
files the table's log lists (``DeltaTable.file_uris()``), which is the table's
current state when the engine writes no deletion vectors.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from changelake.connectors.delta_sink import TableSpec
from changelake.spark.delta_sink import open_sink

from .tables import changes, read_rows, seq

pytestmark = pytest.mark.spark


def _ts(ms: int) -> pa.Array:
    return pa.array([ms], pa.timestamp("ms", tz="UTC"))


def test_spark_parquet_reader_sees_exactly_the_live_rows(spark, tmp_path):
    sink = open_sink(TableSpec(name="interop", path=str(tmp_path / "interop"), primary_key=("id",)),
                     pipeline_id="p", engine="delta-rs")
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b"), ("+I", 3, 1, "c")],
                       extra={"qty": pa.array([1, 2, 3], pa.int32())}), batch_id=0)
    later = changes([("+U", 1, 2, "a2"), ("-D", 2, 2, None)], extra={"qty": pa.array([10, None], pa.int32())})
    later = later.append_column("_source_ts", pa.concat_arrays([_ts(1_700_000_000_000), _ts(0)]))
    sink.apply(later, batch_id=1)

    files = DeltaTable(sink.spec.path).file_uris()
    df = spark.read.parquet(*files)
    assert dict(df.dtypes) == {"id": "bigint", "v": "string", "qty": "int", "_seq": "string",
                               "_source_ts": "timestamp"}
    rows = sorted(tuple(r) for r in df.select("id", "v", "qty", "_seq", "_source_ts").collect())
    assert rows == [
        (1, "a2", 10, seq(2), datetime(2023, 11, 14, 22, 13, 20)),  # session time zone is UTC
        (3, "c", 3, seq(1), None),
    ]


def test_spark_reads_partitioned_output_with_partition_discovery(spark, tmp_path):
    path = str(tmp_path / "parted")
    sink = open_sink(TableSpec(name="parted", path=path, primary_key=("id",), partition_by=("region",)),
                     pipeline_id="p", engine="delta-rs")
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")],
                       extra={"region": pa.array(["eu", "us"])}), batch_id=0)
    sink.apply(changes([("+U", 2, 2, "b2")], extra={"region": pa.array(["eu"])}), batch_id=1)
    df = spark.read.option("basePath", path).parquet(*DeltaTable(path).file_uris())
    assert sorted(tuple(r) for r in df.select("id", "v", "region").collect()) == [(1, "a", "eu"), (2, "b2", "eu")]


def test_a_spark_micro_batch_converted_with_toArrow_is_accepted(spark, tmp_path):
    """What the pipeline does in foreachBatch: ``sink.apply(batch_df.toArrow(), batch_id=...)``."""
    batch = changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b"), ("-U", 1, 2, "a"), ("+U", 1, 2, "a2")])
    batch = batch.append_column("_source_ts", pa.array([1_700_000_000_000] * 4, pa.timestamp("ms", tz="UTC")))
    batch_df = spark.createDataFrame(batch)
    sink = open_sink(TableSpec(name="from_spark", path=str(tmp_path / "from_spark"), primary_key=("id",)),
                     pipeline_id="p", engine="delta-rs")
    result = sink.apply(batch_df.toArrow(), batch_id=0)
    assert (result.committed, result.upserts) == (True, 2)
    rows = read_rows(sink.spec.path, columns='id, v, "_seq", "_source_ts"')
    assert [(r["id"], r["v"], r["_seq"]) for r in rows] == [(1, "a2", seq(2)), (2, "b", seq(1))]
    assert rows[0]["_source_ts"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
