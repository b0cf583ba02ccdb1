"""Sources that feed the operator graph: routed to it, and rows with a null key never reach a kernel."""

from __future__ import annotations

import shutil

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.delta_read import read_delta
from changelake.errors import SinkCommitError
from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor, graph_sink_changes

pytestmark = pytest.mark.unit


def _config(tmp_path):
    return parse_config(f"""
pipeline: {{id: graph-routes, checkpoint: {tmp_path}/ckpt}}
kafka: {{bootstrap_servers: localhost:1}}
sources:
  - {{name: products, topics: [shop.products], columns: {{id: bigint, name: string}}, primary_key: [id]}}
tables:
  - {{name: product_names, from: products, primary_key: [id]}}
storage: {{root: {tmp_path}/lake}}
""")


def _records(values: list[dict]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "topic": ["shop.products"] * n, "partition": [0] * n, "offset": list(range(n)),
        "timestamp": [1_700_000_000_000] * n, "key": [b"k"] * n,
        "value": [orjson.dumps({"before": None, "after": v, "op": "c", "ts_ms": 1}) for v in values],
        EXPIRED: [0] * n}, schema=ARROW_SCHEMA)


def test_null_key_rows_of_a_graph_source_become_dead_letters_in_the_executors(tmp_path):
    processor = BatchProcessor(_config(tmp_path))
    assert list(processor.graph_routes) == [0]
    assert processor.stage.graph_keys == {0: ("id",)}
    out = pa.Table.from_batches(list(processor.stage(iter([_records([{"id": 1, "name": "a"},
                                                                      {"id": None, "name": "b"}])]))))
    _, parts = processor.stage.split(out)
    assert parts[0]["rows"]["id"].to_pylist() == [1]
    dead = parts[0]["dl"]
    assert dead["reason"].to_pylist() == ["missing-key"] and dead["offset"].to_pylist() == [1]
    assert "table" not in dead["error"][0].as_py() and "source 'products'" in dead["error"][0].as_py()
    # the letter keeps its message: the raw bytes, to replay once the key is fixed upstream
    assert orjson.loads(dead["value"][0].as_py())["after"] == {"id": None, "name": "b"}
    assert dead["key"].to_pylist() == [b"k"] and dead["timestamp"][0].value == 1_700_000_000_000


def test_graph_changes_ordered_by_the_graph_then_sequenced_after_earlier_batches():
    # payloads of two tasks, collected out of order: the graph's _seq (positions) restores the order
    changes = pa.table({"id": [7, 7, 8, 9], "_kind": pa.array([1, 2, 0, 1], pa.int8()),
                        "_seq": ["000000000001", "000000000002", "000000000000", "000000000003"]})
    got = graph_sink_changes(changes, primary_key=["id"], batch_id=12)
    assert got["id"].to_pylist() == [8, 7, 7, 9]
    assert got["_kind"].to_pylist() == [0, 1, 2, 3]       # 9's lone -U (retracted, not replaced) is a -D
    seqs = got["_seq"].to_pylist()
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert seqs[-1] < graph_sink_changes(changes, primary_key=["id"], batch_id=13)["_seq"][0].as_py()


def test_a_graph_table_keyed_by_a_nullable_group_key_takes_the_null_group_and_a_mirror_still_dead_letters(
        tmp_path):
    config = _products_by_name(tmp_path, "null-groups", on_error="skip")
    processor = BatchProcessor(config)
    out = pa.Table.from_batches(list(processor.stage(iter([_records([{"id": 1, "name": None},
                                                                      {"id": None, "name": "b"}])]))))
    stats, parts = processor.stage.split(out)
    # what the graph made of the batch: the NULL name is one group
    graph = pa.table({"name": pa.array([None], pa.string()), "n": pa.array([1], pa.int64()),
                      "_kind": pa.array([0], pa.int8()), "_seq": ["000000000000"]})
    report = processor._apply(stats, [(processor.routes[0], parts[0]["rows"], parts[0]["dl"])], 0,
                              {"by_name": graph})
    assert report.committed_tables == ["by_name", "products"]
    assert report.dead_letters == {"missing-key": 1}                # the mirror's NULL primary key
    assert processor.sinks["by_name"].spec.nullable_key == ("name",)
    assert processor.sinks["products"].spec.nullable_key == ()
    assert read_delta(config.table_path("by_name"), columns=["name", "n"]).to_pylist() == [{"name": None, "n": 1}]
    assert read_delta(config.table_path("products"), columns=["id", "name"]).to_pylist() == [{"id": 1, "name": None}]


