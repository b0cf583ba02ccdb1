"""The Kafka source: a Spark Python streaming data source over confluent-kafka.

Spark owns the offsets. Each micro-batch is a range ``{topic: {partition: [start, end)}}``
planned on the driver and written to Spark's checkpoint before it runs; the
reads run in executor Python workers, the partitions' ranges packed into ``readTasks``
Spark tasks, each reading its ranges together with one consumer (:func:`read_ranges`),
and yield Arrow record batches. A restart resumes exactly at the end of the
last committed batch, and a replayed batch reads exactly the same records, so
with an idempotent sink every change lands once. No consumer group is joined
(partitions are assigned explicitly), so a restarted pipeline never waits for a
group rebalance. :func:`commit_group_offsets` tells a consumer group where a batch
ended (the query does so after each batch's Delta commits, so Kafka's tools see the
lag); such commits are informational: a restart resumes from the checkpoint.

Options (all strings, as Spark passes them):

=========================  ===============================================================
``bootstrap.servers``      Kafka bootstrap servers (required)
``topics``                 comma-separated topic names, or
``topicPattern``           a regular expression matched against all topic names
``startingOffsets``        ``earliest`` (default), ``latest`` or JSON per topic:
                           ``{"t1": {"0": 42}, "t2": "latest", "t3": {"timestamp": 1793491200000}}``
                           (unlisted: earliest). A timestamp (epoch ms) starts each partition at
                           the first record whose timestamp is at or after it, as the broker's
                           offsets-for-times answers; a partition without one starts at its end
``maxRecordsPerTrigger``   admission control: at most this many records per micro-batch
``readTimeoutMs``          give up reading a planned range after this long without progress
``readTasks``              Spark tasks per micro-batch (default 2); partition ranges are packed into them
``sequenceState``          the pipeline's checkpoint: each range carries its partition's epoch state at
                           its start (``changelake.formats.sequence``), read there
``replayTopics``           a regular expression over the topics ``changelake dlq replay`` writes to: those
                           that exist are read too (a new one from its start), and each of their records
                           takes its original topic, partition and offset from its headers (below)
``replayPipeline``         the pipeline id: a replayed record whose ``changelake.pipeline`` header names
                           another pipeline (one sharing the replay topic) is not read
``skipDataLoss``           a regular expression over topic names: records of those topics that Kafka deleted
                           (retention) before they were read are skipped and counted; in any other topic
                           such a gap stops the query with a :class:`DataLossError` naming topic, partition
                           and the lost offsets (``sources[].on_data_loss``)
``brokerWaitMs``           how long a broker fault (a partition without a leader while leadership moves,
                           every broker down) is waited out, with retries, before the query fails
                           (default 300000)
``kafka.<property>``       passed to the consumer (``kafka.security.protocol``, ``kafka.sasl.*``,
                           ``kafka.ssl.*``)
=========================  ===============================================================

Offsets deleted from Kafka before they were read (retention, ``kafka-delete-records``) are data lost
upstream. By default that stops the query, on the driver when it plans a batch (the low watermark is
past the batch's start) or in the read task (deleted after planning), with a :class:`DataLossError`
naming topic, partition and offset range. Only for topics of ``skipDataLoss`` is the gap skipped:
the output has the raw record columns of :data:`changelake.changelog.RAW_SCHEMA`
plus ``expired`` (int64): the number of offsets before this record that had
already been deleted from Kafka when the read started.
When a whole planned range has expired, the reader emits one marker row with
``offset = -1`` carrying only that count. :func:`split_markers` separates them.

A replayed record (``changelake dlq replay``, service/dlq.py) carries where it was first read in
the headers ``changelake.topic``, ``changelake.partition`` and ``changelake.offset``; its row has
that position instead of the replay topic's, so it is decoded as part of its source with the
ordering token (``_seq``) it would have had, and a dead letter of it names the same position again.
A record of a replay topic without those headers keeps its own position.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from changelake.changelog import RAW_SCHEMA
from changelake.connectors.kafka_retry import transient, with_retries
from changelake.errors import SourceError

log = logging.getLogger(__name__)

SOURCE_NAME = "changelake-kafka"
EXPIRED = "expired"
# The Kafka timestamp travels as epoch milliseconds (a Spark TIMESTAMP's Arrow form
# depends on the session time zone, which the executors cannot know).
SPARK_SCHEMA = ("topic string, partition int, offset bigint, timestamp bigint, "
                "key binary, value binary, expired bigint")
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.int64()), pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field(EXPIRED, pa.int64()),
])

_CONSUME_BATCH = 10_000
#: a range's consumer: bytes per partition per fetch (librdkafka's default); see :meth:`KafkaOptions.consumer_config`
_RANGE_FETCH_BYTES = 1024 * 1024
#: a consumer of several ranges (:func:`read_ranges`): bytes per partition per fetch
_TOGETHER_FETCH_BYTES = 64 * 1024
#: ... and how soon it fetches again for a partition whose queue was full, and its least queue per partition
_QUEUE_BACKOFF_MS = 10
_MIN_QUEUED = 1_000
_METADATA_TIMEOUT_S = 30.0
#: how long the driver and the read tasks wait out a broker fault (no leader for a partition while its
#: leader moves, every broker down) before the query fails: ``brokerWaitMs``
_BROKER_WAIT_MS = 300_000


Offsets = dict[str, dict[str, int]]     # {topic: {partition (as str): next offset to read}}


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting_offsets: str
    max_records_per_trigger: int | None
    read_timeout_ms: int
    read_tasks: int
    consumer_properties: Mapping[str, str]
    sequence_state: str | None = None
    replay_topics: str | None = None
    replay_pipeline: str | None = None
    #: routes whose mirrored table's snapshot goes into the first batch of a rebuilt checkpoint
    #: (``snapshotRoutes``; :class:`SnapshotTask`), while ``sequence_state`` (the checkpoint) has no committed batch
    snapshot_routes: tuple[int, ...] = ()
    #: topics (a regular expression) whose deleted, unread offsets are skipped and counted, not an error
    skip_data_loss: str | None = None
    #: how long a broker fault is waited out before the query fails (``brokerWaitMs``)
    broker_wait_ms: int = _BROKER_WAIT_MS
    #: the first batch this reader plans admits at most this many records, each next one twice as many, up to
    #: ``max_records_per_trigger`` (``firstRecordsPerTrigger``; :meth:`KafkaStreamReader.latestOffset`)
    first_records_per_trigger: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "KafkaOptions":
        # Spark passes option names lower-cased (a case-insensitive map): look them up that way.
        opts = {k.lower(): v for k, v in options.items()}
        servers = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not servers:
            raise SourceError("the Kafka source needs option 'bootstrap.servers' (host:port,...)")
        topics = tuple(t.strip() for t in opts.get("topics", "").split(",") if t.strip())
        pattern = opts.get("topicpattern") or None
        if bool(topics) == bool(pattern):
            raise SourceError("give the Kafka source exactly one of 'topics' (a comma-separated list) "
                              "or 'topicPattern' (a regular expression)")
        for option, value in (("topicPattern", pattern), ("replayTopics", opts.get("replaytopics")),
                              ("skipDataLoss", opts.get("skipdataloss"))):
            if value:
                try:
                    re.compile(value)
                except re.error as exc:
                    raise SourceError(f"{option} {value!r} is not a valid regular expression: {exc}") from None
        limit = opts.get("maxrecordspertrigger")
        max_records = int(limit) if limit else None
        if max_records is not None and max_records <= 0:
            raise SourceError(f"maxRecordsPerTrigger must be a positive number, got {limit!r}")
        first = opts.get("firstrecordspertrigger")
        first_records = int(first) if first else None
        if first_records is not None and first_records <= 0:
            raise SourceError(f"firstRecordsPerTrigger must be a positive number, got {first!r}")
        props = {k[len("kafka."):]: v for k, v in opts.items()
                 if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            topic_pattern=pattern,
            starting_offsets=opts.get("startingoffsets", "earliest").strip(),
            max_records_per_trigger=max_records,
            read_timeout_ms=int(opts.get("readtimeoutms", "120000")),
            read_tasks=max(1, int(opts.get("readtasks", "2"))),
            consumer_properties=props,
            sequence_state=opts.get("sequencestate") or None,
            replay_topics=opts.get("replaytopics") or None,
            replay_pipeline=opts.get("replaypipeline") or None,
            snapshot_routes=tuple(int(r) for r in opts.get("snapshotroutes", "").split(",") if r.strip()),
            skip_data_loss=opts.get("skipdataloss") or None,
            broker_wait_ms=int(opts.get("brokerwaitms", str(_BROKER_WAIT_MS))),
            first_records_per_trigger=first_records,
        )

    def skips_data_loss(self, topic: str) -> bool:
        """Offsets of ``topic`` deleted before they were read are skipped (and counted), not an error."""
        return self.skip_data_loss is not None and _regex(self.skip_data_loss).fullmatch(topic) is not None

    def is_replay(self, topic: str) -> bool:
        """``topic`` is one of the pipeline's replay topics."""
        return self.replay_topics is not None and _regex(self.replay_topics).fullmatch(topic) is not None

    def consumer_config(self, records: int | None = None) -> dict[str, Any]:
        """The consumer's settings; ``records``: how many records the consumer is to read (a range's consumer:
        smaller fetches, below)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            # Never joined (partitions are assigned explicitly); librdkafka wants a group id anyway.
            "group.id": f"changelake-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            # an offset that left the log while it was read is an error here, never a silent jump
            "auto.offset.reset": "error",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
            "log_level": 3,
        }
        if records is not None:
            # A range's consumer needs ``records`` messages, then closes. Left to the settings above it fetches
            # (and decompresses) up to 16 MB of the partition at a time: on bench/operators.py's topics (zstd)
            # much more than a range holds. It fetches in 1 MB steps (librdkafka's default). Also bounding the
            # queue to the range's records (``queued.min.messages``) was tried and dropped: a pipeline reading
            # many small ranges (tests/integration/test_routed_database.py's 50 tables) took 230 s instead of 25.
            conf["max.partition.fetch.bytes"] = _RANGE_FETCH_BYTES
        conf.update(self.consumer_properties)
        return conf


class DataLossError(SourceError):
    """Offsets were deleted from Kafka (retention) before the pipeline read them."""

    def __init__(self, topic: str, partition: int, start: int, low: int) -> None:
        self.topic, self.partition, self.first, self.last = topic, partition, start, low - 1
        super().__init__(
            f"data loss: {topic}[{partition}] offsets {start}..{low - 1} ({low - start} records) were deleted from "
            f"Kafka (retention) before changelake read them; the tables would miss those changes. Raise the "
            f"topic's retention.ms / retention.bytes and rebuild the tables from a new snapshot, or set "
            f"on_data_loss: skip on the source to skip such gaps (counted in "
            f"changelake_expired_offsets_skipped_total)")


class KafkaSource(DataSource):
    """``spark.readStream.format("changelake-kafka")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema: Any) -> "KafkaStreamReader":
        return KafkaStreamReader(KafkaOptions.parse(self.options))


