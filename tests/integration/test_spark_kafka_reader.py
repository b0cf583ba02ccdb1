"""``kafka.reader: spark-kafka``: Spark's own Kafka source in front of the same decode stage, on the real broker.

The python reader is the reference: the same topics mirrored by both give the same Delta tables (values,
``_seq`` and all), a restart resumes where the checkpoint says, and a malformed message reaches the dead
letters with its bytes and its position.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.demo import verify
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.spark.checkpoint import batch_end_offsets, last_committed_batch
from tests.jars import need

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(autouse=True)
def _spark_kafka_jars():
    need("spark-kafka")

SPARK_KAFKA = {"kafka": {"reader": "spark-kafka"}}


def _config(kafka, tmp_path, prefix: str, reader: str, **kw):
    overrides = {"kafka": {"bootstrap_servers": kafka.bootstrap_servers, "reader": reader}}
    return pipeline_config(kafka.bootstrap_servers, tmp_path / reader, topic_prefix=prefix, overrides=overrides,
                           **kw)[0]


def _run(spark, config):
    processor = BatchProcessor(config, spark=spark)
    query = start_query(spark, config, processor, available_now=True)
    query.awaitTermination()
    return processor, query


def _table(config, name: str) -> pa.Table:
    table = read_delta(config.table_path(name))
    return table.select(sorted(table.column_names)).sort_by([(c, "ascending") for c in sorted(table.column_names)
                                                            if not pa.types.is_binary(table.schema.field(c).type)])


def test_spark_kafka_reader_mirrors_the_same_tables_as_the_python_reader(spark, kafka, tmp_path):
    prefix = kafka.topic("skmirror")
    db = write_history(kafka.bootstrap_servers, seed=23, changes=1_200, topic_prefix=prefix)
    python = _config(kafka, tmp_path, prefix, "python", max_records=600)
    java = _config(kafka, tmp_path, prefix, "spark-kafka", max_records=600)
    p_proc, _ = _run(spark, python)
    j_proc, j_query = _run(spark, java)
    assert verify(java, db.state) == {t: "ok" for t in db.state}
    # Spark's own Kafka source read (the python reader's is a Python data source)
    assert j_query.recentProgress[0]["sources"][0]["description"].startswith("KafkaV2[SubscribePattern[")
    for name in db.state:
        assert _table(java, name).equals(_table(python, name)), name
    assert j_proc.totals.records == p_proc.totals.records > 1_200
    assert j_proc.totals.changes == p_proc.totals.changes
    # admission: pipeline.max_records_per_batch became maxOffsetsPerTrigger
    assert len(j_query.recentProgress) > 1
    assert all(p["numInputRows"] <= 600 for p in j_query.recentProgress)
    # the checkpoint holds the offsets as the python reader's does: status and the consumer group read them
    last = last_committed_batch(java.pipeline.checkpoint)[0]
    assert batch_end_offsets(java.pipeline.checkpoint, last) == \
        batch_end_offsets(python.pipeline.checkpoint, last_committed_batch(python.pipeline.checkpoint)[0])


def test_spark_kafka_reader_resumes_from_its_checkpoint_without_loss_or_duplicates(spark, kafka, tmp_path):
    import changelake.service.inventory as inv
    from changelake.connectors.kafka_broker import create_topics

    prefix = kafka.topic("skresume")
    create_topics(kafka.bootstrap_servers, {inv.topic_for(t).replace(inv.SERVER, prefix, 1): 4 for t in inv.TABLES})
    db = inv.InventoryDatabase(seed=31)
    msgs = [inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value)
            for m in db.history(snapshot_sizes={"customers": 30, "products": 40, "orders": 60}, changes=500,
                                redeliver=0)]
    half = len(msgs) // 2
    inv.produce(msgs[:half], kafka.bootstrap_servers)
    config = _config(kafka, tmp_path, prefix, "spark-kafka", max_records=250)
    first, _ = _run(spark, config)
    inv.produce(msgs[half:], kafka.bootstrap_servers)
    second, _ = _run(spark, config)         # a new query over the same checkpoint
    third, _ = _run(spark, config)
    # each message read exactly once over the runs: none lost at the restart, none read twice (an upsert
    # keyed by _seq would hide a repeat in the tables, so the counts are the proof)
    assert (first.totals.records, second.totals.records, third.totals.records) == (half, len(msgs) - half, 0)
    end = batch_end_offsets(config.pipeline.checkpoint, last_committed_batch(config.pipeline.checkpoint)[0])
    assert sum(o for ps in end.values() for o in ps.values()) == len(msgs)
    assert verify(config, db.state) == {t: "ok" for t in db.state}


def test_a_checkpoint_changes_readers_without_loss_or_duplicates(spark, kafka, tmp_path):
    """Both readers keep the same offsets in Spark's checkpoint: a pipeline may switch kafka.reader and resume."""
    import changelake.service.inventory as inv
    from changelake.connectors.kafka_broker import create_topics

    prefix = kafka.topic("skswitch")
    create_topics(kafka.bootstrap_servers, {inv.topic_for(t).replace(inv.SERVER, prefix, 1): 4 for t in inv.TABLES})
    db = inv.InventoryDatabase(seed=41)
    msgs = [inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value)
            for m in db.history(snapshot_sizes={"customers": 20, "products": 30, "orders": 40}, changes=300,
                                redeliver=0)]
    third = len(msgs) // 3
    python = _config(kafka, tmp_path, prefix, "python")
    java = python.model_copy(update={"kafka": python.kafka.model_copy(update={"reader": "spark-kafka"})})
    inv.produce(msgs[:third], kafka.bootstrap_servers)
    first, _ = _run(spark, python)
    inv.produce(msgs[third:2 * third], kafka.bootstrap_servers)
    second, _ = _run(spark, java)           # the python reader's checkpoint, read on by Spark's Kafka source
    inv.produce(msgs[2 * third:], kafka.bootstrap_servers)
    third_run, _ = _run(spark, python)      # and back
    assert (first.totals.records, second.totals.records, third_run.totals.records) == \
        (third, third, len(msgs) - 2 * third)
    assert verify(python, db.state) == {t: "ok" for t in db.state}


