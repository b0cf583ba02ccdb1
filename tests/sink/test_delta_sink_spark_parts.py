"""The parts of the delta-spark engine that run without the Delta jars.

The engine's MERGE needs the jars (absent here; the behavioural suite runs on it
where they are present). What is checked here: its Arrow-to-Spark conversion, that
its merge clauses are valid Spark SQL selecting the intended rows, that the
transaction id settings stay inside its private session, and that its steps name
their Spark jobs.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyspark.sql.functions import expr

from changelake.connectors.delta_sink import TableSpec
from changelake.connectors.delta_sink_merge import backtick, spark_null_safe_equal, table_merge
from changelake.spark.delta_sink import (
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    DeltaSparkSink,
    described,
    expired_before,
)

from .tables import seq

pytestmark = pytest.mark.spark


@pytest.fixture
def spark_sink(spark, tmp_path, clock):
    spec = TableSpec(name="parts", path=str(tmp_path / "t"), primary_key=("Region", "order id"))
    return DeltaSparkSink(spec, pipeline_id="p", spark=spark, clock=clock, max_commit_retries=0)


def test_arrow_batches_become_spark_frames_with_delta_compatible_types(spark_sink):
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    table = pa.table({"Region": ["eu"], "order id": pa.array([1], pa.int64()),
                      "_seq": [seq(1)], "_source_ts": pa.array([ts], pa.timestamp("us", tz="UTC")),
                      "_kind": pa.array([2], pa.int8())})
    frame = spark_sink._frame(table)
    assert frame.dtypes == [("Region", "string"), ("order id", "bigint"), ("_seq", "string"),
                            ("_source_ts", "timestamp"), ("_kind", "tinyint")]
    assert frame.first()["_source_ts"] == datetime(2026, 1, 2, 3, 4, 5)  # session time zone is UTC


def test_merge_clauses_are_valid_spark_sql_and_select_the_intended_rows(spark_sink):
    keys = spark_sink.spec.primary_key
    clauses = table_merge(keys, ["Region", "order id", "_seq"], backtick)
    target = spark_sink._frame(pa.table({"Region": ["eu", "eu", "us"], "order id": [1, 2, 3],
                                         "_seq": [seq(5), seq(5), seq(5)]}))
    source = spark_sink._frame(pa.table({
        "Region": ["eu", "eu", "us", "us"], "order id": [1, 2, 3, 4],
        "_seq": [seq(6), seq(4), seq(9), seq(1)], "_kind": pa.array([2, 2, 3, 0], pa.int8())}))
    matched = target.alias("t").join(source.alias("s"), on=expr(clauses.on))
    unmatched = source.alias("s").join(target.alias("t"), on=expr(clauses.on), how="left_anti")

    def ids(frame):
        return sorted(r["order id"] for r in frame.select("s.`order id`").collect())

    assert ids(matched) == [1, 2, 3]
    assert ids(matched.where(clauses.update_when)) == [1]
    assert ids(matched.where(clauses.delete_when)) == [3]
    assert ids(unmatched.where(clauses.insert_when)) == [4]
    updated = matched.where(clauses.update_when).select(
        *[expr(value).alias(column.strip("`")) for column, value in clauses.update_set.items()])
    assert [tuple(r) for r in updated.collect()] == [("eu", 1, seq(6))]


def test_the_null_safe_merge_condition_matches_a_null_region_with_a_null_region_only(spark_sink):
    clauses = table_merge(spark_sink.spec.primary_key, ["Region", "order id", "_seq"], backtick,
                          nullable={"Region": pa.string()}, null_safe_equal=spark_null_safe_equal)
    target = spark_sink._frame(pa.table({"Region": pa.array([None, "eu", None], pa.string()), "order id": [1, 1, 2],
                                         "_seq": [seq(5)] * 3}))
    source = spark_sink._frame(pa.table({"Region": pa.array([None, None, "eu"], pa.string()), "order id": [1, 3, 2],
                                         "_seq": [seq(6)] * 3, "_kind": pa.array([2, 0, 2], pa.int8())}))
    pairs = target.alias("t").join(source.alias("s"), on=expr(clauses.on)).select("t.Region", "t.`order id`")
    assert [tuple(r) for r in pairs.collect()] == [(None, 1)]


def test_transaction_settings_stay_in_the_private_session_of_the_table_written(spark, spark_sink):
    table, tombstones = spark_sink._session, spark_sink._tomb_session
    with spark_sink._txn(7, spark_sink.spec.path):
        assert table.conf.get(TXN_APP_ID_CONF) == "changelake:p:parts"
        assert table.conf.get(TXN_VERSION_CONF) == "7"
        assert spark.conf.get(TXN_VERSION_CONF, None) is None
        # the tombstone MERGE, running beside the table's, must not commit with the table's txn
        assert tombstones.conf.get(TXN_VERSION_CONF, None) is None
    assert table.conf.get(TXN_VERSION_CONF, None) is None
    with spark_sink._txn(8, spark_sink.tombstone_path):
        assert tombstones.conf.get(TXN_VERSION_CONF) == "8"
        assert table.conf.get(TXN_VERSION_CONF, None) is None
    assert tombstones.conf.get(TXN_VERSION_CONF, None) is None


def test_expiry_predicate_selects_tombstones_older_than_the_cutoff(spark_sink):
    moments = [datetime(2026, 1, d, 12, tzinfo=timezone.utc) for d in (1, 2, 3)]
    frame = spark_sink._frame(pa.table({"id": [1, 2, 3],
                                        "_deleted_at": pa.array(moments, pa.timestamp("us", tz="UTC"))}))
    cutoff = datetime(2026, 1, 2, 12, tzinfo=timezone.utc)
    assert sorted(r["id"] for r in frame.where(expired_before(cutoff)).collect()) == [1]


def test_sink_steps_name_their_spark_jobs_and_give_back_the_description_they_found(spark):
    """The Spark UI and the event log show which step of a sink's batch ran a job (bench/spark_timing.py
    lists them by this name); the query's own description comes back after the step, also on an error."""
    context = spark.sparkContext
    key = "spark.job.description"
    with described(spark, "orders", "validate"):
        alone = context.getLocalProperty(key)
    assert alone == "changelake orders: validate"
    assert context.getLocalProperty(key) is None
    context.setJobDescription("pipeline p, batch 3")
    try:
        with pytest.raises(RuntimeError):
            with described(spark, "orders", "table MERGE"):
                inside = context.getLocalProperty(key)
                raise RuntimeError("the MERGE failed")
        assert inside == "changelake orders: table MERGE\npipeline p, batch 3"
        assert context.getLocalProperty(key) == "pipeline p, batch 3"
    finally:
        context.setJobDescription(None)
