"""The Kafka source against a real Apache Kafka broker (see the ``kafka`` fixture)."""

from __future__ import annotations

import re
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from changelake.spark.kafka_source import (
    ARROW_SCHEMA,
    DataLossError,
    KafkaOptions,
    KafkaRange,
    KafkaStreamReader,
    read_range,
    read_ranges,
    split_markers,
)
from changelake.errors import SourceError

pytestmark = pytest.mark.kafka


def _produce(servers: str, topic: str, n: int, *, partition: int | None = None, size: int = 0) -> None:
    # idempotent: the tests compare each record's value with its offset, and a plain producer's retry (a request
    # that timed out on a loaded machine, or met a leader not yet elected just after the topic's creation) may land
    # a later batch first (CI: offset 5 held record 1557)
    p = Producer({"bootstrap.servers": servers, "linger.ms": 5, "log_level": 3, "enable.idempotence": True})
    pad = b"x" * size
    for i in range(n):
        kwargs = {"partition": partition} if partition is not None else {}
        while True:
            try:
                p.produce(topic, key=str(i).encode(), value=b"%d:" % i + pad, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def _read(opts: KafkaOptions, rng: KafkaRange):
    batches = list(read_range(opts, rng))
    return split_markers(pa.Table.from_batches(batches, schema=ARROW_SCHEMA))


def test_planned_ranges_read_each_record_exactly_once(kafka):
    topic = kafka.topic("reads", partitions=4)
    _produce(kafka.bootstrap_servers, topic, 500)
    opts = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic})
    reader = KafkaStreamReader(opts)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(200))
    second = reader.latestOffset(first, ReadAllAvailable())
    seen = []
    for a, b in ((start, first), (first, second)):
        for task in reader.partitions(a, b):
            for rng in task.ranges:
                records, expired = _read(opts, rng)
                assert not expired
                seen += list(zip(records["partition"].to_pylist(), records["offset"].to_pylist()))
    reader.stop()
    assert len(seen) == 500 and len(set(seen)) == 500
    total_first = sum(first[topic][p] - start[topic][p] for p in first[topic])
    assert total_first == 200


def test_a_read_task_reads_all_its_ranges_at_once_each_record_exactly_once_in_partition_order(kafka):
    """A read task's ranges (several topics and partitions, of very different sizes) are read by one consumer
    together: every record of every range exactly once, nothing before a range's start or from its end on,
    each partition's records in offset order; a partition that is done while others are still read is not
    read further. A planned range that Kafka does not hold (past its log's end) stops with an error naming
    the partition, instead of waiting forever."""
    topics = [kafka.topic("many"), kafka.topic("many")]
    kafka.create_topics({topics[0]: 3, topics[1]: 2})
    sizes = {(topics[0], 0): 2_000, (topics[0], 1): 7, (topics[0], 2): 300, (topics[1], 0): 1, (topics[1], 1): 900}
    for (topic, partition), n in sizes.items():
        _produce(kafka.bootstrap_servers, topic, n, partition=partition)
    opts = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": ",".join(topics)})
    wanted = {(topics[0], 0): (5, 1_990), (topics[0], 1): (0, 7), (topics[0], 2): (100, 101),
              (topics[1], 0): (0, 1), (topics[1], 1): (450, 900)}
    ranges = [KafkaRange(t, p, s, e) for (t, p), (s, e) in wanted.items()]
    batches = list(read_ranges(opts, ranges))
    for batch in batches:                   # a batch holds one partition's records
        assert len(set(zip(batch["topic"].to_pylist(), batch["partition"].to_pylist()))) == 1
    records, expired = split_markers(pa.Table.from_batches(batches, schema=ARROW_SCHEMA))
    assert not expired
    read = {}
    for t, p, o in zip(records["topic"].to_pylist(), records["partition"].to_pylist(), records["offset"].to_pylist()):
        read.setdefault((t, p), []).append(o)
    assert read == {k: list(range(s, e)) for k, (s, e) in wanted.items()}
    assert records["value"].to_pylist() == [b"%d:" % o for o in records["offset"].to_pylist()]   # each its own
    quick = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topics[1],
                                "readTimeoutMs": "1000"})
    with pytest.raises(SourceError, match=rf"{topics[1]}\[1\]: offset 900 of the planned range 890..904 is past the end"):
        list(read_ranges(quick, [KafkaRange(topics[1], 0, 0, 1), KafkaRange(topics[1], 1, 890, 905)]))


