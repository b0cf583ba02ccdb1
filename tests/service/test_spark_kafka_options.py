"""``kafka.reader: spark-kafka``: the pipeline's Kafka settings as Spark's Kafka source options
(changelake/spark/spark_kafka_options.py), what ``validate`` refuses for it, and the jars the session gets."""

from __future__ import annotations

import json
import re

import pytest

from changelake import jvm_deps
from changelake.service.cli import main
from changelake.spark.session import jar_set_settings
from changelake.spark.spark_kafka_options import (option_problems, property_problems, spark_options,
                                                  subscribe_pattern)

pytestmark = pytest.mark.unit

READER = {"bootstrap.servers": "k1:9092,k2:9092", "topics": "db.inv.orders,db.inv.order-lines",
          "replayTopics": r"(?:db\.inv\.orders\.replay)", "maxRecordsPerTrigger": "5000", "readTasks": "2"}


def test_security_settings_become_the_java_clients():
    props = {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cl",
             "sasl.password": 'p"w\\d', "ssl.ca.location": "/certs/ca.pem", "client.id": "me",
             "fetch.wait.max.ms": "200", "ssl.endpoint.identification.algorithm": "none"}
    assert property_problems(props) == []
    out = spark_options(READER, props, {})
    assert out["kafka.bootstrap.servers"] == "k1:9092,k2:9092"
    assert out["kafka.security.protocol"] == "SASL_SSL"
    assert out["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert out["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                             'username="cl" password="p\\"w\\\\d";')
    assert (out["kafka.ssl.truststore.location"], out["kafka.ssl.truststore.type"]) == ("/certs/ca.pem", "PEM")
    assert out["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert out["kafka.client.id"] == "me" and out["kafka.fetch.max.wait.ms"] == "200"
    # the same guarantees as the python reader: committed records only, the admission limit, every topic
    assert out["kafka.isolation.level"] == "read_committed"
    assert out["maxOffsetsPerTrigger"] == "5000"
    assert out["startingOffsets"] == "earliest" and out["includeHeaders"] == "true"
    assert not {"readTasks", "topics", "maxRecordsPerTrigger"} & set(out)


def test_topics_and_replay_topics_are_one_fully_matched_pattern():
    pattern = re.compile(subscribe_pattern(READER))
    for topic in ("db.inv.orders", "db.inv.order-lines", "db.inv.orders.replay"):
        assert pattern.fullmatch(topic), topic
    for topic in ("db.inv.orders2", "dbXinv.orders", "db.inv.order-lines.replay"):
        assert not pattern.fullmatch(topic), topic
    with_pattern = re.compile(subscribe_pattern({"topicPattern": r"db\.inv\..*", "replayTopics": "r"}))
    assert with_pattern.fullmatch("db.inv.anything") and with_pattern.fullmatch("r")


def test_starting_offsets_other_than_earliest_or_latest_are_resolved_per_partition():
    asked = []
    by_topic = {**READER, "startingOffsets": json.dumps({"db.inv.orders": "latest",
                                                         "db.inv.order-lines": {"timestamp": 1_700_000_000_000}})}
    out = spark_options(by_topic, {}, {}, resolve_offsets=lambda: asked.append(1) or
                        {"db.inv.orders": {"1": 40, "0": 12}, "db.inv.order-lines": {"0": 3}})
    assert asked == [1]
    assert json.loads(out["startingOffsets"]) == {"db.inv.order-lines": {"0": 3}, "db.inv.orders": {"0": 12, "1": 40}}
    assert spark_options({**READER, "startingOffsets": "latest"}, {}, {})["startingOffsets"] == "latest"


def test_spark_options_pass_through_last_whatever_their_case():
    out = spark_options(READER, {}, {"maxoffsetspertrigger": "100", "failOnDataLoss": "false",
                                     "kafka.ssl.keystore.location": "/k.p12"})
    assert out["maxoffsetspertrigger"] == "100" and "maxOffsetsPerTrigger" not in out
    assert out["failOnDataLoss"] == "false" and out["kafka.ssl.keystore.location"] == "/k.p12"


def test_what_has_no_java_equivalent_is_refused_with_the_reason():
    problems = dict(property_problems({"enable.ssl.certificate.verification": "false", "queued.min.messages": "9",
                                       "sasl.username": "u", "sasl.password": "p",
                                       "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"}))
    assert "always verifies the broker's certificate" in problems["enable.ssl.certificate.verification"]
    assert "kafka.spark_options" in problems["queued.min.messages"]
    assert "not GSSAPI" in problems["sasl.mechanism"]                 # a password with no SASL mechanism given
    assert "one file" in problems["ssl.certificate.location"]
    assert property_problems({"ssl.certificate.location": "/both.pem", "ssl.key.location": "/both.pem"}) == []


def test_options_changelake_sets_itself_or_spark_does_not_know_are_refused():
    problems = dict(option_problems({"subscribe": "t", "minPartitions": "8", "kafka.group.id": "g",
                                     "failOnDataLos": "false", "kafka.ssl.keystore.type": "PKCS12",
                                     "startingOffsets": "latest", "maxTriggerDelay": "5m"}))
    assert set(problems) == {"subscribe", "minPartitions", "kafka.group.id", "failOnDataLos"}
    assert "sources[].topics" in problems["subscribe"]
    assert "one task" in problems["minPartitions"]
    assert "did you mean 'failOnDataLoss'" in problems["failOnDataLos"]


YAML = """pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka:
  bootstrap_servers: "localhost:9092"
  reader: READER
  properties: {security.protocol: SSL, enable.ssl.certificate.verification: false}
  spark_options: {failOnDataLoss: false, minPartitions: 4}
sources: [{name: p, topics: [a.b.products], table: products, columns: {id: int}}]
tables: [{name: products, primary_key: [id]}]
"""


def test_validate_names_each_setting_the_chosen_reader_cannot_take(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(YAML.replace("READER", "spark-kafka"))
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "2 error(s)" in err
    assert "kafka.properties.enable.ssl.certificate.verification: 'enable.ssl.certificate.verification' cannot be " \
           "given to Spark's Kafka source" in err
    assert "kafka.spark_options.minPartitions: 'minPartitions': each Kafka partition's range is read by one task" in err
    path.write_text(YAML.replace("READER", "python"))
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "kafka.spark_options.failOnDataLoss: 'failOnDataLoss' is a Spark Kafka source option, which only " \
           "kafka.reader: spark-kafka reads" in err
    path.write_text(YAML.replace("READER", "spark-kafka").replace(", enable.ssl.certificate.verification: false", "")
                    .replace(", minPartitions: 4", ""))
    assert main(["validate", "-c", str(path)]) == 0
    capsys.readouterr()
    path.write_text(path.read_text().replace("checkpoint: /tmp/ckpt", "checkpoint: /tmp/ckpt, first_batch_records: 100"))
    assert main(["validate", "-c", str(path)]) == 2
    assert "pipeline.first_batch_records: Spark's Kafka source (kafka.reader: spark-kafka) admits the same " \
           "maxOffsetsPerTrigger to every batch" in capsys.readouterr().err


def test_the_session_gets_a_sets_jars_after_those_given(monkeypatch, tmp_path):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert jar_set_settings((), {}, {}) == {}
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(tmp_path))
    with pytest.raises(jvm_deps.JvmDepsMissing, match="'spark-kafka'.*make install"):
        jar_set_settings(("spark-kafka",), {}, {})
    monkeypatch.setattr(jvm_deps, "jars", lambda name: [tmp_path / f"{name}-a.jar", tmp_path / f"{name}-b.jar"])
    got = jar_set_settings(("spark-kafka",), {"spark.jars": "/l.jar"}, {"spark.jars": "/p.jar,/l.jar"})
    assert got["spark.jars"].split(",") == ["/l.jar", "/p.jar", f"{tmp_path}/spark-kafka-a.jar",
                                            f"{tmp_path}/spark-kafka-b.jar"]
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")      # under spark-submit the launcher's --jars hold them
    assert jar_set_settings(("spark-kafka",), {}, {}) == {}
