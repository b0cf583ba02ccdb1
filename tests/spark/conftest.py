"""Fixtures of the Spark tier."""

from __future__ import annotations

import pytest

from changelake.service.pipeline import ROCKSDB_PROVIDER


@pytest.fixture
def rocksdb(spark):
    """The session ``spark`` with the RocksDB state store provider the stateful operators need."""
    old = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    yield spark
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", old)