def test_spark_kafka_reader_sends_a_malformed_message_to_the_dead_letters_with_its_position(spark, kafka, tmp_path):
    prefix = kafka.topic("skdlq")
    db = write_history(kafka.bootstrap_servers, seed=5, changes=150, topic_prefix=prefix)
    topic = f"{prefix}.inventory.products"
    bad = [b'{"op": "c", "after": {"id": 1', b"\xff\xfe not json"]
    positions = []
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for value in bad:
        p.produce(topic, key=b'{"id": 1}', value=value, partition=2,
                  on_delivery=lambda err, msg: positions.append((msg.topic(), msg.partition(), msg.offset())))
    p.flush(30)
    config = _config(kafka, tmp_path, prefix, "spark-kafka")
    processor, _ = _run(spark, config)
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    letters = read_delta(config.dead_letter_path()).sort_by("offset")
    assert letters["value"].to_pylist() == bad
    assert list(zip(letters["topic"].to_pylist(), letters["partition"].to_pylist(),
                    letters["offset"].to_pylist())) == sorted(positions)
    assert letters["key"].to_pylist() == [b'{"id": 1}'] * 2
    assert set(letters["reason"].to_pylist()) == {"malformed"}
    assert all(ts is not None for ts in letters["timestamp"].to_pylist())
    assert sum(processor.totals.dead_letters.values()) == 2


def test_spark_kafka_reader_reads_replayed_dead_letters_at_their_original_positions(spark, kafka, tmp_path, capsys):
    """``changelake dlq replay`` writes to ``<topic>.replay`` with the letter's position in headers: the
    spark-kafka reader subscribes to replay topics too and decodes each record at that position."""
    import yaml

    from changelake.changelog import seq_from_kafka
    from changelake.service.cli import main
    from changelake.service.config import parse_config

    from .test_dlq_replay import HISTORY, _rows

    topic = kafka.topic("skreplay")
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for key, value in HISTORY:
        p.produce(topic, key=key, value=value, partition=0)
    p.flush(30)

    def configured(upsert: bool):
        raw = {"pipeline": {"id": f"skdlq-{topic}", "checkpoint": str(tmp_path / "ckpt")},
               "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "reader": "spark-kafka"},
               "sources": [{"name": "products", "topics": [topic], "format": "debezium-json", "table": "products",
                            "on_error": "dlq", "options": {"upsert": upsert}}],
               "tables": [{"name": "products", "primary_key": ["id"]}],
               "storage": {"root": str(tmp_path / "lake")}}
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return parse_config(path.read_text(), origin=str(path)), str(path)

    config, _ = configured(upsert=False)
    _run(spark, config)
    assert {k: v[0] for k, v in _rows(config).items()} == {1: "new"}
    config, path = configured(upsert=True)      # the cause is fixed: replay the letters, run on the same checkpoint
    assert main(["dlq", "replay", "-c", path]) == 0
    assert "replayed 2 dead letter(s)" in capsys.readouterr().out
    processor, _ = _run(spark, config)
    assert processor.totals.records == 2
    rows = _rows(config)
    assert rows[1] == ("new", seq_from_kafka(0, 2))     # the replayed older update stays older
    assert rows[2] == ("x", seq_from_kafka(0, 3))       # at the position it was first read at


def test_spark_kafka_reader_starts_a_new_checkpoint_where_starting_offsets_say(spark, kafka, tmp_path):
    """sources[].starting_offsets {timestamp: ...}: resolved per partition on the driver (as the python reader
    does) and given to Spark's source as explicit startingOffsets; `latest` as Spark's own."""
    import orjson

    from .test_starting_offsets import MOMENT, MOMENT_MS, _config as offsets_config, _event, _ids

    topic = kafka.topic("sksince", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    stamps = {i: MOMENT_MS - 3_600_000 + i * 60_000 for i in range(1, 21)}
    stamps |= {i: MOMENT_MS + (i - 21) * 1_000 for i in range(21, 31)}
    for i, stamp in stamps.items():
        producer.produce(topic, key=orjson.dumps({"id": i}), value=_event(100 * i, {"id": i, "amount": i}),
                         partition=i % 2, timestamp=stamp)
    assert producer.flush(30) == 0

    def spark_kafka(config):
        return config.model_copy(update={"kafka": config.kafka.model_copy(update={"reader": "spark-kafka"})})

    since = spark_kafka(offsets_config(kafka.bootstrap_servers, tmp_path / "since", topic,
                                       {"timestamp": MOMENT.isoformat()}))
    assert _ids(spark, since) == list(range(21, 31))
    latest = spark_kafka(offsets_config(kafka.bootstrap_servers, tmp_path / "latest", topic, "latest"))
    assert _ids(spark, latest) == []
    producer.produce(topic, key=orjson.dumps({"id": 99}), value=_event(9_900, {"id": 99, "amount": 99}), partition=0)
    assert producer.flush(30) == 0
    assert _ids(spark, latest) == [99]          # the checkpoint began at the end: only what came after