class KafkaRange(InputPartition):
    """One Kafka partition's offsets ``[start, end)`` for one micro-batch: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int, epoch: dict | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        #: the partition's epoch state at ``start`` (``changelake.formats.sequence.PartitionEpoch`` as JSON)
        self.epoch = epoch


class KafkaReadTask(InputPartition):
    """The ranges one Spark task reads, one after the other.

    Spark's per-task cost (a Python worker round trip) is far larger than reading a
    small range, so small ranges are packed into ``readTasks`` tasks, balanced by size.
    """

    def __init__(self, ranges: list[KafkaRange]) -> None:
        super().__init__([(r.topic, r.partition, r.start, r.end) for r in ranges])
        self.ranges = ranges


class SnapshotTask(InputPartition):
    """The rows of a mirrored source's table at the snapshot a rebuilt checkpoint starts from: read by a task
    of the checkpoint's first batch beside its Kafka ranges (``changelake.service.rebuild``). The decoding
    stage reads it (``stage.snapshot(route)``); a plain Kafka reader yields nothing for it."""

    def __init__(self, route: int) -> None:
        super().__init__(("snapshot", route))
        self.route = route


def pack_ranges(ranges: list[KafkaRange], tasks: int) -> list[KafkaReadTask]:
    """Largest range first into the currently smallest task (greedy balance)."""
    bins: list[list[KafkaRange]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    sizes = [0] * len(bins)
    for r in sorted(ranges, key=lambda r: r.end - r.start, reverse=True):
        i = sizes.index(min(sizes))
        bins[i].append(r)
        sizes[i] += r.end - r.start
    return [KafkaReadTask(sorted(b, key=lambda r: (r.topic, r.partition))) for b in bins if b]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; :meth:`read` runs in executors."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._admin_consumer: Any = None
        self._latest: Offsets | None = None
        self._available_now_target: Offsets | None = None
        self._planned = 0       # batches this reader planned (the ramp after a start: latestOffset)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin_consumer"] = None      # a live client never travels to executors
        return state

    # --- driver side -------------------------------------------------------
    def _metadata_client(self) -> Any:
        if self._admin_consumer is None:
            from confluent_kafka import Consumer
            self._admin_consumer = Consumer(self.options.consumer_config())
        return self._admin_consumer

    def _partitions(self) -> list[tuple[str, int]]:
        try:
            md = with_retries(f"listing the topics on {self.options.bootstrap_servers}",
                               lambda: self._metadata_client().list_topics(timeout=_METADATA_TIMEOUT_S),
                               wait_ms=self.options.broker_wait_ms)
        except Exception as exc:  # KafkaException
            raise SourceError(f"cannot list topics on {self.options.bootstrap_servers}: {exc}; "
                              "check bootstrap.servers and the kafka.* security settings") from exc
        if self.options.topic_pattern is not None:
            rx = re.compile(self.options.topic_pattern)
            names = sorted(t for t in md.topics if rx.fullmatch(t) and not t.startswith("__"))
        else:
            names = list(self.options.topics)
        # replay topics that exist (changelake dlq replay creates them); a new one is read from its start
        names += sorted(t for t in md.topics if t not in names and self.options.is_replay(t)
                        and md.topics[t].error is None and md.topics[t].partitions)
        out: list[tuple[str, int]] = []
        for name in names:
            topic = md.topics.get(name)
            if topic is None or topic.error is not None or not topic.partitions:
                # A listed topic that does not exist yet (auto-creation may be off): ask for it directly.
                topic = self._metadata_client().list_topics(name, timeout=_METADATA_TIMEOUT_S).topics.get(name)
                if topic is None or not topic.partitions:
                    log.warning("topic %s has no partitions yet; it will be read once it exists", name)
                    continue
            out.extend((name, p) for p in sorted(topic.partitions))
        return out

    def _watermarks(self, parts: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        from confluent_kafka import TopicPartition
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, p in parts:
            try:
                low, high = with_retries(f"the offsets of {topic}[{p}]",
                                          functools.partial(self._watermark, TopicPartition(topic, p)),
                                          wait_ms=self.options.broker_wait_ms)
            except Exception as exc:
                raise SourceError(f"cannot read the offsets of {topic}[{p}] from "
                                  f"{self.options.bootstrap_servers}: {exc}") from exc
            marks[(topic, p)] = (low, high)
        return marks

    def _watermark(self, tp: Any) -> tuple[int, int]:
        try:
            return self._metadata_client().get_watermark_offsets(tp, timeout=_METADATA_TIMEOUT_S, cached=False)
        except Exception:
            # a fresh client for the next try: after every broker was down, the old one kept answering
            # "Unknown partition" from its own metadata for minutes
            self.stop()
            raise

    def initialOffset(self) -> Offsets:
        parts = self._partitions()
        marks = self._watermarks(parts)
        spec = self.options.starting_offsets
        default, explicit = spec, {}
        if spec not in ("earliest", "latest"):
            try:
                explicit = json.loads(spec)
            except ValueError:
                explicit = None
            if not isinstance(explicit, dict):
                raise SourceError("startingOffsets must be 'earliest', 'latest' or JSON like "
                                  f'{{"topic": {{"0": 42}}}} or {{"topic": "latest"}}, got {spec!r}')
            default = "earliest"
        by_time = self._offsets_for_times({(t, p): explicit[t]["timestamp"] for t, p in marks
                                           if isinstance(explicit.get(t), dict) and "timestamp" in explicit[t]})
        offsets: Offsets = {}
        for (topic, p), (low, high) in marks.items():
            chosen = explicit.get(topic, default)
            if (topic, p) in by_time:
                found = by_time[(topic, p)]
                start = high if found < 0 else max(found, low)
            elif isinstance(chosen, dict):
                start = int(chosen[str(p)]) if str(p) in chosen else low
            elif chosen == "latest":
                start = high
            elif chosen == "earliest":
                start = low
            else:
                raise SourceError(f"startingOffsets for topic {topic!r} must be 'earliest', 'latest', "
                                  f"{{partition: offset}} or {{\"timestamp\": epoch ms}}, got {chosen!r}")
            offsets.setdefault(topic, {})[str(p)] = start
        return offsets

    def _offsets_for_times(self, wanted: dict[tuple[str, int], Any]) -> dict[tuple[str, int], int]:
        """Per partition, the broker's first offset whose record timestamp is at or after the wanted
        epoch ms (-1: none, the partition is read from its end)."""
        if not wanted:
            return {}
        from confluent_kafka import TopicPartition
        for (topic, _), ms in wanted.items():
            if type(ms) is not int or ms < 0:
                raise SourceError(f"startingOffsets for topic {topic!r}: timestamp must be epoch milliseconds "
                                  f"(a non-negative integer), got {ms!r}")
        asked = [TopicPartition(t, p, ms) for (t, p), ms in sorted(wanted.items())]
        try:
            answers = self._metadata_client().offsets_for_times(asked, timeout=_METADATA_TIMEOUT_S)
        except Exception as exc:  # KafkaException
            raise SourceError(f"cannot look up starting offsets by timestamp on {self.options.bootstrap_servers}: "
                              f"{exc}") from exc
        out: dict[tuple[str, int], int] = {}
        for tp in answers:
            if tp.error is not None:
                raise SourceError(f"the broker could not find the offset of {tp.topic}[{tp.partition}] at timestamp "
                                  f"{wanted[(tp.topic, tp.partition)]}: {tp.error}")
            out[(tp.topic, tp.partition)] = tp.offset
        log.info("starting offsets by timestamp: %s", {f"{t}[{p}]": o for (t, p), o in sorted(out.items())})
        return out

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        parts = self._partitions()
        marks = self._watermarks(parts)
        latest: Offsets = {}
        for (topic, p), (low, high) in marks.items():
            latest.setdefault(topic, {})[str(p)] = high
            s = start.get(topic, {}).get(str(p))
            if s is not None and low > s and not self.options.skips_data_loss(topic):
                raise DataLossError(topic, p, s, low)
        self._latest = latest
        target = self._available_now_target
        if target is not None:
            latest = {t: {p: min(o, target.get(t, {}).get(p, o)) for p, o in ps.items()}
                      for t, ps in latest.items()}
        end = _carry_forward(start, latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if target is not None and max_rows is None:
            # Trigger.AvailableNow: Spark 4.2 asks Python sources for everything, but a
            # catch-up must still run in bounded batches, as Spark's own Kafka source does.
            max_rows = self.options.max_records_per_trigger
        if max_rows and target is None:
            max_rows = self._ramped(max_rows)
        if max_rows:
            end = _admit(start, end, max_rows, marks)
        if end != start:
            self._planned += 1
        return end

    def _ramped(self, max_rows: int) -> int:
        """The admission of the next batch after a start: ``first_records_per_trigger``, doubled with each batch
        planned since, up to ``max_rows``. The first batch after a restart (its one-off costs: Python workers,
        state stores, the JIT) then commits early instead of carrying the whole backlog; a catch-up reaches full
        batches within a few (operations.md, "Restart to first commit")."""
        first = self.options.first_records_per_trigger
        if not first or first >= max_rows:
            return max_rows
        return min(max_rows, first << min(self._planned, 40))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        parts = self._partitions()
        self._available_now_target = {}
        for (topic, p), (_, high) in self._watermarks(parts).items():
            self._available_now_target.setdefault(topic, {})[str(p)] = high

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaReadTask]:
        ranges = []
        for topic, ends in sorted(end.items()):
            for p, e in sorted(ends.items(), key=lambda kv: int(kv[0])):
                s = start.get(topic, {}).get(p, 0)
                if e > s:
                    ranges.append(KafkaRange(topic, int(p), s, e))
        if self.options.sequence_state and ranges:
            from changelake.spark.checkpoint import epochs_at

            found = epochs_at(self.options.sequence_state, {(r.topic, r.partition): r.start for r in ranges})
            for r in ranges:
                r.epoch = found.get((r.topic, r.partition))
        return [*pack_ranges(ranges, self.options.read_tasks), *self._snapshot_tasks()]

    def _snapshot_tasks(self) -> list["SnapshotTask"]:
        """The snapshot's tasks, in the checkpoint's first batch only (also when a crash replays it)."""
        if not self.options.snapshot_routes or not self.options.sequence_state:
            return []
        from changelake.spark.checkpoint import last_committed_batch

        if last_committed_batch(self.options.sequence_state) is not None:
            return []
        return [SnapshotTask(r) for r in self.options.snapshot_routes]

    def commit(self, end: Offsets) -> None:
        pass    # offsets live in Spark's checkpoint; the query tells the consumer group (commit_group_offsets)

    def stop(self) -> None:
        if self._admin_consumer is not None:
            self._admin_consumer.close()
            self._admin_consumer = None

    # --- executor side -----------------------------------------------------
    def read(self, partition: KafkaReadTask) -> Iterator[pa.RecordBatch]:
        return read_ranges(self.options, list(getattr(partition, "ranges", ())))


@functools.lru_cache(maxsize=8)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def commit_group_offsets(options: KafkaOptions, group_id: str, end: Offsets) -> None:
    """Commit ``end`` (the next offset to read, per partition) to consumer group ``group_id`` without
    joining it. Informational: a failure is logged, never raised."""
    from confluent_kafka import Consumer, TopicPartition

    offsets = [TopicPartition(t, int(p), int(o)) for t, ps in sorted(end.items()) for p, o in sorted(ps.items())
               if int(o) >= 0]
    if not offsets:
        return
    conf = dict(options.consumer_config(), **{"group.id": group_id})
    consumer = Consumer(conf)
    try:
        failed = [tp for tp in consumer.commit(offsets=offsets, asynchronous=False) if tp.error is not None]
        if failed:
            log.warning("consumer group %s: offsets of %d partition(s) not committed (first: %s[%d]: %s); "
                        "Kafka tools show an older lag until the next batch", group_id, len(failed),
                        failed[0].topic, failed[0].partition, failed[0].error)
    except Exception as exc:  # KafkaException: informational offsets only
        log.warning("consumer group %s: could not commit offsets (%s); Kafka tools show an older lag until "
                    "the next batch. The pipeline's own position is in its checkpoint.", group_id, exc)
    finally:
        consumer.close()


def _carry_forward(start: Offsets, latest: Offsets) -> Offsets:
    """End offsets per partition, never behind the start.

    A partition that appears after the query started is read from offset 0, so
    anything already deleted from it is reported as expired, not silently skipped.
    """
    end: Offsets = {}
    for topic, ps in latest.items():
        for p, high in ps.items():
            s = start.get(topic, {}).get(p, 0)
            end.setdefault(topic, {})[p] = max(s, high)
    for topic, ps in start.items():      # partitions that vanished from metadata keep their position
        for p, s in ps.items():
            end.setdefault(topic, {}).setdefault(p, s)
    return end


def _admit(start: Offsets, end: Offsets, max_rows: int,
           marks: Mapping[tuple[str, int], tuple[int, int]]) -> Offsets:
    """Cut the range to at most ``max_rows`` records, shared fairly between partitions."""
    pending = {}
    for topic, ps in end.items():
        for p, e in ps.items():
            s = max(start.get(topic, {}).get(p, 0), marks.get((topic, int(p)), (0, 0))[0])
            if e > s:
                pending[(topic, p)] = (s, e)
    out = {t: dict(ps) for t, ps in end.items()}
    budget = max_rows
    take: dict[tuple[str, str], int] = {k: 0 for k in pending}
    while budget > 0:
        open_parts = [k for k, (s, e) in pending.items() if s + take[k] < e]
        if not open_parts:
            break
        share = max(1, budget // len(open_parts))
        for k in open_parts:
            s, e = pending[k]
            n = min(share, e - s - take[k], budget)
            take[k] += n
            budget -= n
            if budget == 0:
                break
    for (topic, p), (s, _e) in pending.items():
        out[topic][p] = s + take[(topic, p)]
    return out


def read_range(options: KafkaOptions, rng: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Read ``[rng.start, rng.end)`` of one partition as Arrow record batches (:func:`read_ranges` of one)."""
    return read_ranges(options, [rng])


