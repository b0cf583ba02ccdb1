"""Broker faults on a 3-node Apache Kafka cluster (KRaft, replication factor 3, min.insync.replicas 2), during a
steady stream of a simulated database's changes through mirrors and a join graph (orders JOIN products,
sales per category, Top-3), the pipeline running in this process (tests/integration/faults_support.py):

* the leader of a source partition is killed (SIGKILL) and later restarted: leadership moves, batches go on,
  and the broker metrics show the broker disconnected, then reconnected;
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

from changelake import metrics
from changelake.service.demo import verify
from changelake.service.broker_watch import BrokerWatch
from changelake.service.inventory import fold
from changelake.service.status import collect_status
from tests.jars import need

from .faults_support import Running, config_for, stream, topics

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

#: what tests/conftest.py's broker takes, on three JVMs: C1 only, a small heap
JAVA = ("-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from changelake.connectors.kafka_broker import LocalKafka

    need("kafka")
    with LocalKafka(nodes=3, workdir=tmp_path_factory.mktemp("cluster"), java_options=JAVA,
                    settings={"log.retention.ms": "-1"}) as c:
        yield c


_SERVERS: list[str] = []


def _brokers(name: str, value: float, *, at_least: bool = False) -> list[str]:
    """This module's cluster's brokers whose sample of ``name`` is ``value`` (or at least it)."""
    return [s.labels["broker"] for fam in metrics.REGISTRY.collect() for s in fam.samples
            if s.name == name and s.labels["broker"].split("/")[0] in _SERVERS
            and (s.value >= value if at_least else s.value == value)]


def _no_lag(config) -> list:
    status = collect_status(config)
    assert status.kafka_error is None, status.kafka_error
    return [p for p in status.partitions if p.lag != 0]


def test_leader_kill_cluster_restart_and_new_partitions_during_one_stream(spark, cluster, tmp_path):
    """One steady stream, three faults in turn (one pipeline start: each costs a minute on a busy machine)."""
    servers = cluster.bootstrap_servers
    prefix = f"faults{time.time_ns() % 10**8}"
    # ~1,900 messages at 12/s: the stream outlasts the faults also on a busy machine (at 25/s it ended there
    # before the pipeline's first batch, and the new partitions got nothing); the rest goes at once after them
    db, producer = stream(servers, prefix, seed=31, changes=1_500, rate=12,
                          extra={"topic.metadata.refresh.interval.ms": 1000})
    names = topics(prefix)
    config = config_for(servers, tmp_path, prefix)
    with Running(spark, config, prefix) as run:
        run.wait_first_batch(600)

        # (d) more partitions for two source topics while it runs (first, while the stream is young):
        #     read from their start
        admin = AdminClient({"bootstrap.servers": servers})
        for future in admin.create_partitions([NewPartitions(t, 4) for t in (names["orders"], names["products"])],
                                              operation_timeout=30).values():
            future.result(timeout=60)

        # (a) SIGKILL of the leader of a source partition: leadership moves, batches go on, the node comes back;
        #     the broker metrics (the driver's watching client, service/broker_watch.py) show it go and come back
        _SERVERS[:] = servers.split(",")
        watch = BrokerWatch(servers).start()
        assert _wait(lambda: len(_brokers("changelake_broker_connected", 1)) == 3, 60), "the watch sees no brokers"
        leader = cluster.leader(names["orders"], 0)
        killed_at = time.monotonic()
        cluster.kill(leader)
        assert _wait(lambda: cluster.leader(names["orders"], 0) not in (leader, -1), 30), "leadership did not move"
        gone = f"/{leader}"
        assert _wait(lambda: any(b.endswith(gone) for b in _brokers("changelake_broker_connected", 0)), 30)
        run.wait_batch_after(killed_at, 300)
        cluster.start_node(leader)
        assert _wait(lambda: len(_brokers("changelake_broker_connected", 1)) == 3, 120), "no reconnect seen"
        back = [b for b in _brokers("changelake_broker_reconnects_total", 1, at_least=True) if b.endswith(gone)]
        assert back and [b for b in _brokers("changelake_broker_disconnects_total", 1, at_least=True)
                         if b.endswith(gone)] == back
        watch.stop()

        # (b) the whole cluster down for five trigger intervals: no batch finishes meanwhile, then they go on
        cluster.stop_all()
        time.sleep(5)
        cluster.start_all()
        run.wait_batch_after(time.monotonic(), 300)
        assert run.samples.longest_gap_s >= 5, run.samples

        # the faults are over: the rest of the history at once (on a quiet machine they take well under the
        # stream's ~160 s, which would only be waited out)
        producer.rate = 100_000.0
        got = run.wait_equal(db, producer, timeout_s=600)
        assert got == {t: "ok" for t in got}
    parts = {(p.topic, p.partition): p for p in collect_status(config).partitions}
    for t in (names["orders"], names["products"]):
        for p in (2, 3):
            assert parts[(t, p)].end > 0, f"the producer wrote nothing to the new partition {t}[{p}]"
            assert parts[(t, p)].committed == parts[(t, p)].end
    assert _no_lag(config) == []


def test_records_deleted_before_they_were_read_stop_the_pipeline_unless_skipping_is_configured(
        spark, cluster, tmp_path):
    """The pipeline's position is before the log's start (it fell behind the retention; here a configured
    starting offset, the same check as a checkpoint's): it stops, naming what was lost; with on_data_loss: skip
    it goes on over the gap, counting it, and its tables hold what the log still holds."""
    servers = cluster.bootstrap_servers
    prefix = f"lost{time.time_ns() % 10**8}"
    _, producer = stream(servers, prefix, seed=33, changes=400, rate=5_000)
    producer.wait(120)
    orders = topics(prefix)["orders"]
    cut = _end(servers, orders, 0) - 3
    assert cut > 0
    admin = AdminClient({"bootstrap.servers": servers})      # kept alive until its answer is in
    [future] = admin.delete_records([TopicPartition(orders, 0, cut)], request_timeout=60).values()
    future.result(timeout=90)
    from_zero = {"orders": {"starting_offsets": {orders: {"0": 0}}}}

    failing = config_for(servers, tmp_path / "fail", prefix, views=False, per_source=from_zero)
    run = Running(spark, failing, prefix).__enter__()
    error = run.wait_failed(600)
    run.stop(raise_error=False)
    assert error is not None, "the pipeline went on over a gap in the log"
    assert re.search(rf"data loss: {re.escape(orders)}\[0\] offsets 0\.\.{cut - 1} \({cut} records\)"
                     r".*on_data_loss: skip", str(error), re.S), str(error)[-2000:]
    assert not (tmp_path / "fail" / "lake" / "orders").exists()      # nothing was written

    skipping = config_for(servers, tmp_path / "skip", prefix, views=False,
                          sources={"on_data_loss": "skip"}, per_source=from_zero)
    before = metrics.REGISTRY.get_sample_value("changelake_expired_offsets_skipped_total",
                                               {"topic": orders, "partition": "0"}) or 0
    expected = fold(_log(servers, topics(prefix).values()))
    with Running(spark, skipping, prefix) as run:
        run.wait_first_batch(600)
        assert _wait(lambda: verify(skipping, expected) == {t: "ok" for t in expected}, 300), \
            verify(skipping, expected)
    skipped = metrics.REGISTRY.get_sample_value("changelake_expired_offsets_skipped_total",
                                                {"topic": orders, "partition": "0"}) - before
    assert skipped == cut


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def _end(servers: str, topic: str, partition: int) -> int:
    c = Consumer({"bootstrap.servers": servers, "group.id": "faults-probe", "log_level": 0})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=15, cached=False)[1]
    finally:
        c.close()


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
