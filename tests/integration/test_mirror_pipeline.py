"""Kafka -> Spark -> Delta, end to end, in this test process's Spark session."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.spark.kafka_source import SOURCE_NAME, KafkaSource
from changelake import metrics
from changelake.service.demo import verify
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


def _run(spark, config):
    processor = BatchProcessor(config, spark=spark)
    query = start_query(spark, config, processor, available_now=True)
    query.awaitTermination()
    return processor, query


def test_stream_reads_in_bounded_batches_and_resumes_from_its_checkpoint(spark, kafka, tmp_path):
    topic = kafka.topic("stream")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for i in range(500):
        producer.produce(topic, key=b"%d" % i, value=b"%d" % i)
    producer.flush(30)
    spark.dataSource.register(KafkaSource)
    seen: list[tuple[int, int, int]] = []

    def collect(df, batch_id):
        rows = df.select("partition", "offset").collect()
        seen.extend((batch_id, r.partition, r.offset) for r in rows)

    def run_once():
        q = (spark.readStream.format(SOURCE_NAME).option("bootstrap.servers", kafka.bootstrap_servers)
             .option("topics", topic).option("maxRecordsPerTrigger", "150").load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination()

    run_once()
    per_batch = {}
    for b, _, _ in seen:
        per_batch[b] = per_batch.get(b, 0) + 1
    assert sum(per_batch.values()) == 500 and max(per_batch.values()) <= 150
    assert len({(p, o) for _, p, o in seen}) == 500
    first_run = len(seen)
    for i in range(500, 620):
        producer.produce(topic, key=b"%d" % i, value=b"%d" % i)
    producer.flush(30)
    run_once()                      # restart from the checkpoint: only the new records
    new = seen[first_run:]
    assert len(new) == 120
    assert not {(p, o) for _, p, o in new} & {(p, o) for _, p, o in seen[:first_run]}



def test_each_start_ramps_its_batches_up_to_the_cap_and_reads_every_record_once(spark, kafka, tmp_path):
    """The ramp after a start (firstRecordsPerTrigger) in Spark's own calls: the reader counts the batches it
    planned across them, and a restart from the checkpoint starts small again."""
    import time

    topic = kafka.topic("ramp")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})

    def produce(first, last):
        for i in range(first, last):
            producer.produce(topic, key=b"%d" % i, value=b"%d" % i)
        producer.flush(30)

    spark.dataSource.register(KafkaSource)
    seen: dict[int, int] = {}
    offsets: set[tuple[int, int]] = set()

    def collect(df, batch_id):
        rows = df.select("partition", "offset").collect()
        seen[batch_id] = len(rows)
        offsets.update((r.partition, r.offset) for r in rows)

    def run_until(total):
        q = (spark.readStream.format(SOURCE_NAME).option("bootstrap.servers", kafka.bootstrap_servers)
             .option("topics", topic).option("maxRecordsPerTrigger", "400").option("firstRecordsPerTrigger", "50")
             .load().writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")).start())
        deadline = time.monotonic() + 180
        while len(offsets) < total and time.monotonic() < deadline and q.exception() is None:
            time.sleep(0.2)
        q.stop()
        assert q.exception() is None

    produce(0, 1000)
    run_until(1000)
    assert [n for _, n in sorted(seen.items()) if n] == [50, 100, 200, 400, 250]
    first_run = set(seen)
    produce(1000, 1600)
    run_until(1600)                     # the next start ramps again from the checkpoint's offsets
    assert [n for b, n in sorted(seen.items()) if b not in first_run and n] == [50, 100, 200, 250]
    assert len(offsets) == 1600 and sum(seen.values()) == 1600

def test_debezium_topics_are_mirrored_into_delta_tables(spark, kafka, tmp_path):
    prefix = kafka.topic("mirror")
    db = write_history(kafka.bootstrap_servers, seed=11, changes=1_500, topic_prefix=prefix)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=700)
    arrow_before = pa.default_memory_pool().bytes_allocated()
    processor, query = _run(spark, config)
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    # once a batch is done the driver's Arrow pool holds none of its buffers, only the sinks' copies of their
    # tombstones (a batch's tables, ~250 KB each here, kept alive from one batch to the next would show; the
    # gauge is what an operator watches)
    held = metrics.REGISTRY.get_sample_value("changelake_driver_arrow_bytes")
    copies = [s._tomb_copy[1] for s in processor.sinks.values() if s._tomb_copy is not None]
    assert copies and held is not None
    assert held - arrow_before - sum(t.get_total_buffer_size() for t in copies) < 64 * 1024, (held, arrow_before)
    totals = processor.totals
    assert totals.records > 1_500 and not totals.dead_letters
    for table, counts in db.counts.items():
        kinds = totals.changes[table]
        # every snapshot row and insert arrived as +I, every delete as -D (re-deliveries may add some)
        assert kinds["+I"] >= counts["r"] + counts["c"]
        assert kinds["-D"] >= counts["d"]
        assert kinds["-U"] == kinds["+U"] >= counts["u"]
    # running again over the same checkpoint reads nothing and changes nothing
    versions = {t: read_delta(config.table_path(t)).num_rows for t in db.state}
    processor, _ = _run(spark, config)
    assert processor.totals.records == 0
    assert {t: read_delta(config.table_path(t)).num_rows for t in db.state} == versions


def test_bad_messages_go_to_the_dead_letter_table_with_bytes_and_position(spark, kafka, tmp_path):
    prefix = kafka.topic("dlq")
    db = write_history(kafka.bootstrap_servers, seed=5, changes=200, topic_prefix=prefix)
    topic = f"{prefix}.inventory.products"
    bad = [b'{"op": "c", "after": {"id": 1', b"\xff\xfe not json", b'{"op": "x", "after": {"id": 9}}']
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for value in bad:
        p.produce(topic, key=b'{"id": 1}', value=value, partition=0)
    p.flush(30)
    before = metrics.REGISTRY.get_sample_value("changelake_dead_letters_total",
                                               {"topic": topic, "reason": "malformed"}) or 0
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix)
    processor, _ = _run(spark, config)
    assert verify(config, db.state) == {t: "ok" for t in db.state}   # bad input corrupted nothing
    letters = read_delta(config.dead_letter_path())
    assert sorted(letters["value"].to_pylist()) == sorted(bad)
    assert set(letters["topic"].to_pylist()) == {topic}
    assert set(letters["partition"].to_pylist()) == {0}
    assert pc.min(letters["offset"]).as_py() >= 0
    assert all(e for e in letters["error"].to_pylist())
    assert set(letters["reason"].to_pylist()) <= {"malformed", "unknown-op"}
    after = metrics.REGISTRY.get_sample_value("changelake_dead_letters_total",
                                              {"topic": topic, "reason": "malformed"})
    assert after - before == sum(1 for r in letters["reason"].to_pylist() if r == "malformed")
    assert sum(processor.totals.dead_letters.values()) == 3


def test_on_error_fail_stops_before_anything_is_written(spark, kafka, tmp_path):
    prefix = kafka.topic("fail")
    topic = f"{prefix}.inventory.customers"
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    p.produce(topic, key=b'{"id": 1}', value=json.dumps(
        {"op": "c", "after": {"id": 1, "first_name": "A", "last_name": "B", "email": "a@b"},
         "source": {"ts_ms": 1}}).encode())
    p.produce(topic, key=b'{"id": 2}', value=b"{not json")
    p.flush(30)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix)
    sources = [s.model_copy(update={"on_error": "fail"}) for s in config.sources]
    config = config.model_copy(update={"sources": sources})
    processor = BatchProcessor(config, spark=spark)
    query = start_query(spark, config, processor, available_now=True)
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    assert "on_error: fail" in str(info.value) and topic in str(info.value)
    assert not (tmp_path / "lake" / "customers").exists()


def test_sources_with_and_without_declared_columns_both_arrive(spark, kafka, tmp_path):
    """Declared columns: decoded in the executors. No columns (types inferred at run time): on the driver."""
    prefix = kafka.topic("mixed")
    db = write_history(kafka.bootstrap_servers, seed=17, changes=400, topic_prefix=prefix)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix)
    sources = [s.model_copy(update={"columns": None}) if s.table == "customers" else s for s in config.sources]
    config = config.model_copy(update={"sources": sources})
    processor, _ = _run(spark, config)
    on_executors = {processor.routes[i].spec.table for i in processor.stage.executor_routes}
    assert on_executors == {"products", "orders"}
    assert verify(config, db.state) == {t: "ok" for t in db.state}


def test_dead_letters_are_replayed_once_after_the_cause_is_fixed(spark, kafka, tmp_path):
    from changelake.service.dlq import replay

    prefix = kafka.topic("replay")
    topic = f"{prefix}.inventory.orders"
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    row = {"order_id": 7, "order_date": 19000, "purchaser": 1, "quantity": "a dozen", "product_id": 3}
    p.produce(topic, key=b'{"order_id": 7}', value=json.dumps(
        {"op": "c", "after": row, "source": {"ts_ms": 1, "file": "mysql-bin.000001", "pos": 4, "row": 0}}).encode())
    p.flush(30)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix)
    _run(spark, config)
    letters = read_delta(config.dead_letter_path())
    assert letters.num_rows == 1 and letters["reason"][0].as_py() == "schema-mismatch"
    assert not (tmp_path / "lake" / "orders").exists()

    # The fix: quantity is declared as text, which is what this producer sends.
    fixed = [s.model_copy(update={"columns": {**s.columns, "quantity": "string"}}) if s.table == "orders" else s
             for s in config.sources]
    config = config.model_copy(update={"sources": fixed})
    assert replay(config).replayed == 1
    assert replay(config).replayed == 0                    # never sent twice
    _run(spark, config)
    table = read_delta(config.table_path("orders"))
    assert table.select(["order_id", "quantity"]).to_pylist() == [{"order_id": 7, "quantity": "a dozen"}]
