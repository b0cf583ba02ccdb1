"""``starting_offsets: {timestamp: ...}`` end to end: a new checkpoint starts each partition at its first
record whose Kafka timestamp is at or after the moment, through Spark into a Delta table.

Debezium MySQL changes on two partitions of a real Kafka topic, each produced with its own CreateTime:
an hour of history before the moment and changes after it. The mirror holds exactly the rows of the
changes at or after the moment (librdkafka's mock cluster answered every offsets-for-times lookup with
-1, so this could not be tested there); ``earliest`` on the same topic holds them all.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

MOMENT = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
MOMENT_MS = int(MOMENT.timestamp() * 1000)


def _event(pos: int, row: dict) -> bytes:
    source = {"connector": "mysql", "db": "shop", "table": "orders", "file": "mysql-bin.000003", "pos": pos,
              "row": 0, "ts_ms": MOMENT_MS}
    return orjson.dumps({"op": "c", "before": None, "after": row, "source": source, "ts_ms": MOMENT_MS})


def _config(servers: str, workdir: Path, topic: str, starting_offsets):
    raw = {
        "pipeline": {"id": f"it-{workdir.name}", "checkpoint": str(workdir / "ckpt"), "max_records_per_batch": 7,
                     "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "kafka": {"bootstrap_servers": servers},
        "storage": {"root": str(workdir / "lake")},
        "metrics": {"port": 0},
        "sources": [{"name": "orders", "topics": [topic], "columns": {"id": "bigint", "amount": "bigint"},
                     "table": "orders", "starting_offsets": starting_offsets}],
        "tables": [{"name": "orders", "primary_key": ["id"]}],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path))


def _ids(spark, config) -> list[int]:
    start_query(spark, config, BatchProcessor(config, spark=spark), available_now=True).awaitTermination()
    if not Path(config.table_path("orders"), "_delta_log").exists():
        return []                       # nothing read yet: the mirror is created with its first rows
    return sorted(r["id"] for r in read_delta(config.table_path("orders"), columns=["id"]).to_pylist())


def test_a_new_checkpoint_starts_at_the_first_record_at_or_after_the_timestamp(spark, kafka, tmp_path):
    topic = kafka.topic("since", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    # ids 1..30 an hour before the moment, 31..50 from the moment on (the first exactly at it), spread
    # over both partitions, each partition in time order
    stamps = {i: MOMENT_MS - 3_600_000 + i * 60_000 for i in range(1, 31)}
    stamps |= {i: MOMENT_MS + (i - 31) * 1_000 for i in range(31, 51)}
    for i, stamp in stamps.items():
        producer.produce(topic, key=orjson.dumps({"id": i}), value=_event(100 * i, {"id": i, "amount": i}),
                         partition=i % 2, timestamp=stamp)
    assert producer.flush(30) == 0

    since = _config(kafka.bootstrap_servers, tmp_path / "since", topic, {"timestamp": MOMENT.isoformat()})
    assert _ids(spark, since) == list(range(31, 51))
    everything = _config(kafka.bootstrap_servers, tmp_path / "earliest", topic, "earliest")
    assert _ids(spark, everything) == list(range(1, 51))

    # a moment after every record: nothing yet, and what comes later is read
    later = _config(kafka.bootstrap_servers, tmp_path / "later", topic,
                    {"timestamp": "2026-11-02T00:00:00Z"})
    assert _ids(spark, later) == []
    producer.produce(topic, key=b'{"id": 99}', value=_event(9_900, {"id": 99, "amount": 99}), partition=1,
                     timestamp=MOMENT_MS + 86_400_000 + 1)
    assert producer.flush(30) == 0
    assert _ids(spark, later) == [99]
