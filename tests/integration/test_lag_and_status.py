"""Lag where people look: the pipeline's consumer group and ``changelake status``.

After an ``--available-now`` run (a child process, as an operator runs it) the consumer group named
after the pipeline id holds, for every partition, the end offset the run read to: Kafka's admin API
(what kafka-consumer-groups.sh --describe and Burrow read) shows them with a lag of zero, and the
records produced after the run as lag; ``changelake status`` shows the same per partition, the last
batch of the checkpoint, each table's Delta version and files, and the dead letters by source and reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from changelake.service.query_start import consumer_group

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING", *args],
                          env=env, capture_output=True, text=True, timeout=600)


def test_the_consumer_group_and_status_show_what_was_committed(kafka, tmp_path):
    prefix = kafka.topic("lag")
    write_history(kafka.bootstrap_servers, seed=5, changes=300, topic_prefix=prefix,
                  sizes={"customers": 20, "products": 30, "orders": 40})
    config, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=400)
    orders_topic = next(s.topics[0] for s in config.sources if s.name == "orders")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(orders_topic, key=b'{"id": 1}', value=b"{not json", partition=0)
    producer.flush()

    run = _cli("run", "--available-now", "-c", str(path))
    assert run.returncode == 0, run.stderr[-3000:]

    group = consumer_group(config)
    assert group == f"changelake.{config.pipeline.id}"
    parts = [TopicPartition(t, p) for s in config.sources for t in s.topics for p in range(4)]
    ends = _end_offsets(kafka.bootstrap_servers, parts)
    assert sum(ends.values()) > 0 and all(ends.values())      # every partition got records
    assert _committed(kafka.bootstrap_servers, group) == ends

    # records produced after the run are the group's lag, as Kafka's tools compute it
    for i in range(5):
        producer.produce(orders_topic, key=b'{"id": %d}' % i, value=b"{not json either", partition=1)
    producer.flush()
    later = _end_offsets(kafka.bootstrap_servers, parts)
    lag = {k: later[k] - c for k, c in _committed(kafka.bootstrap_servers, group).items()}
    assert lag == {k: (5 if k == (orders_topic, 1) else 0) for k in ends}

    status = _cli("status", "-c", str(path))
    assert status.returncode == 0, status.stderr[-3000:]
    out = status.stdout
    assert f"consumer group {group}" in out
    rows = re.findall(rf"^\s+({re.escape(prefix)}\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)$", out, re.M)
    assert {(t, int(p)): (int(c), int(e), lag) for t, p, c, e, lag in rows} == \
        {k: (ends[k], later[k], str(lag[k])) for k in ends}
    assert "total lag: 5" in out
    assert re.search(r"^last batch: \d+, committed ", out, re.M)
    for t in config.tables:
        m = re.search(rf"^\s+{t.name}\s+(\d+)\s+(\d+)\s+([\d,]+)$", out, re.M)
        assert m and int(m.group(2)) > 0 and int(m.group(3).replace(",", "")) > 0, (t.name, out)
    assert re.search(r"^\s+orders / malformed: 1$", out, re.M), out


def _end_offsets(servers: str, parts: list[TopicPartition]) -> dict[tuple[str, int], int]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "lag-probe"})
    try:
        return {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=15, cached=False)[1]
                for tp in parts}
    finally:
        consumer.close()


def _committed(servers: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets through the admin API (OffsetFetch, as kafka-consumer-groups.sh does)."""
    admin = AdminClient({"bootstrap.servers": servers})
    [(_, future)] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).items()
    return {(tp.topic, tp.partition): tp.offset for tp in future.result(timeout=30).topic_partitions}
