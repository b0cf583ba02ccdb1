"""A local checkpoint is written through Spark's FileSystem-based manager, not Hadoop's FileContext,
whose local filesystem starts a ``readlink`` process per file status (changelake/spark/checkpoint.py)."""

from __future__ import annotations

import pytest

from changelake.spark.checkpoint import FILE_MANAGER, LOCAL_FILE_MANAGER, is_local, use_local_file_manager

pytestmark = pytest.mark.spark


def _manager_spark_uses(spark, checkpoint: str) -> str:
    """The class of the checkpoint file manager a query started now gets: Spark builds it from the
    session's Hadoop configuration, as StreamExecution and the state stores do."""
    jvm = spark._jvm
    hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
    managers = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return managers.create(jvm.org.apache.hadoop.fs.Path(checkpoint), hadoop_conf).getClass().getName()


@pytest.mark.unit
@pytest.mark.parametrize("uri, local", [
    ("/var/lib/changelake/checkpoint", True), ("checkpoints/orders", True), ("file:///tmp/ck", True),
    ("FILE:/tmp/ck", True), ("s3a://bucket/ck", False), ("hdfs://nn:8020/ck", False),
    ("abfss://c@acct.dfs.core.windows.net/ck", False), ("gs://bucket/ck", False)])
def test_local_checkpoints_are_told_from_remote_ones(uri, local):
    assert is_local(uri) is local


def test_a_local_checkpoint_gets_the_filesystem_manager_and_a_remote_one_keeps_the_default(spark, tmp_path):
    try:
        assert use_local_file_manager(spark, str(tmp_path / "ck"))
        assert _manager_spark_uses(spark, f"file://{tmp_path}/ck") == LOCAL_FILE_MANAGER
        # a later query of the same session over HDFS or an object store: Spark's default again
        assert not use_local_file_manager(spark, "hdfs://namenode:8020/ck")
        assert spark.conf.get(FILE_MANAGER, None) is None
        assert _manager_spark_uses(spark, f"file://{tmp_path}/ck") != LOCAL_FILE_MANAGER
    finally:
        spark.conf.unset(FILE_MANAGER)


def test_a_stateful_query_resumes_from_a_checkpoint_written_through_it(spark, tmp_path):
    """The RocksDB state store and the offset and commit logs, written through the FileSystem-based
    manager, are read back by a restarted query: its counts go on from the first run's."""
    from pyspark.sql import functions as F

    checkpoint = str(tmp_path / "ck")
    source = tmp_path / "in"
    source.mkdir()
    seen: list[dict[str, int]] = []

    def collect(df, _batch_id):
        seen.append({r["k"]: r["n"] for r in df.collect()})

    def run_once(lines: list[str], name: str) -> None:
        (source / name).write_text("\n".join(lines) + "\n")
        stream = (spark.readStream.format("text").load(str(source))
                  .groupBy(F.col("value").alias("k")).agg(F.count("*").alias("n")))
        query = (stream.writeStream.outputMode("update").foreachBatch(collect)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()

    provider = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(provider, None)
    spark.conf.set(provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:
        assert use_local_file_manager(spark, checkpoint)
        run_once(["a", "b", "a"], "1.txt")
        run_once(["a", "c"], "2.txt")           # a second query on the same checkpoint, as after a restart
    finally:
        spark.conf.unset(FILE_MANAGER)
        if before is None:
            spark.conf.unset(provider)
        else:
            spark.conf.set(provider, before)
    assert seen == [{"a": 2, "b": 1}, {"a": 3, "c": 1}]
