"""The Spark session changelake runs in."""

from __future__ import annotations

import glob
import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

_DELTA_JAR_GLOB = "delta-spark_*.jar"


def delta_jars_on_classpath() -> bool:
    """True when the Delta Lake jars (delta-spark + delta-storage) are in Spark's jar directory."""
    import pyspark

    jar_dirs = [os.path.join(os.path.dirname(pyspark.__file__), "jars")]
    if os.environ.get("SPARK_HOME"):
        jar_dirs.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    return any(glob.glob(os.path.join(d, _DELTA_JAR_GLOB)) for d in jar_dirs)


def build_session(*, app_name: str = "changelake", master: str = "local[2]",
                  conf: Mapping[str, str] | None = None, ui: bool = True) -> SparkSession:
    """A Spark session for one pipeline.

    Python workers use this interpreter (so executors see the same packages),
    timestamps are UTC, and Delta's SQL extensions are enabled when its jars are present.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.appName(app_name).master(master)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.ui.showConsoleProgress", "false")
               # A micro-batch's decoded rows are collected on the driver: 1 GB (Spark's default) is too small
               # for 250k-record batches. Overridden by pipeline.spark_conf["spark.driver.memory"].
               .config("spark.driver.memory", "2g")
               .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
               # Python workers connect back to the JVM; on a loaded 2-core machine 15 s (the default) is not enough
               .config("spark.python.authenticate.socketTimeout", "120s"))
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    if delta_jars_on_classpath():
        builder = (builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                   .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    conf = dict(conf or {})
    # Every stateful operator runs one task per shuffle partition per micro-batch, and each task starts
    # its Python runners: on local[N], N partitions (one wave of tasks) halved the demo graph's time per
    # batch of 1,000 records against 4 on 2 cores (bench/batch_latency.py). A checkpoint keeps the count
    # it was created with; a value the user sets wins.
    conf.setdefault("spark.sql.shuffle.partitions", str(local_cores(master) or 4))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def local_cores(master: str) -> int | None:
    """The worker threads of a ``local[N]`` / ``local[*]`` / ``local`` master (None for any other master)."""
    if master == "local":
        return 1
    if master.startswith("local[") and master.endswith("]"):
        n = master[6:-1].split(",")[0]
        if n == "*":
            return os.cpu_count() or 1
        return int(n) if n.isdigit() else None
    return None