def read_ranges(options: KafkaOptions, ranges: list[KafkaRange]) -> Iterator[pa.RecordBatch]:
    """Read every range of ``ranges`` (at most one per partition) as Arrow record batches, with one consumer.

    The consumer is assigned all the ranges' partitions at once, so they are fetched together: a read task
    of a micro-batch that holds a few hundred records in each of 16 partitions paid a consumer (its
    connection, threads and metadata), a watermark request and a fetch round trip per range when each was
    read alone (~15 ms of wall time and ~5 ms of CPU per range on 2 cores; docs/benchmarks.md). Each batch
    holds the records of one partition from one ``consume`` call, in offset order; batches of different
    partitions interleave. A partition is paused once its range is read. The messages of each call become
    record batches column by column (each accessor mapped over the call's message list): no Python code
    runs per message beyond those C calls.
    """
    import time

    from confluent_kafka import Consumer, TopicPartition

    if len({(r.topic, r.partition) for r in ranges}) != len(ranges):
        raise ValueError("read_ranges: at most one range per partition")
    if not ranges:
        return
    largest = max(r.end - r.start for r in ranges)
    conf = options.consumer_config(records=largest)
    if len(ranges) > 1 and "max.partition.fetch.bytes" not in options.consumer_properties:
        # librdkafka fetches every assigned partition ahead, past the range's end. So a consumer of several
        # ranges fetches 64 kB per partition (not 1 MB of zstd, ~10 MB decompressed), queues at most the
        # largest range per partition (``queued.min.messages``, 100,000 by default), and fetches a partition
        # whose queue was full again after 10 ms (the default second made the smaller fetches 1.4x slower than
        # reading one by one). Eight ranges of 6,000 records read together held +357 MB with 1 MB fetches
        # against +117 MB one by one, +84 MB so; eight of 62,500 +172 MB against +148 MB, in 0.7-0.8x the time
        # (bench-like JSON, real broker, in process).
        conf["max.partition.fetch.bytes"] = _TOGETHER_FETCH_BYTES
        conf.setdefault("fetch.queue.backoff.ms", _QUEUE_BACKOFF_MS)
        conf.setdefault("queued.min.messages", max(_MIN_QUEUED, largest))
    consumer = Consumer(conf)
    try:
        # Each partition is read from its range's start at once; only where Kafka says that offset is gone
        # (retention) or nothing comes for ``readTimeoutMs`` is the partition's low watermark asked for
        # (a round trip per partition that every range paid before).
        reading = {(r.topic, r.partition): [r, r.start, 0] for r in ranges if r.end > r.start}
        if not reading:                                 # [range, position, expired offsets not yet told]
            return
        consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r, _, _ in reading.values()])
        last_progress = time.monotonic()
        while reading:
            left = sum(r.end - position for r, position, _ in reading.values())
            msgs = consumer.consume(min(_CONSUME_BATCH, left), timeout=0.2)
            if not msgs:
                if (time.monotonic() - last_progress) * 1000 > options.read_timeout_ms:
                    _check_stalled(consumer, options, [(r, position) for r, position, _ in reading.values()])
                    last_progress = time.monotonic()      # the brokers answered after a fault: wait again
                continue
            last_progress = time.monotonic()
            for key, part in _by_partition(msgs):
                state = reading.get(key)
                if state is None:
                    if key is None:         # errors of no partition (the client's own): raised or logged
                        for msg in part:
                            _client_error(msg.error(), "the read task")
                    continue                # a partition read to its end: what was fetched beyond it
                rng, position, pending = state
                part, gone = _until_gone(part)
                part, offsets, position = _records_in_range(part, rng, position)
                if part:
                    yield _record_batch(rng, part, offsets, pending,
                                        replayed=(options.replay_pipeline or "") if options.is_replay(rng.topic) else None)
                    pending = 0
                if gone and position < rng.end:     # Kafka deleted the offsets from ``position`` on (retention)
                    position, expired = _readable_start(consumer, options, rng, position)
                    pending += expired
                    if position < rng.end:      # (a seek is refused in the partition's error state)
                        consumer.incremental_unassign([TopicPartition(rng.topic, rng.partition)])
                        consumer.incremental_assign([TopicPartition(rng.topic, rng.partition, position)])
                if position >= rng.end:
                    if pending:
                        yield _marker_batch(rng, pending)
                    del reading[key]
                    consumer.pause([TopicPartition(rng.topic, rng.partition)])
                else:
                    state[1], state[2] = position, pending
    finally:
        consumer.close()


