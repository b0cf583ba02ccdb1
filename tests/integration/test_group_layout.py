"""The chain's group numbering and operators are recorded with the checkpoint and kept across restarts.

A new checkpoint spreads each node's state buckets evenly over the shuffle partitions
(:mod:`changelake.spark.groups`); a checkpoint written before that numbering existed (an offset log
and no record of it) keeps ``g`` = the bucket, or its state would not be found after an upgrade. Real
topics on the test broker, the demo's graph (join -> aggregate -> top-N) in this process's Spark
session, real Delta tables checked against the same query in batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import changelake.service.inventory as inv
from changelake.service.config import parse_config
from changelake.service.demo import demo_config, expected_views, verify, verify_views
from changelake.service.inventory import InventoryDatabase, produce
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.spark.groups import MARKER

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

GRAPH = ("sales_by_category", "top_categories")


def _config(servers: str, workdir: Path, prefix: str):
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"it-{prefix}",
                      max_records_per_batch=200, views=True)
    for source in raw["sources"]:
        source["topics"] = [t.replace("dbserver1", prefix, 1) for t in source["topics"]]
    raw["pipeline"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2"}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path))


def _run(spark, config) -> BatchProcessor:
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    return processor


@pytest.mark.parametrize("before", ["legacy", "per-node"])
def test_a_checkpoint_keeps_the_numbering_and_the_operators_it_was_written_with(spark, kafka, tmp_path, before):
    """Half of a history runs the way an earlier version ran it, the rest runs after a restart: the restart
    finds every bucket's state, so the graph tables equal the batch query over the final database.
    ``legacy``: g = the bucket, one operator per stateful node, and no record (the record is removed, as a
    checkpoint of that version has none). ``per-node``: balanced groups recorded without ``stages``, one
    operator per stateful node. (A new checkpoint's layout, per level: test_framed_batches.)"""
    prefix = kafka.topic("groups")
    db = InventoryDatabase(seed=47)
    messages = [inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value)
                for m in db.history(snapshot_sizes={"customers": 10, "products": 20, "orders": 40},
                                    changes=200, redeliver=20)]
    half = len(messages) // 2

    old = _config(kafka.bootstrap_servers, tmp_path / "old", prefix)
    marker = Path(old.pipeline.checkpoint) / MARKER
    marker.parent.mkdir(parents=True)
    record = {"layout": "legacy", "partitions": None} if before == "legacy" else {"layout": "balanced", "partitions": 2}
    marker.write_text(json.dumps(record))
    produce(iter(messages[:half]), kafka.bootstrap_servers)
    first = _run(spark, old)
    assert first.query.groups.balanced == (before == "per-node") and not first.query.groups.per_level
    operators = len(first.query._chain.stages)
    assert operators == len(first.query._chain.order), "one operator per stateful node"
    if before == "legacy":
        marker.unlink()

    produce(iter(messages[half:]), kafka.bootstrap_servers)
    again = _run(spark, old)
    assert again.query.groups == first.query.groups, "a checkpoint must keep the layout it was written with"
    assert len(again.query._chain.stages) == operators
    assert json.loads(marker.read_text()) == record                    # recorded (again, for legacy)
    assert verify(old, db.state) == {t: "ok" for t in db.state}
    assert verify_views(old, expected_views(db.state)) == {t: "ok" for t in GRAPH}
