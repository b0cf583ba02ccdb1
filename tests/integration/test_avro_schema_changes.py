"""Debezium Avro writer schemas changing mid-stream, through Kafka, Spark and Delta.

Two tables read Avro with their columns taken from the writer schemas. ``people``
gets a new writer schema that adds a column: the table gains it, older rows read
null. ``items`` gets an incompatible one (a column's type changes): its source is
quarantined, all of its later messages go to the dead-letter table, and ``people``
keeps committing. ``people`` has no ``primary_key``: it is learnt from the Avro
message keys (their schema comes from the registry).
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake import metrics
from changelake.service.config import ChangelakeConfig
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from tests.formats.avro_envelopes import KEY, V1, V2_ADDS_EMAIL, V3_NAME_IS_LONG, framed, framed_key
from tests.registry_stub import schema_registry

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

SCHEMAS = {1: V1, 2: V2_ADDS_EMAIL, 3: V3_NAME_IS_LONG, 100: KEY}


def _config(servers: str, url: str, tmp_path, prefix: str) -> ChangelakeConfig:
    source = {"format": "debezium-avro-confluent", "options": {"url": url}, "on_error": "dlq"}
    return ChangelakeConfig.model_validate({
        "pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "ckpt"), "max_records_per_batch": 20},
        "kafka": {"bootstrap_servers": servers},
        "sources": [{**source, "name": "people", "topics": [f"{prefix}.people"], "table": "people"},
                    {**source, "name": "items", "topics": [f"{prefix}.items"], "table": "items"}],
        "tables": [{"name": "people"}, {"name": "items", "primary_key": ["id"]}],
        "storage": {"root": str(tmp_path / "lake")},
    })


def _produce(servers: str, topic: str, messages: list[tuple[int, bytes]]) -> None:
    """Keys: Avro (registry id 100) for people, JSON for items."""
    p = Producer({"bootstrap.servers": servers, "log_level": 3})
    for key, value in messages:
        raw_key = framed_key(100, key) if topic.endswith(".people") else b'{"id": %d}' % key
        p.produce(topic, key=raw_key, value=value, partition=0)
    p.flush(30)


def _run(spark, config) -> BatchProcessor:
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    return processor


def _sample(name: str, **labels) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0


def test_a_new_column_evolves_one_table_while_an_incompatible_schema_quarantines_the_other(
        spark, kafka, tmp_path, caplog):
    prefix = kafka.topic("avroschema")
    people = [(i, framed(1, V1, "c", pos=i, after={"id": i, "name": f"p{i}"})) for i in range(1, 31)]
    people += [(i, framed(2, V2_ADDS_EMAIL, "c", pos=i, after={"id": i, "name": f"p{i}", "email": f"p{i}@x"}))
               for i in range(31, 61)]
    items = [(i, framed(1, V1, "c", pos=i, after={"id": i, "name": f"i{i}"})) for i in range(1, 31)]
    items += [(i, framed(3, V3_NAME_IS_LONG, "c", pos=i, after={"id": i, "name": i})) for i in range(31, 41)]
    items += [(i, framed(1, V1, "c", pos=i, after={"id": i, "name": f"i{i}"})) for i in range(41, 51)]
    _produce(kafka.bootstrap_servers, f"{prefix}.people", people)
    _produce(kafka.bootstrap_servers, f"{prefix}.items", items)
    items_topic = f"{prefix}.items"
    letters_before = _sample("changelake_dead_letters_total", topic=items_topic, reason="schema-incompatible")
    caplog.set_level(logging.ERROR, logger="changelake.service.quarantine")

    with schema_registry(SCHEMAS) as (url, _):
        config = _config(kafka.bootstrap_servers, url, tmp_path, prefix)
        processor = _run(spark, config)

        # people: the column email was added; rows written before it read null
        table = read_delta(config.table_path("people")).sort_by("id")
        assert table.schema.field("email").type == pa.string()
        assert table["id"].to_pylist() == list(range(1, 61))
        assert table["email"].to_pylist() == [None] * 30 + [f"p{i}@x" for i in range(31, 61)]
        assert processor.totals.changes["people"] == {"+I": 60}
        assert processor.keys.key_of("people") == ("id",)                 # from the Avro message keys

        # items: what landed before the incompatible schema stays; everything from then on is a dead letter
        landed = set(read_delta(config.table_path("items"))["id"].to_pylist())
        letters = read_delta(config.dead_letter_path())
        by_value = {value: key for key, value in items}
        quarantined = [by_value[v] for v in letters["value"].to_pylist()]
        assert set(letters["reason"].to_pylist()) == {"schema-incompatible"}
        assert len(quarantined) == len(set(quarantined))                  # none twice
        assert landed | set(quarantined) == set(range(1, 51))             # none lost
        assert not landed & set(quarantined)                              # none in the table
        assert set(range(31, 51)) <= set(quarantined)                     # the old schema after it, too
        assert "column 'name' changed from string to int64" in letters["error"][0].as_py()
        quarantine_logs = [r for r in caplog.records if "is quarantined" in r.getMessage()]
        assert len(quarantine_logs) == 1 and "items" in quarantine_logs[0].getMessage()
        assert _sample("changelake_table_quarantined", table="items") == 1
        assert _sample("changelake_table_quarantined", table="people") == 0
        assert _sample("changelake_dead_letters_total", topic=items_topic,
                       reason="schema-incompatible") - letters_before == len(quarantined)

        # A restart without a fix: the first writer schema is checked against the table, not adopted.
        _produce(kafka.bootstrap_servers, f"{prefix}.items",
                 [(51, framed(3, V3_NAME_IS_LONG, "c", pos=51, after={"id": 51, "name": 51}))])
        _produce(kafka.bootstrap_servers, f"{prefix}.people",
                 [(61, framed(2, V2_ADDS_EMAIL, "c", pos=61, after={"id": 61, "name": "p61", "email": "e"}))])
        _run(spark, config)
        assert 51 not in read_delta(config.table_path("items"))["id"].to_pylist()
        assert read_delta(config.dead_letter_path()).num_rows == len(quarantined) + 1
        assert 61 in read_delta(config.table_path("people"))["id"].to_pylist()
