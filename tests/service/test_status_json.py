"""``changelake status --json`` against a broker (the session's embedded one unless KAFKA_BOOTSTRAP_SERVERS)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from changelake.service.cli import main
from tests.service.test_cli import GOOD

pytestmark = pytest.mark.kafka


def test_status_json_holds_lag_last_batch_tables_and_dead_letters(tmp_path, capsys, kafka):
    topic = kafka.topic("status")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, key=b"k", value=b"{}", partition=0)
    producer.flush(10)
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("localhost:9092", kafka.bootstrap_servers).replace("a.b.products", topic)
                    .replace("/tmp/ckpt", str(tmp_path / "ckpt")) + f"storage: {{root: {tmp_path / 'lake'}}}\n")
    assert main(["status", "--json", "-c", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pipeline_id"] == "inv" and doc["consumer_group"] == "changelake.inv" and doc["kafka_error"] is None
    assert {"topic": topic, "partition": 0, "committed": None, "end": 3, "lag": None} in doc["partitions"]
    assert doc["last_batch"] is None and doc["dead_letters"] == []
    assert doc["tables"] == [{"name": "products", "path": str(tmp_path / "lake" / "products"), "version": None,
                              "files": 0, "bytes": 0}]