def _until_gone(msgs: list[Any]) -> tuple[list[Any], bool]:
    """One partition's messages up to the first saying that the offset asked for is not in Kafka's log, and
    whether there was one."""
    from confluent_kafka import KafkaError

    for i, m in enumerate(msgs):
        err = m.error()
        if err is not None and err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            return msgs[:i], True
    return msgs, False


def _check_stalled(consumer: Any, options: KafkaOptions, stalled: list[tuple[KafkaRange, int]]) -> None:
    """Nothing came for ``readTimeoutMs`` from the partitions ``stalled`` (range, position): their offsets are
    asked for (waiting out a broker fault as the driver does, up to ``brokerWaitMs``). If the brokers answer
    and the records are there, the read gives up with an error; returns when they were not answering (the read
    goes on)."""
    for rng, position in stalled:
        low, high, calls = _watermarks(consumer, options, rng)
        if calls > 1:
            return                  # a broker fault, now over
        if not low <= position < high:
            raise _not_in_log(rng, position, low, high)
    where = ", ".join(f"{r.topic}[{r.partition}] offsets {position}..{r.end - 1}" for r, position in stalled)
    raise SourceError(f"no data for {where} after {options.read_timeout_ms} ms; is the broker reachable from the "
                      "executors?")


def _readable_start(consumer: Any, options: KafkaOptions, rng: KafkaRange, position: int) -> tuple[int, int]:
    """Kafka refused to serve ``rng`` from ``position``: where it can be read from, and how many of its offsets
    Kafka deleted before that (retention): a :class:`DataLossError` unless the topic's data loss is skipped."""
    low, high, _ = _watermarks(consumer, options, rng)
    if low <= position:
        raise _not_in_log(rng, position, low, high)
    if not options.skips_data_loss(rng.topic):
        raise DataLossError(rng.topic, rng.partition, position, low)
    expired = min(low, rng.end) - position
    log.warning("%s[%d]: offsets %d..%d expired from Kafka before they were read; "
                "%d changes were lost upstream (raise the topic's retention)",
                rng.topic, rng.partition, position, min(low, rng.end) - 1, expired)
    return min(low, rng.end), expired


