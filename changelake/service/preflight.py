"""Before Spark starts: reach Kafka once, and see which topics a ``topic_pattern`` would read.

An unreachable broker is one line, within :data:`TIMEOUT_S` seconds, not minutes of Spark start-up and
hundreds of librdkafka retry lines: ``run`` and ``status`` call :func:`broker_topics` first. librdkafka's
own log lines (a FAIL line per retry) are kept, not printed: the last one makes up the one line, and
``--log-level DEBUG`` shows them all.

A Debezium connector with ``provide.transaction.metadata`` writes transaction boundaries to
``<topic.prefix>.transaction``, next to the table topics, so a ``topic_pattern`` such as
``dbserver1\\..*`` matches it too. Such a topic holds no row changes: its messages would all be
dead letters (reason ``unrouted``). :func:`side_topic` names it, and :func:`pattern_without_side_topics`
keeps it out of what a pattern reads (a topic listed in ``topics`` is read as listed). The runner logs
and counts each skipped topic (``changelake_topics_skipped``).
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Any

from changelake.errors import SourceError

log = logging.getLogger(__name__)

#: seconds the first metadata request may take before the broker counts as unreachable
TIMEOUT_S = 10.0


class _Kept(logging.Handler):
    """Keeps librdkafka's last lines instead of printing them; at DEBUG they go on to the log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=20)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if log.isEnabledFor(logging.DEBUG):
            log.debug("librdkafka: %s", record.getMessage())


#: the logger the service's own Kafka clients give librdkafka (``logger`` client property)
RDKAFKA_LOGGER = logging.getLogger("changelake.kafka")
RDKAFKA_LOGGER.propagate = False
RDKAFKA_LOGGER.setLevel(logging.DEBUG)
_KEPT = _Kept()
RDKAFKA_LOGGER.addHandler(_KEPT)

#: Debezium's transaction-metadata topics: ``<topic.prefix>.transaction``
TRANSACTION_TOPIC = r".+\.transaction"


def side_topic(topic: str) -> str | None:
    """The kind of Debezium side topic ``topic`` is (``transaction-metadata``), or None."""
    return "transaction-metadata" if re.fullmatch(TRANSACTION_TOPIC, topic) else None


def pattern_without_side_topics(pattern: str) -> str:
    """``pattern`` that no longer matches a Debezium side topic (used with ``re.fullmatch``)."""
    return rf"(?!{TRANSACTION_TOPIC}\Z)(?:{pattern})"


def broker_topics(config: Any, *, timeout_s: float = TIMEOUT_S) -> set[str]:
    """The topic names the broker lists; :class:`SourceError` with one line when it cannot be reached."""
    from confluent_kafka import Consumer, KafkaException

    kafka = config.kafka
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "group.id": "changelake-preflight",
            "enable.auto.commit": False, **kafka.plain_properties(), "logger": RDKAFKA_LOGGER}
    _KEPT.lines.clear()
    try:
        consumer = Consumer(conf)
    except KafkaException as exc:       # a property librdkafka refuses
        raise SourceError(f"cannot create a Kafka client for {kafka.bootstrap_servers}: {exc.args[0].str()}") from None
    try:
        return set(consumer.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        failed = exc.args[0].str()
    finally:
        consumer.close()            # delivers librdkafka's queued log lines
    reason = _reason(list(_KEPT.lines)) or failed
    raise SourceError(f"cannot reach Kafka at {kafka.bootstrap_servers} within {timeout_s:.0f} s: {reason}. "
                      "Check kafka.bootstrap_servers, the kafka.properties security settings and that the "
                      "broker is up")


def _reason(lines: list[str]) -> str:
    """The most telling librdkafka line: the last failure's own text (``FAIL [rdkafka#consumer-1]
    [thrd:...]: host:port/bootstrap: Connect to ... failed: Connection refused (...)``), not 'all brokers down'."""
    failures = [line for line in lines if "brokers are down" not in line and ("FAIL" in line or "ERROR" in line)]
    if not failures:
        return ""
    return failures[-1].split("]: ", 1)[-1].strip()


def skipped_side_topics(config: Any, topics: set[str]) -> dict[str, str]:
    """Topic -> the source whose ``topic_pattern`` matches it and skips it as a Debezium side topic."""
    out: dict[str, str] = {}
    for s in config.sources:
        if s.topic_pattern is None:
            continue
        rx = re.compile(s.topic_pattern)
        for t in sorted(topics):
            if rx.fullmatch(t) and side_topic(t) and t not in out:
                out[t] = s.name
    return out
