"""An embedded Kafka-protocol broker for demos and tests: librdkafka's mock cluster.

The mock cluster lives inside a librdkafka client, so it lasts only as long as
that client. :class:`EmbeddedBroker` keeps one alive in a child process and
hands out the broker address its metadata reports; any Kafka client in any
process can use that address.

Limits of the mock cluster (fixed in librdkafka): each partition keeps at most
5 MB or 100,000 message sets and old messages drop off, topics are auto-created
with 4 partitions, and CreateTopics is not supported. Readers must start from
the low watermark, which the changelake source does.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 4


class EmbeddedBroker:
    """A librdkafka mock cluster in a child process. Use as a context manager."""

    def __init__(self, *, num_brokers: int = 1, start_timeout_s: float = 30.0) -> None:
        self._num_brokers = num_brokers
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self.bootstrap_servers: str | None = None

    def start(self) -> "EmbeddedBroker":
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "changelake.connectors.embedded_broker", str(self._num_brokers)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        deadline = time.monotonic() + self._start_timeout_s
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line.startswith("BOOTSTRAP ") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(
                "the embedded Kafka broker (librdkafka mock cluster) did not start; "
                "check that confluent-kafka is installed in this environment")
        self.bootstrap_servers = line.split(" ", 1)[1].strip()
        log.info("embedded Kafka broker (librdkafka mock cluster) at %s", self.bootstrap_servers)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.stdin:
                self._proc.stdin.close()     # the child exits when its stdin closes
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(num_brokers: int) -> None:
    from confluent_kafka import Producer

    holder = Producer({"test.mock.num.brokers": num_brokers, "bootstrap.servers": "",
                       "log_level": 3})
    brokers = holder.list_topics(timeout=10).brokers.values()
    print("BOOTSTRAP " + ",".join(f"{b.host}:{b.port}" for b in brokers), flush=True)
    # Stay alive until the parent closes our stdin (or dies, which closes it too).
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