def test_starting_offsets_latest_and_explicit(kafka):
    topic = kafka.topic("start", partitions=1)
    _produce(kafka.bootstrap_servers, topic, 40, partition=0)
    latest = KafkaStreamReader(KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic,
                                                   "startingOffsets": "latest"})).initialOffset()
    assert latest[topic]["0"] == 40
    explicit = KafkaStreamReader(KafkaOptions.parse({
        "bootstrap.servers": kafka.bootstrap_servers, "topics": topic,
        "startingOffsets": '{"%s": {"0": 25}}' % topic})).initialOffset()
    assert explicit[topic]["0"] == 25


def test_starting_offsets_by_timestamp_follow_the_brokers_offsets_for_times(kafka):
    """Records produced with their own CreateTime; the reader starts each partition where the broker's
    offsets-for-times says (none at or after the time: at the end): the first record at or after it.
    (librdkafka's mock cluster answers every timestamp lookup with -1, so this could not be tested there.)"""
    topic = kafka.topic("bytime", partitions=2)
    base = 1_793_491_200_000
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3, "enable.idempotence": True})
    for i in range(20):
        p.produce(topic, key=b"%d" % i, value=b"%d" % i, partition=i % 2, timestamp=base + i * 1_000)
    assert p.flush(30) == 0
    at = base + 9_500                                         # records 10..19 are at or after it
    reader = KafkaStreamReader(KafkaOptions.parse({
        "bootstrap.servers": kafka.bootstrap_servers, "topics": topic,
        "startingOffsets": '{"%s": {"timestamp": %d}}' % (topic, at)}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    stamps = []
    for task in reader.partitions(start, end):
        for rng in task.ranges:
            records, _ = _read(KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic}),
                               rng)
            stamps += records["timestamp"].cast("int64").to_pylist()
    reader.stop()
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe", "log_level": 3})
    told = {tp.partition: tp.offset for tp in c.offsets_for_times(
        [TopicPartition(topic, q, at) for q in range(len(start[topic]))], timeout=10)}
    c.close()
    assert told == {0: 5, 1: 5}                               # records 10, 12, ... and 11, 13, ...
    assert start[topic] == {"0": 5, "1": 5}
    assert sorted(stamps) == [base + i * 1_000 for i in range(10, 20)]


def test_expired_offsets_stop_the_read_or_are_skipped_and_reported_when_configured(kafka):
    """Kafka deletes a partition's oldest segments past ``retention.bytes``: a range that starts before the
    low watermark stops with an error naming topic, partition and the lost offsets, on the driver when it plans
    and in the read task; with ``skipDataLoss`` matching the topic it reads what is left and reports the rest as
    expired."""
    if kafka.kind != "local":
        pytest.skip("needs a broker that checks retention every second (the local broker of tests/conftest.py); "
                    f"this run uses a {kafka.kind} broker")
    topic = kafka.topic("expire")
    kafka.create_topics({topic: 1}, retention_bytes=str(1 << 20), segment_bytes=str(1 << 20))
    _produce(kafka.bootstrap_servers, topic, 3_000, partition=0, size=1_000)     # ~3 MB: 3 segments
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe", "log_level": 3})
    # retention deletes one segment per check: wait until the low watermark has stood still for 3 s
    deadline = time.monotonic() + 60
    low, high, since = 0, 0, time.monotonic()
    while time.monotonic() < deadline and (low == 0 or time.monotonic() - since < 3):
        time.sleep(0.5)
        seen = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        if seen[0] != low:
            since = time.monotonic()
        low, high = seen
    c.close()
    assert low > 0, "the broker did not expire anything within 60 s; the test premise failed"
    strict = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic})
    with pytest.raises(DataLossError, match=rf"{topic}\[0\] offsets 0\.\.{low - 1} \({low} records\)"):
        _read(strict, KafkaRange(topic, 0, 0, high))
    with pytest.raises(DataLossError, match=rf"{topic}\[0\] offsets 0\.\.{low - 1} .*on_data_loss: skip"):
        KafkaStreamReader(strict).latestOffset({topic: {"0": 0}}, ReadAllAvailable())
    assert KafkaStreamReader(strict).latestOffset({topic: {"0": low}}, ReadAllAvailable()) == {topic: {"0": high}}
    opts = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic,
                               "skipDataLoss": re.escape(topic)})
    assert KafkaStreamReader(opts).latestOffset({topic: {"0": 0}}, ReadAllAvailable()) == {topic: {"0": high}}
    records, expired = _read(opts, KafkaRange(topic, 0, 0, high))
    assert expired == {(topic, 0): low}
    assert records["offset"].to_pylist() == list(range(low, high))
    # A range that expired completely still reports how much was lost.
    records, expired = _read(opts, KafkaRange(topic, 0, 0, low))
    assert records.num_rows == 0 and expired == {(topic, 0): low}
    # read in one task with another partition: the expired one skips its gap, the other is read whole
    other = kafka.topic("expire-other")
    kafka.create_topics({other: 1})
    _produce(kafka.bootstrap_servers, other, 50, partition=0)
    both = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": f"{topic},{other}",
                               "skipDataLoss": re.escape(topic)})
    records, expired = split_markers(pa.Table.from_batches(
        list(read_ranges(both, [KafkaRange(other, 0, 0, 50), KafkaRange(topic, 0, 0, high)])), schema=ARROW_SCHEMA))
    assert expired == {(topic, 0): low}
    assert records.filter(pc.equal(records["topic"], topic))["offset"].to_pylist() == list(range(low, high))
    assert records.filter(pc.equal(records["topic"], other))["offset"].to_pylist() == list(range(50))


