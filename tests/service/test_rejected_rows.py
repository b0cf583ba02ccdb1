"""One change an operator cannot process never stops the pipeline in a loop.

A kernel that raises on a bucket's rows has the guilty rows found by halving and set aside; the state
and output are those of the other rows, in order. On the driver the set-aside rows become dead letters
of the source they descend from (reason ``operator-error``), so that source's ``on_error`` applies:
``dlq`` goes on, ``fail`` stops naming the view, the position and the error.
"""

from __future__ import annotations

import json
import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ, seq_from_kafka
from changelake.connectors.delta_read import read_delta
from changelake.errors import DecodeError
from changelake.operators import AggCall, Changes, GroupAggregate, GroupAggregateConfig
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.spark.binding import NodeInfo, poisoned_reports, run_bucket, run_bucket_isolating
from changelake.spark.decode_stage import SCHEMA
from changelake.spark.reports import Rejected

pytestmark = pytest.mark.unit

MAX = 2**63 - 1
OUT = pa.schema([("k", pa.string()), ("total", pa.int64())])
CONFIG = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),))


def _rows(rows) -> pa.Table:
    return pa.table({"k": [r[0] for r in rows], "v": pa.array([r[1] for r in rows], pa.int64()),
                     KIND: pa.array([0] * len(rows), pa.int8()),
                     SEQ: [seq_from_kafka(2, 100 + i) for i in range(len(rows))]})


def test_the_row_that_overflows_a_sum_is_set_aside_and_the_rest_goes_on():
    rows = [("a", MAX), ("b", 1), ("a", 1), ("b", 2), ("c", 5)]
    with pytest.raises(Exception):                   # the plain step fails on the whole bucket
        run_bucket(GroupAggregate, CONFIG, None, _rows(rows), OUT)
    step, bad = run_bucket_isolating(GroupAggregate, CONFIG, None, _rows(rows), OUT)
    assert [(p.row["k"][0].as_py(), p.row["v"][0].as_py(), p.row[SEQ][0].as_py()) for p in bad] == \
        [("a", 1, seq_from_kafka(2, 102))]
    assert "overflow" in str(bad[0].error).lower() or "out of bounds" in str(bad[0].error).lower() \
        or "too large" in str(bad[0].error).lower() or "int64" in str(bad[0].error).lower(), bad[0].error
    # what one kernel gives for the other rows, in their order
    want = GroupAggregate(CONFIG)
    out = want.process(_rows([r for i, r in enumerate(rows) if i != 2]).select(["k", "v", KIND]))
    out.extend(want.finish())
    final = {}
    for kind, (k, total) in Changes.from_arrow(step.out).as_pairs():
        if kind in ("+I", "+U"):
            final[k] = total
    assert final == {"a": MAX, "b": 3, "c": 5}
    assert Changes.from_arrow(step.out).as_pairs()[-1] == out.as_pairs()[-1]
    # the state continues from the good rows: the next batch adds to b and c
    nxt, bad2 = run_bucket_isolating(GroupAggregate, CONFIG, step.snapshot, _rows([("b", 10)]), OUT)
    assert not bad2 and ("+U", ("b", 13)) in Changes.from_arrow(nxt.out).as_pairs()
    report = poisoned_reports(NodeInfo("revenue"), bad)[0]
    assert report.node == "revenue" and json.loads(report.row) == {"k": "a", "v": 1}
    assert report.seq == seq_from_kafka(2, 102)


def test_a_bucket_whose_every_row_fails_keeps_its_state():
    step, _ = run_bucket_isolating(GroupAggregate, CONFIG, None, _rows([("a", MAX)]), OUT)
    again, bad = run_bucket_isolating(GroupAggregate, CONFIG, step.snapshot, _rows([("a", 1), ("a", 2)]), OUT)
    assert len(bad) == 2 and again.out.num_rows == 0
    assert again.snapshot == step.snapshot and again.state_rows == step.state_rows


def _config(tmp_path, policy: str):
    return parse_config(f"""
pipeline: {{id: rejected, checkpoint: {tmp_path}/ckpt}}
kafka: {{bootstrap_servers: localhost:1}}
sources:
  - name: orders
    topics: [shop.orders]
    columns: {{order_id: bigint, category: string, amount: bigint}}
    primary_key: [order_id]
    on_error: {policy}
views:
  - {{name: revenue, from: orders, group_by: [category], aggregates: {{total: "sum(amount)"}}}}
tables:
  - {{name: revenue, from: revenue, primary_key: [category]}}
storage: {{root: {tmp_path}/lake}}
""")


def _rejected(node: str):
    return Rejected(node=node, side="left", row=json.dumps({"order_id": 7, "category": "x", "amount": 1}),
                    seq=seq_from_kafka(3, 41), error="ArrowInvalid: Integer value 9223372036854775808 not in range")


def test_rejected_rows_are_dead_letters_of_their_source_with_position(tmp_path):
    processor = BatchProcessor(_config(tmp_path, "dlq"))
    node = next(n.id for n in processor.plan if n.op == "aggregate")
    report = processor.process_decoded(SCHEMA.empty_table(), 5, rejected=[_rejected(node)])
    assert report.dead_letters == {"operator-error": 1}
    letters = read_delta(processor.config.dead_letter_path()).to_pylist()
    assert len(letters) == 1
    letter = letters[0]
    assert letter["source"] == "orders" and letter["topic"] == "shop.orders"
    assert (letter["partition"], letter["offset"]) == (3, 41)
    assert letter["reason"] == "operator-error" and json.loads(letter["value"])["order_id"] == 7
    assert f"view {node!r}" in letter["error"] and "Integer value" in letter["error"]


