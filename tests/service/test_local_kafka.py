"""The local Apache Kafka of changelake/connectors/kafka_broker.py and ``changelake broker``, from the jars
``make install`` put in .jvm/kafka (changelake/jvm_deps.py); they skip, naming the set, without them (and
fail under ``CHANGELAKE_JVM_DEPS_REQUIRED=1``, tests/jars.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.jars import need

pytestmark = pytest.mark.kafka


@pytest.fixture(autouse=True)
def _kafka_jars():
    need("kafka")


def _produce(servers: str, topic: str, values: list[bytes], **conf) -> None:
    errors = []
    p = Producer({"bootstrap.servers": servers, "log_level": 3, **conf})
    for v in values:
        p.produce(topic, value=v, on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert p.flush(60) == 0
    if errors:
        raise KafkaException(errors[0])


def _values(servers: str, topic: str, partition: int = 0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": servers, "group.id": "probe", "log_level": 3})
    _, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=15, cached=False)
    c.assign([TopicPartition(topic, partition, 0)])
    out = []
    deadline = time.monotonic() + 30
    while len(out) < high and time.monotonic() < deadline:
        out += [m.value() for m in c.consume(100, timeout=1) if m.error() is None]
    c.close()
    return out


def test_the_broker_verb_prints_its_address_serves_it_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "changelake.service.cli", "broker", "--port", "0",
                             "--dir", str(tmp_path / "kafka")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        first = proc.stdout.readline()
        m = re.match(r"Apache Kafka \(KRaft, 1 node\) at (127\.0\.0\.1:\d+)$", first.strip())
        assert m, first + proc.stderr.read() if proc.poll() is not None else first
        servers = m.group(1)
        _produce(servers, "hello", [b"a", b"b"])
        assert _values(servers, "hello") == [b"a", b"b"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-2000:]
    assert out.rstrip().endswith("Kafka stopped")
    log = (tmp_path / "kafka" / "node-1" / "server.log").read_text()
    assert "Kafka Server started" in log or "KafkaRaftServer" in log


def test_three_nodes_replicate_and_keep_serving_acks_all_with_one_node_down(tmp_path):
    from changelake.connectors.kafka_broker import LocalKafka, create_topics

    with LocalKafka(nodes=3, workdir=tmp_path / "cluster", java_options=(
            "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")) as cluster:
        servers = cluster.bootstrap_servers
        assert len(servers.split(",")) == 3
        create_topics(servers, {"replicated": 1})
        admin = AdminClient({"bootstrap.servers": servers})
        [described] = admin.describe_configs([ConfigResource("topic", "replicated")]).values()
        assert described.result(timeout=30)["min.insync.replicas"].value == "2"
        replicas = admin.list_topics("replicated", timeout=30).topics["replicated"].partitions[0].replicas
        assert sorted(replicas) == [1, 2, 3]
        _produce(servers, "replicated", [b"1"], acks="all")

        leader = admin.list_topics("replicated", timeout=30).topics["replicated"].partitions[0].leader
        cluster.stop_node(leader, kill=True)                   # a crash of the partition's leader
        _produce(servers, "replicated", [b"2"], acks="all")     # two in-sync replicas left: still accepted
        assert _values(servers, "replicated") == [b"1", b"2"]
        cluster.start_node(leader)
        assert cluster.ready(timeout_s=10)
