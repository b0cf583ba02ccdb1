"""What the real-database tests do around the database: wait until Debezium has written a change,
write a pipeline YAML, run ``changelake run --available-now`` as a user does, and compare a Delta
table with the rows the database returns for the same table."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from changelake.connectors.delta_read import read_delta


#: the connector settings that make each topic it creates one partition with the broker's replication
#: factor (Connect's topic creation): the tests read a topic's changes in order from partition 0, and the
#: tests' broker gives an auto-created topic 4 partitions (tests/conftest.py)
ONE_PARTITION = {"topic.creation.default.partitions": "1", "topic.creation.default.replication.factor": "-1"}


def wait_for_marker(bootstrap: str, topic: str, n: int, *, timeout: float = 120) -> None:
    """Wait until ``topic`` (a Debezium topic of a one-row ``marker`` table) holds a change whose
    ``after.n`` is ``n``: Debezium reads the log in order, so every earlier change is in Kafka. Reads
    every partition of the topic (a connector without :data:`ONE_PARTITION` may have made several)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"marker-{os.getpid()}-{time.time()}",
                         "enable.auto.commit": False, "log_level": 0})
    deadline = time.monotonic() + timeout
    try:
        partitions: list[int] = []
        while not partitions and time.monotonic() < deadline:
            found = consumer.list_topics(topic, timeout=5).topics.get(topic)
            partitions = sorted(found.partitions) if found is not None and not found.error else []
            if not partitions:
                time.sleep(0.3)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=1):
                if msg.error() or not msg.value():
                    continue
                value = json.loads(msg.value())
                value = value.get("payload", value) if "op" not in value else value
                if (value.get("after") or {}).get("n") == n:
                    return
    finally:
        consumer.close()
    raise TimeoutError(f"Debezium did not write marker {n} to {topic} within {timeout:.0f} s")


def topic_values(bootstrap: str, topic: str) -> list[dict | None]:
    """Every value of partition 0 of ``topic`` as JSON (the payload of an envelope; None: a tombstone)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{os.getpid()}-{time.time()}",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[dict | None] = []
        while len(values) < end:
            for msg in consumer.consume(500, timeout=5):
                if msg.error():
                    raise RuntimeError(f"{topic}: {msg.error()}")
                value = json.loads(msg.value()) if msg.value() else None
                values.append(value.get("payload", value) if value and "op" not in value else value)
        return values
    finally:
        consumer.close()


def topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=10).topics)


def write_pipeline(workdir: Path, *, pipeline_id: str, bootstrap: str, sources: list[dict[str, Any]],
                   tables: list[dict[str, Any]] | None = None, max_records: int = 100_000) -> Path:
    raw = {
        "pipeline": {"id": pipeline_id, "checkpoint": str(workdir / "checkpoint"), "trigger_interval": "1 second",
                     "max_records_per_batch": max_records, "read_tasks": 1, "master": "local[1]",
                     "spark_conf": {"spark.driver.memory": "768m", "spark.sql.shuffle.partitions": "1"}},
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": sources,
        "tables": tables if tables is not None else [{"name": s["table"]} for s in sources if "table" in s],
        "storage": {"root": str(workdir / "lake")},
        "metrics": {"port": 0},
    }
    path = workdir / "pipeline.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


def run_changelake(config: Path, *, fault: str | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    if fault:
        env["CHANGELAKE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING",
                           "run", "--available-now", "-c", str(config)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def canonical(value: Any) -> Any:
    """One form for a value read from the database and from Delta: JSON text parsed, timestamps with a
    zone in UTC, floats as floats, decimals exact."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, decimal.Decimal):
        return value
    return value


def delta_rows(path: str, key: list[str], *, json_columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    table = read_delta(path)
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in table.to_pylist()]
    for r in rows:
        for c in json_columns:
            if isinstance(r.get(c), str):
                r[c] = json.loads(r[c])
    return sorted(({k: canonical(v) for k, v in r.items()} for r in rows), key=lambda r: [r[k] for k in key])


def assert_same_rows(expected: list[dict[str, Any]], actual: list[dict[str, Any]], *, table: str) -> None:
    expected = [{k: canonical(v) for k, v in r.items()} for r in expected]
    if expected == actual:
        return
    lines = [f"{table}: Delta ({len(actual)} rows) differs from the database ({len(expected)} rows)"]
    for i in range(max(len(expected), len(actual))):
        e = expected[i] if i < len(expected) else None
        a = actual[i] if i < len(actual) else None
        if e != a:
            if e and a:
                diff = {k: (e.get(k), a.get(k)) for k in sorted(set(e) | set(a)) if e.get(k) != a.get(k)
                        or (k in e) != (k in a)}
                lines.append(f"  row {i}: (database, delta) {diff!r}")
            else:
                lines.append(f"  row {i}: database {e!r}, delta {a!r}")
        if len(lines) > 12:
            break
    raise AssertionError("\n".join(lines))
