"""Waiting out a broker fault: which Kafka errors pass (a leader moving, a coordinator loading, brokers
down or restarting) and a call retried with backoff while it fails with one. Used by the Kafka source's
driver and read tasks (``changelake.spark.kafka_source``) and by ``changelake status``; no pyspark."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)


def _transient_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, name) for name in (
        "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT",
        "REQUEST_TIMED_OUT", "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
        "_WAIT_COORD", "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "BROKER_NOT_AVAILABLE", "NOT_ENOUGH_REPLICAS",
        "KAFKA_STORAGE_ERROR", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE", "_NODE_UPDATE",
        # librdkafka retires its bootstrap brokers' handles once it knows the cluster's: a request in flight
        # on one fails so, on a fresh client, also without any fault
        "_DESTROY_BROKER") if hasattr(KafkaError, name))


try:
    _TRANSIENT = _transient_codes()
except ImportError:       # confluent-kafka is imported where it is used
    _TRANSIENT = frozenset()


def transient(err: Any) -> bool:
    """Whether the KafkaError ``err`` passes once the broker answers again (not fatal; retriable or one of the
    codes above)."""
    return err is not None and not err.fatal() and (err.retriable() or err.code() in _TRANSIENT)


def with_retries(what: str, call: Any, *, wait_ms: int) -> Any:
    """``call()``, again with backoff while it fails with a transient Kafka error (a leader moving, brokers
    down), for at most ``wait_ms``; a warning says what is awaited, and when it is back."""
    from confluent_kafka import KafkaError, KafkaException

    deadline, pause, warned = time.monotonic() + wait_ms / 1000, 0.2, False
    while True:
        try:
            result = call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if not transient(err) or time.monotonic() + pause > deadline:
                raise
            if not warned:
                log.warning("%s: %s; retrying for up to %.0f s (the broker may be restarting or its partition "
                            "leaders moving)", what, err.str(), wait_ms / 1000)
                warned = True
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            continue
        if warned:
            log.warning("%s: answered again", what)
        return result
