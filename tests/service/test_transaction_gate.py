"""The gate's rule on Arrow tables (changelake.service.transactions.TransactionGate), and what the formats
give it (changelake.formats.transactions): no Delta, no Spark."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from changelake.changelog import OFFSET, PARTITION, TOPIC
from changelake.formats.transactions import BOUNDARIES_SCHEMA, EVENTS_SCHEMA, event_transactions, transaction_boundaries
from changelake.service.transactions import FEED, GateBook, GateState, TransactionGate

pytestmark = pytest.mark.unit


def _records(rows: list[tuple[str, int, int, dict | None]]) -> pa.Table:
    return pa.table({"topic": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
                     "offset": pa.array([r[2] for r in rows], pa.int64()),
                     "value": pa.array([None if r[3] is None else orjson.dumps(r[3]) for r in rows], pa.binary())})


def _gate(limit: int = 1000) -> TransactionGate:
    return TransactionGate(collection_of=lambda t: t.removeprefix("p.") if t.startswith("p.") else None,
                           tracked=lambda c: c in ("db.a", "db.b"), max_held_rows=limit)


def _rows(topic: str, offsets: list[int], partition: int = 0) -> pa.Table:
    n = len(offsets)
    return pa.table({"id": list(range(n)), TOPIC: [topic] * n, PARTITION: pa.array([partition] * n, pa.int32()),
                     OFFSET: pa.array(offsets, pa.int64())})


def _events(rows: list[tuple[str, int, int, str]]) -> pa.Table:
    return pa.table({"topic": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
                     "offset": pa.array([r[2] for r in rows], pa.int64()), "txn": [r[3] for r in rows],
                     "last": [False] * len(rows)}, schema=EVENTS_SCHEMA)


def _ends(ends: list[tuple[int, str, dict]]) -> pa.Table:
    return pa.Table.from_pylist([{"topic": "p.transaction", "partition": 0, "offset": o, "txn": t,
                                  "event_count": sum(c.values()),
                                  "collections": [{"collection": k, "event_count": v} for k, v in c.items()]}
                                 for o, t, c in ends], schema=BOUNDARIES_SCHEMA)


def test_formats_read_the_transaction_of_each_event_and_the_ends():
    dbz = {"op": "c", "after": {"id": 1}, "transaction": {"id": "571", "total_order": 1, "data_collection_order": 1}}
    enveloped = {"schema": {}, "payload": {**dbz, "transaction": {"id": "572"}}}
    got = event_transactions(_records([("p.db.a", 0, 0, dbz), ("p.db.a", 0, 1, None),
                                       ("p.db.a", 1, 0, enveloped), ("p.db.a", 1, 1, {"op": "r", "after": {}})]),
                             "debezium-json")
    assert list(zip(got["offset"].to_pylist(), got["txn"].to_pylist())) == [(0, "571"), (0, "572")]
    maxwell = event_transactions(_records([("m", 0, 0, {"database": "shop", "xid": 9, "data": {}}),
                                           ("m", 0, 1, {"database": "shop", "xid": 9, "commit": True, "data": {}})]),
                                 "maxwell-json")
    assert maxwell["txn"].to_pylist() == ["shop:9", "shop:9"] and maxwell["last"].to_pylist() == [False, True]
    ends, bad = transaction_boundaries(_records([
        ("p.transaction", 0, 0, {"status": "BEGIN", "id": "571", "event_count": None, "data_collections": None}),
        ("p.transaction", 0, 1, {"status": "END", "id": "571", "event_count": 2, "data_collections": [
            {"data_collection": "db.a", "event_count": 1}, {"data_collection": "db.b", "event_count": 1}]}),
        ("p.transaction", 0, 2, {"hello": 1})]))
    assert ends.to_pylist()[0]["collections"] == [{"collection": "db.a", "event_count": 1},
                                                  {"collection": "db.b", "event_count": 1}]
    assert bad == [2]
    # Debezium PostgreSQL: <txId>:<LSN of the event> in a change, <txId>:<commit LSN> in the END (3.6.1)
    pg_event = {**dbz, "transaction": {"id": "734:26378888", "total_order": 2, "data_collection_order": 2}}
    pg_end = {"status": "END", "id": "734:26379616", "event_count": 1,
              "data_collections": [{"data_collection": "public.a", "event_count": 1}]}
    assert event_transactions(_records([("p.public.a", 0, 0, pg_event)]), "debezium-json")["txn"].to_pylist() == \
        transaction_boundaries(_records([("p.transaction", 0, 0, pg_end)]))[0]["txn"].to_pylist() == ["734"]
    gtid = {**dbz, "transaction": {"id": "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"}}
    assert event_transactions(_records([("p.db.a", 0, 0, gtid)]), "debezium-json")["txn"].to_pylist() == \
        ["3e11fa47-71ca-11e1-9e33-c80aa9429562:23"]


def test_a_transaction_waits_for_its_end_and_all_its_events_in_every_table():
    gate = _gate()
    # batch 0: txn 1's event on a, nothing of b yet, END read; txn 2 complete but after txn 1
    r0, s0 = gate.apply(GateState(), {"a": [_rows("p.db.a", [0, 1])]},
                        _events([("p.db.a", 0, 0, "1"), ("p.db.a", 0, 1, "2")]),
                        _ends([(1, "1", {"db.a": 1, "db.b": 1}), (3, "2", {"db.a": 1, "db.x": 4})]), batch_id=0)
    assert r0.rows["a"].num_rows == 0 and r0.held_rows == 2 and r0.released == 0
    # batch 1: txn 1's event on b comes: both go, in one batch
    r1, s1 = gate.apply(s0, {"b": [_rows("p.db.b", [0])]}, _events([("p.db.b", 0, 0, "1")]), _ends([]), batch_id=1)
    assert r1.rows["a"]["_offset"].to_pylist() == [0, 1] and r1.rows["b"].num_rows == 1
    assert (r1.released, r1.held_rows, r1.last_txn, r1.last_position) == (2, 0, "2", "p.transaction:0:3")
    assert "__txn" not in r1.rows["a"].column_names
    # rows of no transaction (snapshot) pass at once; the state it started from is not changed
    r2, _ = gate.apply(s1, {"a": [_rows("p.db.a", [5])]}, _events([]), _ends([]), batch_id=2)
    assert r2.rows["a"].num_rows == 1 and s0.held["a"].num_rows == 2


def test_maxwell_commit_ends_its_transaction():
    gate = TransactionGate(collection_of=lambda t: "", tracked=lambda c: True, max_held_rows=100)
    events = pa.table({"topic": ["m", "m", "m"], "partition": pa.array([0, 0, 0], pa.int32()),
                       "offset": pa.array([0, 1, 2], pa.int64()), "txn": ["s:1", "s:1", "s:2"],
                       "last": [False, True, False]}, schema=EVENTS_SCHEMA)
    r, s = gate.apply(GateState(), {"t": [_rows("m", [0, 1, 2])]}, events, BOUNDARIES_SCHEMA.empty_table(),
                      batch_id=0)
    assert r.rows["t"]["_offset"].to_pylist() == [0, 1] and r.held_rows == 1 and r.last_position == "m:0:1"


def test_the_limit_splits_every_incomplete_transaction_and_later_events_pass(tmp_path):
    gate = _gate(limit=1)
    r, s = gate.apply(GateState(), {"a": [_rows("p.db.a", [0, 1])]},
                      _events([("p.db.a", 0, 0, "1"), ("p.db.a", 0, 1, "1")]),
                      _ends([(1, "1", {"db.a": 2, "db.b": 1})]), batch_id=0)
    assert r.split == 1 and r.rows["a"].num_rows == 2 and r.held_rows == 0
    r, s = gate.apply(s, {"b": [_rows("p.db.b", [0])]}, _events([("p.db.b", 0, 0, "1")]), _ends([]), batch_id=1)
    assert r.rows["b"].num_rows == 1 and r.held_rows == 0


def test_a_source_mirrored_and_read_by_the_views_counts_its_held_rows_once():
    # txn 1 waits for db.b; db.a's two rows are held for its table and for the views' feed of source a,
    # and a third row only the views read (another topic) is held for its feed alone
    rows = {"a": [_rows("p.db.a", [0, 1])], FEED + "a": [_rows("p.db.a", [0, 1])], FEED + "c": [_rows("p.db.c", [0])]}
    events = _events([("p.db.a", 0, 0, "1"), ("p.db.a", 0, 1, "1"), ("p.db.c", 0, 0, "1")])
    r, s = _gate(limit=3).apply(GateState(), rows, events, _ends([(1, "1", {"db.a": 2, "db.b": 1})]), batch_id=0)
    assert r.held_rows == 3 and r.split == 0
    assert {t: h.num_rows for t, h in s.held.items()} == {"a": 2, FEED + "a": 2, FEED + "c": 1}
    # one row over the limit still splits
    r, _ = _gate(limit=2).apply(GateState(), rows, events, _ends([(1, "1", {"db.a": 2, "db.b": 1})]), batch_id=0)
    assert r.split == 1 and r.held_rows == 0


def test_the_checkpoint_keeps_the_held_rows_for_the_batch_after(tmp_path):
    gate, book = _gate(), GateBook(str(tmp_path))
    _, s0 = gate.apply(GateState(), {"a": [_rows("p.db.a", [0])]}, _events([("p.db.a", 0, 0, "1")]), _ends([]),
                       batch_id=0)
    book.write(0, s0)
    book.write(1, GateState())                       # a later batch's state (a run that crashed after it)
    again = book.before(1)                           # batch 1 replayed: starts from batch 0's state
    assert again.held["a"].equals(s0.held["a"]) and again.seen == {"1": {"db.a": 1}}
    assert book.before(0).held == {}


def test_a_transaction_topic_of_several_partitions_is_refused():
    from changelake.errors import ConfigError

    ends = _ends([(1, "1", {"db.a": 1})]).to_pydict()
    ends["partition"] = [2]
    with pytest.raises(ConfigError, match="more than one partition"):
        _gate().apply(GateState(), {}, _events([]), pa.table(ends, schema=BOUNDARIES_SCHEMA), batch_id=0)
