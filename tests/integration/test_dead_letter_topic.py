"""Dead letters to a Kafka topic: raw bytes, headers, once per batch across crashes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.dead_letter_topic import LETTER_SCHEMA, DeadLetterTopic, header_dict, read_topics
from changelake import metrics
from changelake.service.demo import verify
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _letters_in(servers: str, topic: str) -> list:
    return list(read_topics({"bootstrap.servers": servers, "log_level": 3}, [topic]))


@pytest.mark.spark
def test_bad_messages_go_to_the_dead_letter_topic_with_bytes_and_headers(spark, kafka, tmp_path):
    prefix = kafka.topic("dlqtopic")
    dlq_topic = f"{prefix}.dead-letters"
    db = write_history(kafka.bootstrap_servers, seed=7, changes=200, topic_prefix=prefix)
    topic = f"{prefix}.inventory.products"
    bad = {b'{"id": 1}': b'{"op": "c", "after": {"id": 1', b'{"id": 2}': b"\xff\xfe not json",
           b'{"id": 3}': b'{"op": "x", "after": {"id": 9}}'}
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for key, value in bad.items():
        p.produce(topic, key=key, value=value, partition=1)
    p.flush(30)
    before = sum(metrics.REGISTRY.get_sample_value("changelake_dead_letters_total",
                                                   {"topic": topic, "reason": r}) or 0
                 for r in ("malformed", "unknown-op"))
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix,
                                overrides={"dead_letter": {"topic": dlq_topic}})
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()

    assert verify(config, db.state) == {t: "ok" for t in db.state}
    got = _letters_in(kafka.bootstrap_servers, dlq_topic)
    assert {m.key(): m.value() for m in got} == bad
    for m in got:
        h = header_dict(m.headers())
        assert h["topic"] == topic and h["partition"] == "1" and int(h["offset"]) >= 0
        assert h["source"] == "products" and h["pipeline"] == config.pipeline.id and h["batch"].isdigit()
        assert h["reason"] in ("malformed", "unknown-op") and h["error"]
    assert len({int(header_dict(m.headers())["offset"]) for m in got}) == 3
    assert not (tmp_path / "lake" / "_dead_letters").exists()          # none in the Delta table
    after = sum(metrics.REGISTRY.get_sample_value("changelake_dead_letters_total",
                                                  {"topic": topic, "reason": r}) or 0
                for r in ("malformed", "unknown-op"))
    assert after - before == 3

    # the same batch handed to a new processor (a replay after a restart) produces nothing again
    again = BatchProcessor(config, spark=spark)
    letters = [("products", _letter(topic, 0, 99))]
    again.dead_letters.write(letters, batch_id=0)
    assert len(_letters_in(kafka.bootstrap_servers, dlq_topic)) == 3

    # changelake dlq list / replay read the topic; these reasons cannot succeed again: sent only when forced,
    # to the source's replay topic (never its own), once each
    from changelake.service.dlq import Filters, list_letters, replay
    listed = list_letters(config, Filters(source="products"))
    assert sorted(r["offset"] for r in listed) == sorted(int(header_dict(m.headers())["offset"]) for m in got)
    assert {r["store"] for r in listed} == {dlq_topic} and {r["replay"] for r in listed} == {"force"}
    refused = replay(config, dry_run=True)
    assert (refused.by_reason, refused.refused) == ({}, {"malformed": 2, "unknown-op": 1})
    assert replay(config, force=True, dry_run=True).by_reason == {"malformed": 2, "unknown-op": 1}
    assert replay(config, force=True).replayed == 3
    assert replay(config, force=True).replayed == 0
    assert not [m for m in _letters_in(kafka.bootstrap_servers, topic) if m.headers()]
    replayed = _letters_in(kafka.bootstrap_servers, f"{topic}.replay")
    assert sorted(m.value() for m in replayed) == sorted(bad.values())
    assert {(header_dict(m.headers())["topic"], header_dict(m.headers())["source"]) for m in replayed} == \
        {(topic, "products")}


def _letter(topic: str, partition: int, offset: int) -> pa.Table:
    return pa.table({"topic": [topic], "partition": pa.array([partition], pa.int32()),
                     "offset": pa.array([offset], pa.int64()),
                     "timestamp": pa.array([1_700_000_000_000], pa.timestamp("ms", tz="UTC")),
                     "key": [b"k%d" % offset], "value": [b"v%d" % offset], "reason": ["malformed"],
                     "error": ["bad"]}, schema=DEAD_LETTER_SCHEMA)


def _for_topic(letters: pa.Table, dlq_topic: str) -> pa.Table:
    n = letters.num_rows
    return letters.append_column("source", pa.array(["s"] * n)).append_column(
        "dead_letter_topic", pa.array([dlq_topic] * n)).cast(LETTER_SCHEMA)


def test_a_crash_between_the_kafka_commit_and_the_ledger_does_not_duplicate(kafka, tmp_path):
    dlq_topic = kafka.topic("dlqcrash")
    letters = _for_topic(pa.concat_tables([_letter("src", 0, i) for i in range(5)]), dlq_topic)

    def writer() -> DeadLetterTopic:
        return DeadLetterTopic(bootstrap_servers=kafka.bootstrap_servers, properties={}, pipeline_id="p1",
                               ledger_path=str(tmp_path / "ledger"))

    first = writer()
    assert first.write(letters.slice(0, 2), batch_id=0)
    crashing = writer()

    def crash(*_args):
        raise SystemExit("killed after the Kafka commit, before the ledger write")

    crashing._record = crash
    with pytest.raises(SystemExit):
        crashing.write(letters.slice(2), batch_id=1)
    assert len(_letters_in(kafka.bootstrap_servers, dlq_topic)) == 5      # batch 1 is in Kafka ...

    restarted = writer()                                                  # ... and replayed after a restart
    assert restarted.write(letters.slice(2), batch_id=1) is False
    assert restarted.write(letters.slice(2), batch_id=1) is False         # now from the ledger
    assert restarted.write(letters.slice(0, 1), batch_id=2) is True
    got = _letters_in(kafka.bootstrap_servers, dlq_topic)
    assert sorted(header_dict(m.headers())["batch"] for m in got) == ["0", "0", "1", "1", "1", "2"]


def test_sigkill_after_the_batch_then_restart_produces_each_dead_letter_once(kafka, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    prefix = kafka.topic("dlqkill")
    dlq_topic = f"{prefix}.dead-letters"
    topic = f"{prefix}.inventory.orders"
    kafka.create_topics({topic: 4})
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    bad = [b"{truncated %d" % i for i in range(4)]
    for i, value in enumerate(bad):                 # first in their partitions: read by batch 0
        p.produce(topic, key=b'{"order_id": %d}' % i, value=value, partition=i)
    p.flush(30)
    db = write_history(kafka.bootstrap_servers, seed=29, changes=600, topic_prefix=prefix)
    config, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=400,
                                   overrides={"dead_letter": {"topic": dlq_topic}})

    def run(fault: str | None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
        if fault:
            env["CHANGELAKE_FAULT"] = fault
        return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING", "run",
                               "--available-now", "-c", str(path)], env=env, capture_output=True, text=True,
                              timeout=600)

    crashed = run("after-sinks@0")                  # letters and tables of batch 0 written, Spark not told
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert sorted(m.value() for m in _letters_in(kafka.bootstrap_servers, dlq_topic)) == sorted(bad)
    restarted = run(None)                           # replays batch 0
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    got = _letters_in(kafka.bootstrap_servers, dlq_topic)
    assert sorted(m.value() for m in got) == sorted(bad)
    assert {header_dict(m.headers())["batch"] for m in got} == {"0"}