def test_with_on_error_fail_a_rejected_row_stops_naming_view_and_position(tmp_path):
    processor = BatchProcessor(_config(tmp_path, "fail"))
    node = next(n.id for n in processor.plan if n.op == "aggregate")
    with pytest.raises(DecodeError, match=f"source 'orders'.*view '{node}'.*position") as info:
        processor.process_decoded(SCHEMA.empty_table(), 5, rejected=[_rejected(node)])
    assert (info.value.partition, info.value.offset) == (3, 41)


@pytest.mark.parametrize("normalize", [True, False])
def test_behind_the_transaction_gate_a_row_the_views_raise_on_is_a_dead_letter_and_the_batch_goes_on(tmp_path,
                                                                                                    normalize):
    """With ``consistency: transaction`` the views run on the driver (``service.driver_graph``): a row its
    aggregate overflows on is set aside there as on the executors, and the rest of the batch lands. Without
    the source's ChangelogNormalize the aggregate reads the source's rows: the letter names their message."""
    import orjson
    import yaml

    from tests import txn_history as th

    topic, txn_topic = th.TOPICS["accounts"], th.TXN_TOPIC
    config = parse_config(yaml.safe_dump({
        "pipeline": {"id": "txn-rejected", "checkpoint": str(tmp_path / "ckpt")},
        "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")},
        "sources": [{"name": "accounts", "topics": [topic], "format": "debezium-json", "table": "accounts",
                     "columns": {"id": "bigint", "balance": "bigint"}, "consistency": "transaction",
                     "on_error": "dlq", "normalize": normalize}],
        "views": [{"name": "by_parity",
                   "sql": "SELECT id % 2 AS parity, SUM(balance) AS total FROM accounts GROUP BY id % 2"}],
        "tables": [{"name": "accounts", "primary_key": ["id"]},
                   {"name": "by_parity", "from": "by_parity", "primary_key": ["parity"]}]}))
    processor = BatchProcessor(config)
    assert processor.driver_graph is not None

    def txn(k: int, rows: list[tuple[int, int]], offset: int) -> list[tuple]:
        tid = f"{900 + k}:1"
        out = [(topic, 0, offset + i, orjson.dumps({"id": a}), orjson.dumps({
            "op": "c", "before": None, "after": {"id": a, "balance": b}, "ts_ms": 1_700_000_000_000,
            "source": {"connector": "mysql", "db": th.DB, "table": "accounts", "file": "mysql-bin.000001",
                       "pos": 100 * (offset + i + 1), "row": 0},
            "transaction": {"id": tid, "total_order": i + 1, "data_collection_order": i + 1}}))
            for i, (a, b) in enumerate(rows)]
        end = (txn_topic, 0, k, None, orjson.dumps({"status": "END", "id": tid, "event_count": len(rows),
                                                    "data_collections": [{"data_collection": f"{th.DB}.accounts",
                                                                          "event_count": len(rows)}]}))
        return out + [end]

    # account 3's balance overflows the odd accounts' SUM after account 1's
    first = th.record_batch(txn(0, [(1, MAX), (3, 1)], 0))
    out = pa.Table.from_batches(list(processor.stage(iter([first]))))
    report = processor.process_decoded(out, 0)
    assert report.dead_letters == {"operator-error": 1}
    letters = read_delta(config.dead_letter_path()).to_pylist()
    assert [(json.loads(r["value"]), r["reason"], r["source"]) for r in letters] == [
        ({"parity": 1, "balance": 1}, "operator-error", "accounts")]
    assert "view 'by_parity'" in letters[0]["error"] and "ValueOverflowError" in letters[0]["error"]
    if normalize:           # the aggregate's input is the normalize's output: no message to name
        assert "no source position" in letters[0]["error"] and letters[0]["partition"] == -1
    else:                   # the change's source position and the Kafka message of account 3: offset 1
        assert (letters[0]["topic"], letters[0]["partition"], letters[0]["offset"]) == (topic, 0, 1)
        assert f"(the message at {topic} partition 0 offset 1)" in letters[0]["error"], letters[0]["error"]
    assert sorted(read_delta(config.table_path("by_parity")).select(["parity", "total"]).to_pylist(),
                  key=lambda r: r["parity"]) == [{"parity": 1, "total": MAX}]
    # the next transaction goes through the same views' state
    second = th.record_batch(txn(1, [(2, 7)], 2))
    report = processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([second])))), 1)
    assert not report.dead_letters
    assert sorted(read_delta(config.table_path("by_parity")).select(["parity", "total"]).to_pylist(),
                  key=lambda r: r["parity"]) == [{"parity": 0, "total": 7}, {"parity": 1, "total": MAX}]
    assert read_delta(config.table_path("accounts")).num_rows == 3       # the mirror took every row
    # a later batch's bad row runs again from the state the batch before left (not from nothing)
    third = th.record_batch(txn(2, [(4, 3), (5, 1)], 3))
    report = processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([third])))), 2)
    assert report.dead_letters == {"operator-error": 1}
    assert sorted(read_delta(config.table_path("by_parity")).select(["parity", "total"]).to_pylist(),
                  key=lambda r: r["parity"]) == [{"parity": 0, "total": 10}, {"parity": 1, "total": MAX}]
