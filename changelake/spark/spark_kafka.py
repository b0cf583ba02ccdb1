"""Spark's own Kafka source (spark-sql-kafka-0-10, ``kafka.reader: spark-kafka``) in front of the decode stage.

The ``python`` reader (:mod:`changelake.spark.kafka_source`) reads with librdkafka in a Python data source
and decodes in the same task. This reader lets Spark's JVM Kafka source read, then hands each task's
records to the same decode stage (or the chain's :class:`~changelake.spark.chain.RoutedStage`) with
``mapInArrow``, in the same executor task: the decoders, the dead letters (raw key and value, topic,
partition, offset, reason), the operator chain and the driver's batch processing are the ones of the
``python`` reader.

===================  ==================================================  ===================================
                     ``python`` reader                                   ``spark-kafka`` reader
===================  ==================================================  ===================================
offsets in the       ``{topic: {partition: next offset}}``               the same JSON (Spark's
checkpoint                                                               ``KafkaSourceOffset``): ``status``,
                                                                         the consumer group and the epoch
                                                                         states read both alike
read tasks           ``pipeline.read_tasks``, ranges packed into them    one per Kafka partition with records
admission            ``pipeline.max_records_per_batch``                  ``maxOffsetsPerTrigger`` (the same
                                                                         value unless ``kafka.spark_options``
                                                                         sets it)
offsets gone from    counted (``changelake_expired_offsets_skipped_       the query fails (Spark's
Kafka before read    total``), the batch goes on                         ``failOnDataLoss``, true unless
                                                                         ``kafka.spark_options`` says false)
a rebuilt            its first batch reads the mirrored tables'          refused (start the rebuild with the
checkpoint           snapshots                                           ``python`` reader)
client               librdkafka (``kafka.properties``)                   the Java consumer: ``kafka.properties``
                                                                         mapped (changelake/spark/
                                                                         spark_kafka_options.py), plus
                                                                         ``kafka.spark_options``
jars                 none                                                the ``spark-kafka`` JVM set on
                                                                         ``spark.jars`` (:func:`session_jars`)
===================  ==================================================  ===================================

Epoch states (``changelake.formats.sequence``): a task's first record says which partition it reads and from
where; the task reads that partition's state at that offset from the checkpoint (``sequenceState``), as the
``python`` reader's driver does when it plans the range. So the executors must reach the checkpoint (a local
master, a shared volume or an object store, as a cluster's checkpoint is anyway).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa

from changelake import jvm_deps
from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED, KafkaOptions, KafkaStreamReader
from changelake.spark.spark_kafka_options import replay_regex, spark_options

#: the JVM set (changelake/jvm_deps.py) holding spark-sql-kafka-0-10 and its dependencies
JVM_SET = "spark-kafka"
SPARK_FORMAT = "kafka"
READERS = ("python", "spark-kafka")


def session_jars() -> list[str]:
    """The jars a session needs for this reader (``spark.jars``); ``JvmDepsMissing`` saying how to install."""
    return [str(p) for p in jvm_deps.jars(JVM_SET)]


def source_options(reader_options: Mapping[str, str], properties: Mapping[str, str],
                   passthrough: Mapping[str, str]) -> dict[str, str]:
    """Spark's Kafka source options for a pipeline (``spark_kafka_options.spark_options``); starting offsets
    other than earliest/latest are resolved here, on the driver, as the ``python`` reader resolves them."""

    def resolve() -> dict[str, dict[str, int]]:
        reader = KafkaStreamReader(KafkaOptions.parse(reader_options))
        try:
            return reader.initialOffset()
        finally:
            reader.stop()

    return spark_options(reader_options, properties, passthrough, resolve_offsets=resolve)


def load(spark: Any, options: Mapping[str, str], reader_options: Mapping[str, str], stage: Any) -> Any:
    """The streaming DataFrame of ``stage``'s output (its ``spark_schema``, else the decode stage's payloads)
    over Spark's Kafka source with ``options`` (:func:`source_options`)."""
    from pyspark.sql import functions as F

    from changelake.spark.decode_stage import SPARK_SCHEMA

    records = spark.readStream.format(SPARK_FORMAT).options(**options).load()
    replay = replay_regex(reader_options)
    # headers cross into Python only for replay topics' records (their original positions)
    headers = F.when(F.col("topic").rlike(f"^(?:{replay})$"), F.col("headers")) if replay else \
        F.lit(None).cast("array<struct<key:string,value:binary>>")
    raw = records.select("topic", "partition", "offset",
                         F.when(F.col("timestampType") >= 0, F.unix_millis("timestamp")).alias("timestamp"),
                         "key", "value", headers.alias("headers"))
    opts = {k.lower(): v for k, v in reader_options.items()}
    task = ReadTask(stage, sequence_state=opts.get("sequencestate") or None, replay=replay,
                    pipeline=opts.get("replaypipeline") or "")
    return raw.mapInArrow(task, getattr(stage, "spark_schema", SPARK_SCHEMA))