def _watermarks(consumer: Any, options: KafkaOptions, rng: KafkaRange) -> tuple[int, int, int]:
    """The partition's low and high watermarks, asked until the brokers answer (up to ``brokerWaitMs``), and
    how many calls that took (1: they answered at once)."""
    from confluent_kafka import TopicPartition

    tp = TopicPartition(rng.topic, rng.partition)
    calls = 0

    def ask() -> tuple[int, int]:
        nonlocal calls
        calls += 1
        try:
            return consumer.get_watermark_offsets(tp, timeout=_METADATA_TIMEOUT_S, cached=False)
        except Exception:
            try:        # the client's metadata may have lost the partition while the brokers were down
                consumer.list_topics(rng.topic, timeout=_METADATA_TIMEOUT_S)
            except Exception:  # KafkaException: retried with the call
                pass
            raise

    low, high = with_retries(f"the offsets of {rng.topic}[{rng.partition}]", ask, wait_ms=options.broker_wait_ms)
    return low, high, calls


def _not_in_log(rng: KafkaRange, position: int, low: int, high: int) -> SourceError:
    if position >= high:
        why = "past the end of the partition's log: the log was truncated (an unclean leader election?)"
    else:
        why = "refused by the broker although the log holds it"
    return SourceError(f"{rng.topic}[{rng.partition}]: offset {position} of the planned range {rng.start}..{rng.end - 1} "
                       f"is {why} (the log holds offsets {low}..{high - 1})")


