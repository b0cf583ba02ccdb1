"""The brokers as the running pipeline sees them: connected or not, disconnects and reconnects.

The reads run in Spark's Python workers, whose Kafka clients live one batch long; what they retry is
logged (``changelake.spark.kafka_source``), not counted. So the driver keeps one idle Kafka client of
its own for the life of the run, connected to every broker of the cluster (librdkafka's
``enable.sparse.connections: false``; it subscribes to nothing and joins no group), and reads
librdkafka's statistics (``statistics.interval.ms``) every few seconds:

=====================================================  ==============================================
metric (label ``broker``: ``host:port/node id``)       from librdkafka's statistics, per broker
=====================================================  ==============================================
``changelake_broker_connected``                        1 while its state is ``UP``, else 0
``changelake_broker_disconnects_total``                its ``disconnects`` counter, as it grows
``changelake_broker_reconnects_total``                 its state ``UP`` again after a disconnect
=====================================================  ==============================================

A broker going away and coming back is logged once each way (a warning, then ``connected again after
N s``). The bootstrap addresses' own entries (node id -1) are left out: librdkafka retires them once it
knows the cluster. ``changelake status`` shows these figures from the running instance's /metrics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from changelake import metrics

log = logging.getLogger(__name__)

#: seconds between two statistics of the watching client
STATS_INTERVAL_S = 2.0


class BrokerWatch:
    """One idle Kafka client on the driver whose statistics set the broker metrics (module docstring)."""

    def __init__(self, bootstrap_servers: str, properties: dict[str, Any] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.properties = dict(properties or {})
        #: broker -> (disconnects counted so far, a disconnect not followed by UP yet)
        self._seen: dict[str, tuple[int, bool]] = {}
        self._down_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_config(cls, config: Any) -> "BrokerWatch":
        return cls(config.kafka.bootstrap_servers, config.kafka.plain_properties())

    def start(self) -> "BrokerWatch":
        from confluent_kafka import Consumer

        from changelake.service.preflight import RDKAFKA_LOGGER

        client = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "changelake-broker-watch",
                           "enable.auto.commit": False, **self.properties,
                           "enable.sparse.connections": False,
                           "statistics.interval.ms": int(STATS_INTERVAL_S * 1000),
                           "stats_cb": self.on_stats, "logger": RDKAFKA_LOGGER})

        def loop() -> None:
            refreshed = 0.0
            try:
                while not self._stop.is_set():
                    if time.monotonic() - refreshed > 30:       # learn the cluster's brokers (and new ones)
                        refreshed = time.monotonic()
                        try:
                            client.list_topics(timeout=5)
                        except Exception:  # KafkaException: the brokers are down; the statistics say so
                            pass
                    client.poll(1.0)
            finally:
                client.close()

        self._thread = threading.Thread(target=loop, name="changelake-broker-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def on_stats(self, raw: str) -> None:
        """One statistics JSON of librdkafka: set the metrics of every broker it lists. librdkafka's ``connects``
        counts attempts (failed ones too), so a reconnect is counted here instead: the broker seen ``UP`` again
        after a disconnect."""
        try:
            brokers = json.loads(raw).get("brokers", {})
        except ValueError:
            return
        now = time.monotonic()
        for entry in brokers.values():
            if int(entry.get("nodeid", -1)) < 0:
                continue
            name = str(entry.get("name", entry.get("nodename", "?")))
            disconnects = int(entry.get("disconnects", 0))
            if name not in self._seen:          # every broker's series from the start, at 0
                metrics.BROKER_DISCONNECTS.labels(name)
                metrics.BROKER_RECONNECTS.labels(name)
            before, pending = self._seen.get(name, (0, False))
            if disconnects > before:
                metrics.BROKER_DISCONNECTS.labels(name).inc(disconnects - before)
                pending = True
            up = entry.get("state") == "UP"
            if up and pending:
                metrics.BROKER_RECONNECTS.labels(name).inc()
                pending = False
            self._seen[name] = (max(disconnects, before), pending)
            metrics.BROKER_CONNECTED.labels(name).set(1 if up else 0)
            if not up and pending and name not in self._down_since:
                self._down_since[name] = now
                log.warning("broker %s: not connected (state %s); the reads retry until it answers or another "
                            "broker leads its partitions", name, entry.get("state"))
            elif up and name in self._down_since:
                log.warning("broker %s: connected again after %.0f s", name, now - self._down_since.pop(name))
