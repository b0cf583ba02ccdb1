"""The event-time joins' late rows on the driver: counted per view and side, dead-lettered when asked."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from changelake import metrics
from changelake.service.config import parse_config
from changelake.spark.decode_stage import SCHEMA
from changelake.service.pipeline import BatchProcessor

pytestmark = pytest.mark.unit


def _config(tmp_path, policy: str):
    return parse_config(f"""
pipeline: {{id: late-rows, checkpoint: {tmp_path}/ckpt}}
kafka: {{bootstrap_servers: localhost:1}}
sources:
  - name: orders
    topics: [shop.orders]
    columns: {{order_id: bigint, ts: timestamp}}
    append_only: true
    event_time: ts
  - name: ships
    topics: [shop.ships]
    columns: {{ship_id: bigint, order_id: bigint, ts: timestamp}}
    append_only: true
    event_time: ts
views:
  - name: shipped
    interval_join: {{left: orders, right: ships, on: {{order_id: order_id}}, before: 1 hour, after: 0 s,
                    late_rows: {policy}}}
tables:
  - {{name: shipped, from: shipped, primary_key: [order_id, ship_id]}}
storage: {{root: {tmp_path}/lake}}
""")


def _count(view: str, side: str) -> float:
    return metrics.REGISTRY.get_sample_value("changelake_late_rows_total", {"view": view, "side": side}) or 0


def test_dead_lettered_late_rows_keep_the_row_and_name_the_view(tmp_path):
    processor = BatchProcessor(_config(tmp_path, "dead_letter"))
    before = _count("shipped", "right")
    row = {"order_id": None, "ts": None, "ship_id": 7, "ships_order_id": 3, "ships_ts": "2026-01-01 00:00:00"}
    report = processor.process_decoded(SCHEMA.empty_table(), 4, late_rows={("shipped", "right"): (1, [json.dumps(row)])})
    assert report.dead_letters == {"late": 1}
    assert _count("shipped", "right") == before + 1
    letters = DeltaTable(processor.config.dead_letter_path()).to_pyarrow_table().to_pylist()
    assert len(letters) == 1
    letter = letters[0]
    assert letter["source"] == "ships" and letter["topic"] == "shop.ships" and letter["reason"] == "late"
    assert json.loads(letter["value"]) == row
    assert "view 'shipped'" in letter["error"] and "watermark_delay" in letter["error"]
    assert letter["batch_id"] == 4


def test_dropped_late_rows_are_counted_and_logged(tmp_path, caplog):
    processor = BatchProcessor(_config(tmp_path, "drop"))
    before = _count("shipped", "left")
    report = processor.process_decoded(SCHEMA.empty_table(), 0, late_rows={("shipped", "left"): (3, [])})
    assert report.dead_letters == {"late": 3}
    assert _count("shipped", "left") == before + 3
    assert "dropped 3 late left row(s)" in caplog.text
    assert not (tmp_path / "lake" / "_dead_letters").exists()
