"""Broker faults on a 3-node Apache Kafka cluster (KRaft, replication factor 3, min.insync.replicas 2), during a
steady stream of a simulated database's changes through mirrors and a join graph (orders JOIN products,
sales per category, Top-3), the pipeline running in this process (tests/integration/faults_support.py):

* the leader of a source partition is killed (SIGKILL) and later restarted: leadership moves, batches go on;
* the whole cluster is stopped for longer than the trigger interval and started again: the pipeline stalls
  (no batch finishes while it is down, as ``changelake_batches_total`` shows) and catches up;
* records the pipeline has not read are deleted from the log (``kafka-delete-records``; retention moves the
  log start offset the same way): the pipeline stops with an error naming topic, partition and the lost
  offsets, and only with ``on_data_loss: skip`` skips them, counting them in a metric;
* a source topic gets more partitions while the pipeline runs: they are read from their start.

After each, the tables equal the source's final state, and ``changelake status`` shows no lag.
"""

from __future__ import annotations

import re
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from changelake import jvm_deps, metrics
from changelake.service.demo import verify
from changelake.service.inventory import fold
from changelake.service.status import collect_status

from .faults_support import Running, config_for, stream, topics

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

#: what tests/conftest.py's broker takes, on three JVMs: C1 only, a small heap
JAVA = ("-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from changelake.connectors.kafka_broker import LocalKafka

    why = jvm_deps.missing("kafka")
    if why:
        pytest.skip(why)
    with LocalKafka(nodes=3, workdir=tmp_path_factory.mktemp("cluster"), java_options=JAVA,
                    settings={"log.retention.ms": "-1"}) as c:
        yield c


def _no_lag(config) -> list:
    status = collect_status(config)
    assert status.kafka_error is None, status.kafka_error
    return [p for p in status.partitions if p.lag != 0]


def test_killed_leader_of_a_source_partition_moves_and_nothing_is_lost(spark, cluster, tmp_path):
    prefix = f"lead{time.time_ns() % 10**8}"
    db, producer = stream(cluster.bootstrap_servers, prefix, seed=31, changes=1_200, rate=120)
    orders = topics(prefix)["orders"]
    config = config_for(cluster.bootstrap_servers, tmp_path, prefix)
    with Running(spark, config, prefix) as run:
        run.wait_first_batch()
        leader = cluster.leader(orders, 0)
        killed_at = time.monotonic()
        cluster.kill(leader)
        assert _wait(lambda: cluster.leader(orders, 0) not in (leader, -1), 30), "leadership did not move"
        time.sleep(3)
        cluster.start_node(leader)
        got = run.wait_equal(db, producer)
        assert got == {t: "ok" for t in got}
        assert run.samples.batches_since(killed_at) > 0
    assert _no_lag(config) == []


def test_whole_cluster_stopped_longer_than_the_trigger_then_started(spark, cluster, tmp_path):
    prefix = f"down{time.time_ns() % 10**8}"
    db, producer = stream(cluster.bootstrap_servers, prefix, seed=32, changes=1_200, rate=120)
    config = config_for(cluster.bootstrap_servers, tmp_path, prefix)
    with Running(spark, config, prefix) as run:
        run.wait_first_batch()
        down = time.monotonic()
        cluster.stop_all()
        time.sleep(5)                               # five trigger intervals without a broker
        cluster.start_all()
        outage = time.monotonic() - down
        got = run.wait_equal(db, producer)
        assert got == {t: "ok" for t in got}
        # /metrics showed it: no batch finished while the cluster was down, and the backlog as lag
        assert run.samples.longest_gap_s >= 5, run.samples
        assert run.samples.max_lag > 0
        assert outage > 5
    assert _no_lag(config) == []


def test_records_deleted_before_they_were_read_stop_the_pipeline_unless_skipping_is_configured(
        spark, cluster, tmp_path):
    servers = cluster.bootstrap_servers
    prefix = f"lost{time.time_ns() % 10**8}"
    db, producer = stream(servers, prefix, seed=33, changes=300, rate=2_000)
    producer.wait(120)
    config = config_for(servers, tmp_path, prefix, views=False)
    with Running(spark, config, prefix) as run:
        assert run.wait_equal(db, producer, views=False) == {t: "ok" for t in db.state}
    orders = topics(prefix)["orders"]
    committed = {(p.topic, p.partition): p.committed for p in collect_status(config).partitions}
    # more changes while the pipeline is down, then the log loses records it has not read
    _, producer = stream(servers, prefix, seed=34, changes=300, rate=2_000)
    producer.wait(120)
    start = committed[(orders, 0)]
    cut = _end(servers, orders, 0) - 3
    assert cut > start
    [future] = AdminClient({"bootstrap.servers": servers}).delete_records(
        [TopicPartition(orders, 0, cut)]).values()
    future.result(timeout=30)

    failed = Running(spark, config, prefix).__enter__()
    error = failed.wait_failed(180)
    failed.stop(raise_error=False)
    assert error is not None, "the pipeline went on over a gap in the log"
    assert re.search(rf"data loss: {re.escape(orders)}\[0\] offsets {start}\.\.{cut - 1} \({cut - start} records\)"
                     r".*on_data_loss: skip", str(error), re.S), str(error)[-2000:]
    assert _position(config, orders, 0) == start               # nothing was committed past the gap

    skipping = config_for(servers, tmp_path, prefix, views=False, sources={"on_data_loss": "skip"})
    before = metrics.REGISTRY.get_sample_value("changelake_expired_offsets_skipped_total",
                                               {"topic": orders, "partition": "0"}) or 0
    with Running(spark, skipping, prefix) as run:
        assert _wait(lambda: not _no_lag_quiet(skipping), 120), "the pipeline did not catch up over the gap"
    skipped = metrics.REGISTRY.get_sample_value("changelake_expired_offsets_skipped_total",
                                                {"topic": orders, "partition": "0"}) - before
    assert skipped == cut - start
    # the tables hold what the log still holds, folded in order: the skipped records are missing, nothing else
    expected = fold(_log(servers, topics(prefix).values()))
    assert verify(skipping, expected) == {t: "ok" for t in expected}


def test_partitions_added_while_running_are_read_from_their_start(spark, cluster, tmp_path):
    servers = cluster.bootstrap_servers
    prefix = f"grow{time.time_ns() % 10**8}"
    db, producer = stream(servers, prefix, seed=35, changes=1_200, rate=120,
                          extra={"topic.metadata.refresh.interval.ms": 1000})
    config = config_for(servers, tmp_path, prefix)
    names = topics(prefix)
    with Running(spark, config, prefix) as run:
        run.wait_first_batch()
        admin = AdminClient({"bootstrap.servers": servers})
        for future in admin.create_partitions([NewPartitions(t, 4) for t in (names["orders"], names["products"])],
                                              operation_timeout=30).values():
            future.result(timeout=60)
        got = run.wait_equal(db, producer)
        assert got == {t: "ok" for t in got}
    parts = {(p.topic, p.partition): p for p in collect_status(config).partitions}
    for t in (names["orders"], names["products"]):
        for p in (2, 3):
            assert parts[(t, p)].end > 0, f"the producer wrote nothing to the new partition {t}[{p}]"
            assert parts[(t, p)].committed == parts[(t, p)].end
    assert _no_lag(config) == []


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def _no_lag_quiet(config) -> list:
    try:
        return [p for p in collect_status(config).partitions if p.lag != 0]
    except Exception:
        return ["unknown"]


def _end(servers: str, topic: str, partition: int) -> int:
    c = Consumer({"bootstrap.servers": servers, "group.id": "faults-probe", "log_level": 0})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=15, cached=False)[1]
    finally:
        c.close()


def _position(config, topic: str, partition: int) -> int | None:
    return next(p.committed for p in collect_status(config).partitions if (p.topic, p.partition) == (topic, partition))


def _log(servers: str, names) -> list[tuple[str, bytes | None, bytes | None]]:
    """Every record the topics still hold, per partition in offset order."""
    c = Consumer({"bootstrap.servers": servers, "group.id": "faults-probe", "log_level": 0,
                  "enable.partition.eof": False})
    out = []
    try:
        for name in names:
            for p in sorted(c.list_topics(name, timeout=15).topics[name].partitions):
                low, high = c.get_watermark_offsets(TopicPartition(name, p), timeout=15, cached=False)
                c.assign([TopicPartition(name, p, low)])
                got = 0
                while got < high - low:
                    for m in c.consume(1000, timeout=5):
                        if m.error() is None and m.offset() < high:
                            out.append((name, m.key(), m.value()))
                            got += 1
    finally:
        c.close()
    return out
