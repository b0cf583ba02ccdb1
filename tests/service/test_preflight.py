"""Before Spark starts: an unreachable broker is one line within seconds; a topic_pattern skips Debezium's
transaction-metadata topics."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest

from changelake.errors import SourceError
from changelake.service.config import parse_config
from changelake.service.query_start import kafka_reader_options
from changelake.service.preflight import broker_topics, skipped_side_topics

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # nothing listens there once the socket is closed


def _config(tmp_path, bootstrap: str, **source):
    import yaml

    src = {"name": "shop", "format": "debezium-json", "table": "orders", **source} if source else \
        {"name": "shop", "topics": ["db.shop.orders"], "format": "debezium-json", "table": "orders"}
    return parse_config(yaml.safe_dump({
        "pipeline": {"id": "p", "checkpoint": f"{tmp_path}/cp"}, "kafka": {"bootstrap_servers": bootstrap},
        "sources": [src], "tables": [{"name": "orders", "primary_key": ["id"]}],
        "storage": {"root": f"{tmp_path}/lake"}}))


def test_an_unreachable_broker_fails_at_once_with_one_line(tmp_path):
    config = _config(tmp_path, f"127.0.0.1:{_closed_port()}")
    started = time.monotonic()
    with pytest.raises(SourceError) as raised:
        broker_topics(config, timeout_s=3)
    assert time.monotonic() - started < 6
    text = str(raised.value)
    assert "\n" not in text and text.startswith("cannot reach Kafka at 127.0.0.1:")
    assert "Connection refused" in text and "kafka.bootstrap_servers" in text


@pytest.mark.parametrize("command", ["status", "run"])
def test_status_and_run_against_an_unreachable_broker_exit_with_one_line(tmp_path, command):
    import yaml

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline": {"id": "p", "checkpoint": f"{tmp_path}/cp"},
        "kafka": {"bootstrap_servers": f"127.0.0.1:{_closed_port()}"},
        "sources": [{"name": "shop", "topics": ["t"], "format": "debezium-json", "table": "orders"}],
        "tables": [{"name": "orders", "primary_key": ["id"]}], "storage": {"root": f"{tmp_path}/lake"},
        "metrics": {"port": 0}}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "changelake.service.cli", command, "-c", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 30            # not Spark's start-up and minutes of retries
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("changelake: cannot reach Kafka at 127.0.0.1:"), done.stderr
    assert done.stdout == ""


def test_a_topic_pattern_skips_debezium_transaction_topics(tmp_path):
    config = _config(tmp_path, "localhost:9092", topic_pattern=r"dbserver1\..*")
    rx = re.compile(kafka_reader_options(config)["topicPattern"])
    assert rx.fullmatch("dbserver1.inventory.orders")
    assert not rx.fullmatch("dbserver1.transaction")
    assert rx.fullmatch("dbserver1.inventory.transactions")        # a table named so is read
    topics = {"dbserver1.inventory.orders", "dbserver1.transaction", "other.transaction"}
    assert skipped_side_topics(config, topics) == {"dbserver1.transaction": "shop"}
    listed = _config(tmp_path, "localhost:9092")                    # topics: listed, read as listed
    assert skipped_side_topics(listed, {"db.shop.orders", "db.transaction"}) == {}
