"""With ``storage.engine: delta-spark`` a batch's rows never pass through the driver (issue #28).

The driver receives what its tasks return: Spark records each task's serialized result (``resultSize``:
collected rows, Arrow batches, the write tasks' file lists, accumulator updates), and the status store
sums it per stage. The test counts, per micro-batch, the result bytes of the stages that batch ran (in
this test process's Spark session, whose class path holds the delta JVM set) for the demo's three
mirrors, over a small and a ten times larger history of the same tables, each read in one batch:

- delta-spark: ``DeltaSparkSink.apply_frame`` runs (the tables are framed, and Delta for Spark wrote
  their commits); the driver's bytes stay those of a small batch (tasks, files, counts), not the rows;
- delta-rs on the larger history: the batch is collected, and the driver's bytes grow with its rows
  (which shows that the count sees rows when they come).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from changelake.service.demo import demo_config, verify
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.spark.delta_sink import DeltaSparkSink
from changelake.spark.query import PipelineQuery

from .helpers import write_history

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

MIRRORS = ("customers", "products", "orders")


class DriverBytes:
    """The result bytes the driver received from the stages that ran since the last call (Spark's status
    store, once its listener caught up)."""

    def __init__(self, spark) -> None:
        self.sc = spark.sparkContext._jsc.sc()
        self.seen = self._stages()

    def _stages(self) -> dict[int, int]:
        """Stage id -> result bytes of every stage the store holds (it keeps the last 1,000)."""
        self.sc.listenerBus().waitUntilEmpty()
        empty = _java_list()
        stages = self.sc.statusStore().stageList(empty, False, False, _double_array(), empty)
        return {int(stages.apply(i).stageId()): int(stages.apply(i).resultSize()) for i in range(stages.size())}

    def since_last(self) -> int:
        now = self._stages()
        new = sum(size for stage, size in now.items() if stage not in self.seen)
        self.seen = now
        return new


def _java_list():
    from pyspark import SparkContext

    return SparkContext._jvm.java.util.ArrayList()


def _double_array():
    from pyspark import SparkContext

    return SparkContext._gateway.new_array(SparkContext._jvm.double, 0)


def _config(servers: str, workdir: Path, prefix: str, engine: str):
    import yaml

    from changelake.service.config import parse_config

    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"it-{workdir.name}",
                      max_records_per_batch=1_000_000, views=False)
    for source in raw["sources"]:
        source["topics"] = [t.replace("dbserver1", prefix, 1) for t in source["topics"]]
    raw["storage"]["engine"] = engine
    for table in raw["tables"]:     # no VACUUM (due at a sink's first batch): ~60 Spark jobs per table with delta-spark
        table["maintenance"] = {"vacuum_every": None}
    raw["pipeline"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2"}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path))


def _run(spark, config, monkeypatch) -> tuple[BatchProcessor, dict[int, int]]:
    """Runs ``config`` to the end of its topics; returns the processor and the driver's bytes per batch."""
    meter = DriverBytes(spark)
    per_batch: dict[int, int] = {}
    original = PipelineQuery.__call__

    def measured(query, batch_df, batch_id):
        original(query, batch_df, batch_id)
        per_batch[batch_id] = meter.since_last()

    monkeypatch.setattr(PipelineQuery, "__call__", measured)
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    monkeypatch.setattr(PipelineQuery, "__call__", original)
    return processor, per_batch


def test_delta_spark_batches_stay_on_the_executors_and_the_driver_bytes_do_not_grow_with_rows(
        spark, kafka, tmp_path, monkeypatch):
    runs = {}
    for name, changes, sizes in (("small", 150, {"customers": 20, "products": 20, "orders": 40}),
                                 ("large", 1_500, {"customers": 200, "products": 200, "orders": 400})):
        prefix = kafka.topic(f"funnel-{name}")
        db = write_history(kafka.bootstrap_servers, seed=41, changes=changes, topic_prefix=prefix, redeliver=10,
                           sizes=sizes)
        runs[name] = (db, prefix)

    measured = {}
    for name, engine in (("small", "delta-spark"), ("large", "delta-spark"), ("large", "delta-rs")):
        db, prefix = runs[name]
        config = _config(kafka.bootstrap_servers, tmp_path / f"{name}-{engine}", prefix, engine)
        calls = []
        original_apply_frame = DeltaSparkSink.apply_frame

        def apply_frame(sink, *args, **kwargs):
            calls.append(sink.spec.name)
            return original_apply_frame(sink, *args, **kwargs)

        monkeypatch.setattr(DeltaSparkSink, "apply_frame", apply_frame)
        processor, per_batch = _run(spark, config, monkeypatch)
        monkeypatch.setattr(DeltaSparkSink, "apply_frame", original_apply_frame)
        assert verify(config, db.state) == {t: "ok" for t in MIRRORS}
        assert list(per_batch) == [0], per_batch          # the whole history in one batch
        measured[(name, engine)] = per_batch[0]
        if engine == "delta-spark":
            assert sorted(processor.framed_tables()) == sorted(MIRRORS)
            assert sorted(calls) == sorted(MIRRORS)       # DeltaSparkSink.apply_frame ran, once per table
            writers = {str(c.get("engineInfo", "delta-rs")).split("/")[0] for t in MIRRORS
                       for c in DeltaTable(config.table_path(t)).history() if c.get("operation") == "MERGE"}
            assert writers == {"Apache-Spark"}, writers
        else:
            assert calls == [] and not processor.framed_tables()

    small, large, collected = (measured[("small", "delta-spark")], measured[("large", "delta-spark")],
                               measured[("large", "delta-rs")])
    print(f"driver bytes per batch: delta-spark {small} (small history), {large} (10x rows); "
          f"delta-rs {collected} (10x rows)")
    # ten times the rows: the same tasks, files and counts reach the driver, give or take Spark's own figures
    assert large <= 1.25 * small + 64 * 1024, measured
    # the collecting engine receives the rows themselves (~2,300 records, about 100 KB of Arrow here): the
    # count sees them (measured: 724,741 and 723,931 bytes with delta-spark, 822,127 with delta-rs)
    assert collected >= large + 48 * 1024, measured