def test_a_topic_pattern_picks_up_matching_topics(kafka):
    prefix = kafka.topic("rx")
    kafka.create_topics({f"{prefix}.a": 1, f"{prefix}.b": 2, f"{prefix}x.c": 1})
    for suffix in ("a", "b"):
        _produce(kafka.bootstrap_servers, f"{prefix}.{suffix}", 3)
    _produce(kafka.bootstrap_servers, f"{prefix}x.c", 3)
    time.sleep(0.5)
    reader = KafkaStreamReader(KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers,
                                                   "topicPattern": rf"{prefix}\.[ab]"}))
    offsets = reader.initialOffset()
    reader.stop()
    assert sorted(offsets) == [f"{prefix}.a", f"{prefix}.b"]


def test_a_transactional_partition_yields_its_records_with_their_keys_tombstones_and_times(kafka):
    """Transaction markers take offsets but are no records: a range ending on one still completes, a
    range cut inside a fetched batch stops exactly at its end (exclusive), and an aborted transaction's
    records are never read (``read_committed``; librdkafka's mock cluster did not filter them)."""
    topic = kafka.topic("txn", partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": topic, "log_level": 3})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0, timestamp=1_793_491_200_000 + i)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, key=b"aborted", value=b"never read", partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, key=b"k0", value=None, partition=0)        # a tombstone
    p.produce(topic, key=None, value=b"no key", partition=0)
    p.commit_transaction(30)
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe", "log_level": 3})
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    c.close()
    opts = KafkaOptions.parse({"bootstrap.servers": kafka.bootstrap_servers, "topics": topic,
                               "readTimeoutMs": "20000"})
    started = time.monotonic()
    records, expired = _read(opts, KafkaRange(topic, 0, 0, high))
    assert time.monotonic() - started < 15, "the read waited for offsets that hold no record"
    assert not expired
    rows = records.select(["offset", "key", "value"]).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2"),
                                                      (b"k0", None), (None, b"no key")]
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets) and high - 1 not in offsets     # the last offset is a commit marker
    assert offsets[3] - offsets[2] == 4       # the commit marker, the aborted record and its abort marker
    assert records["timestamp"].cast("int64").to_pylist()[:3] == [1_793_491_200_000 + i for i in range(3)]
    # every sub-range reads exactly its own records
    for start in range(high):
        for end in range(start + 1, high + 1):
            part, _ = _read(opts, KafkaRange(topic, 0, start, end))
            assert part["offset"].to_pylist() == [o for o in offsets if start <= o < end], (start, end)
