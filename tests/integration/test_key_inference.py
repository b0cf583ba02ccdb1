"""Tables without primary_key take their key from the Kafka message keys, once, and keep it."""

from __future__ import annotations

import json

import orjson
import pytest
from deltalake import DeltaTable

import changelake.service.inventory as inv
from changelake.connectors.delta_sink_schema import PROP_PRIMARY_KEY
from changelake.service.demo import verify
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query

from .helpers import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


def _envelope_key(key: bytes) -> bytes:
    """The JSON converter's form of a Debezium key: {schema, payload}."""
    schema = {"type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Key",
              "fields": [{"field": "id", "type": "int64", "optional": False}]}
    return orjson.dumps({"schema": schema, "payload": orjson.loads(key)})


def _run(spark, config) -> BatchProcessor:
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    return processor


def test_primary_keys_come_from_the_message_keys_and_survive_a_restart(spark, kafka, tmp_path):
    prefix = kafka.topic("pkeys")
    db = inv.InventoryDatabase(seed=13)
    msgs = list(db.history(snapshot_sizes={"customers": 40, "products": 50, "orders": 60}, changes=300,
                           redeliver=20))

    def retopic(m: inv.Message, key: bytes | None = None) -> inv.Message:
        return inv.Message(m.topic.replace(inv.SERVER, prefix, 1), key or m.key, m.value)

    # customers' keys carry the JSON converter's schema envelope, the others are schema-less
    inv.produce((retopic(m, _envelope_key(m.key) if m.topic.endswith(".customers") else None) for m in msgs),
                kafka.bootstrap_servers)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix,
                                overrides={"tables": [{"name": t} for t in inv.TABLES]})
    assert all(t.primary_key is None for t in config.tables)

    processor = _run(spark, config)
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    expected = {"customers": ["id"], "products": ["id"], "orders": ["order_id"]}
    for table, key in expected.items():
        assert json.loads(DeltaTable(config.table_path(table)).metadata().configuration[PROP_PRIMARY_KEY]) == key
    assert not processor.keys.unknown()

    # After a restart the key comes from the table: a message keyed differently is applied by order_id.
    order_id, before = next(iter(db.state["orders"].items()))
    after = {**before, "quantity": before["quantity"] + 100}
    update = db._envelope("orders", "u", before, after, snapshot=False)
    db.state["orders"][order_id] = after
    inv.produce([retopic(update, orjson.dumps({"id": order_id}))], kafka.bootstrap_servers)
    restarted = BatchProcessor(config, spark=spark)
    assert restarted.keys.key_of("orders") == ("order_id",) and not restarted.keys.unknown()
    start_query(spark, config, restarted, available_now=True).awaitTermination()
    assert restarted.totals.changes["orders"] == {"-U": 1, "+U": 1}
    assert verify(config, db.state) == {t: "ok" for t in db.state}