def _by_partition(msgs: list[Any]) -> Iterator[tuple[tuple[str, int] | None, list[Any]]]:
    """``msgs`` of one ``consume`` call by partition (``(topic, partition)``; None: an error of no partition),
    each partition's in their order, the partitions in the order they first appear."""
    from confluent_kafka import Message

    keys = list(zip(map(Message.topic, msgs), map(Message.partition, msgs)))
    if keys[0] == keys[-1] and keys.count(keys[0]) == len(keys):     # the common case: one partition
        yield (keys[0] if keys[0][0] is not None else None), msgs
        return
    groups: dict[tuple[str, int] | None, list[Any]] = {}
    for key, msg in zip(keys, msgs):
        groups.setdefault(key if key[0] is not None else None, []).append(msg)
    yield from groups.items()


def _records_in_range(msgs: list[Any], rng: KafkaRange, position: int) -> tuple[list[Any], list[int], int]:
    """The records of one ``consume`` call that lie in ``rng``, their offsets, and the next position.

    End-of-partition events are dropped (everything up to the end of the log was read; offsets
    beyond are transaction markers or aborted records, so the position moves there); any other
    error is raised or, when transient, logged (:func:`_client_error`; an offset Kafka no longer holds was cut
    off before, by :func:`_until_gone`). Offsets rise within a partition, so the records at or after
    ``rng.end`` are a tail.
    """
    from confluent_kafka import KafkaError, Message

    errors = list(map(Message.error, msgs))
    if any(e is not None for e in errors):      # (a KafkaError cannot be compared with None: no list.count)
        kept = []
        for m, err in zip(msgs, errors):
            if err is None:
                kept.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                position = max(position, m.offset())
            else:
                _client_error(err, f"{rng.topic}[{rng.partition}]")
        msgs = kept
    offsets = list(map(Message.offset, msgs))
    if offsets and offsets[-1] >= rng.end:
        cut = bisect.bisect_left(offsets, rng.end)
        msgs, offsets = msgs[:cut], offsets[:cut]
        position = rng.end
    elif offsets:
        position = max(position, offsets[-1] + 1)
    return msgs, offsets, position


