"""A generated history of multi-table source transactions, as Debezium (MySQL) writes it to Kafka with
``provide.transaction.metadata=true``: each table a topic of 4 partitions (by key), BEGIN/END events on
``dbz.transaction`` (one partition), and the database's state after every transaction to compare with.

Transactions keep two invariants: the sum of ``accounts.balance`` is :data:`TOTAL` (a transfer updates two
accounts; the first transaction opens them all), and every ``order_lines`` row has its ``orders`` row (an
order is inserted with its lines, deleted with them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import orjson
import pyarrow as pa

from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED

PREFIX = "dbz"
DB = "shop"
TABLES = {"accounts": ["id", "balance"], "orders": ["id", "customer"], "order_lines": ["id", "order_id", "qty"]}


def topics(prefix: str = PREFIX) -> dict[str, str]:
    """table -> its topic, for a connector whose topic.prefix is ``prefix``."""
    return {t: f"{prefix}.{DB}.{t}" for t in TABLES}


TOPICS = topics()
TXN_TOPIC = f"{PREFIX}.transaction"
PARTITIONS = 4
ACCOUNTS = 6
TOTAL = ACCOUNTS * 100


@dataclass
class History:
    records: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = field(default_factory=dict)
    #: the database's tables after transaction k (index 0: before any)
    states: list[dict[str, dict[int, dict]]] = field(default_factory=list)

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.records.setdefault((topic, partition), []).append((key, value))


def generate(seed: int, transactions: int = 60, *, untracked: bool = True, prefix: str = PREFIX) -> History:
    """``transactions`` random transactions after the one that opens the accounts. ``untracked``: some
    transactions also write ``audit``, a table the pipeline does not read (its END counts it)."""
    rng = random.Random(seed)
    h = History()
    names, txn_topic = topics(prefix), f"{prefix}.transaction"
    db: dict[str, dict[int, dict]] = {t: {} for t in TABLES}
    h.states.append(_copy(db))
    pos = [4]
    next_order, next_line = [1], [1]

    def event(txn: str, order: list[int], table: str, op: str, before: dict | None, after: dict | None) -> None:
        pos[0] += 100
        order[0] += 1
        order[1][table] = order[1].get(table, 0) + 1
        row = after or before
        value = {"op": op, "before": before, "after": after, "ts_ms": 1_700_000_000_000 + pos[0],
                 "source": {"connector": "mysql", "db": DB, "table": table, "file": "mysql-bin.000001",
                            "pos": pos[0], "row": 0, "ts_ms": 1_700_000_000_000 + pos[0]},
                 "transaction": {"id": txn, "total_order": order[0], "data_collection_order": order[1][table]}}
        h.append(names[table], row["id"] % PARTITIONS, orjson.dumps({"id": row["id"]}), orjson.dumps(value))
        if op == "d":
            h.append(names[table], row["id"] % PARTITIONS, orjson.dumps({"id": row["id"]}), None)  # tombstone

    for k in range(transactions + 1):
        txn = f"{1000 + k}:{pos[0]}"
        h.append(txn_topic, 0, None, orjson.dumps({"status": "BEGIN", "id": txn, "event_count": None,
                                                   "data_collections": None}))
        order: list = [0, {}]
        kind = "open" if k == 0 else rng.choice(["transfer", "transfer", "order", "order", "cancel"])
        if kind == "open":
            for a in range(1, ACCOUNTS + 1):
                db["accounts"][a] = {"id": a, "balance": 100}
                event(txn, order, "accounts", "c", None, db["accounts"][a])
        elif kind == "transfer":
            a, b = rng.sample(range(1, ACCOUNTS + 1), 2)
            amount = rng.randint(1, 30)
            for acct, delta in ((a, -amount), (b, amount)):
                before = dict(db["accounts"][acct])
                db["accounts"][acct] = {"id": acct, "balance": before["balance"] + delta}
                event(txn, order, "accounts", "u", before, db["accounts"][acct])
        elif kind == "order" or not db["orders"]:
            oid = next_order[0]
            next_order[0] += 1
            db["orders"][oid] = {"id": oid, "customer": rng.randint(1, ACCOUNTS)}
            event(txn, order, "orders", "c", None, db["orders"][oid])
            for _ in range(rng.randint(1, 3)):
                lid = next_line[0]
                next_line[0] += 1
                db["order_lines"][lid] = {"id": lid, "order_id": oid, "qty": rng.randint(1, 9)}
                event(txn, order, "order_lines", "c", None, db["order_lines"][lid])
        else:      # cancel: the order and its lines go
            oid = rng.choice(sorted(db["orders"]))
            for lid in [i for i, r in db["order_lines"].items() if r["order_id"] == oid]:
                event(txn, order, "order_lines", "d", db["order_lines"].pop(lid), None)
            event(txn, order, "orders", "d", db["orders"].pop(oid), None)
        collections = [{"data_collection": f"{DB}.{t}", "event_count": n} for t, n in order[1].items()]
        if untracked and rng.random() < 0.3:
            collections.append({"data_collection": f"{DB}.audit", "event_count": 1})
        h.append(txn_topic, 0, None, orjson.dumps({"status": "END", "id": txn, "event_count": order[0],
                                                   "data_collections": collections}))
        h.states.append(_copy(db))
    return h


def _copy(db: dict) -> dict:
    return {t: {k: dict(v) for k, v in rows.items()} for t, rows in db.items()}


def produce(h: History, servers: str) -> None:
    """Write the history to a Kafka broker, each record to its partition, in order."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "log_level": 3, "linger.ms": 5})
    for (topic, partition), recs in sorted(h.records.items()):
        for key, value in recs:
            producer.produce(topic, key=key, value=value, partition=partition)
    producer.flush(30)


def random_batches(h: History, seed: int, *, max_step: int = 6) -> list[pa.RecordBatch]:
    """The history read in micro-batches whose end offsets are cut at random, per partition."""
    rng = random.Random(seed)
    at = {tp: 0 for tp in h.records}
    batches = []
    while any(at[tp] < len(recs) for tp, recs in h.records.items()):
        rows = []
        for tp, recs in sorted(h.records.items()):
            step = rng.randint(0, max_step)
            for offset in range(at[tp], min(len(recs), at[tp] + step)):
                rows.append((tp[0], tp[1], offset, *recs[offset]))
            at[tp] = min(len(recs), at[tp] + step)
        if rows:
            batches.append(record_batch(rows))
    return batches


def record_batch(rows: list[tuple[str, int, int, bytes | None, bytes | None]]) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_pydict({
        "topic": [r[0] for r in rows], "partition": [r[1] for r in rows], "offset": [r[2] for r in rows],
        "timestamp": [1_700_000_000_000] * n, "key": [r[3] for r in rows], "value": [r[4] for r in rows],
        EXPIRED: [0] * n}, schema=ARROW_SCHEMA)