def test_a_failed_table_commit_lets_the_batchs_other_tables_commit_then_stops_the_batch(tmp_path):
    # the batch's tables commit at once: a failing one neither stops the others nor goes unnoticed,
    # and the replay of the batch commits only what is missing
    config = _products_by_name(tmp_path, "at-once")
    processor = BatchProcessor(config)
    out = pa.Table.from_batches(list(processor.stage(iter([_records([{"id": 1, "name": "a"}])]))))
    stats, parts = processor.stage.split(out)
    decoded = [(processor.routes[0], parts[0]["rows"], DEAD_LETTER_SCHEMA.empty_table())]
    graph = {"by_name": pa.table({"name": ["a"], "n": pa.array([1], pa.int64()), "_kind": pa.array([0], pa.int8()),
                                  "_seq": ["000000000000"]})}
    foreign = pa.table({"name": ["z"], "n": pa.array([9], pa.int64())})
    write_deltalake(config.table_path("by_name"), foreign)     # a table changelake did not create is refused
    with pytest.raises(SinkCommitError, match="by_name"):
        processor._apply(stats, decoded, 0, graph)
    assert processor.sinks["products"].committed_batch_id() == 0          # committed beside the failure
    shutil.rmtree(config.table_path("by_name"))                           # the user's fix
    processor = BatchProcessor(config)                                    # the restart replays batch 0
    report = processor._apply(stats, decoded, 0, graph)
    assert report.committed_tables == ["by_name"]                         # only what was missing
    assert read_delta(config.table_path("products"), columns=["id", "name"]).to_pylist() == [{"id": 1, "name": "a"}]
    assert read_delta(config.table_path("by_name"), columns=["name", "n"]).to_pylist() == [{"name": "a", "n": 1}]


def test_the_read_task_routes_graph_rows_into_envelopes_and_hands_everything_else_to_the_driver(tmp_path):
    """With a graph, the Kafka read task decodes and routes in one Python process (the chain's first
    envelopes: here to the source's normalize, by bucket of its key); what the driver needs (stats,
    dead letters with their position) rides in envelopes addressed to it, and the end of the chain
    gives back the decode stage's payloads."""
    from changelake.spark.buckets import bucket_of
    from changelake.spark.chain import DRIVER, Deliver
    from changelake.spark.decode_stage import PARTS
    from changelake.spark.payloads import from_ipc
    from changelake.spark.query import PipelineQuery

    processor = BatchProcessor(_config(tmp_path))
    query = PipelineQuery(processor, read_tasks=1)
    stage = query.source_stage()
    big, text = 9_223_372_036_854_775_807, "\U0001f600 ü"
    records = _records([{"id": 1, "name": "a"}, {"id": None, "name": "b"}, {"id": big, "name": text}])
    envelopes = pa.Table.from_batches(list(stage(iter([records]))))
    assert stage.spark_schema.startswith("g int, target smallint") and envelopes.schema.names[:2] == ["g", "target"]
    chain = query._chain
    assert chain.order == ("normalize_products",)
    routed = envelopes.filter(pa.compute.equal(envelopes["target"], 0))
    rows = pa.concat_tables([from_ipc(p) for p in routed["payload"].to_pylist()])
    assert sorted(zip(rows["id"].to_pylist(), rows["name"].to_pylist())) == [(1, "a"), (big, text)]
    for bucket, g, payload in zip(routed["bucket"].to_pylist(), routed["g"].to_pylist(), routed["payload"].to_pylist()):
        part = from_ipc(payload)
        assert g == bucket and set(bucket_of(part, ["id"], chain.buckets["normalize_products"]).tolist()) == {bucket}
    assert set(envelopes["target"].to_pylist()) == {0, DRIVER}
    out = pa.Table.from_batches(list(Deliver(len(chain.order), None)(envelopes.to_batches())))
    stats, parts = processor.stage.split(out)
    # records read, offsets expired upstream, the latest Kafka timestamp read (changelake_consumer_lag_seconds)
    assert stats == {("shop.products", 0): (3, 0, max(records["timestamp"].to_pylist()))}
    assert set(parts[0]) == {"dl"}         # no typed rows for the driver: the graph alone reads them
    dead = parts[0]["dl"]
    assert dead["reason"].to_pylist() == ["missing-key"] and dead["offset"].to_pylist() == [1]
    assert orjson.loads(dead["value"][0].as_py())["after"]["id"] is None     # with its raw bytes
    assert set(out["part"].to_pylist()) <= set(PARTS)


def _products_by_name(tmp_path, pipeline_id: str, *, on_error: str = "dlq"):
    """A mirrored ``products`` source and the graph table ``by_name`` (count per name) over it."""
    return parse_config(f"""
pipeline: {{id: {pipeline_id}, checkpoint: {tmp_path}/ckpt}}
kafka: {{bootstrap_servers: localhost:1}}
sources:
  - {{name: products, topics: [shop.products], columns: {{id: bigint, name: string}}, primary_key: [id],
      table: products, on_error: {on_error}}}
views:
  - {{name: by_name, from: products, group_by: [name], aggregates: {{n: "count(*)"}}}}
tables:
  - {{name: products, primary_key: [id]}}
  - {{name: by_name, from: by_name, primary_key: [name]}}
storage: {{root: {tmp_path}/lake}}
""")