def _client_error(err: Any, where: str) -> None:
    """A Kafka error a ``consume`` call returned for ``where``: logged when the client retries it, else raised."""
    if transient(err):
        log.info("%s: %s (the client retries)", where, err)
        return
    raise SourceError(f"{where}: Kafka error while reading: {err}")


def _record_batch(rng: KafkaRange, msgs: list[Any], offsets: list[int], expired: int, *,
                  replayed: str | None = None) -> pa.RecordBatch:
    """``msgs`` (records of ``rng``'s partition) as one batch of :data:`ARROW_SCHEMA`; ``expired`` goes on
    the first row (the offsets lost before it). ``replayed`` (the pipeline id): ``rng`` is a replay topic,
    whose records take their original position from their headers (module doc)."""
    from confluent_kafka import Message

    if replayed is not None:
        return _replayed_batch(rng, msgs, offsets, expired, pipeline=replayed)
    n = len(msgs)
    # a timestamp of type 0 (TIMESTAMP_NOT_AVAILABLE) is no time
    stamps = [ts if kind else None for kind, ts in map(Message.timestamp, msgs)]
    lost = np.zeros(n, dtype=np.int64)
    lost[0] = expired
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(rng.topic, pa.string()), n),
        pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()),
        pa.array(list(map(Message.key, msgs)), pa.binary()),
        pa.array(list(map(Message.value, msgs)), pa.binary()),
        pa.array(lost),
    ], schema=ARROW_SCHEMA)


