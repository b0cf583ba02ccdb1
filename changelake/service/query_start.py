"""How a pipeline's streaming query starts: the options of its Kafka source, its consumer group, the
checkpoint's checks (``service.lifecycle``) and, for ``--rebuild-views``, the mirrored tables' snapshots.

:func:`start_query` starts one :class:`~changelake.service.pipeline.BatchProcessor`'s query
(:mod:`changelake.spark.query`); a pipeline of two queries (``service.split``) calls it once per query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from changelake.errors import ConfigError
from changelake.service.config import ChangelakeConfig, StartingTimestamp, parse_duration
from changelake.service.preflight import pattern_without_side_topics

if TYPE_CHECKING:
    from changelake.service.pipeline import BatchProcessor


def consumer_group(config: ChangelakeConfig) -> str:
    """The Kafka consumer group that receives each batch's end offsets once its Delta commits are done:
    stable for a pipeline id, so kafka-consumer-groups and Burrow follow its lag across restarts."""
    return f"changelake.{config.pipeline.id}"


def kafka_reader_options(config: ChangelakeConfig) -> dict[str, str]:
    """Options of the one Kafka source that feeds every configured source."""
    opts: dict[str, str] = {"bootstrap.servers": config.kafka.bootstrap_servers}
    # a pattern never reads Debezium's transaction-metadata topics (changelake.service.preflight)
    patterns = [pattern_without_side_topics(s.topic_pattern) for s in config.sources if s.topic_pattern]
    topics = sorted({t for s in config.sources for t in (s.topics or ())} |
                    ({s.transaction_topic_name() for s in config.sources} - {None}))
    if patterns:
        alternatives = patterns + [re.escape(t) for t in topics]
        opts["topicPattern"] = "|".join(f"(?:{p})" for p in alternatives)
    else:
        opts["topics"] = ",".join(topics)
    starting: dict[str, Any] = {}
    for s in config.sources:
        for t in s.topics or ():
            if isinstance(s.starting_offsets, StartingTimestamp):
                starting[t] = {"timestamp": s.starting_offsets.epoch_ms}
            elif isinstance(s.starting_offsets, dict):
                starting[t] = s.starting_offsets.get(t, "earliest")
            else:
                starting[t] = s.starting_offsets
        txn_topic = s.transaction_topic_name()
        if txn_topic is not None and not isinstance(s.starting_offsets, dict):
            # ENDs of transactions whose changes are never read would keep every later one waiting
            starting[txn_topic] = starting[(s.topics or [txn_topic])[0]] if s.topics else "earliest"
    if any(v != "earliest" for v in starting.values()):
        opts["startingOffsets"] = json.dumps(starting)
    opts["replayTopics"] = "|".join(f"(?:{s.replay_topic_regex()})" for s in config.sources)
    opts["replayPipeline"] = config.pipeline.id
    skipping = [s.topic_regex() for s in config.sources if s.on_data_loss == "skip"]
    if skipping:
        opts["skipDataLoss"] = "|".join(f"(?:{rx})" for rx in skipping)
    opts["readTasks"] = str(config.pipeline.read_tasks)
    opts["sequenceState"] = config.pipeline.checkpoint     # the partitions' epoch states (service.epochs)
    if config.pipeline.max_records_per_batch:
        opts["maxRecordsPerTrigger"] = str(config.pipeline.max_records_per_batch)
        first = config.pipeline.first_admission()
        if first < config.pipeline.max_records_per_batch:
            opts["firstRecordsPerTrigger"] = str(first)
    for k, v in config.kafka.plain_properties().items():
        opts[f"kafka.{k}"] = v
    return opts


def start_query(spark: Any, config: ChangelakeConfig, processor: BatchProcessor, *,
                available_now: bool | None = None, rebuild_views: bool = False,
                writes: Callable[[str], bool] | None = None, recorded: Mapping[str, int] | None = None) -> Any:
    """Start ``processor``'s streaming query (:mod:`changelake.spark.query`); returns Spark's StreamingQuery.
    ``rebuild_views``: changed views start from the mirrored tables (``changelake.service.rebuild``);
    ``writes``: the tables the query writes, when the pipeline runs two (``service.split``); ``recorded``: the
    positions the start's check already read from the Delta logs (``service.runner.refuse_bad_start``)."""
    from changelake.spark.query import PipelineQuery, start

    from changelake.service.lifecycle import prepare
    from changelake.spark.compile import DEFAULT_BUCKETS

    once = config.pipeline.available_now if available_now is None else available_now
    if rebuild_views and processor.driver_graph is not None:
        raise ConfigError("--rebuild-views starts changed views from the mirrored tables on the executors, but with "
                          "consistency: transaction the views run on the driver behind the transaction gate, which "
                          "cannot be rebuilt that way yet; run without --rebuild-views with a new checkpoint (the "
                          "views recompute from the sources' starting offsets)")
    begun = prepare(config, processor.plan, buckets=processor.buckets, default_buckets=DEFAULT_BUCKETS,
                    rebuild_views=rebuild_views, writes=writes, app_suffix=processor.query_name, positions=recorded)
    processor.start_generation(begun.generation, sorted(begun.replaced))
    options = kafka_reader_options(config)
    if begun.rebuild is not None:
        if config.kafka.reader == "spark-kafka":
            raise ConfigError("the views changed, so their checkpoint is rebuilt from the mirrored tables, whose first "
                              "batch only kafka.reader: python can read (it adds the tables' snapshots to the Kafka "
                              "ranges); run once with kafka.reader: python until the first batch is done, then switch "
                              "back (both readers keep the same offsets in the checkpoint)")
        options.update(_rebuild_options(config, processor, begun.rebuild))
    spark_kafka = None
    if config.kafka.reader == "spark-kafka":     # Spark's own Kafka source (changelake.spark.spark_kafka)
        from changelake.spark.spark_kafka import source_options

        spark_kafka = source_options(options, config.kafka.plain_properties(), config.kafka.plain_spark_options())
    processor.query = PipelineQuery(processor, read_tasks=config.pipeline.read_tasks)
    return start(spark, processor.query, name=config.pipeline.id + processor.query_name,
                 checkpoint=config.pipeline.checkpoint,
                 reader_options=options, available_now=once,
                 trigger_seconds=parse_duration(config.pipeline.trigger_interval),
                 group_id=consumer_group(config) + processor.query_name, spark_kafka_options=spark_kafka)


def _rebuild_options(config: ChangelakeConfig, processor: BatchProcessor, rebuild: Any) -> dict[str, str]:
    """A rebuilt checkpoint (``changelake.service.rebuild``): its sources start at the old checkpoint's offsets,
    and its first batch feeds the mirrored tables' snapshots to the graph (``processor.snapshots``)."""
    from changelake.connectors.delta_read import TableSnapshot
    from changelake.service.rebuild import reader_options

    options = config.storage.plain_options()
    processor.snapshots = {i: TableSnapshot(config.table_path(processor.routes[i].spec.table),
                                            rebuild.tables[processor.routes[i].spec.name], dict(options))
                           for i in processor.graph_routes}
    return {**reader_options(rebuild), "snapshotRoutes": ",".join(str(i) for i in sorted(processor.snapshots))}
