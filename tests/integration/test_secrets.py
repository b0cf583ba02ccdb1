"""Kafka credentials reach the consumer but never Spark's plan, progress reports or our logs."""

from __future__ import annotations

import logging

import pytest

from changelake.service.cli import configure_logging
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import kafka_reader_options, start_query

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

SECRET = "pa55-w0rd-that-must-not-leak"


def test_sasl_password_stays_out_of_plans_progress_and_logs(spark, kafka, tmp_path, caplog, capsys):
    prefix = kafka.topic("secret")
    write_history(kafka.bootstrap_servers, seed=3, changes=50, topic_prefix=prefix,
                  sizes={"customers": 5, "products": 5, "orders": 5}, redeliver=0)
    # sasl.username/password are only used with a SASL protocol; with PLAINTEXT they ride along unused,
    # which is enough to see where the values travel.
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, overrides={
        "kafka": {"properties": {"sasl.username": "changelake", "sasl.password": SECRET}}})
    assert kafka_reader_options(config)["kafka.sasl.password"] == SECRET     # it does reach the source
    configure_logging("DEBUG")                   # what `changelake --log-level DEBUG` does
    caplog.set_level(logging.DEBUG)
    processor = BatchProcessor(config, spark=spark)
    query = start_query(spark, config, processor, available_now=True)
    query.awaitTermination()
    capsys.readouterr()
    query.explain(extended=True)                 # the plans Spark shows in its UI and logs
    plan = capsys.readouterr().out
    assert "changelake-kafka" in plan
    progress = "".join(str(p) for p in query.recentProgress)
    assert processor.totals.records > 0
    assert SECRET not in plan
    assert SECRET not in progress
    assert SECRET not in caplog.text
    assert SECRET not in str(config.redacted()) and SECRET not in repr(config)