def _replayed_batch(rng: KafkaRange, msgs: list[Any], offsets: list[int], expired: int, *,
                    pipeline: str) -> pa.RecordBatch:
    """Records of a replay topic at their original positions; those another pipeline replayed are left out."""
    rows = []
    for msg, offset in zip(msgs, offsets):
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or ()
             if k.startswith("changelake.")}
        if pipeline and h.get("changelake.pipeline", pipeline) != pipeline:
            continue
        topic, partition, original = h.get("changelake.topic"), h.get("changelake.partition"), \
            h.get("changelake.offset")
        kind, ts = msg.timestamp()
        if topic and partition and original and partition.isdigit() and original.isdigit():
            position = (topic, int(partition), int(original))
        else:
            position = (rng.topic, rng.partition, offset)
        rows.append({"topic": position[0], "partition": position[1], "offset": position[2],
                     "timestamp": ts if kind else None, "key": msg.key(), "value": msg.value(), EXPIRED: 0})
    if rows:
        rows[0][EXPIRED] = expired
    elif expired:
        return _marker_batch(rng, expired)
    return pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMA)


def _marker_batch(rng: KafkaRange, expired: int) -> pa.RecordBatch:
    """One row that carries only ``expired``: the offsets of ``rng`` lost before anything was read."""
    return pa.RecordBatch.from_pylist([{"topic": rng.topic, "partition": rng.partition, "offset": -1,
                                        "timestamp": None, "key": None, "value": None, EXPIRED: expired}],
                                      schema=ARROW_SCHEMA)


def split_markers(records: pa.Table) -> tuple[pa.Table, dict[tuple[str, int], int]]:
    """Separate real records from expiry markers; return (records with RAW_SCHEMA, expired per partition)."""
    import pyarrow.compute as pc

    records = records.combine_chunks() if records.num_rows else ARROW_SCHEMA.empty_table()
    expired: dict[tuple[str, int], int] = {}
    if records.num_rows and pc.max(records[EXPIRED]).as_py():
        hit = records.filter(pc.greater(records[EXPIRED], 0))
        for t, p, n in zip(hit["topic"].to_pylist(), hit["partition"].to_pylist(), hit[EXPIRED].to_pylist()):
            expired[(t, p)] = expired.get((t, p), 0) + n
        records = records.filter(pc.greater_equal(records["offset"], 0))
    records = records.drop_columns([EXPIRED])
    ts = records["timestamp"].cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    records = records.set_column(records.column_names.index("timestamp"), "timestamp", ts)
    return records.cast(RAW_SCHEMA), expired


def offsets_json(offsets: Mapping[str, Mapping[int | str, int]]) -> str:
    """Explicit startingOffsets in the form the source accepts."""
    return json.dumps({t: {str(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()})