class ReadTask:
    """``mapInArrow`` over one Spark Kafka task's records (one Kafka partition's range): the records as the
    ``python`` reader's batches (:data:`~changelake.spark.kafka_source.ARROW_SCHEMA`), through ``stage``."""

    def __init__(self, stage: Any, *, sequence_state: str | None, replay: str | None, pipeline: str) -> None:
        self.stage = stage
        self.sequence_state = sequence_state
        self.replay = replay
        self.pipeline = pipeline

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = (b for b in batches if b.num_rows)
        first = next(batches, None)
        if first is None:
            return
        begin = getattr(self.stage, "begin", None)
        if begin is not None:
            where = (first.column(0)[0].as_py(), first.column(1)[0].as_py())
            epochs = {}
            if self.sequence_state:
                from changelake.spark.checkpoint import epochs_at

                epochs = epochs_at(self.sequence_state, {where: first.column(2)[0].as_py()})
            begin(epochs)
        raw = (self.raw(b) for b in itertools.chain([first], batches))
        yield from self.stage(b for b in raw if b.num_rows)

    def raw(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Spark's records as :data:`ARROW_SCHEMA`; a replay topic's at the positions their headers name."""
        headers = batch.column(6)
        if headers.null_count < batch.num_rows:
            return replayed(batch, self.pipeline)
        n = batch.num_rows
        return pa.RecordBatch.from_arrays([
            batch.column(0).cast(pa.string()), batch.column(1).cast(pa.int32()), batch.column(2).cast(pa.int64()),
            batch.column(3).cast(pa.int64()), batch.column(4).cast(pa.binary()), batch.column(5).cast(pa.binary()),
            pa.array(np.zeros(n, dtype=np.int64))], schema=ARROW_SCHEMA)


def replayed(batch: pa.RecordBatch, pipeline: str) -> pa.RecordBatch:
    """Records of a replay topic (with their headers) at their original positions; those another pipeline
    replayed are left out (the rule of ``kafka_source._replayed_batch``, over Spark's header column)."""
    rows = []
    for rec in batch.to_pylist():
        h = {kv["key"]: (kv["value"] or b"").decode("utf-8", "replace") for kv in rec["headers"] or ()
             if kv["key"].startswith("changelake.")}
        if pipeline and h.get("changelake.pipeline", pipeline) != pipeline:
            continue
        topic, partition, original = h.get("changelake.topic"), h.get("changelake.partition"), \
            h.get("changelake.offset")
        if topic and partition and original and partition.isdigit() and original.isdigit():
            position = (topic, int(partition), int(original))
        else:
            position = (rec["topic"], rec["partition"], rec["offset"])
        rows.append({"topic": position[0], "partition": position[1], "offset": position[2],
                     "timestamp": rec["timestamp"], "key": rec["key"], "value": rec["value"], EXPIRED: 0})
    return pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMA)
