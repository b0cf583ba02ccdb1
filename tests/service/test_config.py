from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.service.config import load_config, parse_config

pytestmark = pytest.mark.unit

GOOD = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092", properties: {sasl.password: "${KAFKA_PW}"}}
sources: [{name: p, topics: [a.b.products], table: products}]
tables: [{name: products, primary_key: [id]}]
"""


def test_every_error_is_reported_with_its_path():
    bad = """
pipeline: {id: "has space", checkpoint: /tmp/c, trigger_interval: soon}
kafka: {bootstrap_servers: "x:1"}
sources: [{name: s, format: avro, table: missing, topics: [t]}]
tables: [{name: t, primary_key: []}]
"""
    with pytest.raises(ConfigError) as info:
        parse_config(bad, environ={})
    text = str(info.value)
    for path in ("pipeline.id", "pipeline.trigger_interval", "sources.0.format", "tables.0.primary_key"):
        assert path in text
    assert "error(s)" in text


def test_a_source_must_write_to_a_declared_table():
    with pytest.raises(ConfigError, match="not under 'tables'"):
        parse_config(GOOD.replace("table: products}", "table: nope}"), environ={"KAFKA_PW": "x"})


def test_env_references_overrides_and_secret_files(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = parse_config(GOOD, environ={"KAFKA_PW": "hunter2",
                                      "CHANGELAKE_KAFKA__BOOTSTRAP_SERVERS": "broker:9093",
                                      "CHANGELAKE_PIPELINE__MAX_RECORDS_PER_BATCH": "500"})
    assert cfg.kafka.plain_properties() == {"sasl.password": "hunter2"}
    assert cfg.kafka.bootstrap_servers == "broker:9093"
    assert cfg.pipeline.max_records_per_batch == 500
    from_file = parse_config(GOOD.replace('sasl.password: "${KAFKA_PW}"', f"sasl.password_file: {secret}"),
                             environ={})
    assert from_file.kafka.plain_properties() == {"sasl.password": "from-file"}
    env_secret = parse_config(GOOD, environ={"KAFKA_PW": "a", "CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD": "b"})
    assert env_secret.kafka.plain_properties()["sasl.password"] == "b"


def test_secrets_are_hidden_in_the_log_safe_dump():
    cfg = parse_config(GOOD, environ={"KAFKA_PW": "hunter2"})
    assert "hunter2" not in repr(cfg.redacted()) and "hunter2" not in repr(cfg)


def test_a_missing_environment_variable_is_an_error_not_an_empty_secret():
    with pytest.raises(ConfigError, match="KAFKA_PW is not set"):
        parse_config(GOOD, environ={})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the pipeline file"):
        load_config(tmp_path / "nope.yaml")


def test_dead_letter_topic_per_source_overrides_the_global_one_and_primary_key_is_optional():
    two = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: a, topics: [a], table: a}
  - {name: b, topics: [b], table: b, dead_letter_topic: b.dlq}
tables: [{name: a}, {name: b, primary_key: [id]}]
"""
    cfg = parse_config(two, environ={})
    assert cfg.dead_letter_topic("a") is None and cfg.dead_letter_topic("b") == "b.dlq"
    assert cfg.table("a").primary_key is None and cfg.table("b").primary_key == ["id"]
    cfg = parse_config(two + "dead_letter: {topic: all.dlq}\n", environ={})
    assert cfg.dead_letter_topic("a") == "all.dlq" and cfg.dead_letter_topic("b") == "b.dlq"
