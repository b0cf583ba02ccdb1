"""Fixtures of the Spark tier."""

from __future__ import annotations

import pytest

from changelake.spark.query import ROCKSDB_PROVIDER


@pytest.fixture
def rocksdb(spark):
    """The session ``spark`` with the RocksDB state store provider the stateful operators need."""
    old = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    yield spark
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", old)


def write_micro_batch(table, directory, index: int) -> None:
    """Write ``table`` as the ``index``-th file of a file-source stream, read in that order.

    Spark's file source orders new files by modification time; files written within the same
    millisecond tie and come in listing order, so a later batch could be read first. Each file
    gets its own modification time, ``index`` seconds after a fixed base.
    """
    import os

    import pyarrow.parquet as pq

    path = directory / f"part-{index:03d}.parquet"
    pq.write_table(table, path)
    stamp = 1_700_000_000 + index
    os.utime(path, (stamp, stamp))


def run_to_end(df, collect, checkpoint):
    """Run the streaming ``df`` through ``foreachBatch(collect)`` with availableNow until it has read
    everything; fails the test on a timeout or a query error. Returns the finished query."""
    q = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(900), "the availableNow query did not finish"
    assert q.exception() is None
    return q
